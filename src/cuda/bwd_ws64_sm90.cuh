// bwd_ws64_sm90.cuh -- backward main kernel version 6, head dim 64: the paired kernel's math
// (bwd_wgmma64p_sm90.cuh, two list entries per iteration) with a producer warpgroup, as versions
// 8 / 9 do at head dim 128 (bwd_ws128_sm90.cuh), and its two consumer warpgroups out of step:
//   warpgroup 0, producer (24 registers): thread 0 loads the column's K / V (KV mbarrier) and
//     each pair with TMA into a two-buffer ring (FULL / EMPTY mbarriers); thread 32 issues the
//     dQ reduce-adds of each consumer warpgroup's staged block (DQFULL / DQEMPTY per warpgroup;
//     one staging buffer per warp).
//   warpgroups 1 and 2, consumers (240 registers): per pair S^T, dP^T, the exponentials and dS,
//     then dV, dK and the previous pair's dQ. The warpgroups take turns to issue their products
//     (named barriers WS64_TURN0 + wg: warpgroup 0's S^T / dP^T, then 1's, then 0's dV / dK,
//     then 1's, ...), so that one warpgroup's exponentials and dS run while the other's products
//     do, as FlashAttention-3's forward ping-pong does (version 5 ran both in step, and the
//     tensor cores idled while both computed exponentials: the turns took 3-4.5 % off at
//     16k x 16 x 64, the exponentials' loop without branches 4-6 % more; bench/notes-bwd.md,
//     seventeenth session). dS goes between them through a two-buffer ring (DSFULL / DSEMPTY
//     mbarriers): either warpgroup's dQ of pair k needs both key halves. At the end dK / dV go
//     out by TMA stores from the freed Q buffers.
#pragma once
#include "bwd_wgmma64p_sm90.cuh"
#include "bwd_ws128_sm90.cuh"

namespace bl_bwd {

static_assert(wg64p_smem::DQS - wg64p_smem::BARS >= ws_bars::BYTES, "room for the mbarriers");

// Named barriers 3 and 4: warpgroup 0's / 1's turn to issue products (1 is WS_BAR_LOOP_TOP).
constexpr int WS64_TURN0 = 3;

// Dev only (-DBL_BWD_COLS64, dev/cuda/attn_bwd.cu `cols64`; apart from BL_BWD_TIMELINE, whose
// stamps sit inside the pair loop): every CTA's SM, entry count and clock64 at TL64_POINTS places
// -- 0 the CTA's start (producer thread 0), 1 its K / V landed, 2 the pair loop's end, 3 dK / dV
// staged (consumer thread 0), 4 their stores' reads done (the same; the end waits are `.read`
// waits since c51bf20), 5 the reducer's last reduce-adds' reads done -- so that the host can
// split each SM's time into launch gaps, column starts, pairs and column ends
// (bl_bwd_cols64_print). One predicated store per stamp, outside the pair loop.
#ifdef BL_BWD_COLS64
constexpr int TL64_CTAS = 8192, TL64_POINTS = 6;
__device__ long long bl_bwd_tl64[TL64_CTAS][TL64_POINTS];
__device__ int bl_bwd_tl64_info[TL64_CTAS][2];  // SM id, entry count
__device__ int bl_bwd_tl64_grid;
// Stamp i of slot `slot` (a CTA, or the persistent form's schedule position).
__device__ __forceinline__ void bl_tl64_store_at(bool on, int slot, int i) {
    on = on && slot < TL64_CTAS;
    long long *a = &bl_bwd_tl64[slot < TL64_CTAS ? slot : 0][i];
    asm volatile("{\n.reg .pred p;\n.reg .u64 t;\nsetp.ne.u32 p, %0, 0;\nmov.u64 t, %%clock64;\n"
                 "@p st.global.u64 [%1], t;\n}\n" ::"r"((unsigned)on),
                 "l"(a)
                 : "memory");
}
__device__ __forceinline__ void bl_tl64_store(bool on, int i) {
    bl_tl64_store_at(on, (int)blockIdx.x, i);
}
// Slot `slot`'s SM and entry count; slot 0 also publishes how many slots the launch fills.
__device__ __forceinline__ void bl_tl64_info_at(int slot, int count, int slots) {
    if (slot >= TL64_CTAS) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    bl_bwd_tl64_info[slot][0] = (int)sm;
    bl_bwd_tl64_info[slot][1] = count;
    if (slot == 0) bl_bwd_tl64_grid = slots;
}
__device__ __forceinline__ void bl_tl64_info(int count) {
    bl_tl64_info_at((int)blockIdx.x, count, (int)gridDim.x);
}
#define BL_TL64(on, i) bl_tl64_store(on, i)
#define BL_TL64_INFO(count) bl_tl64_info(count)
// The persistent form (bwd_ws64p_sm90.cuh) stamps by schedule position `pos` instead of by CTA,
// at the same places as seen by its consumer thread 0 (a CTA's columns follow one another on
// its SM, so the printer's "gaps" are the time from one column's end to the next one's start),
// and publishes the column count as the grid. Points 4 and 5 are both the column's end in the
// consumers (the last dQ staged): the persistent form's stores and reduce-adds overlap the next
// column, and each SM's span is then its CTA's whole walk (max against mean: the walk's balance).
#define BL_TL64P(on, pos, i) bl_tl64_store_at(on, pos, i)
#define BL_TL64P_INFO(on, pos, count, num_cols)        \
    do {                                               \
        if (on) bl_tl64_info_at(pos, count, num_cols); \
    } while (0)
#else
#define BL_TL64P(on, pos, i) \
    do {                     \
    } while (0)
#define BL_TL64P_INFO(on, pos, count, num_cols) \
    do {                                        \
    } while (0)
#define BL_TL64(on, i) \
    do {               \
    } while (0)
#define BL_TL64_INFO(count) \
    do {                    \
    } while (0)
#endif

// This kernel's mbarriers: ws_bars' FULL / EMPTY; DQFULL / DQEMPTY one per consumer warpgroup
// (index wg); and the dS ring, the column's K / V and the prefetch's signal, in ws_bars' slots
// that only the persistent kernels use.
struct ws64_bars {
    static constexpr uint32_t DSFULL = ws_bars::KVFULL;        // [2] a pair's dS, all 256 threads
    static constexpr uint32_t DSEMPTY = DSFULL + 16;           // [2] read by both dQ products
    static constexpr uint32_t KV = DSEMPTY + 16;               // the column's K / V landed (TMA)
    static constexpr uint32_t PF = KV + 8;  // the reducer's go for the next column's prefetch
    static_assert(PF + 8 <= ws_bars::BYTES, "inside the mbarrier area");
};

// The staging of a column's last dQ: the dS buffer of pair pairs - 2, free once both warpgroups
// are past that pair's dQ (at pairs == 1 the unused buffer 1). Its own staging (one buffer per
// warp, L::DQS) would first have to wait for the reducer to read pair pairs - 2's dQ out of it: at a
// column's end the reduce-adds of the last two pairs then ran one after another, ~3,000 clocks
// from dK / dV staged to the reducer's end against ~1,200 for the dK / dV stores (`attn_bwd
// cols64`). Measured (bench/results/bwd-s59-column-end.txt run 5): the main kernel at 16k x 16 x 64
// -0.7 / -1.1 % dense, -1.2..-2.7 % at 3-10 % kept, level to -0.5 % with a causal mask.
__device__ __forceinline__ uint32_t ws64_last_dq_staging(uint32_t s0, int pairs) {
    return s0 + wg64p_smem::DS + (uint32_t)((pairs - 2) & 1) * wg64p_smem::DS_BUF;
}
static_assert(WARPS * DQ_WARP_BYTES <= wg64p_smem::DS_BUF, "a dQ staging fits a dS buffer");

// A column's start -- its K / V and first pair by TMA, which nothing overlaps, since the next CTA
// on the SM starts only when this one leaves -- read DRAM: ~a quarter of a 1 %-kept call's main
// kernel went to column starts and tails (bench/notes-bwd.md, twenty-seventh session). So the
// producer prefetches into L2, while the CTA runs, what the CTA at schedule position `pos`
// (handed this SM or another about one column later) loads first: its K / V boxes and its first
// WS64_PREFETCH_PAIRS pairs' Q / dO boxes and lse / Dlt rows. Hints only: nothing waits for
// them, and a box past the tensor's end is clipped as the loads' are. 32-bit index arithmetic
// (column ids fit): a 64-bit division is a call of ptxas's division helper. Measured
// (bench/results/bwd-s57-column-prefetch.txt): the main kernel -9 % at 16k x 16 x 64 with 1 %
// kept, -3 % at 3 %, causal 3 % -6 %, dense level; two pairs level with one. The same prefetch in
// version 10, a column ahead of its draws, cost +3..+48 us: its TMA unit carries the dQ
// reduce-adds too.
constexpr int WS64_PREFETCH_PAIRS = 1;
// The prefetch waits for the reducer's signal (mbarrier PF), given once it has issued the dQ of
// pair pairs - 1 - WS64_PREFETCH_LEAD, so that the boxes land a few microseconds before the next
// column starts whatever the column's length (a prefetch a whole long column ahead is evicted
// from L2 before its use). Shorter columns prefetch once their own K / V have landed. Measured
// (bench/results/bwd-s58-prefetch-lead.txt): the main kernel at 16k x 16 x 64 with a causal mask
// -2.8 % at 25 % kept, -0.8 / -1.9 % on video W at negl 0.05 / 0.2, level without one; a lead
// of 1 pair lost 3-8 % at 0.8-3 % kept, 2 pairs 3 % with a causal mask at 3 % (too late for
// short columns), 8 gained less than 4.
constexpr int WS64_PREFETCH_LEAD = 4;
__device__ __forceinline__ void ws64_prefetch_next_column(const bwd_params &p, unsigned pos) {
    if (pos >= gridDim.x) return;
    const bl_bwd_dims &dm = p.dm;
    const int4 rec = p.sched_rec[pos];
    if (rec.y <= 0) return;
    const unsigned col = (unsigned)rec.x, tiles_n = (unsigned)dm.tiles_n;
    const int n = (int)(col % tiles_n);
    const int g = (int)((col / tiles_n) % (unsigned)dm.heads_k);
    const int b = (int)(col / (tiles_n * (unsigned)dm.heads_k));
    tma_prefetch_l2_4d(&p.tm_k, 0, n * BN, g, b);  // head dim 64: one 64-column panel
    tma_prefetch_l2_4d(&p.tm_v, 0, n * BN, g, b);
    const int *list = p.lists + (int64_t)col * (dm.group * dm.tiles_m);
    const int first = rec.y < 2 * WS64_PREFETCH_PAIRS ? rec.y : 2 * WS64_PREFETCH_PAIRS;
    for (int s = 0; s < first; ++s) {
        const wg64p_entry e = wg64p_decode(p, g, list[s]);
        tma_prefetch_l2_4d(&p.tm_q, 0, e.row0, e.h, b);
        tma_prefetch_l2_4d(&p.tm_do, 0, e.row0, e.h, b);
        const int64_t rows = ((int64_t)b * dm.heads_q + e.h) * dm.seqlen_q_pad + e.row0;
        bulk_prefetch_l2(p.lse_log2 + rows, BM * sizeof(float));
        bulk_prefetch_l2(p.dlt + rows, BM * sizeof(float));
    }
}

// The pair body shared by version 6 and its persistent form (bwd_ws64p_sm90.cuh), in pieces
// that leave both kernels' SASS as it was (checked instruction for instruction; the dS stores
// through store_ds_tile renamed two of the persistent kernel's uniform registers, nothing else,
// and measured level: bench/results/bwd-s122-dedupe-checks.txt). The masked exponentials stay a
// lambda in each kernel: as a shared function (masked a parameter or a template argument) they
// changed version 6's SASS, which no device run has timed.
constexpr int WS64_NQ = PAIR_ROWS / 8;  // n8 tiles of queries (S^T, dP^T): 16
constexpr int WS64_NQ_ENTRY = BM / 8;   // of them per entry: 8

// S^T = K Q^T into s and dP^T = V dO^T into ds: this warpgroup's 64 keys of the K / V panels at
// sK / sV against the pair's 128 queries, one commit group each (the caller has declared s
// overwritten and taken its turn). The first step of each product does not accumulate.
template <typename T>
__device__ __forceinline__ void ws64_issue_s_dp(float (&s)[WS64_NQ * 4], float (&ds)[WS64_NQ * 4],
                                                uint32_t sK, uint32_t sV, uint32_t sQ,
                                                uint32_t sdO, int wg) {
    constexpr int KSTEPS_D = 64 / 16;
    bl_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS_D; ++kk)
        bl_wgmma_ss_n128<T>(
            s,
            bl_wgmma_desc(sK + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR, 16,
                          BL_WGMMA_GROUP_BYTES),
            bl_wgmma_desc(sQ + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES), kk > 0);
    bl_wgmma_commit();
    bl_acc_overwritten(ds);
    bl_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS_D; ++kk)
        bl_wgmma_ss_n128<T>(
            ds,
            bl_wgmma_desc(sV + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR, 16,
                          BL_WGMMA_GROUP_BYTES),
            bl_wgmma_desc(sdO + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES), kk > 0);
    bl_wgmma_commit();
}

// Per entry of the pair (row0: its first query): whether the column's keys need masking for it
// (keys past Sk, or a causal mask reaching into the column) and the causal reach, key - query <=
// causal_limit (2 BN where there is none), clamped to +-2 BN so that it fits an int.
__device__ __forceinline__ void ws64_mask_reach(const bwd_params &p, int64_t key0, int64_t diag,
                                                const int (&row0)[2], bool (&need_mask)[2],
                                                int (&causal_limit)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        need_mask[e] = key0 + BN > p.dm.seqlen_k || (p.causal && key0 + BN - 1 > row0[e] + diag);
        int64_t room = row0[e] + diag - key0;
        room = room > 2 * BN ? 2 * BN : room;
        room = room < -2 * BN ? -2 * BN : room;
        causal_limit[e] = p.causal ? (int)room : 2 * BN;
    }
}

// This thread's Dlt pairs of the pair's queries (an empty second slot's zeros).
__device__ __forceinline__ void ws64_load_dlt(float2 (&dlt_r)[WS64_NQ], const float *dlt,
                                              bool empty1, int lt) {
#pragma unroll
    for (int t = 0; t < WS64_NQ; ++t) {
        dlt_r[t] = *reinterpret_cast<const float2 *>(dlt + 8 * t + 2 * lt);
        if (t >= WS64_NQ_ENTRY && empty1) dlt_r[t] = make_float2(0.0f, 0.0f);
    }
}

// SPLIT (bwd_params::head_split > 1: bl_bwd_head_split): the CTA's column is one part of a
// column's query heads -- its record's part (rec.w), its list the run of those heads' entries
// (ws_part_run) -- and its dK / dV go to fp32 partials from registers (ws_store_dkv_part) instead
// of staged and stored by TMA. Its own instantiation, so that the unsplit kernel keeps its SASS.
template <typename T, bool SPLIT = false>
__global__ void __launch_bounds__(WS_THREADS, 1) bwd_ws64_kernel(const __grid_constant__ bwd_params p) {
    constexpr int D = 64;
    using L = wg64p_smem;
    constexpr int NQ = PAIR_ROWS / 8;  // n8 tiles of queries (S^T, dP^T): 16
    constexpr int NQ_ENTRY = BM / 8;   // of them per entry: 8
    constexpr int ND = D / 8;          // n8 tiles of head dim (dK, dV, dQ): 8
    constexpr int KSTEPS_Q = PAIR_ROWS / 16;  // dV / dK steps over the pair's queries: 8
    constexpr int WG_WARPS = WARPS / 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
    const uint32_t s0 = bl_smem_addr(smem_base);
    const uint32_t bars = s0 + L::BARS;
    const float *s_rows = reinterpret_cast<const float *>(smem_base + L::ROWS);

    const bl_bwd_dims &dm = p.dm;
    // The column and its entry count in one load (the schedule's record): at 1 % kept a column's
    // start and first loads -- then the schedule, the count, the list, the TMA and the K / V
    // cp.async of 256 threads -- were about a quarter of the kernel's warp time
    // (bench/results/bwd-s29-d64-fixed-costs.txt runs 3 and 5).
    // Decoded in 32 bits, as ws_decode does (col < 2^31: bl_bwd_lists_launch): in 64 bits three
    // divisions, each a branch to ptxas's helper, ran in every thread before the producer could
    // issue the column's K / V: the main kernel 1-2.4 % slower at 3 % kept, 0.6 % dense
    // (bench/results/bwd-s71-gqa-split.txt call 5).
    const int4 rec = p.sched_rec[blockIdx.x];
    const int col32 = rec.x, tn = (int)dm.tiles_n, hk = (int)dm.heads_k;
    const int bg = col32 / tn, b32 = bg / hk;
    const int64_t col = col32, n = col32 - bg * tn, g = bg - b32 * hk, b = b32;
    int count = rec.y;
    const int *list = p.lists + col * (dm.group * dm.tiles_m);
    if constexpr (SPLIT) ws_part_run(p, rec.w, p.head_split, list, count);
    const int pairs = (count + 1) / 2;

    BL_TL64(threadIdx.x == 0, 0);
    if (threadIdx.x == 0) {
        BL_TL64_INFO(count);
        for (int i = 0; i < 2; ++i) {
            mbarrier_init(bars + ws_bars::FULL + 8 * i, 1);
            mbarrier_init(bars + ws_bars::EMPTY + 8 * i, THREADS);  // every consumer thread
            mbarrier_init(bars + ws_bars::DQFULL + 8 * i, WG_WARPS);
            mbarrier_init(bars + ws_bars::DQEMPTY + 8 * i, 1);
            mbarrier_init(bars + ws64_bars::DSFULL + 8 * i, THREADS);
            mbarrier_init(bars + ws64_bars::DSEMPTY + 8 * i, THREADS);
        }
        mbarrier_init(bars + ws64_bars::KV, 1);
        mbarrier_init(bars + ws64_bars::PF, 1);
        fence_mbarrier_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        // ---- producer warpgroup ----
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            // The column's K / V first (it needs only the record), then pair it into buffer
            // it & 1 once pair it-2 has been read (the first wait on each EMPTY passes at once).
            if (count > 0)
                ws_tma_kv_tile<D>(p, s0 + L::K, s0 + L::V, bars + ws64_bars::KV, b, g, n * BN);
            for (int it = 0; it < pairs; ++it) {
                const int buf = it & 1;
                mbarrier_wait(bars + ws_bars::EMPTY + 8 * buf, ((uint32_t)(it >> 1) & 1u) ^ 1u);
                const wg64p_entry e[2] = {
                    wg64p_decode(p, (int)g, list[2 * it]),
                    wg64p_decode(p, (int)g, 2 * it + 1 < count ? list[2 * it + 1] : -1)};
                wg64p_tma_pair(p, s0, buf, b, e);  // an empty slot's lse / Dlt: see `empty1` below
            }
        } else if (threadIdx.x == 32) {
            // Pair k's dQ, staged by each consumer warpgroup on its own (warps 4w.. hold entry
            // w's rows), reduced in the warpgroups' order.
            for (int k = 0; k < pairs; ++k) {
                const wg64p_entry e[2] = {
                    wg64p_decode(p, (int)g, list[2 * k]),
                    wg64p_decode(p, (int)g, 2 * k + 1 < count ? list[2 * k + 1] : -1)};
                // The last pair's dQ comes in its own staging (ws64_last_dq_staging); pair k's
                // staging is rewritten by pair k + 1's only where k + 1 is not the last pair.
                const uint32_t stage =
                    k == pairs - 1 ? ws64_last_dq_staging(s0, pairs) : s0 + L::DQS;
                const bool reused = k + 2 < pairs;
#pragma unroll 1
                for (int w = 0; w < 2; ++w) {
                    const wg64p_entry mine = w == 0 ? e[0] : e[1];  // (no local-memory array)
                    mbarrier_wait(bars + ws_bars::DQFULL + 8 * w, (uint32_t)k & 1u);
                    // The last pair's staging waits only for this wait to have passed: DQFULL's
                    // phases must not run two ahead of it (they did, and it hung).
                    if (k == pairs - 2) mbarrier_arrive(bars + ws_bars::DQEMPTY + 8 * w);
                    if (mine.live()) {
#pragma unroll 1
                        for (int j = 0; j < WG_WARPS; ++j)
                            dq_block_reduce(p, stage + (uint32_t)(WG_WARPS * w + j) * DQ_WARP_BYTES,
                                            0, mine.h, mine.row0 + 16 * j, (int)b);
                    }
                    if (reused) {
                        bulk_wait_group_read<0>();  // the staging may be rewritten
                        mbarrier_arrive(bars + ws_bars::DQEMPTY + 8 * w);
                    }
                }
                if (k == pairs - 1 - WS64_PREFETCH_LEAD) mbarrier_arrive(bars + ws64_bars::PF);
            }
            bulk_wait_group_read<0>();  // the staging outlives the reduce-adds' reads
            BL_TL64(true, 5);
        } else if (threadIdx.x == 64 && p.prefetch_ahead > 0) {
            // Warp 2, otherwise idle: on a long column at the reducer's PF signal (above), on a
            // short one once the column's K / V have landed (KV and PF complete once per CTA), so
            // that the prefetch queues in the TMA unit behind the first pairs' loads
            // (issued beside them it cost +1.2 % at 16k x 16 causal 25 % kept; issued by thread
            // 0 behind them ptxas scheduled the consumers' loop otherwise: dense +0.85 %).
            if (pairs > WS64_PREFETCH_LEAD) mbarrier_wait(bars + ws64_bars::PF, 0);
            else if (count > 0) mbarrier_wait(bars + ws64_bars::KV, 0);
            ws64_prefetch_next_column(p, blockIdx.x + (unsigned)p.prefetch_ahead);
        }
        return;
    }

    // ---- consumer warpgroups ----
    // Per pair it, each warpgroup: [turn] S^T, dP^T [pass the turn]; P^T, dS^T; [turn] dV, dK
    // [pass the turn]; dS into DS[it & 1]; pair it-1's dQ from DS[(it-1) & 1], staged. Every
    // turn is taken and passed once per warpgroup and phase: warpgroup 1 passes one in advance
    // and warpgroup 0 takes that one back after the loop.
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;         // consumer thread 0..255
    const int lane = ct & 31, warp = ct >> 5;  // consumer warp 0..7
    const int wg = warp >> 2;                  // keys 64wg..64wg+63; dQ of entry wg
    const int lg = lane >> 2, lt = lane & 3;
    const int64_t key0 = n * BN;
    const int kw = warp * KEYS_PER_WARP;
    const uint32_t sdq = s0 + L::DQS + (uint32_t)warp * DQ_WARP_BYTES;
    const uint32_t dqfull = bars + ws_bars::DQFULL + 8 * wg;
    const uint32_t dqempty = bars + ws_bars::DQEMPTY + 8 * wg;

    float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
    for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;

    if (count > 0) {
        mbarrier_wait(bars + ws64_bars::KV, 0u);  // K / V by TMA (the producer)
        BL_TL64(ct == 0, 1);
        if (wg == 1) named_barrier_arrive(WS64_TURN0, THREADS);  // warpgroup 0 issues first
    }

    const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag
    const int64_t key_room = dm.seqlen_k - key0;
    const int key_limit = key_room < BN ? (int)key_room : BN;

    // Pair it-1's dQ, issued in iteration it. Zeroed once out here (a variant that carried it
    // into the next iteration needed that for ptxas not to serialise the products, C7518).
    float dq[ND * 4];
#pragma unroll
    for (int x = 0; x < ND * 4; ++x) dq[x] = 0.0f;
    for (int it = 0; it < pairs; ++it) {
        const int buf = it & 1;
        mbarrier_wait(bars + ws_bars::FULL + 8 * buf, (uint32_t)(it >> 1) & 1u);
        BL_TLC(0);
        const uint32_t sQ = s0 + L::Q + buf * L::PANEL;
        const uint32_t sdO = s0 + L::DO + buf * L::PANEL;
        const float *lse2 = s_rows + buf * PAIR_ROWS;
        const float *dlt = s_rows + (2 + buf) * PAIR_ROWS;
        // The last pair of an odd list has an empty second slot: its Q / dO are zeros (TMA past
        // Sq) and its lse / Dlt are taken as +inf / 0 here (the buffer holds stale rows), so
        // that its P and dS are 0.
        const bool empty1 = 2 * it + 1 == count;

        // ---- S^T = K Q^T and dP^T = V dO^T (this warpgroup's 64 keys x 128 queries) ----
        // (The first step of each product does not accumulate: nothing is zeroed.)
        float s[NQ * 4], ds[NQ * 4];
        bl_acc_overwritten(s);
        named_barrier_sync(WS64_TURN0 + wg, THREADS);
        ws64_issue_s_dp<T>(s, ds, s0 + L::K, s0 + L::V, sQ, sdO, wg);
        named_barrier_arrive(WS64_TURN0 + (wg ^ 1), THREADS);
        BL_TLC(1);
        // Row starts of this pair's entries, for the masks (an empty slot's are never used).
        int row0_e[2] = {0, 0};
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            int hl, m;
            if (2 * it + slot < count) {
                ws_split_code(list[2 * it + slot], (int)dm.tiles_m, dm.group == 1, hl, m);
                row0_e[slot] = m * BM;
            }
        }
        bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
        bl_reg_fence(s);
        BL_TLC(2);

        // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
        bool need_mask[2];
        int causal_limit[2];
        ws64_mask_reach(p, key0, diag, row0_e, need_mask, causal_limit);
        // One branch per pair between two copies of the loop: a branch per n8 tile (as before)
        // cut the 64 exponentials into 16 blocks, and one mask pass after them was if-converted
        // by ptxas into ~260 predicated instructions on every pair.
        auto exps = [&](bool masked) {
#pragma unroll
            for (int t = 0; t < NQ; ++t) {
                const int e = t / NQ_ENTRY;  // which entry these 8 queries belong to
                float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
                if (e == 1 && empty1) l = make_float2(INFINITY, INFINITY);
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    s[4 * t + x] = exp2f(fmaf(s[4 * t + x], p.scale_log2, (x & 1) ? -l.y : -l.x));
                    if (masked) {
                        const int jr = kw + lg + ((x >> 1) << 3);              // key - key0
                        const int ir = 8 * (t % NQ_ENTRY) + 2 * lt + (x & 1);  // query - row0
                        if (need_mask[e] && (jr >= key_limit || jr - ir > causal_limit[e]))
                            s[4 * t + x] = 0.0f;
                    }
                }
            }
        };
        if (need_mask[0] || need_mask[1])
            exps(true);
        else
            exps(false);

        // ---- dS^T = P^T * (dP^T - Dlt), then both A operands packed ----
        // Dlt read before the wait: right after it the LDS waited behind the products (-1 %,
        // bench/results/bwd-s11-d64.txt).
        BL_TLC(3);
        float2 dlt_r[NQ];
        ws64_load_dlt(dlt_r, dlt, empty1, lt);
        bl_wgmma_wait<0>();  // dP^T is done
        bl_reg_fence(ds);
        BL_TLC(4);
        ds_from_dp<NQ>(ds, s, dlt_r);
        uint32_t pa[KSTEPS_Q][4], dsa[KSTEPS_Q][4];
        wg64p_pack_a<T>(s, ds, pa, dsa);

        // ---- dV += P^T dO and dK += dS^T Q (A from registers), dS to shared memory ----
        named_barrier_sync(WS64_TURN0 + wg, THREADS);
        bl_wgmma_fence();
        wg64p_issue_dv_dk<T, D>(dv_acc, dk_acc, pa, dsa, sdO, sQ);
        bl_wgmma_commit();
        // The turn passes here, not after the dQ issue below: the other warpgroup's S^T / dP^T
        // then queue behind dV / dK while this one writes dS (-1..-2 % against passing it after
        // dQ, bench/results/bwd-s18.txt).
        named_barrier_arrive(WS64_TURN0 + (wg ^ 1), THREADS);
        // dS buffer buf held pair it-2's dS: both warpgroups' dQ of it-2 have read it (the first
        // two waits pass at once).
        BL_TLC(5);
        mbarrier_wait(bars + ws64_bars::DSEMPTY + 8 * buf, ((uint32_t)(it >> 1) & 1u) ^ 1u);
        BL_TLC(6);
        store_ds_tile(s0 + L::DS + buf * L::DS_BUF + wg * L::PANEL, dsa, warp, lane);
        bl_fence_proxy_async();  // the other warpgroup's wgmma reads what stmatrix wrote
        mbarrier_arrive(bars + ws64_bars::DSFULL + 8 * buf);
        BL_TLC(7);

        // ---- pair it-1's dQ (entry wg's rows), behind dV / dK ----
        // Unconditional (a conditional issue makes ptxas serialize the products): at it == 0 it
        // reads the K / V panels, which nobody writes, and its result is dropped. Its wait at
        // it == 0 is on parity 1 of a fresh barrier and passes at once.
        mbarrier_wait(bars + ws64_bars::DSFULL + 8 * (buf ^ 1), (uint32_t)((it - 1) >> 1) & 1u);
        BL_TLC(8);
        wg64p_issue_dq<T>(dq, it > 0 ? s0 + L::DS + (buf ^ 1) * L::DS_BUF : s0 + L::K,
                          s0 + L::K, wg);
        BL_TLC(9);
        bl_wgmma_wait<0>();  // dV, dK and dQ are done: pa and dsa may die, Q / dO buffer buf is free
        bl_reg_fence(pa);
        bl_reg_fence(dsa);
        bl_reg_fence(dq);
        BL_TLC(10);
        if (it > 0) {
            mbarrier_arrive(bars + ws64_bars::DSEMPTY + 8 * (buf ^ 1));
            // The reducer has read this warpgroup's previous staging (at it == 1: parity 1 of a
            // fresh barrier, passes at once).
            mbarrier_wait(dqempty, (uint32_t)it & 1u);
            dq_block_stage<false>(sdq, dq);
            bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
            __syncwarp();
            if (lane == 0) mbarrier_arrive(dqfull);
        }
        // Every consumer thread releases the buffer itself: its lse / Dlt reads then come before
        // the producer's next TMA writes there in the order compute-sanitizer racecheck checks
        // (one arrive per warp after a __syncwarp is reported as a WAR hazard).
        BL_TLC(11);
        mbarrier_arrive(bars + ws_bars::EMPTY + 8 * buf);
    }
    BL_TL64(ct == 0, 2);
    bl_reg_fence(dk_acc);
    bl_reg_fence(dv_acc);
    // Column end: dK (times scale) and dV staged in the Q buffers, free once both warpgroups are
    // past their last dV / dK products, as the tensor maps' 128-row panels (ws_stage_dkv) and
    // stored by TMA from one thread, as the persistent head-dim-128 kernel does.
    auto store_dkv = [&]() {
        named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);
        if constexpr (SPLIT) {
            // (the barriers stay: the first is what frees pair last - 1's dS buffer for the
            // last dQ's staging)
            const ws_column cl{b, g, n, count, list, 0, rec.w};
            ws_store_dkv_part<D>(p, cl, 0, dk_acc, warp, lane);
            ws_store_dkv_part<D>(p, cl, 1, dv_acc, warp, lane);
            named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);
            return;
        }
        ws_stage_dkv<T>(s0 + L::Q, dk_acc, p.scale, warp, lane);
        ws_stage_dkv<T>(s0 + L::Q + L::PANEL, dv_acc, 1.0f, warp, lane);
        bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
        named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);
        BL_TL64(ct == 0, 3);
        if (ct == 0) {
            tma_store_4d(&p.tm_dk, s0 + L::Q, 0, (int)key0, (int)g, (int)b);
            tma_store_4d(&p.tm_dv, s0 + L::Q + L::PANEL, 0, (int)key0, (int)g, (int)b);
            bulk_commit_group();
        }
    };
    if (pairs > 0) {
        // The last pair's dQ product reads only the dS ring and K: dK / dV are staged and their
        // stores issued while it runs, and it is staged for the reducer after them. (Before, it
        // went first and dK / dV were staged once it was staged itself.) One branch holds the
        // product and its wait, else ptxas waits for it at once (C7517).
        const int last = pairs - 1;
        if (wg == 0) named_barrier_sync(WS64_TURN0, THREADS);  // warpgroup 1's advance turn
        mbarrier_wait(bars + ws64_bars::DSFULL + 8 * (last & 1), (uint32_t)(last >> 1) & 1u);
        wg64p_issue_dq<T>(dq, s0 + L::DS + (last & 1) * L::DS_BUF, s0 + L::K, wg);
        store_dkv();
        bl_wgmma_wait<0>();
        bl_reg_fence(dq);
        // store_dkv's first barrier: both warpgroups' dQ of pair last - 1 are done, so its dS
        // buffer is free for this staging; the reducer has taken pair last - 1's DQFULL.
        mbarrier_wait(dqempty, (uint32_t)pairs & 1u);
        dq_block_stage(ws64_last_dq_staging(s0, pairs) + (uint32_t)warp * DQ_WARP_BYTES, dq);
        if (lane == 0) mbarrier_arrive(dqfull);
    } else {
        store_dkv();  // zeros: nothing was loaded
    }
    // the column's dK / dV where this CTA stored its last part (after the dQ staging, so that
    // the reducer's adds run beside the sum)
    if constexpr (SPLIT) ws_split_sum_column<T, D>(p, b, g, n, ct);
    if (ct == 0) {
        bulk_wait_group_read<0>();  // the staging outlives the stores' reads
        BL_TL64(true, 4);
    }
}

}  // namespace bl_bwd
