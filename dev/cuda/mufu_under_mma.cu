// mufu_under_mma.cu -- does tensor-core work slow the exponentials down? The backward's timelines
// (bench/results/bwd-s20.txt, runs 2 and 7) show a warpgroup's 32 ex2 per thread taking 850-1000
// clocks inside the head-dim-128 kernels, ~25-30 clocks per MUFU instruction and warp, where
// xu_rate.cu measures 8 with nothing else running; waiting for the warpgroup's own dP^T before
// them changed nothing (run 13). This probe times one warpgroup's ex2 chains (warpgroup 1, one
// warp per SM sub-partition) while warpgroup 0 of the same CTA:
//   idle    -- has returned
//   ss      -- runs m64n64k16 wgmma with both operands in shared memory, back to back
//   rs      -- the same with A from registers (the backward's dV / dK form)
// and, within warpgroup 1 itself, with one SS group of its own in flight around every 32 ex2
// (own-ss: the kernel's "exponentials under the warpgroup's dP^T"; own-none: the same loop
// without it). One CTA per SM on all 132 SMs.
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -I src/cuda -o mufu_under_mma dev/cuda/mufu_under_mma.cu
// Run:   ./mufu_under_mma      (one line per scenario: clocks per MUFU warp instruction per
//                              sub-partition in warpgroup 1, and warpgroup 0's busy clocks)
#include <stdint.h>
#include <stdio.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "bwd_ptx.cuh"
#include "probe_operands.cuh"

constexpr int ITERS = 2048;          // warpgroup 1's rounds
constexpr int CHAINS = 16;           // independent ex2 chains per thread (x2 per round)
constexpr int TENSOR_ITERS = 16384;  // warpgroup 0's groups of 4 k16 products: outlasts warpgroup 1
constexpr int SMEM = 64 * 1024;

enum { IDLE = 0, SS = 1, RS = 2, OWN_SS = 3, OWN_NONE = 4 };

// Four m64n64k16 products into d: A (shared, K-major, or registers) times B (shared, K-major).
template <bool RS_FORM>
__device__ __forceinline__ void issue4(float (&d)[32], uint32_t sA, uint32_t sB, const uint32_t (&a)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const uint64_t db = bl_wgmma_desc(sB + kk * 32, 16, BL_WGMMA_GROUP_BYTES);
        if (RS_FORM)
            bl_wgmma_rs<__nv_bfloat16, 64, 0>(d, a[kk], db);
        else
            bl_wgmma_ss_n64<__nv_bfloat16, 0>(d, bl_wgmma_desc(sA + kk * 32, 16, BL_WGMMA_GROUP_BYTES), db);
    }
}

template <int SCEN>
__global__ void __launch_bounds__(256, 1) probe_kernel(float seed, float *sink, long long *clocks) {
    extern __shared__ __align__(1024) unsigned char smem[];
    uint32_t sA, sB, a[4][4];
    probe_operands(smem, SMEM, sA, sB, a);
    float d[32];
#pragma unroll
    for (int x = 0; x < 32; ++x) d[x] = 0.0f;

    if (threadIdx.x < 128) {  // ---- warpgroup 0: the tensor cores' other user ----
        if (SCEN != SS && SCEN != RS) return;
        const long long t0 = clock64();
        for (int it = 0; it < TENSOR_ITERS; ++it) {
            bl_wgmma_fence();
            issue4<SCEN == RS>(d, sA, sB, a);
            bl_wgmma_commit();
            bl_wgmma_wait<0>();
            bl_reg_fence(d);
        }
        float s = 0.0f;
#pragma unroll
        for (int x = 0; x < 32; ++x) s += d[x];
        if (s == 12345.0f) sink[threadIdx.x] = s;
        if (threadIdx.x == 0) clocks[2 * blockIdx.x + 1] = clock64() - t0;
        return;
    }

    // ---- warpgroup 1: the exponentials ----
    float v[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) v[c] = seed * (float)(c + threadIdx.x) * 1e-3f - 1.0f;
    const long long t0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
        if (SCEN == OWN_SS) {
            bl_wgmma_fence();
            issue4<false>(d, sA, sB, a);
            bl_wgmma_commit();
        }
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int c = 0; c < CHAINS; ++c) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[c]));
        if (SCEN == OWN_SS) {
            bl_wgmma_wait<0>();
            bl_reg_fence(d);
        }
    }
    const long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += v[c];
#pragma unroll
    for (int x = 0; x < 32; ++x) s += d[x];
    if (s == 12345.0f) sink[threadIdx.x] = s;
    if (threadIdx.x == 128) clocks[2 * blockIdx.x] = t1 - t0;
}

template <int SCEN>
static void run(const char *name, float *sink, long long *clk) {
    auto k = probe_kernel<SCEN>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    cudaMemset(clk, 0, 2 * 132 * sizeof(long long));
    k<<<132, 256, SMEM>>>(1.0f, sink, clk);  // warm-up
    k<<<132, 256, SMEM>>>(1.0f, sink, clk);
    long long h[2 * 132];
    cudaMemcpy(h, clk, sizeof(h), cudaMemcpyDeviceToHost);
    double ex = 0, tc = 0;
    for (int b = 0; b < 132; ++b) ex += (double)h[2 * b], tc += (double)h[2 * b + 1];
    ex /= 132, tc /= 132;
    printf("%-9s: %6.2f clocks per MUFU warp instruction per sub-partition (warpgroup 1: %.0f clocks;"
           " warpgroup 0 busy %.0f clocks) %s\n",
           name, ex / (ITERS * 2.0 * CHAINS), ex, tc, cudaGetErrorString(cudaGetLastError()));
}

int main() {
    float *sink;
    long long *clk;
    cudaMalloc(&sink, 4096);
    cudaMalloc(&clk, 2 * 132 * sizeof(long long));
    run<IDLE>("idle", sink, clk);
    run<SS>("ss", sink, clk);
    run<RS>("rs", sink, clk);
    run<OWN_NONE>("own-none", sink, clk);
    run<OWN_SS>("own-ss", sink, clk);
    return 0;
}
