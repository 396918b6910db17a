// probe_operands.cuh -- the operands of the wgmma probes (wgmma_rate.cu, mufu_under_mma.cu).
#pragma once
#include <stdint.h>
#include <cuda_bf16.h>
#include "bwd_ptx.cuh"

// Fills `bytes` of shared memory with small pseudo-random bf16 values (the tensor cores' power,
// and so their clock, depend on the data), made visible to wgmma; ends with __syncthreads().
__device__ __forceinline__ void probe_fill_smem(unsigned char *smem, int bytes) {
    for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ 0x9e3779b9u;
        h ^= h >> 15;
        reinterpret_cast<__nv_bfloat16 *>(smem)[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.25f);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}

// A-operand fragments from registers for four k16 steps (RS products): bf16 pairs near 1.
__device__ __forceinline__ void probe_a_fragments(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[k][r] = 0x3c003c00u ^ (threadIdx.x * 0x00010001u * (k + r + 1) & 0x00ff00ffu);
}

// The probes' common start: shared memory filled (probe_fill_smem), A at its first 16 KB and B
// behind it, A fragments for the RS form.
__device__ __forceinline__ void probe_operands(unsigned char *smem, int bytes, uint32_t &sA, uint32_t &sB,
                                               uint32_t (&a)[4][4]) {
    probe_fill_smem(smem, bytes);
    sA = bl_smem_addr(smem);
    sB = sA + 16384;
    probe_a_fragments(a);
}
