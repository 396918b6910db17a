// return_ctas_probe.cu -- what CTAs that return at once cost a grid, at the head-dim-64 backward's
// launch shape (384 threads, ~196 KB of dynamic shared memory: one CTA an SM).
//
// Why: a persistent version 6 picked on the device for sparse calls (bench/notes-bwd.md, s99
// item 5) would be launched beside the per-column form, one grid of #SMs CTAs and one of #columns,
// and the form not picked returns at once. Whether that is affordable depends on what a grid of
// ~2048 returning CTAs of that size costs (15-16 waves of one CTA an SM), alone and behind a grid
// that holds every SM for a while (the persistent CTAs finishing first). No library code.
//
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -o build/probe/return_ctas_probe \
//        dev/cuda/return_ctas_probe.cu
//   build/probe/return_ctas_probe [REPS]   (on the device)
//
// Prints, per case, the GPU time per launch (CUDA events over REPS launches after a warm-up):
//   - `return`: every CTA returns at once (grid, dynamic shared memory);
//   - `hold + return`: CTAs 0..#SMs-1 spin for HOLD_US, the others return at once -- their cost
//     is the case's time minus the `hold` case's (only the #SMs holding CTAs).
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

#include "probe_check.cuh"  // CHECK

constexpr int THREADS = 384;                  // bwd_ws64_kernel's WS_THREADS
constexpr int BIG_SMEM = 196 * 1024;          // ~wg64p_smem::BYTES: one CTA an SM
constexpr double HOLD_US = 50.0;              // the holding CTAs' spin
constexpr int GRIDS[] = {132, 1024, 2048, 4096};

// CTAs below `holders` spin for `cycles` clocks (one thread; the others wait at the barrier);
// the rest return at once. `sink` keeps the spin from being optimised away.
__global__ void __launch_bounds__(THREADS, 1) hold_or_return(int holders, long long cycles,
                                                             int *sink) {
    if ((int)blockIdx.x >= holders) return;
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < cycles) {
        }
        if (sink) atomicAdd(sink, 1);
    }
    __syncthreads();
}

static double us_per_launch(int reps, int grid, int smem, int holders, long long cycles,
                            int *sink) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i)
        hold_or_return<<<grid, THREADS, smem>>>(holders, cycles, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i)
        hold_or_return<<<grid, THREADS, smem>>>(holders, cycles, sink);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return 1000.0 * ms / reps;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
    int dev = 0, sms = 0, khz = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
    CHECK(cudaFuncSetAttribute(hold_or_return, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               BIG_SMEM));
    int *sink = nullptr;
    CHECK(cudaMalloc(&sink, sizeof(int)));
    const long long cycles = (long long)(HOLD_US * khz / 1000.0);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("# return_ctas_probe: %s, %d SMs, %d reps a case, %d threads a CTA, hold %.0f us "
                "(%lld clocks at the nominal clock)\n",
                prop.name, sms, reps, THREADS, HOLD_US, cycles);
    std::printf("| case | grid | dynamic smem (KB) | us a launch |\n|---|---|---|---|\n");
    for (int smem : {0, BIG_SMEM})
        for (int grid : GRIDS)
            std::printf("| return | %d | %d | %.2f |\n", grid, smem / 1024,
                        us_per_launch(reps, grid, smem, 0, 0, nullptr));
    const double hold = us_per_launch(reps, sms, BIG_SMEM, sms, cycles, sink);
    std::printf("| hold | %d | %d | %.2f |\n", sms, BIG_SMEM / 1024, hold);
    for (int grid : GRIDS) {
        if (grid <= sms) continue;
        const double t = us_per_launch(reps, grid, BIG_SMEM, sms, cycles, sink);
        std::printf("| hold + return | %d | %d | %.2f (+%.2f for %d returning CTAs) |\n", grid,
                    BIG_SMEM / 1024, t, t - hold, grid - sms);
    }
    CHECK(cudaFree(sink));
    return 0;
}
