// preprocess_probe.cu -- how fast can the backward's preprocess move its bytes? (fiftieth session)
//
// The shipped preprocess (bwd_prepost_sm90.cu) gives each thread one 16-byte vector of out and of
// dO and 8 floats of the dq accumulator's zeros. The forty-sixth and forty-seventh sessions found
// its zeros hard to skip (the forms that waited for the schedule or split the zeros off lost
// where every zero is needed, and gained little where few are) and read that as the zero stores
// riding on the loads' latency for free. Questions: what do the zeros cost in that kernel alone;
// what does a check that lets a thread skip its zeros cost; can a zero kernel that starts when
// the schedule is known run beside a Dlt pass without zeros as fast as the one pass; and does a
// persistent TMA form (64-row tiles of out / dO through an mbarrier ring, bytes in flight
// without threads waiting on them) read faster than threads do?
//
// Kernels timed (CUDA events, median of REPS launches; Dlt checked against onepass's, the zeros
// read back where a form writes them):
//   onepass     the shipped form's replica (Dlt, lse_log2, all zeros in thread order)
//   onepass0    the same without the zeros: what skipping every zero could reach
//   rowzero     zeros at each thread's own Dlt row (512-byte pieces, no extra index arithmetic)
//   chk:*       rowzero with the check the library would need to skip zeros without waiting:
//               an acquire load of a ready word and the tile's writer bytes (unset: word not
//               ready; need: ready, every tile 2 writers; skip: ready, 1 writer; skip50 / skip35 /
//               need35: only CTAs from 50 % / 35 % of the grid on check, as those that would
//               start after the schedule)
//   chkT:*      the same check with the zeros in thread order (as onepass), each thread's tile
//               from 32-bit index arithmetic on its zero floats' row
//   zf:*        a zero kernel launched first (a CTA per SM, 16 KB bulk stores of a zeroed buffer)
//               and onepass0 as its programmatic dependent, the zeros starting after 0 / 36 / 71 us
//               (the schedule's end at 16k / 32k in the library), or none needed (none36)
//   bulk        Dlt and lse_log2 from 64-row tiles of out / dO loaded by TMA through a 6-stage
//               mbarrier ring, one CTA per SM
//   bulk+zN     the same with a warp writing all zeros by bulk stores, starting after N us
//   onepass:H   the one pass with cache hints H (cs: loads and stores .cs, evict first; l2pf:
//               loads with the 256-byte L2 prefetch hint; cs+l2pf: both)
//   convert:H   the dq conversion of version 10's rows (fp32 accumulator -> bf16 dq, 6 bytes an
//               element), plain and with the same hints
//
// Build (repository root):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I include -I src -I src/cuda \
//       -o build/preprocess_probe dev/cuda/preprocess_probe.cu
// Run: build/preprocess_probe    (one line per shape and kernel)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <type_traits>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ptx_sm90.cuh"
#include "tensor_map.cuh"
#include "cuda_check.cuh"

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

constexpr float LOG2E = 1.4426950408889634f;
constexpr int TILE_ROWS = 64;     // rows of out / dO per ring stage (one row tile of version 10)
constexpr int PANEL_BYTES = 128;  // one 128B-swizzled panel row: 64 16-bit elements
constexpr int ZERO_PIECE = 16384; // bytes per bulk zero store
constexpr int COMPUTE_THREADS = 128, PROBE_THREADS = COMPUTE_THREADS + 64;  // + producer, zero warps

struct dims {
    int B, S, H, D, Spad, tiles_m;
};

// The Dlt part every thread-based form shares: thread tid takes 8 columns (`part`) of row
// (b, h, i), rows i fastest (as the shipped kernel walks them), its out / dO vector read at `at`.
struct dlt_thread {
    int64_t b, h, i, at;
    int part;
    bool live;  // a row of the padded grid (the whole warp still shuffles)
};
template <int D>
__device__ __forceinline__ dlt_thread dlt_thread_of(const dims &dm, int64_t tid) {
    constexpr int TPR = D / 8;
    dlt_thread t;
    const int64_t row = tid / TPR;
    t.part = (int)(tid % TPR);
    t.live = row < (int64_t)dm.B * dm.Spad * dm.H;
    t.i = row % dm.Spad, t.h = (row / dm.Spad) % dm.H, t.b = row / ((int64_t)dm.H * dm.Spad);
    t.at = ((t.b * dm.S + t.i) * dm.H + t.h) * D + t.part * 8;
    return t;
}
// Sum of the products of 8 16-bit elements (bf16) of two 16-byte vectors.
__device__ __forceinline__ float dot8(uint4 o, uint4 g) {
    const __nv_bfloat162 *o2 = reinterpret_cast<const __nv_bfloat162 *>(&o);
    const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(&g);
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 a = __bfloat1622float2(o2[e]), c = __bfloat1622float2(g2[e]);
        dot += a.x * c.x + a.y * c.y;
    }
    return dot;
}
// Cache hints of the memory-bound kernels' accesses (the onepass / convert rows "hint"):
// HINT_NONE plain; HINT_CS streaming (ld / st .cs: evict first); HINT_L2PF loads with the 256-byte
// L2 prefetch hint (ld.global.L2::256B), plain stores; HINT_CS_L2PF the prefetch hint on loads and
// streaming stores.
enum { HINT_NONE = 0, HINT_CS = 1, HINT_L2PF = 2, HINT_CS_L2PF = 3 };
template <int HINT>
__device__ __forceinline__ uint4 ld16(const void *p) {
    if (HINT == HINT_CS) return __ldcs(reinterpret_cast<const uint4 *>(p));
    if (HINT == HINT_L2PF || HINT == HINT_CS_L2PF) {
        uint4 v;
        asm volatile("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return v;
    }
    return *reinterpret_cast<const uint4 *>(p);
}
template <int HINT>
__device__ __forceinline__ void st16(void *p, uint4 v) {
    if (HINT == HINT_CS || HINT == HINT_CS_L2PF)
        __stcs(reinterpret_cast<uint4 *>(p), v);
    else
        *reinterpret_cast<uint4 *>(p) = v;
}
template <int D, int HINT = HINT_NONE>
__device__ __forceinline__ float dlt_thread_dot(const dims &dm, const dlt_thread &t, const uint16_t *out,
                                                const uint16_t *dout) {
    if (!t.live || t.i >= dm.S) return 0.f;
    return dot8(ld16<HINT>(out + t.at), ld16<HINT>(dout + t.at));
}
// Row (b, h, i)'s Dlt and lse in base 2 (rows past S: 0 and +inf, as the library writes them).
__device__ __forceinline__ void dlt_write(const dims &dm, int64_t b, int64_t h, int64_t i, float dot,
                                          const float *lse, float *dlt, float *lse_log2) {
    const int64_t at = (b * dm.H + h) * dm.Spad + i;
    float l2 = INFINITY;
    if (i < dm.S) {
        const float l = lse[(b * dm.H + h) * dm.S + i];
        if (l != -INFINITY) l2 = l * LOG2E;
    }
    dlt[at] = i < dm.S ? dot : 0.f;
    lse_log2[at] = l2;
}
// The row's sum over its D / 8 threads, written by the first.
template <int D>
__device__ __forceinline__ void dlt_thread_finish(const dims &dm, const dlt_thread &t, float dot,
                                                  const float *lse, float *dlt, float *lse_log2) {
#pragma unroll
    for (int off = D / 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (t.live && t.part == 0) dlt_write(dm, t.b, t.h, t.i, dot, lse, dlt, lse_log2);
}
template <int HINT = HINT_NONE>
__device__ __forceinline__ void zero8(float *p) {
    st16<HINT>(p, make_uint4(0, 0, 0, 0));
    st16<HINT>(p + 4, make_uint4(0, 0, 0, 0));
}

// ---- the shipped form (replica): one 16-byte vector per thread, rows (b, h, i) i fastest ----
template <int D, bool ZERO, int HINT = HINT_NONE>
__global__ void __launch_bounds__(256) onepass_kernel(dims dm, const uint16_t *out, const uint16_t *dout,
                                                      const float *lse, float *dlt, float *lse_log2,
                                                      float *accum, int64_t zero_floats) {
    const int64_t tid = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const dlt_thread t = dlt_thread_of<D>(dm, tid);
    const float dot = dlt_thread_dot<D, HINT>(dm, t, out, dout);
    if (ZERO && tid * 8 < zero_floats) zero8<HINT>(accum + tid * 8);
    dlt_thread_finish<D>(dm, t, dot, lse, dlt, lse_log2);
}

// ---- the dq conversion (version 10's rows: the (B, S, H, D) fp32 accumulator -> bf16 dq) ----
// One 8-column part per thread in thread order, as the library's postprocess (columns in their
// natural order here: the probe times bytes, not the permutation).
template <int D, int HINT>
__global__ void __launch_bounds__(256) convert_kernel(int64_t n, const float *accum, float scale,
                                                      uint16_t *dq) {
    const int64_t tid = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (tid * 8 >= n) return;
    const uint4 a = ld16<HINT>(accum + tid * 8), b = ld16<HINT>(accum + tid * 8 + 4);
    const float v[8] = {__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w),
                        __uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w)};
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * e] * scale, v[2 * e + 1] * scale);
        o[e] = *reinterpret_cast<const uint32_t *>(&h);
    }
    st16<HINT>(dq + tid * 8, make_uint4(o[0], o[1], o[2], o[3]));
}

// ---- the shipped form, zeros written at the thread's own Dlt row, skipped where not needed ----
// Each thread zeroes the 8 accumulator floats of its own (b, i, h, part) -- the row it computes
// Dlt for, so no index arithmetic beyond the Dlt part's -- rather than floats 8 tid.. in thread
// order. MODE 0: always. MODE 1: CTAs from `late_from` on (standing in for those that start after
// the schedule) make the check the library would: an acquire load of a ready word, and where it
// holds `expect` the tile's 16 writer bytes (zeros only where they sum to 2 or more).
template <int D, int MODE>
__global__ void __launch_bounds__(256) onepass_skip_kernel(dims dm, const uint16_t *out, const uint16_t *dout,
                                                           const float *lse, float *dlt, float *lse_log2,
                                                           float *accum, const unsigned long long *ready,
                                                           unsigned long long expect,
                                                           const uint4 *writers, unsigned late_from) {
    const int64_t tid = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const dlt_thread t = dlt_thread_of<D>(dm, tid);
    bool need = true;
    // MODE 2: the zeros in thread order (as onepass), their tile from 32-bit index arithmetic
    const uint32_t zrow = (uint32_t)(tid * 8 / D), zh = zrow % (uint32_t)dm.H;
    const uint32_t zi = (zrow / (uint32_t)dm.H) % (uint32_t)dm.S, zb = zrow / ((uint32_t)dm.H * dm.S);
    const int64_t tile = MODE == 2 ? ((int64_t)zb * dm.H + zh) * dm.tiles_m + zi / TILE_ROWS
                                   : (t.b * dm.H + t.h) * dm.tiles_m + t.i / TILE_ROWS;
    if (MODE >= 1 && blockIdx.x >= late_from) {
        unsigned long long r;
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(r) : "l"(ready) : "memory");
        if (r == expect) {
            const uint4 w = __ldcg(writers + tile);
            const unsigned n = __dp4a(w.x, 0x01010101u, __dp4a(w.y, 0x01010101u,
                               __dp4a(w.z, 0x01010101u, __dp4a(w.w, 0x01010101u, 0u))));
            need = n >= 2;
        }
    }
    const float dot = dlt_thread_dot<D>(dm, t, out, dout);
    if (MODE < 2 && need && t.live && t.i < dm.S) zero8(accum + t.at);
    if (MODE == 2 && need && zrow < (uint32_t)dm.B * dm.S * dm.H) zero8(accum + tid * 8);
    dlt_thread_finish<D>(dm, t, dot, lse, dlt, lse_log2);
}

// ---- the TMA form: one CTA per SM walks row tiles (b, h, m) through an NS-stage ring ----
__device__ __forceinline__ void bulk_store(void *gmem_dst, uint32_t smem_src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem_dst),
                 "r"(smem_src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

template <int D, int NS, bool ZERO>
__global__ void __launch_bounds__(PROBE_THREADS, 1)
bulk_kernel(const __grid_constant__ CUtensorMap tm_o, const __grid_constant__ CUtensorMap tm_g, dims dm,
            const float *lse, float *dlt, float *lse_log2, float *accum, int64_t zero_floats,
            int64_t delay_ns) {
    constexpr int PANELS = D / 64;
    constexpr int ARRAY_BYTES = PANELS * TILE_ROWS * PANEL_BYTES;  // one tile of out (or dO)
    constexpr int STAGE_BYTES = 2 * ARRAY_BYTES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ __align__(8) uint64_t full[NS], empty[NS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t tiles = (int64_t)dm.B * dm.H * dm.tiles_m;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), COMPUTE_THREADS / 32);
        }
        fence_mbarrier_init();
    }
    __syncthreads();
    if (warp == COMPUTE_THREADS / 32) {  // producer
        if (lane == 0) {
            int k = 0;
            for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, ++k) {
                const int s = k % NS, ph = (k / NS) & 1;
                mbarrier_wait(smem_u32(&empty[s]), ph ^ 1);
                const int m = (int)(t % dm.tiles_m), h = (int)((t / dm.tiles_m) % dm.H);
                const int b = (int)(t / ((int64_t)dm.tiles_m * dm.H));
                const uint32_t bar = smem_u32(&full[s]);
                mbarrier_arrive_expect_tx(bar, STAGE_BYTES);
                unsigned char *st = smem + s * STAGE_BYTES;
                for (int p = 0; p < PANELS; ++p) {
                    tma_load_4d(smem_u32(st + p * TILE_ROWS * PANEL_BYTES), &tm_o, bar, p * 64,
                                m * TILE_ROWS, h, b);
                    tma_load_4d(smem_u32(st + ARRAY_BYTES + p * TILE_ROWS * PANEL_BYTES), &tm_g,
                                bar, p * 64, m * TILE_ROWS, h, b);
                }
            }
        }
        return;
    }
    if (warp == COMPUTE_THREADS / 32 + 1) {  // zero warp
        if (!ZERO) return;
        unsigned char *zbuf = smem + NS * STAGE_BYTES;
        for (int x = lane * 16; x < ZERO_PIECE; x += 32 * 16)
            *reinterpret_cast<uint4 *>(zbuf + x) = make_uint4(0, 0, 0, 0);
        fence_proxy_async_shared();
        __syncwarp();
        if (lane != 0) return;
        if (delay_ns > 0) {
            const uint64_t t0 = globaltimer_ns();
            while (globaltimer_ns() - t0 < (uint64_t)delay_ns) __nanosleep(1000);
        }
        const int64_t pieces = zero_floats * 4 / ZERO_PIECE;  // the probe's sizes divide
        for (int64_t p = blockIdx.x; p < pieces; p += gridDim.x) {
            bulk_store((char *)accum + p * ZERO_PIECE, smem_u32(zbuf), ZERO_PIECE);
            bulk_commit_group();
        }
        bulk_wait_group<0>();
        return;
    }
    // compute: two threads per row, each half of its D columns (16-byte chunks, swizzled)
    const int row = threadIdx.x / 2, half = threadIdx.x % 2;
    constexpr int CHUNKS = D / 8 / 2;  // per thread
    int k = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, ++k) {
        const int s = k % NS, ph = (k / NS) & 1;
        mbarrier_wait(smem_u32(&full[s]), ph);
        const unsigned char *st = smem + s * STAGE_BYTES;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < CHUNKS; ++j) {
            const int c = half * CHUNKS + j, p = c / 8, cc = c % 8;
            const int off = p * TILE_ROWS * PANEL_BYTES + row * PANEL_BYTES + ((cc ^ (row & 7)) * 16);
            dot += dot8(*reinterpret_cast<const uint4 *>(st + off),
                        *reinterpret_cast<const uint4 *>(st + ARRAY_BYTES + off));
        }
        __syncwarp();
        if (lane == 0) mbarrier_arrive(smem_u32(&empty[s]));
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        if (half == 0) {
            const int64_t m = t % dm.tiles_m, h = (t / dm.tiles_m) % dm.H, b = t / ((int64_t)dm.tiles_m * dm.H);
            dlt_write(dm, b, h, m * TILE_ROWS + row, dot, lse, dlt, lse_log2);
        }
    }
}

// ---- zeros first, by bulk stores, beside a Dlt pass without zeros ----
// The design this probes: a small zero kernel launched first (a CTA per SM: one thread issues
// 16 KB bulk stores of a zeroed shared buffer), its dependent the Dlt pass (the one-pass form
// without zeros) starting at once; the zero kernel learns after `delay_ns` (the schedule's end,
// in the library) which zeros are needed -- here all -- and the Dlt pass's last CTA waits for it.
__global__ void __launch_bounds__(32) zero_first_kernel(float *accum, int64_t zero_floats, int64_t delay_ns) {
    extern __shared__ __align__(128) unsigned char zbuf[];
    griddep_launch_dependents();
    for (int x = threadIdx.x * 16; x < ZERO_PIECE; x += 32 * 16)
        *reinterpret_cast<uint4 *>(zbuf + x) = make_uint4(0, 0, 0, 0);
    fence_proxy_async_shared();
    __syncwarp();
    if (threadIdx.x != 0) return;
    if (delay_ns > 0) {
        const uint64_t t0 = globaltimer_ns();
        while (globaltimer_ns() - t0 < (uint64_t)delay_ns) __nanosleep(500);
    }
    const int64_t pieces = zero_floats * 4 / ZERO_PIECE;
    for (int64_t p = blockIdx.x; p < pieces; p += gridDim.x) {
        bulk_store((char *)accum + p * ZERO_PIECE, smem_u32(zbuf), ZERO_PIECE);
        bulk_commit_group();
    }
    bulk_wait_group<0>();
}

template <int D>
__global__ void __launch_bounds__(256) dlt_after_zero_kernel(dims dm, const uint16_t *out, const uint16_t *dout,
                                                             const float *lse, float *dlt, float *lse_log2) {
    const int64_t tid = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const dlt_thread t = dlt_thread_of<D>(dm, tid);
    dlt_thread_finish<D>(dm, t, dlt_thread_dot<D>(dm, t, out, dout), lse, dlt, lse_log2);
    if (blockIdx.x == gridDim.x - 1) griddep_wait();
}

// ---- host ----
static float median_ms(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <typename F>
static float time_kernel(F launch, int reps) {
    for (int r = 0; r < 3; ++r) launch();
    CK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(ev[2 * r]));
        launch();
        CK(cudaEventRecord(ev[2 * r + 1]));
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; ++r) CK(cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]));
    for (auto &e : ev) CK(cudaEventDestroy(e));
    return median_ms(ms);
}

__global__ void fill_kernel(uint16_t *x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __bfloat16_as_ushort(__float2bfloat16(((h & 0xffff) / 32768.0f) - 1.0f));
    }
}

template <int D>
static void run_shape(int B, int S, int H, int reps, int sms) {
    dims dm;
    dm.B = B, dm.S = S, dm.H = H, dm.D = D;
    dm.tiles_m = (S + TILE_ROWS - 1) / TILE_ROWS;
    const int tiles80 = (S + 79) / 80;
    dm.Spad = std::max(dm.tiles_m * TILE_ROWS, tiles80 * 80);
    const int64_t n = (int64_t)B * S * H * D, rows_pad = (int64_t)B * H * dm.Spad;
    uint16_t *out, *dout;
    float *lse, *dlt, *l2, *accum;
    CK(cudaMalloc(&out, n * 2));
    CK(cudaMalloc(&dout, n * 2));
    CK(cudaMalloc(&lse, (int64_t)B * H * S * 4));
    CK(cudaMalloc(&dlt, rows_pad * 4));
    CK(cudaMalloc(&l2, rows_pad * 4));
    const int64_t zero_floats = n;  // version 10's (B, Sq, Hq, D) rows
    CK(cudaMalloc(&accum, zero_floats * 4));
    fill_kernel<<<1024, 256>>>(out, n, 1u);
    fill_kernel<<<1024, 256>>>(dout, n, 2u);
    CK(cudaMemset(lse, 0, (int64_t)B * H * S * 4));
    CK(cudaDeviceSynchronize());

    bl_tensor t_o = {out, (int64_t)S * H * D, (int64_t)H * D, D};
    bl_tensor t_g = {dout, (int64_t)S * H * D, (int64_t)H * D, D};
    CUtensorMap tm_o, tm_g;
    if (!bl_make_tensor_map(&tm_o, t_o, B, S, H, D, TILE_ROWS, true) ||
        !bl_make_tensor_map(&tm_g, t_g, B, S, H, D, TILE_ROWS, true)) {
        fprintf(stderr, "tensor map failed\n");
        exit(1);
    }
    const int64_t pp_blocks = (rows_pad * (D / 8) + 255) / 256;
    std::vector<float> ref(rows_pad), got(rows_pad);
    const double bytes_rd = 2.0 * n * 2, bytes_z = (double)zero_floats * 4;

    // zeros: the share of the accumulator's zeros the kernel writes (the rate counts only those)
    auto report = [&](const char *name, float ms, double zeros) {
        const double bytes = bytes_rd + zeros * bytes_z;
        CK(cudaMemcpy(got.data(), dlt, rows_pad * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int64_t r = 0; r < rows_pad; ++r)
            worst = std::max(worst, (double)fabsf(got[r] - ref[r]) / (1e-3 + fabsf(ref[r])));
        printf("%dx%dx%dx%d %-10s %8.1f us  %6.2f TB/s  dlt max rel diff %.2e\n", B, S, H, D, name,
               ms * 1e3, bytes / (ms * 1e-3) / 1e12, worst);
    };
    auto zeros_ok = [&](const char *name) {
        std::vector<float> a(zero_floats);
        CK(cudaMemcpy(a.data(), accum, zero_floats * 4, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (float x : a) bad += x != 0.f;
        printf("%dx%dx%dx%d %-10s accumulator non-zero floats after it: %lld\n", B, S, H, D, name,
               (long long)bad);
    };

    float ms = time_kernel([&] {
        onepass_kernel<D, true><<<(unsigned)pp_blocks, 256>>>(dm, out, dout, lse, dlt, l2, accum, zero_floats);
    }, reps);
    CK(cudaGetLastError());
    CK(cudaMemcpy(ref.data(), dlt, rows_pad * 4, cudaMemcpyDeviceToHost));
    report("onepass", ms, 1.0);
    ms = time_kernel([&] {
        onepass_kernel<D, false><<<(unsigned)pp_blocks, 256>>>(dm, out, dout, lse, dlt, l2, accum, 0);
    }, reps);
    report("onepass0", ms, 0.0);
    // the one pass and the dq conversion with cache hints (HINT_*)
    {
        const char *hint_names[4] = {"", "cs", "l2pf", "cs+l2pf"};
        auto onepass_hinted = [&](auto hint) {
            constexpr int HN = decltype(hint)::value;
            const float t = time_kernel([&] {
                onepass_kernel<D, true, HN><<<(unsigned)pp_blocks, 256>>>(dm, out, dout, lse, dlt, l2, accum, zero_floats);
            }, reps);
            CK(cudaGetLastError());
            char name[32];
            snprintf(name, sizeof name, "onepass:%s", hint_names[HN]);
            report(name, t, 1.0);
        };
        onepass_hinted(std::integral_constant<int, HINT_CS>());
        onepass_hinted(std::integral_constant<int, HINT_L2PF>());
        onepass_hinted(std::integral_constant<int, HINT_CS_L2PF>());
        uint16_t *dq;
        CK(cudaMalloc(&dq, n * 2));
        auto convert_hinted = [&](auto hint) {
            constexpr int HN = decltype(hint)::value;
            const float t = time_kernel([&] {
                convert_kernel<D, HN><<<(unsigned)((n / 8 + 255) / 256), 256>>>(n, accum, 0.125f, dq);
            }, reps);
            CK(cudaGetLastError());
            printf("%dx%dx%dx%d convert:%-8s %6.1f us  %6.2f TB/s\n", B, S, H, D, HN ? hint_names[HN] : "plain",
                   t * 1e3, (double)n * 6 / (t * 1e-3) / 1e12);
        };
        convert_hinted(std::integral_constant<int, HINT_NONE>());
        convert_hinted(std::integral_constant<int, HINT_CS>());
        convert_hinted(std::integral_constant<int, HINT_L2PF>());
        convert_hinted(std::integral_constant<int, HINT_CS_L2PF>());
        CK(cudaFree(dq));
    }

    // zeros at the Dlt row (MODE 0), then the ready-word check on the late CTAs (MODE 1)
    {
        const int64_t ntiles = (int64_t)B * H * dm.tiles_m;
        uint4 *writers;
        unsigned long long *ready;
        CK(cudaMalloc(&writers, ntiles * 16));
        CK(cudaMalloc(&ready, 8));
        const unsigned grid = (unsigned)pp_blocks;
        CK(cudaMemset(accum, 0xff, zero_floats * 4));
        ms = time_kernel([&] {
            onepass_skip_kernel<D, 0><<<grid, 256>>>(dm, out, dout, lse, dlt, l2, accum, ready, 0, writers, grid);
        }, reps);
        CK(cudaGetLastError());
        report("rowzero", ms, 1.0);
        zeros_ok("rowzero");
        const unsigned long long expect = 0x1234567800000084ull;
        // late: the share of the grid before the CTAs that check
        struct { const char *name; bool set; int writers; double late; } cases[] = {
            {"chk:unset", false, 2, 0.0}, {"chk:need", true, 2, 0.0}, {"chk:skip", true, 1, 0.0},
            {"chk:skip50", true, 1, 0.5}, {"chk:skip35", true, 1, 0.35}, {"chk:need35", true, 2, 0.35}};
        for (auto &c : cases) {
            const unsigned long long r = c.set ? expect : 0ull;
            CK(cudaMemcpy(ready, &r, 8, cudaMemcpyHostToDevice));
            std::vector<uint8_t> w(ntiles * 16, 0);
            for (int64_t t = 0; t < ntiles; ++t) w[t * 16] = (uint8_t)c.writers;
            CK(cudaMemcpy(writers, w.data(), ntiles * 16, cudaMemcpyHostToDevice));
            const unsigned late_from = (unsigned)(c.late * grid);
            ms = time_kernel([&] {
                onepass_skip_kernel<D, 1><<<grid, 256>>>(dm, out, dout, lse, dlt, l2, accum, ready, expect,
                                                         writers, late_from);
            }, reps);
            CK(cudaGetLastError());
            report(c.name, ms, c.set && c.writers < 2 ? c.late : 1.0);
            ms = time_kernel([&] {
                onepass_skip_kernel<D, 2><<<grid, 256>>>(dm, out, dout, lse, dlt, l2, accum, ready, expect,
                                                         writers, late_from);
            }, reps);
            CK(cudaGetLastError());
            char tname[32];
            snprintf(tname, sizeof tname, "chkT%s", c.name + 3);
            report(tname, ms, c.set && c.writers < 2 ? c.late : 1.0);
        }
        CK(cudaFree(writers));
        CK(cudaFree(ready));
    }

    for (int64_t delay : {(int64_t)0, (int64_t)36000, (int64_t)71000, (int64_t)-1}) {
        // -1: the zero kernel needs no zeros (returns after the delay 36 us)
        CK(cudaMemset(accum, 0xff, zero_floats * 4));
        CK(cudaMemset(dlt, 0xff, rows_pad * 4));
        const int64_t zf = delay < 0 ? 0 : zero_floats, dl = delay < 0 ? 36000 : delay;
        ms = time_kernel([&] {
            CK(bl_launch(zero_first_kernel, dim3(sms), dim3(32), ZERO_PIECE, (cudaStream_t)0, false,
                         accum, zf, dl));
            CK(bl_launch(dlt_after_zero_kernel<D>, dim3((unsigned)((rows_pad * (D / 8) + 255) / 256)),
                         dim3(256), 0, (cudaStream_t)0, true, dm, (const uint16_t *)out,
                         (const uint16_t *)dout, (const float *)lse, dlt, l2));
        }, reps);
        CK(cudaGetLastError());
        char name[32];
        snprintf(name, sizeof name, delay < 0 ? "zf:none36" : "zf:all%lld", (long long)(delay / 1000));
        report(name, ms, delay >= 0 ? 1.0 : 0.0);
        if (delay >= 0) zeros_ok(name);
    }

    constexpr int NS = 6;
    constexpr size_t smem = NS * 2 * (D / 64) * TILE_ROWS * PANEL_BYTES + ZERO_PIECE + 1024;
    CK(cudaFuncSetAttribute(bulk_kernel<D, NS, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaFuncSetAttribute(bulk_kernel<D, NS, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaMemset(dlt, 0xff, rows_pad * 4));
    ms = time_kernel([&] {
        bulk_kernel<D, NS, false><<<sms, PROBE_THREADS, smem>>>(tm_o, tm_g, dm, lse, dlt, l2, accum, 0, 0);
    }, reps);
    CK(cudaGetLastError());
    report("bulk", ms, 0.0);
    const int64_t delays[3] = {0, 20000, 45000};
    for (int64_t delay : delays) {
        CK(cudaMemset(accum, 0xff, zero_floats * 4));
        CK(cudaMemset(dlt, 0xff, rows_pad * 4));
        ms = time_kernel([&] {
            bulk_kernel<D, NS, true><<<sms, PROBE_THREADS, smem>>>(tm_o, tm_g, dm, lse, dlt, l2, accum,
                                                                    zero_floats, delay);
        }, reps);
        CK(cudaGetLastError());
        char name[32];
        snprintf(name, sizeof name, "bulk+z%lld", (long long)(delay / 1000));
        report(name, ms, 1.0);
        zeros_ok(name);
    }
    CK(cudaFree(out));
    CK(cudaFree(dout));
    CK(cudaFree(lse));
    CK(cudaFree(dlt));
    CK(cudaFree(l2));
    CK(cudaFree(accum));
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int reps = 30;
    run_shape<128>(1, 16384, 16, reps, sms);
    run_shape<128>(1, 32768, 24, reps, sms);
    run_shape<64>(1, 16384, 16, reps, sms);
    return 0;
}
