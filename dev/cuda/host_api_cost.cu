// host_api_cost.cu -- what the CUDA runtime calls on the library's host path cost, each timed in
// a loop of N calls with no profiler (the s94 profile, dev/cuda/host_profile.py, read them with
// the profiler's own overhead in): cudaGetDevice, cudaDeviceGetAttribute, cudaFuncSetAttribute
// (max dynamic shared memory, the same value each time, as the launch paths set it),
// cudaOccupancyMaxActiveBlocksPerMultiprocessor, cuTensorMapEncodeTiled, and a plain launch.
//   nvcc -O2 -arch=sm_90a -std=c++17 -o build/probe/host_api_cost dev/cuda/host_api_cost.cu
//   build/probe/host_api_cost [N]   (on the device; bench/results/host-s96-api-cost.txt)
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "probe_check.cuh"  // CHECK

__global__ void big_smem_kernel(float *out) {
    extern __shared__ float s[];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if (out) out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

template <typename F>
static double us_per_call(int n, F &&f) {
    for (int i = 0; i < 10; ++i) f();  // warm-up: first calls load modules, create state
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 2000;
    const int smem = 200 * 1024;  // above the 48 KB default: needs the attribute
    CHECK(cudaFree(nullptr));     // context up
    int dev = 0, v = 0;
    CHECK(cudaGetDevice(&dev));
    std::printf("calls per row: %d (us per call, steady_clock)\n", n);
    std::printf("cudaGetDevice                          %8.3f\n",
                us_per_call(n, [&] { CHECK(cudaGetDevice(&dev)); }));
    std::printf("cudaDeviceGetAttribute(SM count)       %8.3f\n", us_per_call(n, [&] {
                    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
                }));
    std::printf("cudaDeviceGetAttribute(smem optin)     %8.3f\n", us_per_call(n, [&] {
                    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
                }));
    std::printf("cudaFuncSetAttribute(max dyn smem)     %8.3f\n", us_per_call(n, [&] {
                    CHECK(cudaFuncSetAttribute(big_smem_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                }));
    std::printf("cudaOccupancyMaxActiveBlocksPerSM      %8.3f\n", us_per_call(n, [&] {
                    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, big_smem_kernel, 128,
                                                                        0));
                }));
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                           cudaEnableDefault, &q));
    auto encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    void *buf = nullptr;
    CHECK(cudaMalloc(&buf, 64 << 20));
    CUtensorMap map;
    const cuuint64_t dims[3] = {128, 16, 16384};
    const cuuint64_t strides[2] = {128 * 2, 16 * 128 * 2};
    const cuuint32_t box[3] = {64, 1, 128}, estr[3] = {1, 1, 1};
    std::printf("cuTensorMapEncodeTiled                 %8.3f\n", us_per_call(n, [&] {
                    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, buf, dims,
                                        strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
                    if (r != CUDA_SUCCESS) {
                        std::printf("encode failed: %d\n", (int)r);
                        std::exit(1);
                    }
                }));
    std::printf("launch <<<1, 128, 200 KB>>> (no sync)  %8.3f\n", us_per_call(n, [&] {
                    big_smem_kernel<<<1, 128, smem>>>(nullptr);
                    CHECK(cudaPeekAtLastError());
                }));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(buf));
    return 0;
}
