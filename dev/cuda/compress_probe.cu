// compress_probe.cu -- would compressible device memory (Hopper's compute data compression) make
// the backward's fp32 dq accumulator cheaper? Standalone (no library code): the accumulator's
// life in one call -- zeros written beside the Dlt pass (preprocess), entries' dQ reduce-added
// into a share of its 64-row tiles (main kernel), read back and converted to bf16 (postprocess)
// -- timed with the accumulator in cudaMalloc memory and in cuMemCreate memory that asked for
// CU_MEM_ALLOCATION_COMP_GENERIC (the driver may refuse it; the probe prints what it got).
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o build/compress_probe dev/cuda/compress_probe.cu
// (the driver's functions through the runtime's entry points, as src/cuda/tensor_map.cuh does:
// no -lcuda)
//   ./build/compress_probe            (16k x 16 x 128 and 32k x 24 x 128 accumulators)
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)
#define CU(x)                                                                          \
    do {                                                                               \
        CUresult r_ = (x);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                      \
            fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_); \
            return nullptr;                                                            \
        }                                                                              \
    } while (0)

// A driver function by name (CUDA 12.0 ABI), or exit.
template <typename F> static F drv(const char *name) {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !p) {
        fprintf(stderr, "driver entry point %s not found\n", name);
        exit(1);
    }
    return reinterpret_cast<F>(p);
}
#define DRV(fn) drv<decltype(&fn)>(#fn)

constexpr int THREADS = 256;
constexpr int D = 128;               // head dim: one row of the accumulator
constexpr int TILE_ROWS = 64;        // a row tile (BL_BWD_TM)
constexpr int VEC = 8;               // elements a thread moves: 16 bytes of bf16, 32 of fp32
constexpr int TILE_VECS = TILE_ROWS * D / VEC;

// Memory from cuMemCreate, compressible if the driver grants it; *granted says whether it did.
static float *alloc_compressible(size_t bytes, bool *granted, size_t *mapped) {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    size_t gran = 0;
    CU(DRV(cuMemGetAllocationGranularity)(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t size = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CU(DRV(cuMemCreate)(&h, size, &prop, 0));
    CUmemAllocationProp got = {};
    CU(DRV(cuMemGetAllocationPropertiesFromHandle)(&got, h));
    *granted = got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC;
    CUdeviceptr p = 0;
    CU(DRV(cuMemAddressReserve)(&p, size, 0, 0, 0));
    CU(DRV(cuMemMap)(p, size, 0, h, 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(DRV(cuMemSetAccess)(p, size, &access, 1));
    *mapped = size;
    return reinterpret_cast<float *>(p);
}

// Thread i's partial Dlt: 8 elements of a row of out and of dO (bf16).
__device__ __forceinline__ float dlt_dot(const uint4 *out, const uint4 *dout, int64_t i) {
    const uint4 a = out[i], b = dout[i];
    const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 *y = reinterpret_cast<const __nv_bfloat162 *>(&b);
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 u = __bfloat1622float2(x[e]), v = __bfloat1622float2(y[e]);
        dot += u.x * v.x + u.y * v.y;
    }
    return dot;
}

// Thread i's 8 accumulator zeros as the preprocess writes them: 32 bytes of its own, two float4
// stores that each fill half of every sector the warp touches.
__device__ __forceinline__ void zeros_own(float4 *acc, int64_t i) {
    acc[2 * i] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[2 * i + 1] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// The CTA's 2 x THREADS float4 zeros (of 2 * vecs in all) as two runs across the CTA: every
// store instruction fills whole sectors.
__device__ __forceinline__ void zeros_runs(float4 *acc, int64_t vecs) {
    float4 *z = acc + (int64_t)blockIdx.x * 2 * THREADS;
    const int64_t left = 2 * vecs - (int64_t)blockIdx.x * 2 * THREADS;
    if (threadIdx.x < left) z[threadIdx.x] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (THREADS + threadIdx.x < left) z[THREADS + threadIdx.x] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// The preprocess's shape: per 8 elements of a row, read out and dO (bf16), a partial dot (kept
// live by a conditional store), and 8 zeros of the accumulator.
__global__ void pre_kernel(const uint4 *out, const uint4 *dout, float4 *acc, float *sink,
                           int64_t vecs, bool zeros) {
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i >= vecs) return;
    const float dot = dlt_dot(out, dout, i);
    if (dot == 12345.f) sink[0] = dot;
    if (zeros) zeros_own(acc, i);
}

// The accumulator's zeros alone, 8 floats a thread as the preprocess writes them.
__global__ void zero_kernel(float4 *acc, int64_t vecs) {
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i < vecs) zeros_own(acc, i);
}

// The same zeros as runs across the CTA.
__global__ void zero_kernel_runs(float4 *acc, int64_t vecs) { zeros_runs(acc, vecs); }

// The preprocess's shape with those zeros (no early return: the CTA's runs cover its threads').
__global__ void pre_kernel_runs(const uint4 *out, const uint4 *dout, float4 *acc, float *sink,
                                int64_t vecs) {
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    const float dot = i < vecs ? dlt_dot(out, dout, i) : 0.f;
    if (dot == 12345.f) sink[0] = dot;
    zeros_runs(acc, vecs);
}

// One entry's dQ into a share of the row tiles: tile t takes `adds` adds where its hash falls
// under `share` (the main kernel's fp32 reduce-adds, as float4 atomics).
__device__ __forceinline__ uint32_t tile_hash(uint32_t t) {
    t ^= t >> 16; t *= 0x7feb352du; t ^= t >> 15; t *= 0x846ca68bu; t ^= t >> 16;
    return t;
}
__global__ void red_kernel(float4 *acc, int64_t tiles, float share, int adds) {
    const int64_t t = blockIdx.x;
    if (t >= tiles || (tile_hash((uint32_t)t) & 0xffffff) >= (uint32_t)(share * 16777216.f)) return;
    for (int a = 0; a < adds; ++a)
        for (int v = threadIdx.x; v < TILE_VECS * 2; v += THREADS)
            atomicAdd(&acc[t * TILE_VECS * 2 + v], make_float4(0.5f, 0.25f, 0.125f, 1.0f));
}

// The postprocess's shape: 8 floats of the accumulator to 8 bf16 of dq.
__global__ void post_kernel(const float4 *acc, uint4 *dq, int64_t vecs) {
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i >= vecs) return;
    const float4 a = acc[2 * i], b = acc[2 * i + 1];
    uint4 o;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&o);
    h[0] = __floats2bfloat162_rn(a.x, a.y);
    h[1] = __floats2bfloat162_rn(a.z, a.w);
    h[2] = __floats2bfloat162_rn(b.x, b.y);
    h[3] = __floats2bfloat162_rn(b.z, b.w);
    dq[i] = o;
}

__global__ void fill_kernel(uint4 *p, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * THREADS) {
        const uint32_t h = tile_hash((uint32_t)i ^ seed);
        // bf16 values in [1, 2) and [-2, -1): random mantissas, nothing compressible
        const uint32_t w = 0x3f803f80u | (h & 0x007f007fu) | ((h >> 8) & 0x80008000u);
        p[i] = make_uint4(w, w ^ 0x00550055u, w ^ 0x002a002au, w ^ 0x00130013u);
    }
}

struct Timer {
    cudaEvent_t a, b;
    Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
    template <typename F> float us(F f, int reps) {
        std::vector<float> t;
        for (int r = 0; r < reps; ++r) {
            CK(cudaEventRecord(a));
            f();
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms = 0.f;
            CK(cudaEventElapsedTime(&ms, a, b));
            t.push_back(1000.f * ms);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

static void run_shape(const char *name, int64_t rows) {
    const int64_t elems = rows * D, vecs = elems / VEC, tiles = rows / TILE_ROWS;
    const size_t acc_bytes = (size_t)elems * 4, in_bytes = (size_t)elems * 2;
    uint4 *out, *dout, *dq;
    float *sink, *plain;
    CK(cudaMalloc(&out, in_bytes));
    CK(cudaMalloc(&dout, in_bytes));
    CK(cudaMalloc(&dq, in_bytes));
    CK(cudaMalloc(&sink, 64));
    CK(cudaMalloc(&plain, acc_bytes));
    fill_kernel<<<1024, THREADS>>>(out, (int64_t)(in_bytes / 16), 1u);
    fill_kernel<<<1024, THREADS>>>(dout, (int64_t)(in_bytes / 16), 2u);
    bool granted = false;
    size_t mapped = 0;
    float *comp = alloc_compressible(acc_bytes, &granted, &mapped);
    printf("\n== %s: accumulator %.1f MB; cuMemCreate compressible: %s (%.1f MB mapped)\n", name,
           acc_bytes / 1e6, comp ? (granted ? "granted" : "refused (plain)") : "failed",
           mapped / 1e6);
    CK(cudaDeviceSynchronize());
    const unsigned grid = (unsigned)((vecs + THREADS - 1) / THREADS);
    Timer tm;
    cudaStream_t side;
    cudaEvent_t fork, join;
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    const int reps = 15;
    printf("%-44s %12s %12s\n", "step (median of 15, us)", "cudaMalloc", "compressible");
    auto row = [&](const char *what, auto step) {
        const float a = tm.us([&] { step((float4 *)plain); }, reps);
        const float b = comp ? tm.us([&] { step((float4 *)comp); }, reps) : -1.f;
        printf("%-44s %12.1f %12.1f\n", what, a, b);
    };
    row("Dlt pass alone (out, dO read)", [&](float4 *acc) {
        pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, false);
    });
    row("preprocess: Dlt pass + accumulator zeros", [&](float4 *acc) {
        pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, true);
    });
    const float shares[] = {1.0f, 0.5f, 0.1f, 0.03f};
    for (float share : shares) {
        char what[96];
        snprintf(what, sizeof what, "zeros, adds into %.0f %% of tiles (x2)", 100.f * share);
        row(what, [&](float4 *acc) {
            pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, true);
            red_kernel<<<(unsigned)tiles, THREADS>>>(acc, tiles, share, 2);
        });
        snprintf(what, sizeof what, "  whole chain, + postprocess (%.0f %%)", 100.f * share);
        row(what, [&](float4 *acc) {
            pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, true);
            red_kernel<<<(unsigned)tiles, THREADS>>>(acc, tiles, share, 2);
            post_kernel<<<grid, THREADS>>>(acc, dq, vecs);
        });
    }
    row("postprocess alone (after the 3 % chain)", [&](float4 *acc) {
        post_kernel<<<grid, THREADS>>>(acc, dq, vecs);
    });
    // Who else could write the zeros (bench/results/bwd-s84-zeros-probe.txt): the driver's memset, alone, before
    // the Dlt pass, and beside it on a second stream (the Dlt pass and the zeros then share the
    // memory system but not a kernel).
    row("zeros alone (kernel, 8 floats a thread)", [&](float4 *acc) {
        zero_kernel<<<grid, THREADS>>>(acc, vecs);
    });
    row("zeros alone (kernel, runs across the CTA)", [&](float4 *acc) {
        zero_kernel_runs<<<grid, THREADS>>>(acc, vecs);
    });
    row("preprocess: Dlt pass + zeros as CTA runs", [&](float4 *acc) {
        pre_kernel_runs<<<grid, THREADS>>>(out, dout, acc, sink, vecs);
    });
    row("cudaMemsetAsync(0) alone", [&](float4 *acc) {
        CK(cudaMemsetAsync(acc, 0, acc_bytes, 0));
    });
    row("cudaMemsetAsync(0), then the Dlt pass", [&](float4 *acc) {
        CK(cudaMemsetAsync(acc, 0, acc_bytes, 0));
        pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, false);
    });
    row("Dlt pass | cudaMemsetAsync on a 2nd stream", [&](float4 *acc) {
        CK(cudaEventRecord(fork, 0));
        CK(cudaStreamWaitEvent(side, fork, 0));
        CK(cudaMemsetAsync(acc, 0, acc_bytes, side));
        CK(cudaEventRecord(join, side));
        pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, false);
        CK(cudaStreamWaitEvent(0, join, 0));
    });
    row("Dlt pass | zero kernel on a 2nd stream", [&](float4 *acc) {
        CK(cudaEventRecord(fork, 0));
        CK(cudaStreamWaitEvent(side, fork, 0));
        zero_kernel<<<grid, THREADS, 0, side>>>(acc, vecs);
        CK(cudaEventRecord(join, side));
        pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, false);
        CK(cudaStreamWaitEvent(0, join, 0));
    });
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    // the chain's result must not depend on the memory: compare the two accumulators' dq
    if (comp) {
        std::vector<uint4> h1((size_t)vecs), h2((size_t)vecs);
        for (int k = 0; k < 2; ++k) {
            float4 *acc = (float4 *)(k ? comp : plain);
            pre_kernel<<<grid, THREADS>>>(out, dout, acc, sink, vecs, true);
            red_kernel<<<(unsigned)tiles, THREADS>>>(acc, tiles, 0.1f, 2);
            post_kernel<<<grid, THREADS>>>(acc, dq, vecs);
            CK(cudaMemcpy(k ? h2.data() : h1.data(), dq, vecs * 16, cudaMemcpyDeviceToHost));
        }
        int64_t diff = 0;
        for (int64_t i = 0; i < vecs; ++i)
            diff += h1[i].x != h2[i].x || h1[i].y != h2[i].y || h1[i].z != h2[i].z || h1[i].w != h2[i].w;
        printf("dq of the 10 %% chain: %lld of %lld vectors differ between the two memories\n",
               (long long)diff, (long long)vecs);
    }
    CK(cudaFree(out));
    CK(cudaFree(dout));
    CK(cudaFree(dq));
    CK(cudaFree(sink));
    CK(cudaFree(plain));
    // (the compressible mapping is left to the process's exit)
}

int main() {
    CK(cudaFree(0));
    CUdevice dev = 0;
    if (DRV(cuDeviceGet)(&dev, 0) != CUDA_SUCCESS) return 1;
    int supported = 0;
    DRV(cuDeviceGetAttribute)(&supported, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED = %d\n", prop.name, supported);
    run_shape("16k x 16 heads x 128", 16384LL * 16);
    run_shape("32k x 24 heads x 128", 32768LL * 24);
    return 0;
}
