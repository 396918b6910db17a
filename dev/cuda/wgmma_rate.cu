// wgmma_rate.cu -- how fast the tensor cores run the wgmma shapes the backward uses, with both
// operands in shared memory (SS) or A in registers (RS), B K-major or MN-major, one or two
// warpgroups per SM. Question it answers: is an m64n64k16 SS product (4 KB of shared-memory
// operand per 32 clocks of math) limited by shared-memory bandwidth where the RS form is not?
// Nothing else runs: an upper bound for each shape, not a model of the kernel.
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -I src/cuda -o wgmma_rate dev/cuda/wgmma_rate.cu
// Run:   ./wgmma_rate            (one line per shape: TFLOP/s over 132 CTAs, CUDA events)
#include <stdint.h>
#include <stdio.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "bwd_ptx.cuh"
#include "probe_operands.cuh"

constexpr int ITERS = 4096;   // groups of 4 k16 products per warpgroup
constexpr int SMEM = 64 * 1024;

template <int N>
struct acc_t { float v[N / 2]; };

// MODE: 0 SS, B K-major; 1 SS, B MN-major; 2 RS, B K-major; 3 RS, B MN-major.
template <int MODE, int N>
__device__ __forceinline__ void issue4(float (&d)[N / 2], uint32_t sA, uint32_t sB,
                                       const uint32_t (&a)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        if (MODE == 0 || MODE == 1) {
            const uint64_t da = bl_wgmma_desc(sA + kk * 32, 16, BL_WGMMA_GROUP_BYTES);
            // MN-major B: a k16 step is 16 rows of 128 bytes
            const uint64_t db = MODE == 0 ? bl_wgmma_desc(sB + kk * 32, 16, BL_WGMMA_GROUP_BYTES)
                                          : bl_wgmma_desc(sB + kk * 2048, 8192, BL_WGMMA_GROUP_BYTES);
            if constexpr (N == 64) {
                if (MODE == 0) bl_wgmma_ss_n64<__nv_bfloat16, 0>(d, da, db);
                else bl_wgmma_ss_n64<__nv_bfloat16, 1>(d, da, db);
            }
        } else {
            const uint64_t db = MODE == 2 ? bl_wgmma_desc(sB + kk * 32, 16, BL_WGMMA_GROUP_BYTES)
                                          : bl_wgmma_desc(sB + kk * 2048, 8192, BL_WGMMA_GROUP_BYTES);
            if (MODE == 2) bl_wgmma_rs<__nv_bfloat16, N, 0>(d, a[kk], db);
            else bl_wgmma_rs<__nv_bfloat16, N, 1>(d, a[kk], db);
        }
    }
}

template <int MODE, int N>
__global__ void __launch_bounds__(256, 1) rate_kernel(float *sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    uint32_t sA, sB, a[4][4];
    probe_operands(smem, SMEM, sA, sB, a);
    float d0[N / 2], d1[N / 2];
#pragma unroll
    for (int x = 0; x < N / 2; ++x) d0[x] = d1[x] = 0.0f;
    for (int it = 0; it < ITERS; it += 2) {
        bl_wgmma_fence();
        issue4<MODE, N>(d0, sA, sB, a);
        bl_wgmma_commit();
        bl_wgmma_wait<1>();
        bl_reg_fence(d1);
        bl_wgmma_fence();
        issue4<MODE, N>(d1, sA, sB, a);
        bl_wgmma_commit();
        bl_wgmma_wait<1>();
        bl_reg_fence(d0);
    }
    bl_wgmma_wait<0>();
    bl_reg_fence(d0);
    bl_reg_fence(d1);
    float s = 0.0f;
#pragma unroll
    for (int x = 0; x < N / 2; ++x) s += d0[x] + d1[x];
    if (s == 12345.0f) sink[threadIdx.x] = s;  // keeps the products alive
}

template <int MODE, int N>
static void run(const char *name, int wgs, float *sink) {
    auto k = rate_kernel<MODE, N>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    const int ctas = 132;
    k<<<ctas, 128 * wgs, SMEM>>>(sink);  // warm-up
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    const int reps = 5;
    for (int r = 0; r < reps; ++r) k<<<ctas, 128 * wgs, SMEM>>>(sink);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double flops = (double)reps * ctas * wgs * ITERS * 4 * 2.0 * 64 * N * 16;
    printf("%-14s N=%3d warpgroups=%d: %7.1f TFLOP/s (%s)\n", name, N, wgs, flops / (ms * 1e-3) * 1e-12,
           cudaGetErrorString(cudaGetLastError()));
}

int main() {
    float *sink;
    cudaMalloc(&sink, 4096);
    for (int wgs = 1; wgs <= 2; ++wgs) {
        run<0, 64>("SS B K-major", wgs, sink);
        run<1, 64>("SS B MN-major", wgs, sink);
        run<2, 64>("RS B K-major", wgs, sink);
        run<3, 64>("RS B MN-major", wgs, sink);
        run<2, 128>("RS B K-major", wgs, sink);
        run<3, 128>("RS B MN-major", wgs, sink);
    }
    return 0;
}
