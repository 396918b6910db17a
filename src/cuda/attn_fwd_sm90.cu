// attn_fwd_sm90.cu -- the sm_90a attention forward with compact tile statistics, and the CUDA
// backend's availability / workspace queries.
//
// Both kernels are persistent (one CTA per SM, a static schedule of work tiles of 128 query rows
// of one (batch, head); 192 in kernel 2 at head dim 64) and share the math:
//   - two (three at head dim 64) consumer warpgroups, each owning 64 query rows (= one BL_TILE_M
//     row tile of W);
//   - K/V tiles of 128 keys (= one BL_TILE_N key tile of W) in 128B-swizzled shared memory;
//   - S = Q K^T with wgmma (both operands in shared memory), online softmax in base 2 on the
//     accumulator registers (kernel 2 at head dim 64 and with a causal mask rescaling O lazily:
//     rescale_lazy), O += P V with wgmma taking P from registers (no shared-memory round trip)
//     and V from shared memory as the transposed (MN-major) operand.
// Kernel 2 ("ws", the default): a producer warpgroup streams Q and a 3-4 deep K/V ring with TMA
//   onto mbarriers; the consumers take turns issuing GEMMs (ping-pong) and run softmax(n) while
//   P(n-1) V is in flight. Kernel 1 ("sync", the fallback when TMA cannot describe a tensor):
//   cp.async by all threads, K/V double-buffered, one CTA barrier per key tile.
// Statistics (template flag STATS, compiled out otherwise): after the exp of key tile n each row's
// tile sum gives a log2-mass log2(tile_sum) + m_used; it is parked in the CTA's own slot of the
// workspace ((grid, rows of a work tile, Tn) floats, L2-resident, reused by the CTA's next work
// tile) -- or, in the TMA kernel at head dim 64 with Tn <= 128, in the CTA's free shared memory --
// at the end of the key-tile iteration, and the epilogue, once lse is known, reduces
// W[m, n] = sum_rows exp2(logmass - lse2) for its 64-row tile. (At head dim 128 the pair
// (tile_sum, m_used) is parked instead, and W[m, n] = sum_rows tile_sum * exp2(m_used - lse2):
// park_pairs.) Every W entry is written by exactly one thread: no atomics, no memset.
// Measured on the H200 and checked against a float64 reference: bench/notes-fwd.md.
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "backend.h"
#include "bwd_workspace.h"
#include "cuda_check.cuh"
#include "ptx_sm90.cuh"
#include "tensor_map.cuh"

namespace {

// ---- tiling ----
constexpr int kRowsPerWarpgroup = BL_TILE_M;  // 64 = wgmma M; one W row tile per warpgroup
constexpr int kWarpgroups = 2;
constexpr int kBlockM = kRowsPerWarpgroup * kWarpgroups;  // query rows per work tile
constexpr int kBlockN = BL_TILE_N;                        // keys per iteration = one W column
constexpr int kThreadsPerWarpgroup = 128;
constexpr int kThreads = kWarpgroups * kThreadsPerWarpgroup;
constexpr int kRowsPerWarp = 16;  // wgmma accumulator: each warp holds 16 rows of the 64
constexpr int kPanelCols = BL_SWIZZLE_ROW_BYTES / 2;  // 16-bit columns per swizzled panel
constexpr int kChunkElems = 8;                        // 16-bit elements per 16-byte chunk
constexpr int kChunksPerPanelRow = kPanelCols / kChunkElems;
constexpr int kStages = 2;  // K/V ring depth of the sync kernel: load tile n+1 during tile n
constexpr int kMmaK = 16;       // reduction depth of one wgmma (16-bit inputs)
constexpr int kKStepsPerPanel = kPanelCols / kMmaK;
constexpr uint32_t kMmaKBytes = kMmaK * 2;  // start-address step of one k16 slice (K-major)
constexpr uint32_t kUnusedLbo = 16;  // K-major swizzled operands ignore LBO; any nonzero value
constexpr int kSmemAlign = BL_SWIZZLE_GROUP_BYTES;  // 128B swizzle needs 1024-byte panels
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;
// Named barrier ids: 0 is __syncthreads; warpgroup w uses kBarrierWarpgroup0 + w.
constexpr int kBarrierWarpgroup0 = 1;

// Descriptor strides of the transposed (MN-major) V operand: LBO steps between 64-column panels
// of V (along D), SBO between groups of 8 keys (checked on the H200, bench/notes-fwd.md run 1).
constexpr uint32_t kVDescLbo = kBlockN * BL_SWIZZLE_ROW_BYTES;
constexpr uint32_t kVDescSbo = BL_SWIZZLE_GROUP_BYTES;

// Shared-memory map for head dim D (byte offsets from a 1024-aligned base).
template <int D>
struct FwdSmem {
    static constexpr int kPanels = D / kPanelCols;
    static constexpr uint32_t kQPanelBytes = kBlockM * BL_SWIZZLE_ROW_BYTES;
    static constexpr uint32_t kKVPanelBytes = kBlockN * BL_SWIZZLE_ROW_BYTES;
    static constexpr uint32_t kQBytes = kPanels * kQPanelBytes;
    static constexpr uint32_t kKVBytes = kPanels * kKVPanelBytes;
    static constexpr uint32_t kQ = 0;
    static constexpr uint32_t kK = kQ + kQBytes;              // kStages K tiles
    static constexpr uint32_t kV = kK + kStages * kKVBytes;   // kStages V tiles
    static constexpr uint32_t kLse2 = kV + kStages * kKVBytes;  // kBlockM floats
    static constexpr uint32_t kEnd = kLse2 + kBlockM * sizeof(float);
    static constexpr size_t kDynamicBytes = kEnd + kSmemAlign;  // slack to align the base
};

struct FwdParams {
    const uint16_t *q;  // q: (B, Sq, Hq, D), D contiguous, bf16 or fp16 bits
    const uint16_t *k;  // k: (B, Sk, Hk, D), D contiguous
    const uint16_t *v;  // v: (B, Sk, Hk, D), D contiguous
    uint16_t *out;      // out: (B, Sq, Hq, D), D contiguous
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;  // elements
    float *lse;        // lse: (B, Hq, Sq) fp32 contiguous, natural log
    float *tile_mass;  // tile_mass: (B, Hq, Tm, Tn) fp32 contiguous (STATS only)
    float *stats_ws;   // stats_ws: (gridDim.x, work tile rows, Tn) fp32, per-row log2-masses
                       // (head dim 128: (.., Tn, 2), (tile sum, m_used) pairs: park_pairs)
    int64_t seqlen_q, seqlen_k;
    int batch, heads_q, heads_per_kv;
    int num_mblocks;  // ceil(Sq / the kernel's rows per work tile)
    int num_mtiles;   // Tm = ceil(Sq / BL_TILE_M)
    int num_ktiles;   // Tn = ceil(Sk / BL_TILE_N)
    int num_work;     // batch * heads_q * num_mblocks
    int causal_group;   // causal schedule: (b, h) pairs per group (causal_group_size)
    int causal_rounds;  // and rounds of the persistent grid per group
    float scale_log2;  // scale * log2(e), never 0 (see the launcher)
    int scale_positive;
};

// Issues cp.async copies of a ROWS x D tile (rows >= rows_valid are zero-filled) into 128B-swizzled
// panels at smem_base. Chunk i of the tile goes to thread i % kThreads: 16 threads cover one
// 256-byte row, so each warp reads two full rows (coalesced).
template <int D, int ROWS>
__device__ __forceinline__ void load_tile_async(uint32_t smem_base, const uint16_t *gmem,
                                                int64_t row_stride, int64_t rows_valid) {
    constexpr int kChunksPerRow = D / kChunkElems;
    constexpr int kChunks = ROWS * kChunksPerRow;
    static_assert(kChunks % kThreads == 0, "tile copy must split evenly over the CTA");
#pragma unroll
    for (int it = 0; it < kChunks / kThreads; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int row = i / kChunksPerRow;
        const int chunk = i % kChunksPerRow;
        const int panel = chunk / kChunksPerPanelRow;
        const bool ok = row < rows_valid;
        const uint16_t *src = gmem + (ok ? (int64_t)row * row_stride : 0) + chunk * kChunkElems;
        const uint32_t dst = smem_base + panel * (ROWS * BL_SWIZZLE_ROW_BYTES) +
                             swizzle128_offset(row, chunk % kChunksPerPanelRow);
        cp_async_16(dst, src, ok);
    }
}

template <bool BF16>
__device__ __forceinline__ void mma_qk(float (&s)[kBlockN / 2], uint64_t da, uint64_t db, int acc) {
    if (BF16) wgmma_m64n128k16_ss_bf16(s, da, db, acc);
    else wgmma_m64n128k16_ss_f16(s, da, db, acc);
}
template <bool BF16>
__device__ __forceinline__ void mma_pv(float (&o)[64], const uint32_t (&a)[4], uint64_t db) {
    if (BF16) wgmma_m64n128k16_rs_bf16(o, a, db, 1);
    else wgmma_m64n128k16_rs_f16(o, a, db, 1);
}
template <bool BF16>
__device__ __forceinline__ void mma_pv(float (&o)[32], const uint32_t (&a)[4], uint64_t db) {
    if (BF16) wgmma_m64n64k16_rs_bf16(o, a, db, 1);
    else wgmma_m64n64k16_rs_f16(o, a, db, 1);
}
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    return BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
}

// Max (scale > 0) or min (scale < 0) over the 4 threads of a quad that share an accumulator row:
// the row max of scale * s comes from the max of s when scale > 0 and from its min otherwise.
__device__ __forceinline__ float quad_extreme(float x, bool want_max) {
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, off);
        x = want_max ? fmaxf(x, y) : fminf(x, y);
    }
    return x;
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// ---- pieces shared by both kernels ----

// One work tile: BLOCK_M (128, or 192 for kernel 2 with three consumers) query rows
// [row0, row0 + BLOCK_M) of head h of batch b, over key tiles [0, n_end).
struct WorkTile {
    int b, h, hk;
    int64_t row0;
    int n_end;
    bool skip;  // an empty slot of the round (causal head groups): no tile, no output
};

// Static schedule: round r gives CTA i work r*grid + i.
// Non-causal: head-major order, so that the CTAs running at one time share one (b, h) and its
// K/V stay in L2 instead of every CTA streaming a different head from memory.
// Causal: work tiles differ in length (the row block's distance to the diagonal), so they go
// longest first, and every other round runs in reverse CTA order (snake) so that no CTA always
// draws the longest tile of its round. Longest first within groups of p.causal_group (b, h)
// pairs, each group in whole rounds of its own (the last round's empty slots are skipped: they
// would have held its shortest tiles), so that the CTAs running together read the K / V of a
// few heads (causal_group_size). Returns false past the last work.
template <bool CAUSAL, int BLOCK_M = kBlockM>
__device__ __forceinline__ bool decode_work(const FwdParams &p, int round, WorkTile &t) {
    t.skip = false;
    int bh, mb;
    if (CAUSAL) {
        const int bh_count = p.batch * p.heads_q;
        const int group = p.causal_group;
        const int first = round / p.causal_rounds * group;  // the group's first (b, h)
        if (first >= bh_count) return false;
        const int r = round % p.causal_rounds;
        const int slot = (r & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
        const int work = r * gridDim.x + slot;  // in the group
        const int size = min(group, bh_count - first);  // the last group may be smaller
        if (work >= size * p.num_mblocks) {
            t.skip = true;
            return true;
        }
        mb = p.num_mblocks - 1 - work / size;
        bh = first + work % size;
    } else {
        const int work = round * gridDim.x + blockIdx.x;
        if (work >= p.num_work) return false;
        bh = work / p.num_mblocks;
        mb = work - bh * p.num_mblocks;
    }
    t.b = bh / p.heads_q;
    t.h = bh - t.b * p.heads_q;
    t.hk = t.h / p.heads_per_kv;
    t.row0 = (int64_t)mb * BLOCK_M;
    t.n_end = p.num_ktiles;
    if (CAUSAL) {
        const int64_t causal_shift = p.seqlen_k - p.seqlen_q;  // query i sees keys j <= i + shift
        const int64_t last_row = min(t.row0 + BLOCK_M - 1, p.seqlen_q - 1);
        const int64_t last_key = last_row + causal_shift;
        t.n_end = last_key < 0 ? 0 : (int)min((int64_t)p.num_ktiles, last_key / kBlockN + 1);
    }
    return true;
}

// Where this thread sits in the accumulator layout of its warpgroup's 64 rows.
struct ThreadPos {
    int wg;        // consumer warpgroup: rows [64 wg, 64 wg + 64) of the work tile
    int warp;      // warp inside the warpgroup: 16 of those rows
    int lane;
    int quad_row;  // accumulator row inside the warp's 16 (and +8)
    int quad_col;  // accumulator column pair inside each 8-column group
    int row;       // row inside the 128-row work tile of accumulator row quad_row
};
__device__ __forceinline__ ThreadPos thread_pos(int consumer_tid) {
    ThreadPos t;
    t.wg = consumer_tid / kThreadsPerWarpgroup;
    t.warp = (consumer_tid % kThreadsPerWarpgroup) / 32;
    t.lane = consumer_tid % 32;
    t.quad_row = t.lane / 4;
    t.quad_col = t.lane % 4;
    t.row = t.wg * kRowsPerWarpgroup + t.warp * kRowsPerWarp + t.quad_row;
    return t;
}

// Online-softmax state of this thread's two rows (r = 0: quad_row, r = 1: quad_row + 8).
struct RowState {
    float m_run[2];  // running row max of scale*log2(e)*s (LAZY: the reference max, kRescaleSlack)
    float m_use[2];  // the max actually subtracted (0 while the row max is still -inf)
    float l_run[2];  // this thread's share of the row sums
};
__device__ __forceinline__ void row_state_init(RowState &st) {
#pragma unroll
    for (int r = 0; r < 2; ++r) st.m_run[r] = -INFINITY, st.m_use[r] = 0.f, st.l_run[r] = 0.f;
}

// S = Q K^T for this warpgroup: sQ_rows points at its 64 rows of the Q panels (panel stride
// q_panel_bytes), sK at the K tile (128 keys).
// ADVANCE (uniform_descriptors): each operand's descriptor built once and advanced per wgmma,
// else built from each wgmma's address.
template <int D, bool BF16, bool ADVANCE = false>
__device__ __forceinline__ void issue_qk(float (&s)[kBlockN / 2], uint32_t sQ_rows,
                                         uint32_t q_panel_bytes, uint32_t sK) {
    constexpr uint32_t kKPanelBytes = kBlockN * BL_SWIZZLE_ROW_BYTES;
    const uint64_t qd = wgmma_desc_sw128(sQ_rows, kUnusedLbo, BL_SWIZZLE_GROUP_BYTES);
    const uint64_t kd = wgmma_desc_sw128(sK, kUnusedLbo, BL_SWIZZLE_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < D / kMmaK; ++kk) {
        const uint32_t koff = (kk % kKStepsPerPanel) * kMmaKBytes;
        if (ADVANCE) {
            mma_qk<BF16>(s, wgmma_desc_advance(qd, (kk / kKStepsPerPanel) * q_panel_bytes + koff),
                         wgmma_desc_advance(kd, (kk / kKStepsPerPanel) * kKPanelBytes + koff), kk > 0);
        } else {
            const uint32_t qa = sQ_rows + (kk / kKStepsPerPanel) * q_panel_bytes + koff;
            const uint32_t kb = sK + (kk / kKStepsPerPanel) * kKPanelBytes + koff;
            mma_qk<BF16>(s, wgmma_desc_sw128(qa, kUnusedLbo, BL_SWIZZLE_GROUP_BYTES),
                         wgmma_desc_sw128(kb, kUnusedLbo, BL_SWIZZLE_GROUP_BYTES), kk > 0);
        }
    }
}

// O += P V: P from registers (one A fragment per 16 keys), V (128 keys x D) is the transposed
// (MN-major) operand.
template <int D, bool BF16, bool ADVANCE = false>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pa)[kBlockN / kMmaK][4],
                                         uint32_t sV) {
    const uint64_t vd = wgmma_desc_sw128(sV, kVDescLbo, kVDescSbo);
#pragma unroll
    for (int kk = 0; kk < kBlockN / kMmaK; ++kk) {
        const uint32_t vb = sV + kk * (kMmaK * BL_SWIZZLE_ROW_BYTES);
        mma_pv<BF16>(o, pa[kk], ADVANCE ? wgmma_desc_advance(vd, kk * (kMmaK * BL_SWIZZLE_ROW_BYTES))
                                        : wgmma_desc_sw128(vb, kVDescLbo, kVDescSbo));
    }
}

// Lazy rescaling (LAZY): a row's reference max (RowState::m_run, the m subtracted in the
// exponentials) moves only where a tile's max passes it by more than this many powers of two, so
// that after the first tiles the O rescale (D/2 multiplies per thread, after the P V wait) is
// skipped. Exact up to rounding: P = exp2(x - m) <= 2^kRescaleSlack keeps its relative precision
// in bf16 / fp16, and l, the parked log2-masses and lse all use the m that was subtracted. (The
// FlashAttention-4 kernels rescale by the same rule.) Which kernels take it: rescale_lazy.
constexpr float kRescaleSlack = 8.f;

// Masks key tile n (keys past Sk; causal: keys right of each row's diagonal), updates the row
// maxima and turns s into exp2(scale*log2e*s - m_use) in place. Returns, per row, the factor
// alpha that rescales the earlier sums (LAZY: 1 where the reference max did not move) and this
// thread's partial tile sum; LAZY: true where either row's reference max moved (rescale_o_if).
template <bool CAUSAL, bool LAZY = false>
__device__ __forceinline__ bool softmax_tile(float (&s)[kBlockN / 2], const FwdParams &p,
                                             const WorkTile &w, const ThreadPos &tp, int n,
                                             RowState &st, float (&alpha)[2], float (&rowsum)[2]) {
    constexpr int kSRegs = kBlockN / 2;
    const float sl2 = p.scale_log2;
    const bool scale_pos = p.scale_positive != 0;
    // A masked score that turns into -inf once multiplied by the (signed) scale.
    const float masked_score = scale_pos ? -INFINITY : INFINITY;
    const int64_t causal_shift = p.seqlen_k - p.seqlen_q;
    const int64_t key_base = (int64_t)n * kBlockN;
    const bool need_mask = key_base + kBlockN > p.seqlen_k ||
                           (CAUSAL && key_base + kBlockN - 1 > w.row0 + causal_shift);
    if (need_mask) {
        int lim[2];  // last allowed key of each of this thread's rows, relative to key_base
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            int64_t last = p.seqlen_k - 1;
            if (CAUSAL) last = min(last, w.row0 + tp.row + 8 * r + causal_shift);
            last -= key_base;
            lim[r] = (int)max((int64_t)-1, min(last, (int64_t)kBlockN));
        }
#pragma unroll
        for (int j = 0; j < kSRegs / 4; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = 8 * j + 2 * tp.quad_col + e;
                if (key > lim[0]) s[4 * j + e] = masked_score;
                if (key > lim[1]) s[4 * j + 2 + e] = masked_score;
            }
        }
    }
    float ext[2] = {s[0], s[2]};
    if (scale_pos) {
#pragma unroll
        for (int j = 0; j < kSRegs / 4; ++j) {
            ext[0] = fmaxf(ext[0], fmaxf(s[4 * j], s[4 * j + 1]));
            ext[1] = fmaxf(ext[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
    } else {
#pragma unroll
        for (int j = 0; j < kSRegs / 4; ++j) {
            ext[0] = fminf(ext[0], fminf(s[4 * j], s[4 * j + 1]));
            ext[1] = fminf(ext[1], fminf(s[4 * j + 2], s[4 * j + 3]));
        }
    }
    float neg_m[2];
    bool moved = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m_tile = quad_extreme(ext[r], scale_pos) * sl2;
        // LAZY: -inf + slack is -inf, so a row's first finite max always moves it; a NaN never
        // does (fmaxf ignores it too).
        const bool up = LAZY && m_tile > st.m_run[r] + kRescaleSlack;
        const float m_new = !LAZY ? fmaxf(st.m_run[r], m_tile) : up ? m_tile : st.m_run[r];
        // A row with no allowed key so far keeps max -inf: subtract 0 instead so that
        // exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
        const float mu = m_new == -INFINITY ? 0.f : m_new;
        alpha[r] = ex2_approx(st.m_run[r] - mu);
        st.m_run[r] = m_new;
        st.m_use[r] = mu;
        neg_m[r] = -mu;
        moved |= up;
    }
    rowsum[0] = rowsum[1] = 0.f;
#pragma unroll
    for (int j = 0; j < kSRegs / 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            s[4 * j + e] = ex2_approx(fmaf(s[4 * j + e], sl2, neg_m[0]));
            s[4 * j + 2 + e] = ex2_approx(fmaf(s[4 * j + 2 + e], sl2, neg_m[1]));
            rowsum[0] += s[4 * j + e];
            rowsum[1] += s[4 * j + 2 + e];
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) st.l_run[r] = st.l_run[r] * alpha[r] + rowsum[r];
    return moved;
}

// P as bf16/fp16 A fragments, straight from the accumulator layout (keys 16kk..16kk+15).
template <bool BF16>
__device__ __forceinline__ void convert_p(const float (&s)[kBlockN / 2], uint32_t (&pa)[kBlockN / kMmaK][4]) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / kMmaK; ++kk) {
        pa[kk][0] = pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

template <int NREGS>
__device__ __forceinline__ void rescale_o(float (&o)[NREGS], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < NREGS / 4; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
    }
}

// rescale_o where a row of the warp moved its reference max (softmax_tile's result); elsewhere
// every alpha is 1 (or 0 on rows whose o and l are still 0) and the multiplies are skipped. The
// branch is warp-uniform.
template <int NREGS>
__device__ __forceinline__ void rescale_o_if(bool moved, float (&o)[NREGS], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, moved)) rescale_o(o, alpha);
}

// Floats one key tile takes in a kernel 1 CTA's statistics slot (kernel 2: FwdWsSmem::kRows):
// one parked log2-mass per row. (Other parking layouts were measured and rejected:
// bench/notes-fwd.md, bench/results/final1-*.)
constexpr int kParkFloatsPerKeyTile = kBlockM;

// Whether a kernel parks (tile sum, m_use) pairs instead of one log2-mass: the quad's threads 0 / 1
// store the sums of rows tp.row / tp.row + 8, threads 2 / 3 the maxima those sums are relative to,
// in the same store instruction (with log2-masses they store a duplicate), so that the key loop
// has no lg2 and no add in the park's chain; the epilogue forms sum * exp2(m - lse2). The workspace
// slot is then (rows, Tn, 2) floats, twice the log2-masses'. Head dim 128, where the parks go to
// the workspace: measured under ncu against the log2-masses (bench/results/fwd-s48-park-sum-max.txt,
// 2 runs of 3 rounds) 16k x 16 -0.3 / -0.8 % of the statistics kernel without a causal mask and
// -1.0 / -1.3 % with one, 32k x 24 level (+0.1 / -0.1 %, -0.1 / -0.3 %); the plain kernels do not
// park. At head dim 64 the kernels that park in the workspace (Tn > 128) spilled with pairs.
template <int D, bool PARK_SMEM>
__host__ __device__ __forceinline__ constexpr bool park_pairs() {
    return D == 128 && !PARK_SMEM;
}
// Floats a workspace slot holds per (row, key tile).
template <int D>
__host__ __device__ __forceinline__ constexpr int park_ws_floats() {
    return park_pairs<D, false>() ? 2 : 1;
}

// The row of the CTA's statistics slot (kBlockM rows x Tn) this thread parks into: row
// tp.row + 8 * (quad_col & 1), i.e. the row whose quad sum park_tile_logmass leaves in it. Computed
// once per kernel: rebuilding the 64-bit address inside the key loop cost a uniform-datapath chain
// (S2UR, UIMAD.WIDE, ULEA) that ncu showed stalling the consumer right after its GEMM issue.
// park_pairs: the row's pair of key tile n is floats 2n (sum, quad_col 0 / 1) and 2n + 1 (max,
// quad_col 2 / 3).
template <int D, bool PARK_SMEM>
__device__ __forceinline__ float *park_row_ptr(float *ws, int num_ktiles, const ThreadPos &tp) {
    if (park_pairs<D, PARK_SMEM>())
        return ws + (int64_t)(tp.row + 8 * (tp.quad_col & 1)) * num_ktiles * 2 + (tp.quad_col >> 1);
    return ws + (int64_t)(tp.row + 8 * (tp.quad_col & 1)) * num_ktiles;
}

// The row tile log2-mass of key tile n, parked (park_store) until the row's lse is known;
// park_tile_logmass forms and stores it at once. Two shuffles leave the quad's sum of row
// (quad_col & 1) in every thread: exchange the row a thread does not keep, then add the other
// pair's sum. Threads quad_col 2 and 3 hold the same sums as 0 and 1 and store the
// same value to the same address (one transaction): no branch, no divergence in the hot loop.
// (park_pairs: threads 0 / 1 store the sum, threads 2 / 3 the max beside it, no lg2.)
// PARK_SMEM: the slot is in the CTA's shared memory (park_row points there), else in the
// L2-resident workspace.
template <int D, bool PARK_SMEM>
__device__ __forceinline__ float row_logmass(const ThreadPos &tp, const float (&rowsum)[2],
                                             const float (&m_use)[2]) {
    const bool odd = tp.quad_col & 1;
    float mine = odd ? rowsum[1] : rowsum[0];
    mine += __shfl_xor_sync(0xffffffffu, odd ? rowsum[0] : rowsum[1], 1);
    mine += __shfl_xor_sync(0xffffffffu, mine, 2);
    if (park_pairs<D, PARK_SMEM>()) return tp.quad_col >= 2 ? (odd ? m_use[1] : m_use[0]) : mine;
    return lg2_approx(mine) + (odd ? m_use[1] : m_use[0]);
}
template <int D, bool PARK_SMEM>
__device__ __forceinline__ float tile_logmass(const ThreadPos &tp, const float (&rowsum)[2],
                                              const RowState &st) {
    return row_logmass<D, PARK_SMEM>(tp, rowsum, st.m_use);
}
template <int D, bool PARK_SMEM>
__device__ __forceinline__ void park_store(float *park_row, int n, float logmass) {
    if (PARK_SMEM) park_row[n] = logmass;
    else __stcg(park_row + (park_pairs<D, PARK_SMEM>() ? 2 * n : n), logmass);
}
template <int D, bool PARK_SMEM>
__device__ __forceinline__ void park_tile_logmass(float *park_row, const ThreadPos &tp, int n,
                                                  const float (&rowsum)[2], const RowState &st) {
    park_store<D, PARK_SMEM>(park_row, n, tile_logmass<D, PARK_SMEM>(tp, rowsum, st));
}

// End parks only: when tile n's log2-mass, whose row sums are final at the end of iteration n, is
// formed and stored.
// kParkNow: formed and stored at once. kParkStoreLater: formed at once, stored one iteration later
// (at the end of iteration n+1, or after the last P V), so that the store never waits for the
// shuffles and lg2 just issued; measured under ncu (bench/results/fwd-s42-park-defer.txt): -1.2..
// -1.4 % of the statistics kernel at head dim 64 with a causal mask, level at head dim 128 without
// one. kParkFormLater: the row sums and maxima kept, the whole chain (shuffles, lg2, store) run in
// iteration n+1, before the lazy rescale's branch (in the block of the exponentials, whose MUFU
// gaps it fills; after the branch it would be a block of its own, its shuffles' latency bare):
// -2.1 % at 16k x 16 x 64 causal, -1.2 % at 4 x 4k against kParkStoreLater; -0.6 % at head dim
// 128 causal (16k and 32k) against the early park; +0.6..1.4 % at head dim 128 without a causal
// mask against kParkNow (bench/results/fwd-s45-park-form-later.txt). Its four kept floats make the
// head-dim-64 kernel that parks in global memory keep a value in local memory inside the loop, so
// that one stays with kParkStoreLater. (Head dim 128 with a causal mask parks early since its
// parks became (sum, max) pairs: park_early.)
enum ParkDefer { kParkNow = 0, kParkStoreLater = 1, kParkFormLater = 2 };
template <int D, bool CAUSAL, bool PARK_SMEM>
__device__ __forceinline__ constexpr ParkDefer park_defer() {
    if (CAUSAL) return PARK_SMEM ? kParkFormLater : kParkStoreLater;
    return kParkNow;
}

// End parks (!park_early) under deferral DEFER: park_begin after tile 0's softmax, park_end after
// tile n's (n >= 1), park_flush after the last P V's issue; ParkPending holds what a deferral
// has not stored yet.
struct ParkPending {
    float logmass;                // kParkStoreLater: the last tile's log2-mass
    float rowsum[2], m_use[2];    // kParkFormLater: what it is formed from
    __device__ __forceinline__ void keep(const float (&rs)[2], const RowState &st) {
        rowsum[0] = rs[0], rowsum[1] = rs[1], m_use[0] = st.m_use[0], m_use[1] = st.m_use[1];
    }
};
template <int D, bool PARK_SMEM, ParkDefer DEFER>
__device__ __forceinline__ void park_begin(float *park_row, const ThreadPos &tp, const float (&rowsum)[2],
                                           const RowState &st, ParkPending &pd) {
    if (DEFER == kParkNow) park_store<D, PARK_SMEM>(park_row, 0, tile_logmass<D, PARK_SMEM>(tp, rowsum, st));
    if (DEFER == kParkStoreLater) pd.logmass = tile_logmass<D, PARK_SMEM>(tp, rowsum, st);
    if (DEFER == kParkFormLater) pd.keep(rowsum, st);
}
template <int D, bool PARK_SMEM, ParkDefer DEFER>
__device__ __forceinline__ void park_end(float *park_row, const ThreadPos &tp, int n,
                                         const float (&rowsum)[2], const RowState &st, ParkPending &pd) {
    if (DEFER == kParkNow) park_store<D, PARK_SMEM>(park_row, n, tile_logmass<D, PARK_SMEM>(tp, rowsum, st));
    if (DEFER == kParkStoreLater) {
        const float v = tile_logmass<D, PARK_SMEM>(tp, rowsum, st);
        park_store<D, PARK_SMEM>(park_row, n - 1, pd.logmass);
        pd.logmass = v;
    }
    if (DEFER == kParkFormLater) {
        park_store<D, PARK_SMEM>(park_row, n - 1, row_logmass<D, PARK_SMEM>(tp, pd.rowsum, pd.m_use));
        pd.keep(rowsum, st);
    }
}
template <int D, bool PARK_SMEM, ParkDefer DEFER>
__device__ __forceinline__ void park_flush(float *park_row, const ThreadPos &tp, int n_last,
                                           const ParkPending &pd) {
    if (DEFER == kParkStoreLater) park_store<D, PARK_SMEM>(park_row, n_last, pd.logmass);
    if (DEFER == kParkFormLater) park_store<D, PARK_SMEM>(park_row, n_last, row_logmass<D, PARK_SMEM>(tp, pd.rowsum, pd.m_use));
}

// Whether the warp-specialized kernel rescales lazily (kRescaleSlack). Measured under ncu against
// the eager form (bench/results/fwd-s44-lazy-rescale.txt): head dim 64 -4..-5 % without a causal
// mask and -1.5 % with one (plain; with statistics -2..-2.6 % / level); head dim 128 with a causal
// mask level (plain +0.4 %, statistics -0.5..-0.7 %), without one +4.6 % (plain; statistics +1 %):
// there the vote and branch alone cost 6.6 % and the skipped multiplies gain 2 % (run 3). By mask
// and head dim only, so that a forward with statistics writes the same out and lse bits as one
// without (the statistics only add W).
template <int D, bool CAUSAL>
__device__ __forceinline__ constexpr bool rescale_lazy() {
    return D == 64 || CAUSAL;
}

// Whether the warp-specialized kernel keeps its wgmma descriptors on the uniform datapath (issue_qk /
// issue_pv's ADVANCE, and the warpgroup index read from lane 0). Measured under ncu against the
// descriptors built per wgmma (bench/results/fwd-s45-park-form-later.txt run 5): head dim 64
// without a causal mask plain -2.2..-2.5 % (statistics level), head dim 64 with one statistics
// -2 % (plain +1.4 %); head dim 128 plain level / +2 % with a causal mask, statistics +0.6..1.7 %.
// The two kernels chosen, against the per-wgmma form (bench/results/fwd-s46-uniform-descriptors.txt):
// 16k x 16 x 64 plain -2.8 %, causal statistics -2.5 %. The numerics are the same either way.
template <int D, bool CAUSAL, bool STATS>
__device__ __forceinline__ constexpr bool uniform_descriptors() {
    return D == 64 && CAUSAL == STATS;
}

// Where the warp-specialized kernel parks key tile n's log2-mass: at the end of iteration n
// (false), or in iteration n+1 just before softmax(n+1) (true), where ptxas hoists the park's
// shuffle / lg2 / store chain into the GEMM issue window. Measured per (head dim, mask) under ncu
// and with events (bench/notes-fwd.md, twenty-first session): the early park is 3 % cheaper at
// head dim 64 without a causal mask; level at head dim 128 without, 2-3.5 % dearer at head dim 64
// with one. At head dim 128 with a causal mask it was 1.5 % cheaper than the plain end park, and
// 0.6 % dearer than the end park formed later (park_defer) while parks were log2-masses; with
// (sum, max) pairs (park_pairs) it is 0.4 / 0.5 % cheaper than that at 16k / 32k, and the end
// park formed at once 2.2-2.5 % dearer (bench/results/fwd-s48-park-sum-max.txt run 3); without
// a causal mask the early park is still dearer there (+1.5 %).
// (The sync kernel always parks at the end.)
template <int D, bool CAUSAL>
__device__ __forceinline__ constexpr bool park_early() {
    return D == 64 ? !CAUSAL : CAUSAL;
}

// Writes out and lse of this thread's rows and (STATS) the tile mass of the warpgroup's 64-row
// tile. `bar_id` is a named barrier over the warpgroup's 128 threads.
template <int D, bool BF16, bool STATS, bool PARK_SMEM = false>
__device__ __forceinline__ void write_outputs(const FwdParams &p, const WorkTile &w, const ThreadPos &tp,
                                              const float (&o)[D / 2], const RowState &st,
                                              float *s_lse2, const float *ws, int bar_id) {
    constexpr int kORegs = D / 2;
    float lse2[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(st.l_run[r]);
        // l == 0: no allowed key -> out 0, lse -inf (a NaN l stays NaN).
        const float inv_l = l == 0.f ? 0.f : 1.f / l;
        lse2[r] = lg2_approx(l) + st.m_use[r];
        const int64_t row = w.row0 + tp.row + 8 * r;
        if (row < p.seqlen_q) {
            uint16_t *og = p.out + w.b * p.o_sb + row * p.o_ss + w.h * p.o_sh + 2 * tp.quad_col;
#pragma unroll
            for (int j = 0; j < kORegs / 4; ++j) {
                const uint32_t v2 = pack2<BF16>(o[4 * j + 2 * r] * inv_l, o[4 * j + 2 * r + 1] * inv_l);
                *reinterpret_cast<uint32_t *>(og + 8 * j) = v2;
            }
            if (tp.quad_col == 0)
                p.lse[((int64_t)w.b * p.heads_q + w.h) * p.seqlen_q + row] = lse2[r] * kLn2;
        }
    }
    if (!STATS) return;
    named_barrier_sync(bar_id, kThreadsPerWarpgroup);  // last tile's readers of s_lse2 are done
    // Rows past Sq and rows without keys contribute 0: give them lse2 = +inf.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t row = w.row0 + tp.row + 8 * r;
        if (tp.quad_col == 0)
            s_lse2[tp.row + 8 * r] = (row < p.seqlen_q && lse2[r] != -INFINITY) ? lse2[r] : INFINITY;
    }
    named_barrier_sync(bar_id, kThreadsPerWarpgroup);  // s_lse2 and the parked masses visible
    const int64_t mtile = w.row0 / kRowsPerWarpgroup + tp.wg;
    if (mtile < p.num_mtiles) {
        // One key tile per thread: 64 independent loads (all in flight), coalesced across the warp.
        const float *lse2_rows = s_lse2 + tp.wg * kRowsPerWarpgroup;
        constexpr bool kPairs = park_pairs<D, PARK_SMEM>();
        const float *ws_rows = ws + (int64_t)(tp.wg * kRowsPerWarpgroup) * p.num_ktiles * (kPairs ? 2 : 1);
        float *wrow = p.tile_mass + (((int64_t)w.b * p.heads_q + w.h) * p.num_mtiles + mtile) * p.num_ktiles;
        for (int n = tp.warp * 32 + tp.lane; n < p.num_ktiles; n += kThreadsPerWarpgroup) {
            float acc = 0.f;
            if (n < w.n_end) {
#pragma unroll
                for (int r = 0; r < kRowsPerWarpgroup; ++r) {
                    if (kPairs) {
                        const float2 sm = __ldcg(reinterpret_cast<const float2 *>(ws_rows) +
                                                 (int64_t)r * p.num_ktiles + n);
                        acc = fmaf(sm.x, ex2_approx(sm.y - lse2_rows[r]), acc);
                    } else {
                        acc += ex2_approx((PARK_SMEM ? ws_rows[r * p.num_ktiles + n]
                                                     : __ldcg(ws_rows + (int64_t)r * p.num_ktiles + n)) -
                                          lse2_rows[r]);
                    }
                }
            }
            wrow[n] = acc;
        }
    }
    named_barrier_sync(bar_id, kThreadsPerWarpgroup);  // workspace reads done before next writes
}

// =============================================================================================
// Kernel 1 ("sync"): two warpgroups, K/V double-buffered with cp.async by all threads, one CTA
// barrier per key tile. The fallback where TMA cannot describe a tensor.
// =============================================================================================
template <int D, bool BF16, bool CAUSAL, bool STATS>
__global__ void __launch_bounds__(kThreads, 1) attn_fwd_sm90_kernel(const __grid_constant__ FwdParams p) {
    using L = FwdSmem<D>;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + (kSmemAlign - 1)) & ~(uint32_t)(kSmemAlign - 1);
    float *s_lse2 = reinterpret_cast<float *>(smem_raw + (base - raw) + L::kLse2);
    const uint32_t sQ = base + L::kQ;
    const ThreadPos tp = thread_pos(threadIdx.x);
    const uint32_t sQ_rows = sQ + tp.wg * kRowsPerWarpgroup * BL_SWIZZLE_ROW_BYTES;
    float *ws = STATS ? p.stats_ws + (int64_t)blockIdx.x * p.num_ktiles * kParkFloatsPerKeyTile * park_ws_floats<D>()
                      : nullptr;
    float *park_row = STATS ? park_row_ptr<D, false>(ws, p.num_ktiles, tp) : nullptr;

    WorkTile w;
    for (int round = 0; decode_work<CAUSAL>(p, round, w); ++round) {
        if (w.skip) continue;  // uniform over the CTA
        const uint16_t *qg = p.q + w.b * p.q_sb + w.row0 * p.q_ss + w.h * p.q_sh;
        const uint16_t *kg = p.k + w.b * p.k_sb + w.hk * p.k_sh;
        const uint16_t *vg = p.v + w.b * p.v_sb + w.hk * p.v_sh;

        __syncthreads();  // the previous work tile is done with every shared buffer
        if (w.n_end > 0) {
            load_tile_async<D, kBlockM>(sQ, qg, p.q_ss, p.seqlen_q - w.row0);
            load_tile_async<D, kBlockN>(base + L::kK, kg, p.k_ss, p.seqlen_k);
            load_tile_async<D, kBlockN>(base + L::kV, vg, p.v_ss, p.seqlen_k);
            cp_async_commit();
        }
        float o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        RowState st;
        row_state_init(st);

        for (int n = 0; n < w.n_end; ++n) {
            const int stage = n & 1;
            const uint32_t sK = base + L::kK + stage * L::kKVBytes;
            const uint32_t sV = base + L::kV + stage * L::kKVBytes;
            cp_async_wait<0>();
            fence_proxy_async_shared();
            __syncthreads();  // tile n visible to all; everyone is done with the other stage
            if (n + 1 < w.n_end) {
                const int64_t key0 = (int64_t)(n + 1) * kBlockN;
                const uint32_t nxt = (stage ^ 1) * L::kKVBytes;
                load_tile_async<D, kBlockN>(base + L::kK + nxt, kg + key0 * p.k_ss, p.k_ss,
                                            p.seqlen_k - key0);
                load_tile_async<D, kBlockN>(base + L::kV + nxt, vg + key0 * p.v_ss, p.v_ss,
                                            p.seqlen_k - key0);
                cp_async_commit();
            }
            float s[kBlockN / 2];
            wgmma_fence();
            issue_qk<D, BF16>(s, sQ_rows, L::kQPanelBytes, sK);
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kBlockN / 2; ++i) reg_fence(s[i]);
            float alpha[2], rowsum[2];
            softmax_tile<CAUSAL>(s, p, w, tp, n, st, alpha, rowsum);
            uint32_t pa[kBlockN / kMmaK][4];
            convert_p<BF16>(s, pa);
            rescale_o(o, alpha);
#pragma unroll
            for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
            wgmma_fence();
            issue_pv<D, BF16>(o, pa, sV);
            wgmma_commit();
            if (STATS) {
                // While P V runs: the fences keep the compiler from hoisting this above the issue.
                reg_fence(rowsum[0]);
                reg_fence(rowsum[1]);
                park_tile_logmass<D, false>(park_row, tp, n, rowsum, st);
            }
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
        }
        write_outputs<D, BF16, STATS>(p, w, tp, o, st, s_lse2, ws, kBarrierWarpgroup0 + tp.wg);
    }
}

// =============================================================================================
// Kernel 2 ("ws", warp-specialized): a producer warpgroup whose one thread streams Q and a
// K/V ring (kStages deep) with TMA, completing on mbarriers; two or three consumer warpgroups
// (64 rows each) that take turns issuing their GEMMs (a ring of named barriers), so that one
// warpgroup's softmax runs while the others' GEMMs occupy the tensor cores. Inside a consumer,
// P(n-1) V and Q K(n)^T are issued together and softmax(n) runs while P(n-1) V is in flight.
// =============================================================================================
// Consumer warpgroups (NWG) of kernel 2: two (128-row work tiles) at head dim 128, three
// (192-row work tiles) at head dim 64 as in FlashAttention-3: there a tile's exponentials take
// about as long as its two GEMMs, so with two consumers the tensor cores wait while both run
// softmax; with three, two warpgroups' GEMMs cover the third one's softmax (-6..-13 %,
// bench/notes-fwd.md, eleventh session). Head dim 128 needs more than 160 registers.
constexpr int kD64Consumers = 3;
template <int NWG>
__host__ __device__ constexpr int ws_threads() {  // the consumers and the producer
    return (NWG + 1) * kThreadsPerWarpgroup;
}
// Registers per thread after setmaxnreg: 128 * (24 + 2 * 240) = 64512 <= 65536 with two
// consumers, 128 * (24 + 3 * 160) = 64512 with three. setmaxnreg moves registers only within the
// launch allocation (65536 / threads each), so the sum must stay within it.
constexpr int kProducerRegs = 24;
template <int NWG>
__host__ __device__ constexpr int consumer_regs() { return NWG == 2 ? 240 : 160; }
// Named barriers of kernel 2: one per consumer for the turns (consumer w waits on barrier
// kBarrierTurn0 + w, which its predecessor in the ring arrives on: two warpgroups per barrier),
// then one per consumer for its epilogue.
constexpr int kBarrierTurn0 = 1;
constexpr int kTurnThreads = 2 * kThreadsPerWarpgroup;

// PARK_SMEM: the statistics' parking slot follows kEnd (three consumers give up a K/V stage
// for it).
template <int D, int NWG, bool PARK_SMEM = false>
struct FwdWsSmem {
    static constexpr int kRows = NWG * kRowsPerWarpgroup;  // query rows per work tile
    // K/V ring: as deep as 227 KB allow
    static constexpr int kStages = D == 128 ? 3 : (NWG == 3 && PARK_SMEM ? 3 : 4);
    static constexpr int kPanels = D / kPanelCols;
    static constexpr uint32_t kQPanelBytes = kRows * BL_SWIZZLE_ROW_BYTES;
    static constexpr uint32_t kKVPanelBytes = kBlockN * BL_SWIZZLE_ROW_BYTES;
    static constexpr uint32_t kQBytes = kPanels * kQPanelBytes;
    static constexpr uint32_t kKVBytes = kPanels * kKVPanelBytes;
    static constexpr uint32_t kQ = 0;
    static constexpr uint32_t kK = kQ + kQBytes;
    static constexpr uint32_t kV = kK + kStages * kKVBytes;
    static constexpr uint32_t kLse2 = kV + kStages * kKVBytes;
    static constexpr uint32_t kBars = kLse2 + kRows * sizeof(float);
    // mbarriers (8 bytes each): q_full, q_empty, then k_full, v_full, kv_empty per stage.
    static constexpr int kNumBars = 2 + 3 * kStages;
    static constexpr uint32_t kEnd = kBars + kNumBars * 8;
    static constexpr size_t kDynamicBytes = kEnd + kSmemAlign;
    // Statistics: the parked log2-masses (kRows rows x Tn floats) go to shared memory behind
    // kEnd where they fit (head dim 64 leaves 64 / 96 KB for two / three consumers: Tn <= 128,
    // i.e. Sk <= 16384), else to the workspace in L2 (bench/notes-fwd.md, ninth session).
    static constexpr int kParkSmemMaxKtiles = D == 64 ? 128 : 0;
    static_assert(!PARK_SMEM || kDynamicBytes + (size_t)kRows * kParkSmemMaxKtiles * 4 <= 232448,
                  "227 KB of shared memory per CTA on sm_90");
    __device__ static uint32_t q_full(uint32_t b) { return b + kBars; }
    __device__ static uint32_t q_empty(uint32_t b) { return b + kBars + 8; }
    __device__ static uint32_t k_full(uint32_t b, int s) { return b + kBars + 16 + 8 * s; }
    __device__ static uint32_t v_full(uint32_t b, int s) { return b + kBars + 16 + 8 * (kStages + s); }
    __device__ static uint32_t kv_empty(uint32_t b, int s) { return b + kBars + 16 + 8 * (2 * kStages + s); }
};

struct FwdTmaParams {
    CUtensorMap tm_q;  // q as (D, Sq, Hq, B), box (64, rows of a work tile, 1, 1), 128B swizzle
    CUtensorMap tm_k;  // k as (D, Sk, Hk, B), box (64, 128, 1, 1)
    CUtensorMap tm_v;  // v as (D, Sk, Hk, B), box (64, 128, 1, 1)
    FwdParams p;
};

template <int D, bool BF16, bool CAUSAL, bool STATS, bool PARK_SMEM, int NWG>
__global__ void __launch_bounds__(ws_threads<NWG>(), 1) attn_fwd_sm90_ws_kernel(const __grid_constant__ FwdTmaParams tp_) {
    using L = FwdWsSmem<D, NWG, PARK_SMEM>;
    constexpr int S = L::kStages;
    constexpr int kConsumerWarps = NWG * kThreadsPerWarpgroup / 32;
    static_assert(NWG == 2 || D == 64, "three consumers: head dim 64 only");
    constexpr bool kParkEarly = park_early<D, CAUSAL>();
    constexpr ParkDefer kParkDefer = park_defer<D, CAUSAL, PARK_SMEM>();  // end parks only
    constexpr bool kLazy = rescale_lazy<D, CAUSAL>();
    constexpr bool kParkPreBranch = kLazy && !kParkEarly && kParkDefer == kParkFormLater;
    constexpr bool kUniformDesc = uniform_descriptors<D, CAUSAL, STATS>();
    const FwdParams &p = tp_.p;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + (kSmemAlign - 1)) & ~(uint32_t)(kSmemAlign - 1);
    float *s_lse2 = reinterpret_cast<float *>(smem_raw + (base - raw) + L::kLse2);
    const uint32_t sQ = base + L::kQ;

    if (threadIdx.x == 0) {
        mbarrier_init(L::q_full(base), 1);
        mbarrier_init(L::q_empty(base), kConsumerWarps);
        for (int s = 0; s < S; ++s) {
            mbarrier_init(L::k_full(base, s), 1);
            mbarrier_init(L::v_full(base, s), 1);
            mbarrier_init(L::kv_empty(base, s), kConsumerWarps);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (threadIdx.x < kThreadsPerWarpgroup) {
        // ---------------- producer ----------------
        setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == 0) {
            int tiles = 0, it = 0;
            WorkTile w;
            for (int round = 0; decode_work<CAUSAL, L::kRows>(p, round, w); ++round) {
                if (w.skip || w.n_end == 0) continue;
                mbarrier_wait(L::q_empty(base), (tiles & 1) ^ 1);
                mbarrier_arrive_expect_tx(L::q_full(base), L::kQBytes);
                for (int pn = 0; pn < L::kPanels; ++pn)
                    tma_load_4d(sQ + pn * L::kQPanelBytes, &tp_.tm_q, L::q_full(base), pn * kPanelCols,
                                (int)w.row0, w.h, w.b);
                ++tiles;
                for (int n = 0; n < w.n_end; ++n, ++it) {
                    const int s = it % S;
                    mbarrier_wait(L::kv_empty(base, s), ((it / S) & 1) ^ 1);
                    const uint32_t sK = base + L::kK + s * L::kKVBytes;
                    const uint32_t sV = base + L::kV + s * L::kKVBytes;
                    mbarrier_arrive_expect_tx(L::k_full(base, s), L::kKVBytes);
                    for (int pn = 0; pn < L::kPanels; ++pn)
                        tma_load_4d(sK + pn * L::kKVPanelBytes, &tp_.tm_k, L::k_full(base, s),
                                    pn * kPanelCols, n * kBlockN, w.hk, w.b);
                    mbarrier_arrive_expect_tx(L::v_full(base, s), L::kKVBytes);
                    for (int pn = 0; pn < L::kPanels; ++pn)
                        tma_load_4d(sV + pn * L::kKVPanelBytes, &tp_.tm_v, L::v_full(base, s),
                                    pn * kPanelCols, n * kBlockN, w.hk, w.b);
                }
            }
        }
        return;
    }

    // ---------------- consumers ----------------
    setmaxnreg_inc<consumer_regs<NWG>()>();
    const ThreadPos tp = thread_pos(threadIdx.x - kThreadsPerWarpgroup);
    // kUniformDesc: the warpgroup index read from lane 0, so that ptxas keeps what derives from it
    // (the Q descriptors, the turn barriers) on the uniform datapath.
    const uint32_t sQ_rows =
        sQ + (kUniformDesc ? __shfl_sync(0xffffffffu, tp.wg, 0) : tp.wg) * kRowsPerWarpgroup * BL_SWIZZLE_ROW_BYTES;
    float *ws = !STATS    ? nullptr
                : PARK_SMEM ? reinterpret_cast<float *>(smem_raw + (base - raw) + L::kEnd)
                            : p.stats_ws + (int64_t)blockIdx.x * p.num_ktiles * L::kRows * park_ws_floats<D>();
    float *park_row = STATS ? park_row_ptr<D, PARK_SMEM>(ws, p.num_ktiles, tp) : nullptr;
    const int wg_u = kUniformDesc ? __shfl_sync(0xffffffffu, tp.wg, 0) : tp.wg;
    const int my_turn = kBarrierTurn0 + wg_u, their_turn = kBarrierTurn0 + (wg_u + 1) % NWG;
    const bool warp_leader = tp.lane == 0;
    if (tp.wg == NWG - 1) named_barrier_arrive(kBarrierTurn0, kTurnThreads);  // consumer 0 first

    int tiles = 0, it = 0;
    WorkTile w;
    for (int round = 0; decode_work<CAUSAL, L::kRows>(p, round, w); ++round) {
        if (w.skip) continue;  // uniform over the CTA: every consumer skips the same slots
        float o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        RowState st;
        row_state_init(st);
        if (w.n_end > 0) {
            mbarrier_wait(L::q_full(base), tiles & 1);
            ++tiles;
            float s[kBlockN / 2];
            uint32_t pa[kBlockN / kMmaK][4];
            float alpha[2], rowsum[2];
            // key tile 0: S only
            int stage = it % S;
            uint32_t phase = (it / S) & 1;
            mbarrier_wait(L::k_full(base, stage), phase);
            named_barrier_sync(my_turn, kTurnThreads);
            wgmma_fence();
            issue_qk<D, BF16, kUniformDesc>(s, sQ_rows, L::kQPanelBytes, base + L::kK + stage * L::kKVBytes);
            wgmma_commit();
            named_barrier_arrive(their_turn, kTurnThreads);
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kBlockN / 2; ++i) reg_fence(s[i]);
            if (w.n_end == 1 && warp_leader) mbarrier_arrive(L::q_empty(base));
            softmax_tile<CAUSAL, kLazy>(s, p, w, tp, 0, st, alpha, rowsum);
            convert_p<BF16>(s, pa);
            ParkPending pending{};
            if (STATS && !kParkEarly) park_begin<D, PARK_SMEM, kParkDefer>(park_row, tp, rowsum, st, pending);
            // key tiles 1 .. n_end-1: issue P(n-1) V and Q K(n)^T, softmax(n) under P(n-1) V
            for (int n = 1; n < w.n_end; ++n) {
                const int pstage = stage;
                const uint32_t pphase = phase;
                ++it;
                stage = it % S;
                phase = (it / S) & 1;
                mbarrier_wait(L::k_full(base, stage), phase);
                mbarrier_wait(L::v_full(base, pstage), pphase);
                named_barrier_sync(my_turn, kTurnThreads);
#pragma unroll
                for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
                wgmma_fence();
                issue_qk<D, BF16, kUniformDesc>(s, sQ_rows, L::kQPanelBytes, base + L::kK + stage * L::kKVBytes);
                wgmma_commit();
                issue_pv<D, BF16, kUniformDesc>(o, pa, base + L::kV + pstage * L::kKVBytes);
                wgmma_commit();
                named_barrier_arrive(their_turn, kTurnThreads);
                wgmma_wait<1>();  // S(n) ready; P(n-1) V may still run
#pragma unroll
                for (int i = 0; i < kBlockN / 2; ++i) reg_fence(s[i]);
                if (n == w.n_end - 1 && warp_leader) mbarrier_arrive(L::q_empty(base));
                // rowsum and st.m_use still hold tile n-1's values here.
                if (STATS && kParkEarly) park_tile_logmass<D, PARK_SMEM>(park_row, tp, n - 1, rowsum, st);
                const bool moved = softmax_tile<CAUSAL, kLazy>(s, p, w, tp, n, st, alpha, rowsum);
                wgmma_wait<0>();  // P(n-1) V done: stage pstage is free, o and pa may change
#pragma unroll
                for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
                if (warp_leader) mbarrier_arrive(L::kv_empty(base, pstage));
                if constexpr (kLazy) {
                    // P packed first: in the block before the rescale's branch its conversions
                    // fill the exponentials' MUFU gaps (behind it they ran alone, 4-7 % slower at
                    // head dim 128).
                    convert_p<BF16>(s, pa);
                    if (STATS && kParkPreBranch)  // tile n-1's chain, in this block (park_defer)
                        park_end<D, PARK_SMEM, kParkDefer>(park_row, tp, n, rowsum, st, pending);
                    rescale_o_if(moved, o, alpha);
                } else {
                    rescale_o(o, alpha);
                    convert_p<BF16>(s, pa);
                }
                // Tile n's statistics at the end of the iteration (the kernels that do not park
                // before the lazy branch: head dim 128 without a causal mask, head dim 64 causal
                // with the global slot), where the warpgroup would otherwise wait for its turn:
                // measured 4% cheaper at 16k x 64 causal than in the shadow of the next GEMM issue
                // (bench/results/fwd-parkend-ab.txt).
                if (STATS && !kParkEarly && !kParkPreBranch)
                    park_end<D, PARK_SMEM, kParkDefer>(park_row, tp, n, rowsum, st, pending);
            }
            // last P V
            mbarrier_wait(L::v_full(base, stage), phase);
            named_barrier_sync(my_turn, kTurnThreads);
#pragma unroll
            for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
            wgmma_fence();
            issue_pv<D, BF16, kUniformDesc>(o, pa, base + L::kV + stage * L::kKVBytes);
            wgmma_commit();
            named_barrier_arrive(their_turn, kTurnThreads);
            if (STATS && kParkEarly) park_tile_logmass<D, PARK_SMEM>(park_row, tp, w.n_end - 1, rowsum, st);
            if (STATS && !kParkEarly) park_flush<D, PARK_SMEM, kParkDefer>(park_row, tp, w.n_end - 1, pending);
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < D / 2; ++i) reg_fence(o[i]);
            if (warp_leader) mbarrier_arrive(L::kv_empty(base, stage));
            ++it;
        }
        const int epilogue_bar = kBarrierTurn0 + NWG + tp.wg;  // after the turn barriers
        write_outputs<D, BF16, STATS, PARK_SMEM>(p, w, tp, o, st, s_lse2, ws, epilogue_bar);
    }
    // The last consumer arrived once more on consumer 0's turn barrier than consumer 0 waited.
    if (tp.wg == 0) named_barrier_sync(kBarrierTurn0, kTurnThreads);
}

// ---- host side ----

// The kernels are built for sm_90a only: no driver, no device or another architecture is
// BL_ERR_NO_BACKEND (with CUDA's own words), never a launch failure later. Returns the SM count.
bl_status require_sm90_device(int *sm_count) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  // leave no sticky error behind for the caller's next call
        return bl_set_error(BL_ERR_NO_BACKEND, "CUDA backend: no usable CUDA device (%s)",
                            cudaGetErrorString(e));
    }
    if (major != 9 || minor != 0)
        return bl_set_error(BL_ERR_NO_BACKEND,
                            "CUDA backend: device %d has compute capability %d.%d, the kernels are "
                            "built for 9.0 (sm_90a)", dev, major, minor);
    return BL_OK;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// (b, h) pairs per group of the causal schedule (decode_work): as many as have their K / V in
// kCausalGroupL2Bytes (query heads sharing a K / V head count once), but at least two rounds of
// work tiles per group so that the snake can pair long tiles with short ones. Measured on the
// dev checker (bench/results/fwd-s11-causal-head-groups.txt, second call): one group of all heads
// ran 32k x 24 x 128 causal 8-10 % slower than groups of 4-8 (5-7 % with statistics; 16 MB of
// K / V per head), 16k x 16 x 128 level to 3 % slower than groups of 8; groups that fill one
// round or less lost 45-85 % (4 x 4k x 16 x 64 with groups of 4: every round waits for its
// longest tile).
constexpr int64_t kCausalGroupL2Bytes = 64ll << 20;
int causal_group_size(const bl_attn_desc *d, int64_t num_mblocks, int grid) {
    const int64_t bh = d->batch * d->heads_q;
    const int64_t kv_bytes = 2 * d->seqlen_k * d->head_dim * 2;  // one K / V head, 16-bit
    const int64_t per_q_head = (kv_bytes + d->heads_q / d->heads_k - 1) / (d->heads_q / d->heads_k);
    int64_t g = kCausalGroupL2Bytes / (per_q_head > 0 ? per_q_head : 1);
    const int64_t two_rounds = num_mblocks > 0 ? ceil_div(2 * (int64_t)grid, num_mblocks) : 1;
    g = g > two_rounds ? g : two_rounds;
    g = g < bh ? g : bh;
    return (int)(g > 0 ? g : 1);
}

// Consumer warpgroups of the kernel bl_cuda_forward runs when TMA can describe the tensors.
int ws_consumers(int64_t head_dim) {
    return head_dim == 64 ? kD64Consumers : kWarpgroups;
}

// Stats workspace: one (rows of a work tile, Tn) float slot per resident CTA (one CTA per SM);
// sized for kernel 2, whose work tiles are never smaller than kernel 1's.
size_t stats_workspace_bytes(const bl_attn_desc *d, int sms) {
    const int64_t rows = ws_consumers(d->head_dim) * kRowsPerWarpgroup;
    return (size_t)sms * (size_t)ceil_div(d->seqlen_k, kBlockN) * (size_t)rows *
           (size_t)(d->head_dim == 128 ? park_ws_floats<128>() : park_ws_floats<64>()) * sizeof(float);
}

// cp.async moves 16-byte chunks: each row of q/k/v must start 16-byte aligned.
bl_status check_layout(const char *name, bl_tensor t) {
    const int64_t vec = kChunkElems;
    if (((uintptr_t)t.data % 16) != 0)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "CUDA forward: %s.data=%p is not 16-byte aligned", name, t.data);
    if (t.stride_b % vec || t.stride_s % vec || t.stride_h % vec)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "CUDA forward: strides of %s (b=%lld, s=%lld, h=%lld) must be multiples "
                            "of %lld elements",
                            name, (long long)t.stride_b, (long long)t.stride_s,
                            (long long)t.stride_h, (long long)vec);
    return BL_OK;
}

// Which kernel bl_cuda_forward runs: the warp-specialized TMA kernel whenever TMA can describe
// the tensors (the default), or always the cp.async kernel (dev/cuda/attn_fwd.cu checks both).
enum FwdKernelChoice { kFwdKernelAuto = 0, kFwdKernelSync = 1 };
FwdKernelChoice g_fwd_kernel_choice = kFwdKernelAuto;

// Kernel 2 with NWG consumer warpgroups.
template <int D, bool BF16, bool CAUSAL, bool STATS, int NWG>
bl_status launch_ws(const FwdTmaParams &tp, int grid, cudaStream_t stream) {
    using L = FwdWsSmem<D, NWG>;
    using LP = FwdWsSmem<D, NWG, true>;  // with the parking slot in shared memory
    auto kernel = attn_fwd_sm90_ws_kernel<D, BF16, CAUSAL, STATS, false, NWG>;
    size_t smem = L::kDynamicBytes;
    if constexpr (STATS && LP::kParkSmemMaxKtiles > 0) {
        if (tp.p.num_ktiles <= LP::kParkSmemMaxKtiles) {
            kernel = attn_fwd_sm90_ws_kernel<D, BF16, CAUSAL, STATS, true, NWG>;
            smem = LP::kDynamicBytes + (size_t)LP::kRows * tp.p.num_ktiles * sizeof(float);
        }
    }
    BL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, ws_threads<NWG>(), smem, stream>>>(tp);
    BL_CUDA_CHECK_LAUNCH("attn_fwd_sm90_ws_kernel");
    return BL_OK;
}

template <int D, bool BF16, bool CAUSAL, bool STATS>
bl_status launch(const FwdTmaParams &tp, bool use_tma, int grid, cudaStream_t stream) {
    if (use_tma) {
        if constexpr (D == 64 && kD64Consumers == 3)
            return launch_ws<D, BF16, CAUSAL, STATS, 3>(tp, grid, stream);
        else
            return launch_ws<D, BF16, CAUSAL, STATS, kWarpgroups>(tp, grid, stream);
    }
    auto kernel = attn_fwd_sm90_kernel<D, BF16, CAUSAL, STATS>;
    const size_t smem = FwdSmem<D>::kDynamicBytes;
    BL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kThreads, smem, stream>>>(tp.p);
    BL_CUDA_CHECK_LAUNCH("attn_fwd_sm90_kernel");
    return BL_OK;
}

template <int D, bool BF16>
bl_status dispatch_flags(const FwdTmaParams &tp, bool use_tma, int grid, cudaStream_t stream,
                         bool causal, bool stats) {
    if (causal) return stats ? launch<D, BF16, true, true>(tp, use_tma, grid, stream)
                             : launch<D, BF16, true, false>(tp, use_tma, grid, stream);
    return stats ? launch<D, BF16, false, true>(tp, use_tma, grid, stream)
                 : launch<D, BF16, false, false>(tp, use_tma, grid, stream);
}

}  // namespace

extern "C" int bl_cuda_available(void) {
    int count = 0, dev = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();  // leave no sticky error behind for the caller's next call
        return 0;
    }
    return major == 9 && minor == 0;
}

// bl_cuda_supports (what the kernels are built for): cuda_supports.cu.

extern "C" bl_status bl_cuda_workspace_size(const bl_attn_desc *d, bl_op op, int with_stats,
                                            size_t *bytes) {
    if (op == BL_OP_BACKWARD) return bl_cuda_bwd_workspace_size(d, bytes);
    if (op != BL_OP_FORWARD) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "op=%d is not a bl_op", (int)op);
    *bytes = 0;
    if (!with_stats) return BL_OK;
    int sms = 0;
    BL_TRY(require_sm90_device(&sms));
    *bytes = stats_workspace_bytes(d, sms);
    return BL_OK;
}

extern "C" bl_status bl_cuda_forward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                                     bl_tensor out, float *lse, float *tile_mass) {
    int sms = 0;
    BL_TRY(require_sm90_device(&sms));
    BL_TRY(bl_cuda_supports("CUDA forward", d->dtype, d->head_dim));
    BL_TRY(check_layout("q", q));
    BL_TRY(check_layout("k", k));
    BL_TRY(check_layout("v", v));
    BL_TRY(check_layout("out", out));

    FwdTmaParams tp;
    memset(&tp, 0, sizeof tp);
    const bool causal = d->causal != 0, stats = tile_mass != NULL;
    const bool bf16 = d->dtype == BL_DTYPE_BF16;
    // Kernel 2 wherever TMA can describe the tensors (its Q box is one work tile of nwg x 64
    // rows), else kernel 1 (128-row work tiles).
    int nwg = ws_consumers(d->head_dim);
    const bool use_tma =
        g_fwd_kernel_choice == kFwdKernelAuto &&
        bl_make_tensor_map(&tp.tm_q, q, d->batch, d->seqlen_q, d->heads_q, d->head_dim,
                           nwg * kRowsPerWarpgroup, bf16) &&
        bl_make_tensor_map(&tp.tm_k, k, d->batch, d->seqlen_k, d->heads_k, d->head_dim, kBlockN, bf16) &&
        bl_make_tensor_map(&tp.tm_v, v, d->batch, d->seqlen_k, d->heads_k, d->head_dim, kBlockN, bf16);
    if (!use_tma) nwg = kWarpgroups;
    const int block_m = nwg * kRowsPerWarpgroup;
    const int64_t num_mblocks = ceil_div(d->seqlen_q, block_m);
    const int64_t num_work = d->batch * d->heads_q * num_mblocks;
    if (num_work > INT_MAX || d->batch * d->heads_q > INT_MAX)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "CUDA forward: batch*heads_q*ceil(seqlen_q/%d)=%lld exceeds INT_MAX",
                            block_m, (long long)num_work);
    FwdParams &p = tp.p;
    p.q = (const uint16_t *)q.data;
    p.k = (const uint16_t *)k.data;
    p.v = (const uint16_t *)v.data;
    p.out = (uint16_t *)out.data;
    p.q_sb = q.stride_b, p.q_ss = q.stride_s, p.q_sh = q.stride_h;
    p.k_sb = k.stride_b, p.k_ss = k.stride_s, p.k_sh = k.stride_h;
    p.v_sb = v.stride_b, p.v_ss = v.stride_s, p.v_sh = v.stride_h;
    p.o_sb = out.stride_b, p.o_ss = out.stride_s, p.o_sh = out.stride_h;
    p.lse = lse;
    p.tile_mass = tile_mass;
    p.stats_ws = nullptr;
    p.seqlen_q = d->seqlen_q;
    p.seqlen_k = d->seqlen_k;
    p.batch = (int)d->batch;
    p.heads_q = (int)d->heads_q;
    p.heads_per_kv = (int)(d->heads_q / d->heads_k);
    p.num_mblocks = (int)num_mblocks;
    p.num_mtiles = (int)ceil_div(d->seqlen_q, BL_TILE_M);
    p.num_ktiles = (int)ceil_div(d->seqlen_k, BL_TILE_N);
    p.num_work = (int)num_work;
    // scale 0 would make a masked score 0 * inf = NaN; the smallest normal float gives the same
    // probabilities (every finite score times FLT_MIN rounds away against 1 inside exp2).
    float sl2 = d->scale * kLog2e;
    if (sl2 == 0.f) sl2 = FLT_MIN;
    p.scale_log2 = sl2;
    p.scale_positive = sl2 > 0.f;

    if (tile_mass) {
        const size_t need = stats_workspace_bytes(d, sms);
        if (d->workspace == NULL || d->workspace_bytes < need)
            return bl_set_error(BL_ERR_WORKSPACE,
                                "CUDA forward: workspace=%p of %zu bytes, the tile statistics need %zu",
                                d->workspace, d->workspace_bytes, need);
        p.stats_ws = (float *)d->workspace;
    }
    const int grid = (int)(num_work < sms ? num_work : sms);
    p.causal_group = causal_group_size(d, num_mblocks, grid);
    p.causal_rounds = grid > 0 ? (int)ceil_div((int64_t)p.causal_group * num_mblocks, grid) : 1;
    cudaStream_t stream = (cudaStream_t)d->stream;
    if (d->head_dim == 128)
        return bf16 ? dispatch_flags<128, true>(tp, use_tma, grid, stream, causal, stats)
                    : dispatch_flags<128, false>(tp, use_tma, grid, stream, causal, stats);
    return bf16 ? dispatch_flags<64, true>(tp, use_tma, grid, stream, causal, stats)
                : dispatch_flags<64, false>(tp, use_tma, grid, stream, causal, stats);
}
