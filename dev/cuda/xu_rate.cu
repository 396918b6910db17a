// xu_rate.cu -- issue cost of the backward's per-element non-tensor instructions on one SM
// sub-partition: ex2.approx (MUFU.EX2), the fp32 -> bf16x2 pack (cvt.rn.bf16x2.f32, F2FP), an
// FFMA for scale, and ex2 and pack interleaved. Question it answers: do the head-dim-64 kernel's
// 64 packs per thread and pair compete with its 64 exponentials for the same pipe (then a pair
// costs 2 x 64 x 8 clocks of it per warp), or do they run beside them?
// Each thread runs ITERS rounds of 16 independent chains; one CTA of WARPS warps per SM, so the
// clocks per warp instruction per sub-partition are (clocks / (ITERS * 16)) / (WARPS / 4).
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o xu_rate dev/cuda/xu_rate.cu
// Run:   ./xu_rate            (one line per instruction mix and warp count)
#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime.h>

constexpr int ITERS = 4096;
constexpr int CHAINS = 16;

// MODE 0: ex2; 1: pack; 2: ffma; 3: ex2 + pack (one of each per chain and round).
template <int MODE>
__global__ void xu_kernel(float seed, uint32_t *sink, long long *clocks) {
    float v[CHAINS];
    uint32_t acc = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) v[c] = seed * (float)(c + threadIdx.x) * 1e-3f - 1.0f;
    __syncthreads();
    const long long t0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            if (MODE == 0 || MODE == 3)
                asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[c]));
            if (MODE == 1 || MODE == 3) {
                uint32_t r;
                asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v[c]), "f"(v[(c + 1) % CHAINS]));
                acc ^= r;
                if (MODE == 1) v[c] = __uint_as_float(r);  // a chain, as ex2's
            }
            if (MODE == 2) asm volatile("fma.rn.ftz.f32 %0, %0, 0f3F000000, 0f3E800000;" : "+f"(v[c]));
        }
    }
    __syncthreads();
    const long long t1 = clock64();
    for (int c = 0; c < CHAINS; ++c) acc ^= __float_as_uint(v[c]);
    if (acc == 0x12345678u) sink[threadIdx.x] = acc;  // keeps the work
    if (threadIdx.x == 0) clocks[blockIdx.x] = t1 - t0;
}

template <int MODE>
static void run(const char *name, int warps) {
    uint32_t *sink;
    long long *clk, h = 0;
    cudaMalloc(&sink, 1024 * 4);
    cudaMalloc(&clk, 132 * sizeof(long long));
    xu_kernel<MODE><<<132, 32 * warps>>>(1.0f, sink, clk);  // warm-up
    xu_kernel<MODE><<<132, 32 * warps>>>(1.0f, sink, clk);
    cudaMemcpy(&h, clk, sizeof(h), cudaMemcpyDeviceToHost);
    const double per = (double)h / (ITERS * CHAINS) / (warps / 4.0);
    printf("%-10s warps/SM %2d: %6.2f clocks per warp instruction(s) per sub-partition\n", name,
           warps, per);
    cudaFree(sink);
    cudaFree(clk);
}

int main() {
    for (int w : {4, 8, 16}) {
        run<0>("ex2", w);
        run<1>("pack", w);
        run<2>("ffma", w);
        run<3>("ex2+pack", w);
    }
    return 0;
}
