// bwd_dqrows_sm90.cuh -- dQ by row tiles (the "dq-rows" path), head dim 128 or 64: the
// deterministic form's dQ (bl_attn_desc::deterministic: each row tile's sum in key order, by one
// CTA), and the dev variant BL_BWD_VARIANT_DQ_ROWS, which runs it on head-dim-128 calls to
// measure it.
//
// Why: the main kernels walk key tiles and add each entry's dQ into an fp32 accumulator that the
// preprocess zeroes and the postprocess converts; at 1 % kept that accumulator moves ~540 of a
// call's ~990 MB (bench/notes-bwd.md, eighteenth session). Here each CTA owns one 64-row tile of
// one query head, walks the key tiles its mask row keeps, recomputes S and dP for them and keeps
// dQ in registers: no accumulator, no zeros, no conversion, at the price of two more products
// per kept tile (S = Q K^T and dP = dO V^T, which the main kernel computes too). At head dim 128
// the main kernel then runs without its dQ (bwd_ws128_kernel<T, false>); at head dim 64, where
// version 6 has no such form, the deterministic call runs version 6 as usual (its dQ summed in
// the accumulator, unread) and this kernel in place of the postprocess.
//
// One warpgroup per CTA (three CTAs per SM with the one-stage ring), warp w owning query rows
// 16w..16w+15. Per step of 64 keys (half a key tile; a key tile's second half is skipped past Sk
// and above the causal diagonal):
//   S  (64 queries x 64 keys) = Q K^T     SS, both K-major
//   dP (64 x 64)              = dO V^T    SS, both K-major
//   P = exp2(S * scale*log2e - lse*log2e) (masked), dS = P * (dP - Dlt)
//   dQ (64 x D)              += dS K      RS (dS from registers), K MN-major
// Thread 0 loads Q / dO once and each step's K / V with TMA into a DQR_STAGES-deep ring; the
// tile's dQ (times scale, in T) leaves through shared memory by a TMA store per 64-column panel,
// zeros where the mask keeps nothing.
// The kernel also does the preprocess's work for the rows of its tile where it keeps a key tile
// (the only rows whose Dlt / lse the main kernel reads): Dlt = rowsum(dO * out) from the dO tile
// in shared memory and `out` read here, lse_log2 from lse, both written to the workspace for
// version 10, which runs after it. So a head-dim-128 call on this path has no preprocess and no
// postprocess.
#pragma once
#include "bwd_ws128_sm90.cuh"

namespace bl_bwd {

struct dqrows_params {
    // (D, S, H, B) views with (64, 64, 1, 1) boxes: 64 rows (or keys) of one 64-column panel.
    CUtensorMap tm_q, tm_do, tm_k, tm_v, tm_dq;
    const uint8_t *mask;          // (B, Hq, Tm, Tn); NULL: every tile is kept
    const uint16_t *out;          // (B, Sq, Hq, D) in T, strides out_sb / ss / sh
    int64_t out_sb, out_ss, out_sh;
    const float *lse;             // (B, Hq, Sq), natural log
    float *lse_log2, *dlt;        // (B, Hq, Sq_pad): written here for the kept row tiles
    bl_bwd_dims dm;
    float scale, scale_log2;
    int causal;
};

constexpr int DQR_THREADS = 128;
constexpr int DQR_ROWS = 64;     // query rows per CTA: one row tile (BM)
constexpr int DQR_KEYS = 64;     // keys per step
// K / V ring depth. One (three CTAs per SM) against two (two CTAs per SM), 18 pairings of calls
// at 1-10 % kept (bench/results/bwd-s27-dq-rows.txt, runs 3-4): faster in 14 (up to 7 %), 0.5-2 %
// slower in 4 (16k causal at 1 and 3 % among them): the CTAs' own steps overlap less, but a
// third CTA hides more of the latency-bound loads. -DBL_DQR_STAGES=2 builds the other.
#ifndef BL_DQR_STAGES
#define BL_DQR_STAGES 1
#endif
constexpr int DQR_STAGES = BL_DQR_STAGES;
// CTAs per SM: shared memory holds two with a two-deep ring, three with one.
constexpr int DQR_MIN_CTAS = DQR_STAGES == 1 ? 3 : 2;
static_assert(DQR_ROWS == BM && BN == 2 * DQR_KEYS, "a step is half a key tile of one row tile");

// D: the head dim, 128 or 64 (one or two 64-column panels a tile).
template <int D>
struct dqr_smem {
    static_assert(D == 64 || D == 128, "head dims of one or two panels");
    static constexpr uint32_t PANEL = 64 * PANEL_ROW_BYTES;   // 64 rows x 64 columns: 8 KB
    static constexpr uint32_t TILE = D / PANEL_COLS * PANEL;  // 64 rows x D
    static constexpr uint32_t Q = 0;                          // also the dQ staging at the end
    static constexpr uint32_t DO = Q + TILE;
    static constexpr uint32_t KV = DO + TILE;                 // stage s: K at KV + 2s TILE, V next
    static constexpr uint32_t BARS = KV + DQR_STAGES * 2 * TILE;  // QBAR, then FULL[stages]
    static constexpr uint32_t WARP_SUMS = BARS + 8 * (1 + DQR_STAGES);  // 4 ints: the list scan
    static constexpr uint32_t ROWS = WARP_SUMS + 16;          // fp32 lse_log2[64], dlt[64]
    static constexpr uint32_t LIST = ROWS + 2 * 64 * 4;       // ints: the steps' first keys / 64
    static constexpr uint32_t BASE_ALIGN = 1024;
    // The kernel's dynamic shared memory for Tn key tiles (two steps each at most).
    static size_t bytes(int64_t tiles_n) { return LIST + 2 * tiles_n * sizeof(int) + BASE_ALIGN; }
};

// The steps of row tile (b, h, m): step j covers keys 64 list[j] ..; built in order by all 128
// threads. Returns the count.
__device__ __forceinline__ int dqr_build_steps(const dqrows_params &p, int64_t b, int64_t h,
                                               int64_t m, int *list, int *warp_sums) {
    const bl_bwd_dims &dm = p.dm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The last key any row of the tile may see: query i sees keys j <= i + (Sk - Sq) (causal).
    int64_t last_key = dm.seqlen_k - 1;
    if (p.causal) {
        const int64_t diag_last = m * DQR_ROWS + DQR_ROWS - 1 + dm.seqlen_k - dm.seqlen_q;
        last_key = diag_last < last_key ? diag_last : last_key;
    }
    const uint8_t *mrow = p.mask ? p.mask + ((b * dm.heads_q + h) * dm.tiles_m + m) * dm.tiles_n : nullptr;
    int total = 0;
    for (int64_t base = 0; base < dm.tiles_n; base += DQR_THREADS) {
        const int64_t n = base + tid;
        const int64_t key0 = n * BN;
        const bool kept = n < dm.tiles_n && key0 <= last_key && (mrow == nullptr || mrow[n] != 0);
        const int steps = !kept ? 0 : key0 + DQR_KEYS <= last_key ? 2 : 1;
        // exclusive scan of steps over the CTA, in thread order
        int incl = steps;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        if (lane == 31) warp_sums[warp] = incl;
        __syncthreads();
        int before = total;
        for (int w = 0; w < warp; ++w) before += warp_sums[w];
        const int at = before + incl - steps;
        if (steps > 0) list[at] = (int)(2 * n);
        if (steps > 1) list[at + 1] = (int)(2 * n + 1);
        total += warp_sums[0] + warp_sums[1] + warp_sums[2] + warp_sums[3];
        __syncthreads();  // warp_sums is rewritten by the next round
    }
    return total;
}

// TMA of step j's K and V (64 keys from `key0`, kv head g, batch b) into the ring's stage.
template <int D>
__device__ __forceinline__ void dqr_load_kv(const dqrows_params &p, uint32_t sK, uint32_t bar,
                                            int64_t b, int64_t g, int64_t key0) {
    using L = dqr_smem<D>;
    mbarrier_arrive_expect_tx(bar, 2 * L::TILE);
#pragma unroll
    for (int panel = 0; panel < D / PANEL_COLS; ++panel) {
        tma_load_4d(sK + panel * L::PANEL, &p.tm_k, bar, panel * PANEL_COLS, (int)key0, (int)g,
                    (int)b);
        tma_load_4d(sK + L::TILE + panel * L::PANEL, &p.tm_v, bar, panel * PANEL_COLS,
                    (int)key0, (int)g, (int)b);
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(DQR_THREADS, DQR_MIN_CTAS) bwd_dqrows_kernel(const __grid_constant__ dqrows_params p) {
    using L = dqr_smem<D>;
    constexpr int NK = DQR_KEYS / 8;  // n8 tiles of keys (S, dP): 8
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
    const uint32_t s0 = bl_smem_addr(smem_base);
    const uint32_t qbar = s0 + L::BARS, full = qbar + 8;
    int *list = reinterpret_cast<int *>(smem_base + L::LIST);

    const bl_bwd_dims &dm = p.dm;
    // CTA -> (b, h, m), m fastest: neighbouring CTAs share their kv head's K / V in L2.
    const int64_t blk = blockIdx.x;
    const int64_t m = blk % dm.tiles_m, h = (blk / dm.tiles_m) % dm.heads_q,
                  b = blk / (dm.tiles_m * dm.heads_q);
    const int64_t g = h / dm.group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int lg = lane >> 2, lt = lane & 3;

    if (tid == 0) {
        mbarrier_init(qbar, 1);
        for (int s = 0; s < DQR_STAGES; ++s) mbarrier_init(full + 8 * s, 1);
        fence_mbarrier_init();
    }
    const int count =
        dqr_build_steps(p, b, h, m, list, reinterpret_cast<int *>(smem_base + L::WARP_SUMS));
    // (dqr_build_steps ends on a barrier: the list and the initialised mbarriers are visible.)

    float dq[D / 2];  // rows 16 warp + lg (+ 8), columns 8t + 2lt (+ 1): n8 tile t
#pragma unroll
    for (int x = 0; x < D / 2; ++x) dq[x] = 0.0f;

    if (count > 0) {
        if (tid == 0) {
            mbarrier_arrive_expect_tx(qbar, 2 * L::TILE);
#pragma unroll
            for (int panel = 0; panel < D / PANEL_COLS; ++panel) {
                tma_load_4d(s0 + L::Q + panel * L::PANEL, &p.tm_q, qbar, panel * PANEL_COLS,
                            (int)(m * DQR_ROWS), (int)h, (int)b);
                tma_load_4d(s0 + L::DO + panel * L::PANEL, &p.tm_do, qbar, panel * PANEL_COLS,
                            (int)(m * DQR_ROWS), (int)h, (int)b);
            }
            for (int j = 0; j < DQR_STAGES && j < count; ++j)
                dqr_load_kv<D>(p, s0 + L::KV + 2 * j * L::TILE, full + 8 * j, b, g,
                            (int64_t)list[j] * DQR_KEYS);
        }
        // ---- the preprocess's part: row rr's Dlt from columns D/2 half.. by this thread ----
        float *s_lse = reinterpret_cast<float *>(smem_base + L::ROWS), *s_dlt = s_lse + DQR_ROWS;
        {
            constexpr int CHUNKS = D / 16;  // this thread's 16-byte pieces of the row
            const int rr = tid >> 1, half = tid & 1;
            const int64_t i = m * DQR_ROWS + rr;
            const bool live = i < dm.seqlen_q;
            uint4 o[CHUNKS];
            const uint4 *src = reinterpret_cast<const uint4 *>(p.out + b * p.out_sb + i * p.out_ss +
                                                               h * p.out_sh + half * (D / 2));
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) o[c] = live ? src[c] : make_uint4(0u, 0u, 0u, 0u);
            const float l = live ? p.lse[(b * dm.heads_q + h) * dm.seqlen_q + i] : -INFINITY;
            mbarrier_wait(qbar, 0);
            // dO row rr from its chunk `first` on: chunk x of a panel's row at position
            // x ^ (rr % 8) (128B swizzle); at head dim 128 a thread's chunks are one panel's row
            const int first = half * CHUNKS;
            const unsigned char *drow =
                smem_base + L::DO + (first / 8) * L::PANEL + rr * PANEL_ROW_BYTES;
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) {
                const uint4 g =
                    *reinterpret_cast<const uint4 *>(drow + (((first % 8 + c) ^ (rr & 7)) << 4));
                const uint32_t ow[4] = {o[c].x, o[c].y, o[c].z, o[c].w};
                const uint32_t gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 of = bl_unpack2<T>(ow[e]), gf = bl_unpack2<T>(gw[e]);
                    dot = fmaf(of.x, gf.x, fmaf(of.y, gf.y, dot));
                }
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 1);
            if (half == 0) {
                // +inf where the row has no gradient (past Sq, or lse = -inf): exp2(s - inf) = 0
                const float l2 = l == -INFINITY ? INFINITY : l * LOG2E;
                const float dl = live ? dot : 0.0f;
                s_lse[rr] = l2;
                s_dlt[rr] = dl;
                const int64_t at = (b * dm.heads_q + h) * dm.seqlen_q_pad + i;
                p.lse_log2[at] = l2;
                p.dlt[at] = dl;
            }
        }
        __syncthreads();
        // this thread's two rows: r0 = 16 warp + lg and r0 + 8
        const int r0 = 16 * warp + lg;
        const float lse_r[2] = {s_lse[r0], s_lse[r0 + 8]};
        const float dlt_r[2] = {s_dlt[r0], s_dlt[r0 + 8]};
        const int64_t q0 = m * DQR_ROWS + r0;  // this thread's first query
        const int64_t diag = dm.seqlen_k - dm.seqlen_q;

        for (int j = 0; j < count; ++j) {
            const int st = j % DQR_STAGES;
            const uint32_t sK = s0 + L::KV + 2 * st * L::TILE, sV = sK + L::TILE;
            mbarrier_wait(full + 8 * st, (uint32_t)(j / DQR_STAGES) & 1u);
            const int64_t key0 = (int64_t)list[j] * DQR_KEYS;

            // ---- S = Q K^T and dP = dO V^T (two groups) ----
            float s[NK * 4], dp[NK * 4];
#pragma unroll
            for (int x = 0; x < NK * 4; ++x) s[x] = dp[x] = 0.0f;
            bl_reg_fence(s);
            bl_reg_fence(dp);
            bl_wgmma_fence();
            // acc (64 x 64) = A B^T over d, A and B 64-row tiles of two K-major panels; one group
            auto product = [&](float (&acc)[NK * 4], uint32_t sA, uint32_t sB) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const uint32_t off = (kk / 4) * L::PANEL + (kk % 4) * K16_BYTES_KMAJOR;
                    bl_wgmma_ss_n64<T, 0>(acc, bl_wgmma_desc(sA + off, 16, BL_WGMMA_GROUP_BYTES),
                                          bl_wgmma_desc(sB + off, 16, BL_WGMMA_GROUP_BYTES));
                }
                bl_wgmma_commit();
            };
            product(s, s0 + L::Q, sK);
            product(dp, s0 + L::DO, sV);
            bl_wgmma_wait<1>();  // S is done; dP may still run
            bl_reg_fence(s);

            // ---- P: recompute the probabilities from lse; zero what the mask forbids ----
            const bool need_mask = key0 + DQR_KEYS > dm.seqlen_k ||
                                   (p.causal && key0 + DQR_KEYS - 1 > m * DQR_ROWS + diag);
#pragma unroll
            for (int t = 0; t < NK; ++t)
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    float v = exp2f(fmaf(s[4 * t + x], p.scale_log2, -lse_r[x >> 1]));
                    if (need_mask) {
                        const int64_t key = key0 + 8 * t + 2 * lt + (x & 1);
                        const int64_t query = q0 + 8 * (x >> 1);
                        if (key >= dm.seqlen_k || (p.causal && key > query + diag)) v = 0.0f;
                    }
                    s[4 * t + x] = v;
                }
            bl_wgmma_wait<0>();  // dP is done
            bl_reg_fence(dp);

            // ---- dS = P * (dP - Dlt); dQ += dS K ----
#pragma unroll
            for (int x = 0; x < NK * 4; ++x) dp[x] = s[x] * (dp[x] - dlt_r[(x >> 1) & 1]);
            uint32_t dsa[DQR_KEYS / 16][4];
            pack_a_fragments<T>(dsa, dp);
            bl_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < DQR_KEYS / 16; ++ks)
                bl_wgmma_rs<T, D>(dq, dsa[ks],
                                      bl_wgmma_desc(sK + ks * K16_BYTES_MNMAJOR, L::PANEL,
                                                    BL_WGMMA_GROUP_BYTES));
            bl_wgmma_commit();
            bl_wgmma_wait<0>();
            bl_reg_fence(dq);
            bl_reg_fence(dsa);
            // Every warp's products have read the stage: it takes step j + DQR_STAGES.
            __syncthreads();
            if (tid == 0 && j + DQR_STAGES < count)
                dqr_load_kv<D>(p, sK, full + 8 * st, b, g,
                               (int64_t)list[j + DQR_STAGES] * DQR_KEYS);
        }
    }

    // ---- dQ * scale in T through the Q buffer (free: every product has completed) ----
    ws_stage_dkv<T, D / 2, DQR_ROWS>(s0 + L::Q, dq, p.scale, warp, lane);
    bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
    __syncthreads();
    if (tid == 0) {
#pragma unroll
        for (int panel = 0; panel < D / PANEL_COLS; ++panel)
            tma_store_4d(&p.tm_dq, s0 + L::Q + panel * L::PANEL, panel * PANEL_COLS,
                         (int)(m * DQR_ROWS), (int)h, (int)b);
        bulk_commit_group();
        bulk_wait_group_read<0>();  // the shared memory outlives the copy engine's reads
    }
}

}  // namespace bl_bwd
