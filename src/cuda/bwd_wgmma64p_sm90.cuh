// bwd_wgmma64p_sm90.cuh -- backward main kernel for head dim 64, version 3 ("paired"): two list
// entries (128 query rows) per iteration.
//
// Why: version 2 (one entry per iteration, dQ^T split by queries; removed, see git history and
// bench/notes-bwd.md) spends ~5700 cycles per 64 x 128 tile against ~1300
// cycles of tensor work (2026-11-29 bench, 215 TFLOP/s at 1 x 16384 x 16): per entry it runs a
// fixed chain of waits (S -> exp -> dV, dP -> dS -> dK, two CTA barriers, dQ -> reductions) whose
// latency, not its throughput, sets the time. FlashAttention-2 runs its D = 64 backward on 128
// query rows per step. Here each iteration takes the next two entries of the key tile's list
// (any two: different heads or row tiles are fine), so every wait and barrier is paid once per
// 128 rows and the S / dP products are m64n128 instead of m64n64.
//
// Per iteration (warpgroup wg owns keys 64wg..64wg+63 for S^T, dP^T, dV, dK; entry wg of the pair
// for dQ):
//   S^T  (64 keys x 128 queries) = K Q^T      SS m64n128k16, Q of both entries as one 128-row panel
//   dP^T (64 x 128)              = V dO^T     SS m64n128k16
//   dV  (64 keys x 64 d)        += P^T dO     RS m64n64k16, 8 steps over the 128 queries
//   dK  (64 keys x 64 d)        += dS^T Q     RS, 8 steps
//   dS^T goes to shared memory with stmatrix.trans (rows = queries, keys contiguous)
//   dQ  (64 queries x 64 d)      = dS K       SS m64n64k16 over all 128 keys; entry wg's rows
//   dQ and its float4 fp32 reductions (each dq element once per key tile, as version 2) run at
//       the top of the next iteration, under its S^T / dP^T; dS is double-buffered for it
// Measured on the H200 (bench/results/bwd64-v3p.txt): 277 against version 2's 215 TFLOP/s at
// (1, 16384, 16, 64), +28-29 % on every D = 64 shape; FlashAttention-2 in the same run: 278.
// The deferred dQ (bench/results/bwd64-v3dq-ab.txt, dev checker): 283.9 -> 327.6 TFLOP/s there,
// +14-16 % on every D = 64 shape (one barrier fewer per pair, the reductions under S^T).
// Version 4 (TMA_ROWS; the library runs version 6, bwd_ws64_sm90.cuh, this kernel's math with a
// producer warpgroup, where TMA can describe Q and dO): thread 0 loads each pair with
// TMA instead of every thread issuing cp.async (bench/results/bwd64-tma-run.txt: +3.8-6.2 %),
// and each warp's dQ block goes out as 2 TMA reduce-adds instead of float4 atomics.
// An odd list leaves the second slot of the last pair empty: its Q / dO rows are zero-filled and
// its lse is +inf, so its P and dS are exactly 0, and its dq is not reduced.
#pragma once
#include "bwd_wgmma_sm90.cuh"

namespace bl_bwd {

constexpr int PAIR_ROWS = 2 * BM;  // query rows per iteration: 128

// d[64] = A(smem, K-major) * B(smem, K-major) + (acc ? d : 0); m64n128k16.
#define BL_WGMMA_SS_N128(TY)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " BL_REGS64       \
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                            \
                 : BL_ACC64(d)                                                                \
                 : "l"(da), "l"(db), "r"(acc))
template <typename T>
static __device__ __forceinline__ void bl_wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db,
                                                        int acc = 1);
template <>
__device__ __forceinline__ void bl_wgmma_ss_n128<__nv_bfloat16>(float (&d)[64], uint64_t da,
                                                                uint64_t db, int acc) {
    BL_WGMMA_SS_N128("bf16");
}
template <>
__device__ __forceinline__ void bl_wgmma_ss_n128<__half>(float (&d)[64], uint64_t da,
                                                         uint64_t db, int acc) {
    BL_WGMMA_SS_N128("f16");
}

// Byte offsets from the kernel's 1024-aligned shared-memory base.
struct wg64p_smem {
    static constexpr uint32_t PANEL = PAIR_ROWS * PANEL_ROW_BYTES;  // 128 rows x 64 columns
    static constexpr uint32_t K = 0;                   // BN x 64
    static constexpr uint32_t V = K + PANEL;           // BN x 64
    static constexpr uint32_t Q = V + PANEL;           // 2 buffers of 128 rows (entry 0, entry 1)
    static constexpr uint32_t DO = Q + 2 * PANEL;      // 2 buffers of 128 rows
    static constexpr uint32_t DS = DO + 2 * PANEL;     // dS: 2 buffers of 2 key panels x 128 rows
    static constexpr uint32_t DS_BUF = 2 * PANEL;
    static constexpr uint32_t ROWS = DS + 2 * DS_BUF;  // fp32 lse_log2[2][128], dlt[2][128]
    static constexpr uint32_t BARS = ROWS + 4 * PAIR_ROWS * sizeof(float);  // 2 mbarriers (TMA)
    // TMA_ROWS: fp32 dQ staging for the TMA reduce-adds, one buffer per warp (the shared memory
    // has no room for two).
    static constexpr uint32_t DQS = (BARS + 2 * 8 + 1023) / 1024 * 1024;
    static constexpr uint32_t USED = DQS + WARPS * DQ_WARP_BYTES;
    static constexpr uint32_t BASE_ALIGN = 1024;
    static constexpr size_t BYTES = USED + BASE_ALIGN;
    static_assert(BN == PAIR_ROWS, "K / V and a pair of Q tiles share the panel size");
    static_assert(Q % 1024 == 0 && DO % 1024 == 0 && DS % 1024 == 0 && PANEL % 1024 == 0,
                  "panels must start on 1024-byte boundaries");
};

// One list entry, decoded: q head and first row (32-bit: both are far below 2^31), h < 0 for
// the empty second slot of an odd list.
struct wg64p_entry {
    int h, row0;
    __device__ bool live() const { return h >= 0; }
};
// No integer division (ws_split_code): with `e / tiles_m` and `e % tiles_m` here and in the
// consumers' mask rows, the head-dim-64 kernel (bwd_ws64_sm90.cuh) ran 2-3.5 % slower, dense
// and sparse (bench/results/bwd-s71-gqa-split.txt call 3).
__device__ __forceinline__ wg64p_entry wg64p_decode(const bwd_params &p, int g, int e) {
    int hl, m;
    ws_split_code(e, (int)p.dm.tiles_m, p.dm.group == 1, hl, m);
    wg64p_entry x;
    x.h = e >= 0 ? g * (int)p.dm.group + hl : -1;
    x.row0 = e >= 0 ? m * BM : 0;
    return x;
}

// cp.async of a pair into buffer `buf`: entry s's Q and dO rows at rows 64s.. of the 128-row
// panels (zero past Sq and for an empty slot) and its padded lse_log2 / Dlt (+inf / 0 when empty).
template <typename T>
__device__ __forceinline__ void wg64p_load_pair(const bwd_params &p, uint32_t s0, float *s_rows,
                                                int buf, int64_t b, const wg64p_entry (&e)[2]) {
    using L = wg64p_smem;
    constexpr int ROW_CHUNKS = 64 / CHUNK;
    constexpr int STEPS = PAIR_ROWS * ROW_CHUNKS / THREADS;  // 4: rows tid/8 + 32 * step
    static_assert(PAIR_ROWS * ROW_CHUNKS % THREADS == 0 && THREADS % ROW_CHUNKS == 0,
                  "each thread copies whole steps of 32 rows");
    const T *q = static_cast<const T *>(p.q);
    const T *dout = static_cast<const T *>(p.dout);
    const uint32_t sq = s0 + L::Q + buf * L::PANEL;
    const uint32_t sdo = s0 + L::DO + buf * L::PANEL;
    const int ch = threadIdx.x % ROW_CHUNKS;
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
        const int slot = step / (STEPS / 2);  // steps 0, 1: entry 0; steps 2, 3: entry 1
        const int r = threadIdx.x / ROW_CHUNKS + step * (THREADS / ROW_CHUNKS);  // panel row
        const int64_t i = e[slot].row0 + (r - slot * BM);
        const bool valid = e[slot].live() && i < p.dm.seqlen_q;
        const int64_t ii = valid ? i : 0;
        const int64_t h = valid ? e[slot].h : 0;
        const uint32_t off = panel_offset<PAIR_ROWS>(r, ch);
        bl_cp_async16(sq + off, q + b * p.q_sb + ii * p.q_ss + h * p.q_sh + ch * CHUNK, valid);
        bl_cp_async16(sdo + off, dout + b * p.do_sb + ii * p.do_ss + h * p.do_sh + ch * CHUNK,
                      valid);
    }
    constexpr int ROW_VEC = BM / 4;  // 16-byte vectors of fp32 per entry and array
    if (threadIdx.x < 4 * ROW_VEC) {
        const int which = threadIdx.x / (2 * ROW_VEC);  // 0: lse_log2, 1: Dlt
        const int slot = (threadIdx.x / ROW_VEC) & 1, c = threadIdx.x % ROW_VEC;
        const wg64p_entry es = slot ? e[1] : e[0];
        float *dst = s_rows + (which * 2 + buf) * PAIR_ROWS + slot * BM + 4 * c;
        if (es.live()) {
            const float *src = (which == 0 ? p.lse_log2 : p.dlt) +
                               (b * p.dm.heads_q + es.h) * p.dm.seqlen_q_pad + es.row0 + 4 * c;
            bl_cp_async16(bl_smem_addr(dst), src, true);
        } else {
            const float fill = which == 0 ? INFINITY : 0.0f;
            *reinterpret_cast<float4 *>(dst) = make_float4(fill, fill, fill, fill);
        }
    }
}

// TMA_ROWS: the pair into buffer `buf` by one thread (thread 0), as version 6 at D = 128 does
// (bwd_wgmma_sm90.cuh): per slot one 64-row box of Q and of dO -- an empty slot's box lies past
// Sq, so TMA writes zeros -- and a live slot's lse_log2 / Dlt as bulk copies, all completing on
// the buffer's mbarrier. An empty slot's lse / Dlt are filled by wg64p_fill_empty_rows.
__device__ __forceinline__ void wg64p_tma_pair(const bwd_params &p, uint32_t s0, int buf,
                                               int64_t b, const wg64p_entry (&e)[2]) {
    using L = wg64p_smem;
    constexpr uint32_t BOX_BYTES = BM * PANEL_ROW_BYTES;  // 64 rows x 64 columns
    constexpr uint32_t ROW_BYTES = BM * sizeof(float);
    const uint32_t bar = s0 + L::BARS + 8 * buf;
    const int live = (int)e[0].live() + (int)e[1].live();
    mbarrier_arrive_expect_tx(bar, 2 * 2 * BOX_BYTES + live * 2 * ROW_BYTES);
    const int past_end = (int)p.dm.seqlen_q_pad;  // a row tile that is all outside Sq
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) {
        const int row0 = e[slot].live() ? e[slot].row0 : past_end;
        const int h = e[slot].live() ? e[slot].h : 0;
        tma_load_4d(s0 + L::Q + buf * L::PANEL + slot * BOX_BYTES, &p.tm_q, bar, 0, row0, h, (int)b);
        tma_load_4d(s0 + L::DO + buf * L::PANEL + slot * BOX_BYTES, &p.tm_do, bar, 0, row0, h,
                    (int)b);
        if (e[slot].live()) {
            const int64_t rows = (b * p.dm.heads_q + h) * p.dm.seqlen_q_pad + row0;
            const uint32_t dst = s0 + L::ROWS + (buf * PAIR_ROWS + slot * BM) * sizeof(float);
            bulk_load(dst, p.lse_log2 + rows, ROW_BYTES, bar);
            bulk_load(dst + 2 * PAIR_ROWS * sizeof(float), p.dlt + rows, ROW_BYTES, bar);
        }
    }
}
// lse_log2 = +inf, Dlt = 0 for an empty second slot (threads 0..31, float4 each).
__device__ __forceinline__ void wg64p_fill_empty_rows(float *s_rows, int buf,
                                                      const wg64p_entry (&e)[2]) {
    constexpr int ROW_VEC = BM / 4;
    if (e[1].live() || threadIdx.x >= 2 * ROW_VEC) return;
    const int which = threadIdx.x / ROW_VEC, c = threadIdx.x % ROW_VEC;
    const float fill = which == 0 ? INFINITY : 0.0f;
    *reinterpret_cast<float4 *>(s_rows + (which * 2 + buf) * PAIR_ROWS + BM + 4 * c) =
        make_float4(fill, fill, fill, fill);
}

// dq of `mine` (64 query rows x 64 d, this warpgroup's accumulator fragment) into the fp32
// accumulator with float4 reductions. Rows 16*(warp%4) + lg (+8); columns 8t + 2lt (+1). Lane
// pairs (lt, lt^1) swap halves so each lane holds 4 consecutive columns of one row: even lt ->
// row lg, columns 2lt..2lt+3; odd lt -> row lg+8.
// TMA_ROWS: as 2 TMA reduce-adds per warp instead (tma_reduce_dq_block).
template <bool TMA_ROWS>
__device__ __forceinline__ void wg64p_reduce_dq(const bwd_params &p, uint32_t s0, int64_t b,
                                                wg64p_entry mine, const float (&dq)[32]) {
    constexpr int D = 64, ND = D / 8;
    if (!mine.live()) return;
    if (TMA_ROWS) {
        // One staging buffer per warp: its previous boxes (a pair ago) must have been read.
        const int warp = threadIdx.x >> 5;
        tma_reduce_dq_block<0>(p, s0 + wg64p_smem::DQS + warp * DQ_WARP_BYTES, dq, 0, mine.h,
                               mine.row0 + 16 * (warp & 3), (int)b);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int lg = lane >> 2, lt = lane & 3;
    const bool odd = lt & 1;
    const int64_t i = mine.row0 + 16 * (warp & 3) + lg + (odd ? 8 : 0);
    float *dst = p.dq_accum + ((b * p.dm.seqlen_q + i) * p.dm.heads_q + mine.h) * D + 2 * (lt & ~1);
#pragma unroll
    for (int t = 0; t < ND; ++t) {
        const float send0 = odd ? dq[4 * t + 0] : dq[4 * t + 2];
        const float send1 = odd ? dq[4 * t + 1] : dq[4 * t + 3];
        const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
        const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
        const float4 v = odd ? make_float4(got0, got1, dq[4 * t + 2], dq[4 * t + 3])
                             : make_float4(dq[4 * t + 0], dq[4 * t + 1], got0, got1);
        if (i < p.dm.seqlen_q) atomicAdd(reinterpret_cast<float4 *>(dst + 8 * t), v);
    }
}

// dQ (entry wg: 64 queries x 64 d) = dS K over all 128 keys, from dS buffer `ds_buf`; one
// commit group. dS must be visible to the async proxy (fence + barrier) before.
template <typename T>
__device__ __forceinline__ void wg64p_issue_dq(float (&dq)[32], uint32_t ds_buf, uint32_t sK, int wg) {
    using L = wg64p_smem;
    constexpr int KSTEPS_K = BN / 16;  // steps over the keys: 8
    bl_acc_overwritten(dq);  // the first step does not accumulate: no zeroing
    bl_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KSTEPS_K; ++ks)
        bl_wgmma_ss_n64<T, 1>(
            dq,
            // A = dS: entry wg's 64 query rows, K-major over keys (key panel ks/4)
            bl_wgmma_desc(ds_buf + (ks / 4) * L::PANEL + wg * BM * PANEL_ROW_BYTES +
                              (ks % 4) * K16_BYTES_KMAJOR,
                          16, BL_WGMMA_GROUP_BYTES),
            // B = K: 16 keys per step, MN-major (d contiguous), one panel
            bl_wgmma_desc(sK + ks * K16_BYTES_MNMAJOR, L::PANEL, BL_WGMMA_GROUP_BYTES), ks > 0);
    bl_wgmma_commit();
}

// The dV / dK products' A operands from registers: P^T (s) and dS^T (ds) packed to 16-bit pairs,
// one k-step of 16 queries per row of pa / dsa.
template <typename T, int N, int K>
__device__ __forceinline__ void wg64p_pack_a(const float (&s)[N], const float (&ds)[N],
                                             uint32_t (&pa)[K][4], uint32_t (&dsa)[K][4]) {
    static_assert(N == 8 * K, "eight accumulator values a k-step");
#pragma unroll
    for (int ks = 0; ks < K; ++ks)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            pa[ks][x] = bl_pack2<T>(s[8 * ks + 2 * x], s[8 * ks + 2 * x + 1]);
            dsa[ks][x] = bl_pack2<T>(ds[8 * ks + 2 * x], ds[8 * ks + 2 * x + 1]);
        }
}

// dV += P^T dO and dK += dS^T Q, A from registers (wg64p_pack_a), B the pair's dO / Q panels;
// issued only: the caller fences before and commits after.
template <typename T, int D, int N, int K>
__device__ __forceinline__ void wg64p_issue_dv_dk(float (&dv_acc)[N], float (&dk_acc)[N],
                                                  const uint32_t (&pa)[K][4],
                                                  const uint32_t (&dsa)[K][4], uint32_t sdO,
                                                  uint32_t sQ) {
#pragma unroll
    for (int ks = 0; ks < K; ++ks)
        bl_wgmma_rs<T, D>(dv_acc, pa[ks],
                          bl_wgmma_desc(sdO + ks * K16_BYTES_MNMAJOR, wg64p_smem::PANEL,
                                        BL_WGMMA_GROUP_BYTES));
#pragma unroll
    for (int ks = 0; ks < K; ++ks)
        bl_wgmma_rs<T, D>(dk_acc, dsa[ks],
                          bl_wgmma_desc(sQ + ks * K16_BYTES_MNMAJOR, wg64p_smem::PANEL,
                                        BL_WGMMA_GROUP_BYTES));
}

// TMA_ROWS (version 4): pairs loaded by wg64p_tma_pair instead of cp.async from every thread.
template <typename T, bool TMA_ROWS>
__global__ void __launch_bounds__(THREADS, 1) bwd_wgmma64p_kernel(const __grid_constant__ bwd_params p) {
    constexpr int D = 64;
    using L = wg64p_smem;
    constexpr int NQ = PAIR_ROWS / 8;  // n8 tiles of queries (S^T, dP^T): 16
    constexpr int NQ_ENTRY = BM / 8;   // of them per entry: 8
    constexpr int ND = D / 8;          // n8 tiles of head dim (dK, dV, dQ): 8
    constexpr int KSTEPS_D = D / 16;
    constexpr int KSTEPS_Q = PAIR_ROWS / 16;  // dV / dK steps over the pair's queries: 8
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
    const uint32_t s0 = bl_smem_addr(smem_base);
    float *s_rows = reinterpret_cast<float *>(smem_base + L::ROWS);

    const bl_bwd_dims &dm = p.dm;
    const int64_t col = p.schedule[blockIdx.x];
    const int64_t n = col % dm.tiles_n;
    const int64_t g = (col / dm.tiles_n) % dm.heads_k;
    const int64_t b = col / (dm.tiles_n * dm.heads_k);
    const int count = p.counts[col];
    const int pairs = (count + 1) / 2;
    const int *list = p.lists + col * (dm.group * dm.tiles_m);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wg = warp >> 2;                 // warpgroup: keys 64wg..64wg+63; dQ of entry wg
    const int lg = lane >> 2, lt = lane & 3;  // accumulator row group / thread in group
    const int64_t key0 = n * BN;
    const int kw = warp * KEYS_PER_WARP;      // this warp's first key (its 16 accumulator rows)

    float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
    for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;

    // This iteration's pair, decoded, and the list entries of the next one (-1: none).
    wg64p_entry cur[2] = {{-1, 0}, {-1, 0}};
    int nxt0 = -1, nxt1 = -1;
    if (count > 0) {
        load_kv_tile<T, D>(p, s0 + L::K, s0 + L::V, b, g, key0, threadIdx.x);
        cur[0] = wg64p_decode(p, (int)g, list[0]);
        cur[1] = wg64p_decode(p, (int)g, count > 1 ? list[1] : -1);
        if (!TMA_ROWS) {
            wg64p_load_pair<T>(p, s0, s_rows, 0, b, cur);
        } else {
            if (threadIdx.x == 0) {
                // The loop-top barrier publishes the initialisation to the other threads.
                mbarrier_init(s0 + L::BARS, 1);
                mbarrier_init(s0 + L::BARS + 8, 1);
                fence_mbarrier_init();
                wg64p_tma_pair(p, s0, 0, b, cur);
            }
            wg64p_fill_empty_rows(s_rows, 0, cur);
        }
        nxt0 = count > 2 ? list[2] : -1;
        nxt1 = count > 3 ? list[3] : -1;
    }
    bl_cp_async_commit();
    if (TMA_ROWS) bl_cp_async_wait<0>();  // the K / V tiles; the loop-top barrier publishes them

    const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag
    const int64_t key_room = dm.seqlen_k - key0;
    const int key_limit = key_room < BN ? (int)key_room : BN;

    // Pair it-1's dQ is issued at the top of iteration it, ahead of S^T / dP^T, and reduced
    // while they run: the loop-top barrier also publishes pair it-1's dS, so no barrier sits
    // between dS and dQ, and no tensor work waits for the reductions. dS is double-buffered: pair
    // it writes buffer it&1 while pair it-1's dQ may still read the other.
    wg64p_entry dq_entry = {-1, 0};  // the entry whose dS is waiting for its dQ (none yet)

    for (int it = 0; it < pairs; ++it) {
        const int buf = it & 1;
        // With TMA_ROWS only the K / V tiles are cp.async groups, waited for before the loop:
        // a wait_group 0 here would also wait for this thread's bulk groups (the dQ
        // reduce-adds) to complete.
        if (!TMA_ROWS) bl_cp_async_wait<0>();
        bl_fence_proxy_async();  // cp.async (and iteration it-1's stmatrix) wrote what wgmma reads
        // This pair has landed for every thread and every warp is done with iteration it-1: Q /
        // dO buffer buf^1 is free, dS buffer buf^1 holds pair it-1's dS, and dS buffer buf is
        // free (pair it-2's dQ was waited for in iteration it-1).
        __syncthreads();
        // TMA_ROWS: buffer buf's k-th pair (pair it = 2k + buf) completes phase k.
        if (TMA_ROWS) mbarrier_wait(s0 + L::BARS + 8 * buf, (uint32_t)(it >> 1) & 1u);
        // Unconditional, so that the wait below provably retires it (a conditional issue made
        // ptxas serialize the products); at it == 0 it reads a dS buffer nobody wrote, and its
        // result is dropped (dq_entry is empty).
        float dq[ND * 4];
        wg64p_issue_dq<T>(dq, s0 + L::DS + (buf ^ 1) * L::DS_BUF, s0 + L::K, wg);

        const uint32_t sQ = s0 + L::Q + buf * L::PANEL;
        const uint32_t sdO = s0 + L::DO + buf * L::PANEL;
        const float *lse2 = s_rows + buf * PAIR_ROWS;
        const float *dlt = s_rows + (2 + buf) * PAIR_ROWS;

        // ---- S^T = K Q^T and dP^T = V dO^T (this warpgroup's 64 keys x 128 queries) ----
        // Issue order dQ(it-1), S^T, [dq reductions], dP^T: dP^T's accumulators become live only
        // after dq's have died (all three at once need ~255 registers and spill).
        float s[NQ * 4], ds[NQ * 4];
#pragma unroll
        for (int x = 0; x < NQ * 4; ++x) s[x] = 0.0f;
        bl_reg_fence(s);  // the zeros must be in the registers before the fence
        bl_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk)
            bl_wgmma_ss_n128<T>(
                s,
                bl_wgmma_desc(s0 + L::K + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR,
                              16, BL_WGMMA_GROUP_BYTES),
                bl_wgmma_desc(sQ + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        bl_wgmma_wait<1>();  // pair it-1's dQ is done; S^T may still run
        bl_reg_fence(dq);
        wg64p_reduce_dq<TMA_ROWS>(p, s0, b, dq_entry, dq);
#pragma unroll
        for (int x = 0; x < NQ * 4; ++x) ds[x] = 0.0f;
        bl_reg_fence(ds);
        bl_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk)
            bl_wgmma_ss_n128<T>(
                ds,
                bl_wgmma_desc(s0 + L::V + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR,
                              16, BL_WGMMA_GROUP_BYTES),
                bl_wgmma_desc(sdO + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        // The next pair's loads (decode, ~100 instructions of address math per thread) go out
        // while the tensor cores run S^T and dP^T, not in front of them.
        wg64p_entry next[2] = {cur[0], cur[1]};
        if (it + 1 < pairs) {
            next[0] = wg64p_decode(p, (int)g, nxt0);
            next[1] = wg64p_decode(p, (int)g, nxt1);
            if (!TMA_ROWS) {
                wg64p_load_pair<T>(p, s0, s_rows, buf ^ 1, b, next);
                bl_cp_async_commit();
            } else {
                if (threadIdx.x == 0) wg64p_tma_pair(p, s0, buf ^ 1, b, next);
                wg64p_fill_empty_rows(s_rows, buf ^ 1, next);
            }
            nxt0 = 2 * it + 4 < count ? list[2 * it + 4] : -1;
            nxt1 = 2 * it + 5 < count ? list[2 * it + 5] : -1;
        }
        bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
        bl_reg_fence(s);

        // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
        // Per entry: does the tile need masking, and the causal reach (key - query <= limit).
        bool need_mask[2];
        int causal_limit[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            need_mask[e] = key0 + BN > dm.seqlen_k ||
                           (p.causal && key0 + BN - 1 > cur[e].row0 + diag);
            int64_t room = cur[e].row0 + diag - key0;
            room = room > 2 * BN ? 2 * BN : room;
            room = room < -2 * BN ? -2 * BN : room;
            causal_limit[e] = p.causal ? (int)room : 2 * BN;
        }
#pragma unroll
        for (int t = 0; t < NQ; ++t) {
            const int e = t / NQ_ENTRY;  // which entry these 8 queries belong to
            const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
            s[4 * t + 0] = exp2f(fmaf(s[4 * t + 0], p.scale_log2, -l.x));
            s[4 * t + 1] = exp2f(fmaf(s[4 * t + 1], p.scale_log2, -l.y));
            s[4 * t + 2] = exp2f(fmaf(s[4 * t + 2], p.scale_log2, -l.x));
            s[4 * t + 3] = exp2f(fmaf(s[4 * t + 3], p.scale_log2, -l.y));
            if (need_mask[e]) {
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int jr = kw + lg + ((x >> 1) << 3);                  // key - key0
                    const int ir = 8 * (t % NQ_ENTRY) + 2 * lt + (x & 1);  // query - row0
                    if (jr >= key_limit || jr - ir > causal_limit[e]) s[4 * t + x] = 0.0f;
                }
            }
        }

        // ---- dS^T = P^T * (dP^T - Dlt), then both A operands packed ----
        // Unlike version 2, dV waits for dP^T: P^T and dS^T are packed together and dV and dK
        // issue back to back, so the fp32 P^T and dS^T die before the products run (version 2's
        // order needs ~255 registers at 128 queries and spills).
        bl_wgmma_wait<0>();  // dP^T is done
        bl_reg_fence(ds);
        ds_from_dp_smem<NQ>(ds, s, dlt, lt);
        uint32_t pa[KSTEPS_Q][4], dsa[KSTEPS_Q][4];
        wg64p_pack_a<T>(s, ds, pa, dsa);

        // ---- dV += P^T dO and dK += dS^T Q (A from registers), dS to shared memory ----
        bl_wgmma_fence();
        wg64p_issue_dv_dk<T, D>(dv_acc, dk_acc, pa, dsa, sdO, sQ);
        bl_wgmma_commit();
        store_ds_tile(s0 + L::DS + buf * L::DS_BUF + wg * L::PANEL, dsa, warp, lane);
        bl_wgmma_wait<0>();  // dV and dK are done: pa and dsa may die
        bl_reg_fence(pa);
        bl_reg_fence(dsa);
        dq_entry = wg ? cur[1] : cur[0];  // (no runtime index: no local memory)
        cur[0] = next[0];
        cur[1] = next[1];
    }
    if (pairs > 0) {  // the last pair's dQ
        bl_fence_proxy_async();
        __syncthreads();
        float dq[ND * 4];
        wg64p_issue_dq<T>(dq, s0 + L::DS + ((pairs - 1) & 1) * L::DS_BUF, s0 + L::K, wg);
        bl_wgmma_wait<0>();
        bl_reg_fence(dq);
        wg64p_reduce_dq<TMA_ROWS>(p, s0, b, dq_entry, dq);
    }
    // The staged dQ must be read, and added, before the CTA's shared memory goes away.
    if (TMA_ROWS && (threadIdx.x & 31) == 0) bulk_wait_group<0>();
    bl_reg_fence(dk_acc);
    bl_reg_fence(dv_acc);

    store_dk_dv<T>(p, dk_acc, dv_acc, b, g, key0 + kw, lg, lt);
}

}  // namespace bl_bwd
