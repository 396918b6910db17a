// attn_fwd_sm90.cu -- the sm_90a attention forward with compact tile statistics, and the CUDA
// backend's availability / workspace queries.
//
// Kernel shape (one CTA per SM, persistent; each CTA loops over work tiles of 128 query rows of
// one (batch, head)):
//   - two warpgroups, each owning 64 query rows (= one BL_TILE_M row tile of the statistics);
//   - K/V tiles of 128 keys (= one BL_TILE_N key tile), double-buffered in shared memory,
//     filled with cp.async by all threads one tile ahead of the math;
//   - S = Q K^T with wgmma (both operands in shared memory, 128B-swizzled panels), online
//     softmax in base 2 on the accumulator registers, O += P V with wgmma taking P from
//     registers (no shared-memory round trip) and V from shared memory (transposed operand).
//   - Statistics (template flag STATS, compiled out otherwise): after the exp of key tile n each
//     row's tile sum gives a log2-mass log2(tile_sum) + m_used; it is parked in the CTA's own slot
//     of the workspace ((grid, 128, Tn) floats, L2-resident, reused by the CTA's next work tile),
//     and the epilogue, once lse is known, reduces W[m, n] = sum_rows exp2(logmass - lse2) for its
//     64-row tile. Every W entry is written by exactly one thread: no atomics, no memset.
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <cuda_runtime.h>

#include "backend.h"
#include "bwd_workspace.h"
#include "cuda_check.cuh"
#include "ptx_sm90.cuh"

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
constexpr int kStages = 2;      // K/V ring depth: load tile n+1 while computing tile n
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
    float *stats_ws;   // stats_ws: (gridDim.x, kBlockM, Tn) fp32, per-row tile log2-masses
    int64_t seqlen_q, seqlen_k;
    int batch, heads_q, heads_per_kv;
    int num_mblocks;  // ceil(Sq / kBlockM)
    int num_mtiles;   // Tm = ceil(Sq / BL_TILE_M)
    int num_ktiles;   // Tn = ceil(Sk / BL_TILE_N)
    int num_work;     // batch * heads_q * num_mblocks
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

template <int D, bool BF16, bool CAUSAL, bool STATS>
__global__ void __launch_bounds__(kThreads, 1) attn_fwd_sm90_kernel(const __grid_constant__ FwdParams p) {
    using L = FwdSmem<D>;
    constexpr int kSRegs = kBlockN / 2;  // S accumulator: 64 rows x 128 keys over 128 threads
    constexpr int kORegs = D / 2;        // O accumulator: 64 rows x D over 128 threads
    constexpr int kQKSteps = D / kMmaK;
    constexpr int kPVSteps = kBlockN / kMmaK;

    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + (kSmemAlign - 1)) & ~(uint32_t)(kSmemAlign - 1);
    float *s_lse2 = reinterpret_cast<float *>(smem_raw + (base - raw) + L::kLse2);
    const uint32_t sQ = base + L::kQ;

    const int tid = threadIdx.x;
    const int wg = tid / kThreadsPerWarpgroup;
    const int warp = (tid % kThreadsPerWarpgroup) / 32;
    const int lane = tid % 32;
    const int quad_row = lane / 4;  // accumulator row inside the warp's 16 (and +8)
    const int quad_col = lane % 4;  // accumulator column pair inside each 8-column group
    const int wg_row0 = wg * kRowsPerWarpgroup + warp * kRowsPerWarp + quad_row;  // row in tile
    const float sl2 = p.scale_log2;
    const bool scale_pos = p.scale_positive != 0;
    // A masked score that turns into -inf once multiplied by the (signed) scale.
    const float masked_score = scale_pos ? -INFINITY : INFINITY;
    const int64_t causal_shift = p.seqlen_k - p.seqlen_q;  // query i sees keys j <= i + shift
    float *ws = STATS ? p.stats_ws + (int64_t)blockIdx.x * p.num_ktiles * kBlockM : nullptr;

    for (int round = 0;; ++round) {
        // Static schedule, round r gives CTA i work r*grid + i.
        // Non-causal: head-major order, so that the CTAs running at one time share one (b, h)
        // and its K/V stay in L2 instead of every CTA streaming a different head from memory.
        // Causal: work tiles differ in length (the row block's distance to the diagonal), so
        // they go longest first across all heads, and every other round runs in reverse CTA
        // order (snake) so that no CTA always draws the longest tile of its round.
        int slot_in_round = blockIdx.x;
        if (CAUSAL && (round & 1)) slot_in_round = gridDim.x - 1 - blockIdx.x;
        const int work = round * gridDim.x + slot_in_round;
        if (work >= p.num_work) break;
        int bh, mb;
        if (CAUSAL) {
            const int bh_count = p.batch * p.heads_q;
            mb = p.num_mblocks - 1 - work / bh_count;
            bh = work % bh_count;
        } else {
            bh = work / p.num_mblocks;
            mb = work - bh * p.num_mblocks;
        }
        const int b = bh / p.heads_q;
        const int h = bh - b * p.heads_q;
        const int hk = h / p.heads_per_kv;
        const int64_t row0 = (int64_t)mb * kBlockM;
        int n_end = p.num_ktiles;
        if (CAUSAL) {
            const int64_t last_row = min(row0 + kBlockM - 1, p.seqlen_q - 1);
            const int64_t last_key = last_row + causal_shift;
            n_end = last_key < 0 ? 0 : (int)min((int64_t)p.num_ktiles, last_key / kBlockN + 1);
        }
        const uint16_t *qg = p.q + b * p.q_sb + row0 * p.q_ss + h * p.q_sh;
        const uint16_t *kg = p.k + b * p.k_sb + hk * p.k_sh;
        const uint16_t *vg = p.v + b * p.v_sb + hk * p.v_sh;

        __syncthreads();  // the previous work tile is done with every shared buffer
        if (n_end > 0) {
            load_tile_async<D, kBlockM>(sQ, qg, p.q_ss, p.seqlen_q - row0);
            load_tile_async<D, kBlockN>(base + L::kK, kg, p.k_ss, p.seqlen_k);
            load_tile_async<D, kBlockN>(base + L::kV, vg, p.v_ss, p.seqlen_k);
            cp_async_commit();
        }

        float o[kORegs];
#pragma unroll
        for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY};  // running row max of scale*log2e*s
        float m_use[2] = {0.f, 0.f};              // the max actually subtracted (0 while -inf)
        float l_run[2] = {0.f, 0.f};              // this thread's share of the row sums

        for (int n = 0; n < n_end; ++n) {
            const int stage = n & 1;
            const uint32_t sK = base + L::kK + stage * L::kKVBytes;
            const uint32_t sV = base + L::kV + stage * L::kKVBytes;
            cp_async_wait<0>();
            fence_proxy_async_shared();
            __syncthreads();  // tile n visible to all; everyone is done with the other stage
            if (n + 1 < n_end) {
                const int64_t key0 = (int64_t)(n + 1) * kBlockN;
                const uint32_t nxt = (stage ^ 1) * L::kKVBytes;
                load_tile_async<D, kBlockN>(base + L::kK + nxt, kg + key0 * p.k_ss, p.k_ss,
                                            p.seqlen_k - key0);
                load_tile_async<D, kBlockN>(base + L::kV + nxt, vg + key0 * p.v_ss, p.v_ss,
                                            p.seqlen_k - key0);
                cp_async_commit();
            }

            // ---- S = Q K^T (64 x 128 per warpgroup) ----
            float s[kSRegs];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kQKSteps; ++kk) {
                const uint32_t koff = (kk % kKStepsPerPanel) * kMmaKBytes;
                const uint32_t qa = sQ + (kk / kKStepsPerPanel) * L::kQPanelBytes +
                                    wg * kRowsPerWarpgroup * BL_SWIZZLE_ROW_BYTES + koff;
                const uint32_t kb = sK + (kk / kKStepsPerPanel) * L::kKVPanelBytes + koff;
                mma_qk<BF16>(s, wgmma_desc_sw128(qa, kUnusedLbo, BL_SWIZZLE_GROUP_BYTES),
                             wgmma_desc_sw128(kb, kUnusedLbo, BL_SWIZZLE_GROUP_BYTES), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kSRegs; ++i) reg_fence(s[i]);

            // ---- mask: keys past Sk, and (causal) keys right of each row's diagonal ----
            const int64_t key_base = (int64_t)n * kBlockN;
            const bool need_mask = key_base + kBlockN > p.seqlen_k ||
                                   (CAUSAL && key_base + kBlockN - 1 > row0 + causal_shift);
            if (need_mask) {
                int lim[2];  // last allowed key of each of this thread's rows, relative to key_base
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    int64_t last = p.seqlen_k - 1;
                    if (CAUSAL) last = min(last, row0 + wg_row0 + 8 * r + causal_shift);
                    last -= key_base;
                    lim[r] = (int)max((int64_t)-1, min(last, (int64_t)kBlockN));
                }
#pragma unroll
                for (int j = 0; j < kSRegs / 4; ++j) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = 8 * j + 2 * quad_col + e;
                        if (key > lim[0]) s[4 * j + e] = masked_score;
                        if (key > lim[1]) s[4 * j + 2 + e] = masked_score;
                    }
                }
            }

            // ---- online softmax (base 2), row r = 0 (quad_row) and 1 (quad_row + 8) ----
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
            float alpha[2], neg_m[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float m_tile = quad_extreme(ext[r], scale_pos) * sl2;
                const float m_new = fmaxf(m_run[r], m_tile);
                // A row with no allowed key so far keeps max -inf: subtract 0 instead so that
                // exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
                const float mu = m_new == -INFINITY ? 0.f : m_new;
                alpha[r] = ex2_approx(m_run[r] - mu);
                m_run[r] = m_new;
                m_use[r] = mu;
                neg_m[r] = -mu;
            }
            float rowsum[2] = {0.f, 0.f};
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
            for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rowsum[r];

            // ---- P (bf16/fp16 A fragments, straight from the accumulator layout) ----
            uint32_t pa[kPVSteps][4];
#pragma unroll
            for (int kk = 0; kk < kPVSteps; ++kk) {
                pa[kk][0] = pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
                pa[kk][1] = pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
                pa[kk][2] = pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
                pa[kk][3] = pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
            }
#pragma unroll
            for (int j = 0; j < kORegs / 4; ++j) {
                o[4 * j + 0] *= alpha[0];
                o[4 * j + 1] *= alpha[0];
                o[4 * j + 2] *= alpha[1];
                o[4 * j + 3] *= alpha[1];
            }

            // ---- O += P V (V is the transposed, MN-major operand) ----
#pragma unroll
            for (int i = 0; i < kORegs; ++i) reg_fence(o[i]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kPVSteps; ++kk) {
                const uint32_t vb = sV + kk * (kMmaK * BL_SWIZZLE_ROW_BYTES);
                mma_pv<BF16>(o, pa[kk], wgmma_desc_sw128(vb, kVDescLbo, kVDescSbo));
            }
            wgmma_commit();
            if (STATS) {
                // While the tensor cores run P V: the row tile log2-mass of key tile n, parked in
                // the workspace until the row's lse is known. Two shuffles leave the quad's sum of
                // row (quad_col & 1) in every thread: exchange the row a thread does not keep, then
                // add the other pair's sum.
                const bool odd = quad_col & 1;
                float mine = odd ? rowsum[1] : rowsum[0];
                mine += __shfl_xor_sync(0xffffffffu, odd ? rowsum[0] : rowsum[1], 1);
                mine += __shfl_xor_sync(0xffffffffu, mine, 2);
                if (quad_col < 2)
                    __stcg(ws + (int64_t)(wg_row0 + 8 * quad_col) * p.num_ktiles + n,
                           lg2_approx(mine) + (odd ? m_use[1] : m_use[0]));
            }
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kORegs; ++i) reg_fence(o[i]);
        }

        // ---- epilogue: out, lse, and the tile mass of this warpgroup's 64-row tile ----
        float lse2[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(l_run[r]);
            // l == 0: no allowed key -> out 0, lse -inf (a NaN l stays NaN).
            const float inv_l = l == 0.f ? 0.f : 1.f / l;
            lse2[r] = lg2_approx(l) + m_use[r];
            const int64_t row = row0 + wg_row0 + 8 * r;
            if (row < p.seqlen_q) {
                uint16_t *og = p.out + b * p.o_sb + row * p.o_ss + h * p.o_sh + 2 * quad_col;
#pragma unroll
                for (int j = 0; j < kORegs / 4; ++j) {
                    const uint32_t v2 = pack2<BF16>(o[4 * j + 2 * r] * inv_l, o[4 * j + 2 * r + 1] * inv_l);
                    *reinterpret_cast<uint32_t *>(og + 8 * j) = v2;
                }
                if (quad_col == 0) p.lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + row] = lse2[r] * kLn2;
            }
        }
        if (STATS) {
            // Rows past Sq and rows without keys contribute 0: give them lse2 = +inf.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int64_t row = row0 + wg_row0 + 8 * r;
                if (quad_col == 0)
                    s_lse2[wg_row0 + 8 * r] =
                        (row < p.seqlen_q && lse2[r] != -INFINITY) ? lse2[r] : INFINITY;
            }
            named_barrier_sync(kBarrierWarpgroup0 + wg, kThreadsPerWarpgroup);
            const int64_t mtile = row0 / kRowsPerWarpgroup + wg;
            if (mtile < p.num_mtiles) {
                // One key tile per thread: 64 independent loads, coalesced across the warp.
                const float *lse2_rows = s_lse2 + wg * kRowsPerWarpgroup;
                const float *ws_rows = ws + (int64_t)(wg * kRowsPerWarpgroup) * p.num_ktiles;
                float *wrow = p.tile_mass +
                              (((int64_t)b * p.heads_q + h) * p.num_mtiles + mtile) * p.num_ktiles;
                for (int n = tid % kThreadsPerWarpgroup; n < p.num_ktiles; n += kThreadsPerWarpgroup) {
                    float w = 0.f;
                    if (n < n_end) {
#pragma unroll 16
                        for (int r = 0; r < kRowsPerWarpgroup; ++r)
                            w += ex2_approx(__ldcg(ws_rows + (int64_t)r * p.num_ktiles + n) - lse2_rows[r]);
                    }
                    wrow[n] = w;
                }
            }
        }
    }
}

// ---- host side ----

bl_status sm_count(int *count) {
    int dev = 0;
    BL_CUDA_CHECK(cudaGetDevice(&dev));
    BL_CUDA_CHECK(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, dev));
    return BL_OK;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Stats workspace: one (kBlockM, Tn) float slot per resident CTA (one CTA per SM).
size_t stats_workspace_bytes(const bl_attn_desc *d, int sms) {
    return (size_t)sms * (size_t)ceil_div(d->seqlen_k, kBlockN) * kBlockM * sizeof(float);
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

template <int D, bool BF16, bool CAUSAL, bool STATS>
bl_status launch(const FwdParams &p, int grid, cudaStream_t stream) {
    auto kernel = attn_fwd_sm90_kernel<D, BF16, CAUSAL, STATS>;
    const size_t smem = FwdSmem<D>::kDynamicBytes;
    BL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kThreads, smem, stream>>>(p);
    BL_CUDA_CHECK_LAUNCH("attn_fwd_sm90_kernel");
    return BL_OK;
}

template <int D, bool BF16>
bl_status dispatch_flags(const FwdParams &p, int grid, cudaStream_t stream, bool causal, bool stats) {
    if (causal) return stats ? launch<D, BF16, true, true>(p, grid, stream)
                             : launch<D, BF16, true, false>(p, grid, stream);
    return stats ? launch<D, BF16, false, true>(p, grid, stream)
                 : launch<D, BF16, false, false>(p, grid, stream);
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

extern "C" bl_status bl_cuda_workspace_size(const bl_attn_desc *d, bl_op op, int with_stats,
                                            size_t *bytes) {
    if (op == BL_OP_BACKWARD) return bl_cuda_bwd_workspace_size(d, bytes);
    if (op != BL_OP_FORWARD) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "op=%d is not a bl_op", (int)op);
    *bytes = 0;
    if (!with_stats) return BL_OK;
    int sms = 0;
    BL_TRY(sm_count(&sms));
    *bytes = stats_workspace_bytes(d, sms);
    return BL_OK;
}

extern "C" bl_status bl_cuda_forward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                                     bl_tensor out, float *lse, float *tile_mass) {
    if (d->dtype != BL_DTYPE_BF16 && d->dtype != BL_DTYPE_F16)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "CUDA forward: dtype=%d is not supported (bf16 and fp16 only)", (int)d->dtype);
    if (d->head_dim != 64 && d->head_dim != 128)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "CUDA forward: head_dim=%lld is not supported (64 and 128 only)",
                            (long long)d->head_dim);
    BL_TRY(check_layout("q", q));
    BL_TRY(check_layout("k", k));
    BL_TRY(check_layout("v", v));
    BL_TRY(check_layout("out", out));

    const int64_t num_mblocks = ceil_div(d->seqlen_q, kBlockM);
    const int64_t num_work = d->batch * d->heads_q * num_mblocks;
    if (num_work > INT_MAX || d->batch * d->heads_q > INT_MAX)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "CUDA forward: batch*heads_q*ceil(seqlen_q/%d)=%lld exceeds INT_MAX",
                            kBlockM, (long long)num_work);

    int sms = 0;
    BL_TRY(sm_count(&sms));
    FwdParams p;
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
    cudaStream_t stream = (cudaStream_t)d->stream;
    const bool causal = d->causal != 0, stats = tile_mass != NULL;
    const bool bf16 = d->dtype == BL_DTYPE_BF16;
    if (d->head_dim == 128)
        return bf16 ? dispatch_flags<128, true>(p, grid, stream, causal, stats)
                    : dispatch_flags<128, false>(p, grid, stream, causal, stats);
    return bf16 ? dispatch_flags<64, true>(p, grid, stream, causal, stats)
                : dispatch_flags<64, false>(p, grid, stream, causal, stats);
}
