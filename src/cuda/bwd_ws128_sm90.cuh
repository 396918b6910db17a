// bwd_ws128_sm90.cuh -- backward main kernel version 10, head dim 128: version 6's math
// (bwd_wgmma_sm90.cuh) with a producer warpgroup (version 8), entry it+1's S^T issued right
// behind entry it's dQ (version 9), and persistent CTAs (version 10).
//
// Why a producer: in version 6 the thread that issues a TMA (thread 0's row-tile loads, lane 0
// of every warp's two dQ reduce-adds) stalls until the copy engine takes the command, several
// hundred cycles when the engine is busy with reduce-adds, and its warpgroup waits for it at the
// next wgmma or barrier (bench/results/bwd128-ncu-src-s7.txt).
// Why S^T early (version 9): a clock-stamp timeline of version 8
// (bench/results/bwd128-v8-timeline.txt) showed the tensor cores idle for ~870 of every ~4600
// clocks between an entry's dQ and the next entry's S^T (dQ wait, staging, the list read and the
// division by tiles_m, the loop-top barrier, the FULL wait). Now the next S^T queues behind dQ;
// the list entries are read ahead; a second dS buffer replaces the loop-top barrier (+5 %,
// bench/results/bwd128-v9-run.txt).
// Why persistent (version 10): one CTA per SM walks the schedule's columns (drawn from a work
// counter: ws_column below), and the producer loads a column's first row tiles and its K / V
// while the consumers finish the last (8k dense +1 %, 1 % sparse -3..-4 %, 16k causal +1.4 %:
// bench/results/bwd-s9-persistent.txt).
//
// 384 threads, one CTA per SM; a column is (b, kv head, 128-key tile):
//   warpgroup 0, producer (24 registers): warp 0 picks the columns, loads each one's K / V and
//     each list entry's Q / dO / lse / Dlt with TMA into a two-buffer ring (FULL / EMPTY
//     mbarriers; KVFULL / KVEMPTY for K / V); warp 1 issues the dQ reduce-adds of
//     each entry once the consumers have staged it (DQFULL / DQEMPTY mbarriers, two staging
//     buffers), and each column's dK / dV TMA stores, staged in the same ring (ws_stage_dkv).
//   warpgroups 1 and 2, consumers (240 registers): warpgroup 1 + wg owns keys 64wg..64wg+63;
//     they meet once per entry at a named barrier (dS is shared: the dQ product reads both
//     warpgroups' halves).
#pragma once
#include "bwd_wgmma_sm90.cuh"
#include "bwd_split_sum_sm90.cuh"

namespace bl_bwd {

constexpr int WS_THREADS = THREADS + 128;   // producer warpgroup + the two consumer warpgroups
// setmaxnreg only moves registers within the CTA's launch allocation: 384 threads x 168 (the
// __launch_bounds__ cap), so 24 + 2 x 240 = 504 = 3 x 168 is the most; more and setmaxnreg.inc
// waits forever (32 / 240 hung; 40 / 232 ran 1-3 % slower: bench/results/bwd-s11-producer-regs.txt).
constexpr int WS_PRODUCER_REGS = 24;
constexpr int WS_CONSUMER_REGS = 240;
// Named barriers of the consumer warpgroups (0 is __syncthreads). Version 10 uses only WS_BAR_DS
// (once per entry); the head-dim-64 kernel (bwd_ws64_sm90.cuh) WS_BAR_LOOP_TOP (outside its loop)
// and its own turn barriers 3 and 4.
constexpr int WS_BAR_LOOP_TOP = 1;
constexpr int WS_BAR_DS = 2;
// Shared memory: version 6's layout (wg_smem<128>) plus a second dS buffer at its end, so that
// entry it+1's dS can be written while entry it's dQ products still read the first: 227 KB, the
// most a CTA can have.
constexpr uint32_t WS_DS1 = wg_smem<128>::USED;
constexpr size_t WS_SMEM_BYTES = WS_DS1 + BM * BN * 2 + wg_smem<128>::BASE_ALIGN;
static_assert(WS_DS1 % 1024 == 0, "panels start on 1024-byte boundaries");
static_assert(WS_SMEM_BYTES <= 232448, "227 KB of shared memory per CTA on sm_90");
// mbarriers (8 bytes each) in wg_smem<128>'s BARS area; FULL is where version 6 keeps its two.
struct ws_bars {
    static constexpr uint32_t FULL = 0;      // [2] row tile landed (TMA transaction count)
    static constexpr uint32_t EMPTY = 16;    // [2] row tile read by all 256 consumer threads
    static constexpr uint32_t DQFULL = 32;   // [2] dQ staged by all 8 consumer warps
    static constexpr uint32_t DQEMPTY = 48;  // [2] staging read by the reduce-adds
    static constexpr uint32_t NEVER = 64;    // never arrived on: a parity-1 wait passes at once
    static constexpr uint32_t KVFULL = 72;   // the column's K / V tiles landed (TMA)
    static constexpr uint32_t KVEMPTY = 80;  // K / V read by all 256 consumer threads
    static constexpr uint32_t COLFULL = 88;  // [2] a column's schedule record landed (TMA)
    static constexpr uint32_t COLEMPTY = 104;  // [2] record read by the consumers and the reducer
    static constexpr uint32_t COLS = 128;    // [2] the records: 16 bytes each (ws_column)
    static constexpr uint32_t BYTES = COLS + 32;
};
static_assert(wg_smem<128>::DQS - wg_smem<128>::BARS >= ws_bars::BYTES, "room for the mbarriers");
// Version 10's per-entry dQ flags (bwd_params::dq_direct), after the mbarriers: int [4], entry gi
// in slot gi & 3, written by the producer before its FULL arrive and read by the consumers when
// they stage that entry's dQ -- after their EMPTY arrive for it, so two slots would let the
// producer rewrite one for entry gi + 2 first; with four it waits for entry gi + 2's EMPTY.
constexpr uint32_t WS_DQ_FLAGS = ws_bars::BYTES;
static_assert(wg_smem<128>::DQS - wg_smem<128>::BARS >= WS_DQ_FLAGS + 4 * sizeof(int),
              "room for the dQ flags");
// The head of a split call's list of the columns the CTA sums after its last
// (ws_split_count_column): an int after the dQ flags.
constexpr uint32_t WS_SPLIT_HEAD = WS_DQ_FLAGS + 4 * sizeof(int);
static_assert(wg_smem<128>::DQS - wg_smem<128>::BARS >= WS_SPLIT_HEAD + sizeof(int),
              "room for the split list's head");
static_assert(wg_smem<128>::BARS % 16 == 0, "TMA writes the column records 16-byte aligned");

// TMA of a column's K and V tiles (keys key0.., kv head g, batch b; zero past Sk) into the BN-row
// panels at sK / sV that load_kv_tile would write, completing on `bar`.
template <int D>
__device__ __forceinline__ void ws_tma_kv_tile(const bwd_params &p, uint32_t sK, uint32_t sV,
                                               uint32_t bar, int64_t b, int64_t g, int64_t key0) {
    constexpr uint32_t PANEL_BYTES = BN * PANEL_ROW_BYTES;  // 64 columns of BN keys
    mbarrier_arrive_expect_tx(bar, 2 * BN * D * 2);
#pragma unroll
    for (int panel = 0; panel < D / PANEL_COLS; ++panel) {
        tma_load_4d(sK + panel * PANEL_BYTES, &p.tm_k, bar, panel * PANEL_COLS, (int)key0, (int)g,
                    (int)b);
        tma_load_4d(sV + panel * PANEL_BYTES, &p.tm_v, bar, panel * PANEL_COLS, (int)key0, (int)g,
                    (int)b);
    }
}

// The persistent kernel's work. The producer picks each column of its CTA and sends the column's
// 16-byte schedule record to the consumers and the reducer through a two-slot ring in shared
// memory, by TMA (COLFULL / COLEMPTY); record {-1, ...} ends the walk.
// The CTA's first column is schedule position blockIdx.x, each next one gridDim.x + the next
// value of the p.sched_next counter, drawn once the producer has issued the last column's row
// tiles (about two entries before the consumers finish it): CTAs take the schedule (heaviest
// first within windows of whole rounds, bwd_lists_sm90.cu) greedily, as the hardware hands out CTAs.
// Measured: at 16k causal this dynamic walk beats one CTA per column by 2 % dense and 1-3 % sparse
// (bench/results/bwd-s9-persistent.txt, run 6). Non-causal calls walked a static snake until the
// tenth session (round k: CTA x took position k grid + x, or k grid + grid - 1 - x for odd k),
// which had measured 1-1.5 % ahead at 8k; on the bench's inputs the dynamic walk is level at 16k
// x 16 dense, -3.5 % at 32k x 24 dense and -3..-10 % on the 32k video-mask rows
// (bench/results/bwd-s11-noncausal-dynamic.txt).
struct ws_column {
    int64_t b, g, n;
    int count;        // list entries; -1: past the schedule's end
    const int *list;  // entries hl * tiles_m + m (query head hl of the group, row tile m)
    int count80;      // the 80-row kernel's list entries (p.lists80), on masked calls
    int part;         // a split call's part of the column's query heads (bwd_params::head_split)
};
__device__ __forceinline__ ws_column ws_decode(const bwd_params &p, int4 rec) {
    const bl_bwd_dims &dm = p.dm;
    // In 32 bits: col < 2^31 (bl_bwd_lists_launch), so tiles_n and heads_k are too. Every thread
    // of the CTA decodes each column; with 64-bit divisions version 10 ran 0.6-0.8 % slower on
    // causal calls keeping 3-10 %, its non-causal KEYS_FULL form 0.6 % faster (not explained;
    // bench/results/bwd-s70-packed-producer.txt runs 3-4).
    const int col = rec.x < 0 ? 0 : rec.x, tn = (int)dm.tiles_n, hk = (int)dm.heads_k;
    const int bg = col / tn, b = bg / hk;
    return ws_column{b, bg - b * hk, col - bg * tn, rec.x < 0 ? -1 : rec.y,
                     p.lists + (int64_t)col * (dm.group * dm.tiles_m), rec.z, rec.w};
}
// The CTA's k-th column, from record slot k & 1, by a consumer thread or the reducer.
__device__ __forceinline__ ws_column ws_take_column(const bwd_params &p, uint32_t bars,
                                                    const int4 *slots, int k) {
    const int slot = k & 1;
    mbarrier_wait(bars + ws_bars::COLFULL + 8 * slot, (uint32_t)(k >> 1) & 1u);
    const int4 rec = slots[slot];
    mbarrier_arrive(bars + ws_bars::COLEMPTY + 8 * slot);
    return ws_decode(p, rec);
}

// The mbarriers of both persistent head-dim-128 kernels (dq_buffers: their dQ staging buffers).
__device__ __forceinline__ void ws_init_bars(uint32_t bars, int dq_buffers) {
    for (int i = 0; i < 2; ++i) {
        mbarrier_init(bars + ws_bars::FULL + 8 * i, 1);
        mbarrier_init(bars + ws_bars::EMPTY + 8 * i, THREADS);  // every consumer thread
        if (i < dq_buffers) {
            mbarrier_init(bars + ws_bars::DQFULL + 8 * i, WARPS);
            mbarrier_init(bars + ws_bars::DQEMPTY + 8 * i, 1);
        }
    }
    mbarrier_init(bars + ws_bars::NEVER, 1);
    mbarrier_init(bars + ws_bars::KVFULL, 1);
    mbarrier_init(bars + ws_bars::KVEMPTY, THREADS);  // every consumer thread
    for (int i = 0; i < 2; ++i) {
        mbarrier_init(bars + ws_bars::COLFULL + 8 * i, 1);
        mbarrier_init(bars + ws_bars::COLEMPTY + 8 * i, THREADS + 1);  // consumers, reducer
    }
    fence_mbarrier_init();
}

// The producer's draw of the CTA's k-th column: the schedule record of its position (-1: past
// the end, whose end record still goes to the consumers), which goes by TMA into slot k & 1 once
// column k-2's has been read (ws_take_column). SPLIT: positions are (column, part) pairs of the
// parts the call uses (bl_bwd_split_parts, worked out here at each draw rather than held in a
// register through the kernel: the SPLIT forms spill less), mapped onto head_split's records.
template <bool SPLIT>
__device__ __forceinline__ int64_t ws_draw_column(const bwd_params &p, uint32_t bars, int k) {
    const int64_t cols = p.dm.batch * p.dm.heads_k * p.dm.tiles_n;
    const int split = SPLIT ? p.head_split : 1;
    const int parts = SPLIT ? bl_bwd_split_parts(split, p.split_rule, p.totals) : 1;
    const int slot = k & 1;
    mbarrier_wait(bars + ws_bars::COLEMPTY + 8 * slot, ((uint32_t)(k >> 1) & 1u) ^ 1u);
    const int64_t pos =
        k == 0 ? (int64_t)blockIdx.x : (int64_t)gridDim.x + atomicAdd(p.sched_next, 1);
    const bool end = pos >= cols * parts;
    const int64_t rec =
        end ? cols * split : bl_bwd_split_record(pos, parts, split, p.split_rule.window);
    mbarrier_arrive_expect_tx(bars + ws_bars::COLFULL + 8 * slot, sizeof(int4));
    bulk_load(bars + ws_bars::COLS + 16 * slot, ws_records(p) + rec, sizeof(int4),
              bars + ws_bars::COLFULL + 8 * slot);
    return end ? -1 : rec;
}

// The reducer's TMA stores of a column's dK (x = 0) or dV (x = 1), staged at src by
// ws_stage_dkv; returns once the copy engine has read the staging.
__device__ __forceinline__ void ws_store_dkv(const bwd_params &p, uint32_t src, int x,
                                             const ws_column &cl) {
#pragma unroll
    for (int panel = 0; panel < 128 / PANEL_COLS; ++panel)
        tma_store_4d(x == 0 ? &p.tm_dk : &p.tm_dv, src + panel * BN * PANEL_ROW_BYTES,
                     panel * PANEL_COLS, (int)(cl.n * BN), (int)cl.g, (int)cl.b);
    bulk_commit_group();
    bulk_wait_group_read<0>();
}

// A split column's dK (x = 0) or dV (x = 1) partial, unscaled, from this thread's accumulator
// fragments (warp w's keys 16 w.., rows lg and lg + 8 of each n8 tile of head-dim columns) into
// p.dkv_part (2, P, B, Sk, Hk, D): a quad's four float2 stores fill one 32-byte sector of a key's
// row. Keys past Sk are not stored (the reduction reads only Sk rows).
template <int D = 128>
__device__ __forceinline__ void ws_store_dkv_part(const bwd_params &p, const ws_column &cl, int x,
                                                  const float (&acc)[D / 8 * 4], int warp,
                                                  int lane) {
    const bl_bwd_dims &dm = p.dm;
    const int lg = lane >> 2, lt = lane & 3;
    const int64_t part_floats = dm.batch * dm.seqlen_k * dm.heads_k * D;
    float *dst = p.dkv_part + ((int64_t)x * p.head_split + cl.part) * part_floats;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int64_t key = cl.n * BN + warp * KEYS_PER_WARP + lg + 8 * half;
        if (key >= dm.seqlen_k) continue;
        float *row = dst + ((cl.b * dm.seqlen_k + key) * dm.heads_k + cl.g) * D + 2 * lt;
#pragma unroll
        for (int t = 0; t < D / 8; ++t)
            *reinterpret_cast<float2 *>(row + 8 * t) =
                make_float2(acc[4 * t + 2 * half], acc[4 * t + 2 * half + 1]);
    }
}

// This thread's first partial row of a split column's dK (x = 0) or dV (x = 1): key
// 16 warp + lg of the column, column 2 lt (the dV row is the dK row's plus P parts).
__device__ __forceinline__ float *ws_dkv_part_row(const bwd_params &p, const ws_column &cl, int warp,
                                                  int lane) {
    constexpr int D = 128;
    const bl_bwd_dims &dm = p.dm;
    const int64_t part_floats = dm.batch * dm.seqlen_k * dm.heads_k * D;
    const int64_t key = cl.n * BN + warp * KEYS_PER_WARP + (lane >> 2);
    return p.dkv_part + cl.part * part_floats + ((cl.b * dm.seqlen_k + key) * dm.heads_k + cl.g) * D +
           2 * (lane & 3);
}
// The same stores as ws_store_dkv_part from that row pointer (keys past Sk not stored).
__device__ __forceinline__ void ws_store_dkv_part_at(const bwd_params &p, float *row, int64_t key,
                                                     const float (&acc)[128 / 8 * 4]) {
    constexpr int D = 128;
    const int64_t key_stride = p.dm.heads_k * D;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        if (key + 8 * half >= p.dm.seqlen_k) continue;
#pragma unroll
        for (int t = 0; t < D / 8; ++t)
            *reinterpret_cast<float2 *>(row + 8 * half * key_stride + 8 * t) =
                make_float2(acc[4 * t + 2 * half], acc[4 * t + 2 * half + 1]);
    }
}

// SPLIT (bwd_params::head_split > 1): the column's list entries of its part's query heads,
// [part * hpp, (part + 1) * hpp) with hpp = G / head_split: a contiguous run of the list, whose
// codes hl * Tm + m ascend (the lists kernel's order), found by two binary searches.
__device__ __forceinline__ int ws_list_lower_bound(const int *list, int count, int code) {
    int lo = 0, hi = count;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (list[mid] < code) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
__device__ __forceinline__ void ws_part_run(const bwd_params &p, int part, int parts,
                                            const int *&list, int &count) {
    const int span = (int)p.dm.group / parts * (int)p.dm.tiles_m;  // codes per part
    const int a = ws_list_lower_bound(list, count, part * span);
    const int z = ws_list_lower_bound(list, count, (part + 1) * span);
    list += a;
    count = z - a;
}
__device__ __forceinline__ void ws_part_range(const bwd_params &p, ws_column &cl) {
    if (cl.count < 0) return;  // past the schedule's end
    ws_part_run(p, cl.part, bl_bwd_split_parts(p.head_split, p.split_rule, p.totals), cl.list,
                cl.count);
}

// The column's epilogue goes through the dQ staging ring: dK (times scale) and dV of the column's
// 128 keys take the ring's next two positions, one 32 KB buffer each, as two 64-column panels
// of 128 rows with the 128B swizzle (the tensor maps' box), and the reducer stores each with two
// TMA stores (rows past Sk are skipped). Why: stored from registers (store_dk_dv, as the other
// kernels still do) the epilogue held the consumers ~7 us per column with 4-byte stores and
// still cost ~10 % of a 1 %-kept call with 16-byte ones; staged, it costs 6-10 % less there and
// ~4 % less at 10 % kept, dense level (bench/results/bwd-s12-epilogue.txt,
// bwd-s13-dkdv-vector-stores.txt, bwd-s13-dkdv-tma-store.txt).
// Warp `warp` writes its 16 keys (rows 16 warp..) of one accumulator (times mul) into buffer
// `sbuf` with stmatrix: per pair of n8 tiles (2u, 2u + 1), matrices (rows 0-7, tile 2u), (rows
// 8-15, 2u), (0-7, 2u + 1), (8-15, 2u + 1); lane l gives row l % 8 of matrix l / 8.
// PANEL_ROWS: the rows of the buffer's panels (the dq-rows kernel stages 64-row tiles the same way).
template <typename T, int N, int PANEL_ROWS = BN>
__device__ __forceinline__ void ws_stage_dkv(uint32_t sbuf, const float (&acc)[N], float mul,
                                             int warp, int lane) {
    constexpr uint32_t KPANEL = PANEL_ROWS * PANEL_ROW_BYTES;
    const int j = lane >> 3;
    const int row = warp * KEYS_PER_WARP + 8 * (j & 1) + (lane & 7);
#pragma unroll
    for (int u = 0; u < N / 8; ++u) {
        const int c = 2 * u + (j >> 1);  // the 16-byte chunk (8 columns) of this lane's matrix
        bl_stmatrix_x4(sbuf + (uint32_t)(c >> 3) * KPANEL + (uint32_t)row * PANEL_ROW_BYTES +
                           ((uint32_t)((c & 7) ^ (row & 7)) << 4),
                       bl_pack2<T>(acc[8 * u + 0] * mul, acc[8 * u + 1] * mul),
                       bl_pack2<T>(acc[8 * u + 2] * mul, acc[8 * u + 3] * mul),
                       bl_pack2<T>(acc[8 * u + 4] * mul, acc[8 * u + 5] * mul),
                       bl_pack2<T>(acc[8 * u + 6] * mul, acc[8 * u + 7] * mul));
    }
}

// A light row tile's entry's dQ in 16-bit (bwd_params::dq_direct, bl_bwd_dq16_tile), staged by
// ws_stage_dkv in the entry's staging buffer sbuf as two 64-column panels of BM rows, warpgroup
// wg's at wg x WS_DQ16_PANEL_BYTES; the reducer puts them in dq rows m BM.. of q head h with two
// TMA copies (rows past Sq are skipped): stores where the tile has one entry or this entry
// claimed it first (ws_dq16_claim), else 16-bit reduce-adds once that store has completed. One
// code path, the copy chosen by a predicate:
// with the two copies in two branches the reducer spilled twice as much (the dq16 probe,
// bench/results/bwd-s97-dq16-probe-compile.txt).
constexpr uint32_t WS_DQ16_PANEL_BYTES = BM * PANEL_ROW_BYTES;
static_assert(2 * WS_DQ16_PANEL_BYTES <= WARPS * DQ_WARP_BYTES, "inside one staging buffer");
// One box of p.tm_dq16 from shared memory at sbuf to dq at (column col, row, q head h, batch b):
// a store where `add` is false, else a 16-bit reduce-add. Not committed.
__device__ __forceinline__ void dq16_box_copy(const bwd_params &p, uint32_t sbuf, int col,
                                              int row, int h, int b, bool add) {
    asm volatile(
        "{\n.reg .pred a;\nsetp.ne.u32 a, %6, 0;\n"
        "@a cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%2, %3, %4, %5}], [%1];\n"
        "@!a cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%2, %3, %4, %5}], [%1];\n}\n" ::"l"(&p.tm_dq16),
        "r"(sbuf), "r"(col), "r"(row), "r"(h), "r"(b), "r"((unsigned)add)
        : "memory");
}
__device__ __forceinline__ void ws_put_dq16(const bwd_params &p, uint32_t sbuf, int h, int m,
                                            int b, bool add) {
#pragma unroll
    for (int panel = 0; panel < 2; ++panel)
        dq16_box_copy(p, sbuf + panel * WS_DQ16_PANEL_BYTES, panel * PANEL_COLS, m * BM, h, b, add);
    bulk_commit_group();
}

// The claims on a light row tile of several entries (bl_bwd_workspace::dq_claims), so that
// no zeros are written there first: the reducer claims the tile of each such entry in its own
// order, after it is done with the entry before (no wait of its own then lies between a first
// claim and that entry's store, whose completion it publishes: no two reducers can wait on each
// other). The claim's count before this one: 0 for the first claimant, which stores.
__device__ __forceinline__ unsigned ws_dq16_claim(unsigned *claim) {
    unsigned before;
    asm volatile("atom.acquire.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(claim)
                 : "memory");
    return before;
}
// A later claimant (`before` from ws_dq16_claim, not 0): waits for the first claimant's store,
// then lets this thread's TMA copies see it.
__device__ __forceinline__ void ws_dq16_wait_stored(const unsigned *claim, unsigned before) {
    while (!(before & BL_DQ_CLAIM_STORED)) {
        __nanosleep(64);
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(before) : "l"(claim) : "memory");
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
}
// The first claimant, once its store is issued and committed: waits for the store's writes and
// publishes them.
__device__ __forceinline__ void ws_dq16_publish_stored(unsigned *claim) {
    bulk_wait_group<0>();
    asm volatile("fence.proxy.async.global;" ::: "memory");
    asm volatile("red.release.gpu.global.or.b32 [%0], %1;" ::"l"(claim), "r"(BL_DQ_CLAIM_STORED)
                 : "memory");
}

// Dev only (-DBL_BWD_TIMELINE, dev/cuda/attn_bwd.cu `timeline`, `timeline64`): SM clock stamps of
// one CTA's first TL_ITERS entries, lane 0 of consumer warps 0 and 4 (row 0, 1) and the reducer
// (row 2), in this kernel and in bwd_ws64_sm90.cuh (its points: the BL_TLC calls there; it
// stamps no reducer row, so `timeline64` prints that row from stale memory).
// Each stamp is one predicated store: a branch around it made ptxas serialise the products
// (C7517) and distorted the picture (507 instead of 546 TFLOP/s).
#ifdef BL_BWD_TIMELINE
constexpr int TL_ITERS = 48, TL_POINTS = 12;
__device__ unsigned bl_bwd_tl[3][TL_ITERS][TL_POINTS];
__device__ __forceinline__ void bl_tl_store(bool on, int row, int it, int i) {
    unsigned *a = &bl_bwd_tl[row][it < TL_ITERS ? it : 0][i];
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %0, 0;\n@p st.global.u32 [%1], %2;\n}\n" ::"r"(
                     (unsigned)(on && blockIdx.x == 0 && it < TL_ITERS)),
                 "l"(a), "r"((unsigned)clock())
                 : "memory");
}
#define BL_TL(row, i) bl_tl_store(true, row, it, i)
#define BL_TLC(i) bl_tl_store(lane == 0 && (warp & 3) == 0, wg, it, i)
// Column stamps (`timelinecols`; `timelinecols80` for the 80-row kernel, which takes the same
// places): the k-th column of CTA 0 at TL_COL_POINTS
// places, row 0 consumer thread 0 (BL_TLCOL(ct == 0, 0, i, count)), row 1 the producer's thread
// 0, row 2 the 80-row kernel's reducer (column taken, the last dQ^T read, dK staged seen, dK
// read, dV staged seen, dV read); and the column's entry count.
constexpr int TL_COLS = 64, TL_COL_POINTS = 6, TL_COL_ROWS = 3;
__device__ unsigned bl_bwd_tlcol[TL_COL_ROWS][TL_COLS][TL_COL_POINTS];
__device__ int bl_bwd_tlcnt[TL_COLS];
__device__ __forceinline__ void bl_tlcol_store(bool on, int row, int k, int i, int count) {
    on = on && blockIdx.x == 0 && k < TL_COLS;
    unsigned *a = &bl_bwd_tlcol[row][k < TL_COLS ? k : 0][i];
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %0, 0;\n@p st.global.u32 [%1], %2;\n}\n" ::"r"(
                     (unsigned)on),
                 "l"(a), "r"((unsigned)clock())
                 : "memory");
    if (on && row == 0 && i == 1) bl_bwd_tlcnt[k] = count;
}
#define BL_TLCOL(on, row, i, count) bl_tlcol_store(on, row, k, i, count)
// The 80-row kernel's entry stamps (`timeline80`): the same rows as BL_TL / BL_TLC, but only in
// CTA 0's first column (k == 0), whose entries the later columns would otherwise overwrite;
// row 2 holds the reducer's points 0-1 and the producer's 4-6.
#define BL_TL80(on, row, i) bl_tl_store((on) && k == 0, row, it, i)
#else
#define BL_TL80(on, row, i) \
    do {                    \
    } while (0)
#define BL_TLCOL(on, row, i, count) \
    do {                            \
    } while (0)
#define BL_TLC(i) \
    do {          \
    } while (0)
#define BL_TL(row, i) \
    do {              \
    } while (0)
#endif
// Version 10's entry stamps: by the entry's place in the column (BL_TLC / BL_TL: `timeline`,
// one long dense column), or with -DBL_BWD_TL_GLOBAL by its place in the CTA's walk (consumers:
// the row-tile ring position gi; reducer: the staging ring position gj, which also counts two
// dK / dV stagings per column) -- `timelinesparse`, where a column has a few entries.
#if defined(BL_BWD_TIMELINE) && defined(BL_BWD_TL_GLOBAL)
#define BL_TLE(i) bl_tl_store(lane == 0 && (warp & 3) == 0, wg, gi, i)
#define BL_TLR(i) bl_tl_store(true, 2, gj, i)
#else
#define BL_TLE(i) BL_TLC(i)
#define BL_TLR(i) BL_TL(2, i)
#endif

// WITH_DQ = false: dK and dV only (no dS staging, no dQ product, no reduce-adds), for calls
// whose dQ the dq-rows kernel computes (bwd_dqrows_sm90.cuh); the staging ring then carries only
// each column's dK / dV, at positions 2k, 2k + 1.
// DIRECT: the entries of a light row tile (bl_bwd_dq16_tile) write their dQ to dq itself in
// 16-bit (bwd_params::dq_direct, ws_put_dq16), for the masked calls bl_bwd_dq_direct_chosen
// picks; heavier tiles add into the fp32 accumulator. Its own instantiation, because the branch it
// puts in the consumers' entry loop (16-bit or fp32 staging) moves that loop's schedule: +1.3..
// 1.6 % on 32k x 24 causal calls at 10 % kept and +3.7 % at 16k causal 25 %, where few tiles
// have one entry (bench/results/bwd-s52-dq-direct.txt). DIRECT = false is the kernel as before.
// Inside the DIRECT form the producer's and the reducer's tests still read p.dq_direct (always
// set where this form runs), as in its first, single-instantiation build: with them folded to
// constants ptxas scheduled the entry loop worse (967 instructions against 942), the kernel 5 us
// slower at 16k x 16 x 128 1 % kept and 20 us at 32k x 24 causal 3 %
// (bench/results/bwd-s53-direct-threshold.txt, run 3).
// KEYS_FULL: a call without a causal mask whose keys fill whole key tiles (Sk % BN == 0, chosen
// in launch_main): no entry needs the mask, so the P^T phase compiles without its eight guarded
// mask blocks and the consumers without the query tile's division (m is the mask's only use
// there): the entry loop 571 instructions against 865 (DIRECT 652 against 942).
// SPLIT (bwd_params::head_split > 1, a call whose columns are too few for the SMs:
// bl_bwd_head_split): each drawn column is one part of a column's query heads, its list the run
// of those heads' entries (ws_part_range), its dK / dV stored as fp32 partials from registers
// (ws_store_dkv_part) instead of staged and stored by the reducer. Its own instantiation, so that
// the other forms keep their SASS.
template <typename T, bool WITH_DQ = true, bool DIRECT = false, bool KEYS_FULL = false,
          bool SPLIT = false>
__global__ void __launch_bounds__(WS_THREADS, 1) bwd_ws128_kernel(const __grid_constant__ bwd_params p) {
    static_assert(WITH_DQ || !DIRECT, "the direct dQ needs the dQ");
    static_assert(WITH_DQ || !KEYS_FULL, "KEYS_FULL: the shipped forms only");
    static_assert(!SPLIT || (WITH_DQ && !DIRECT), "SPLIT: the plain forms");
    // A masked call may launch this kernel and then the 80-row ones (bwd_ws128r80_sm90.cuh) as
    // its programmatic dependents (their CTAs take an SM only as this kernel's leave it; each
    // grid completes after the one before it); the one the entry totals do not pick returns
    // before anything else. With p.dq_direct both forms are launched, DIRECT first, and the
    // one bl_bwd_dq_direct_chosen does not pick returns too.
    if (DIRECT && p.totals == nullptr) return;
    if (p.totals != nullptr) {
        // The first form launched (DIRECT where launch_main launches it, else this one) is the
        // preprocess's programmatic dependent: the preprocess, and the schedule it waited for,
        // complete before the totals are read. It lets its dependents launch only then, so that
        // every kernel after it reads them at once. A second form (its dependent) that is not
        // picked returns as the 80-row kernels do: CTA 0 waits for the first to complete, the
        // other CTAs leave at once.
        const bool first = DIRECT || !(p.dq_direct && WITH_DQ && !SPLIT);
        if (first) griddep_wait();
        griddep_launch_dependents();
        const bool picked = !bl_bwd_rows80_chosen(p.totals, p.causal != 0, KEYS_FULL) &&
                            DIRECT == (p.dq_direct && bl_bwd_dq_direct_chosen(p.totals, p.dm));
        if (!picked && (first || blockIdx.x != 0)) return;
        if (!first) griddep_wait();
        if (!picked) return;
    }
    constexpr int D = 128;
    using L = wg_smem<D>;
    constexpr int NQ = BM / 8;   // n8 tiles of queries (S^T, dP^T): 8
    constexpr int ND = D / 8;    // n8 tiles of head dim (dK, dV)
    constexpr int KSTEPS_D = D / 16;
    constexpr uint32_t QPANEL = BM * PANEL_ROW_BYTES;
    constexpr uint32_t KPANEL = BN * PANEL_ROW_BYTES;
    constexpr uint32_t TILE_BYTES = BM * D * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
    const uint32_t s0 = bl_smem_addr(smem_base);
    const uint32_t bars = s0 + L::BARS;
    const float *s_rows = reinterpret_cast<const float *>(smem_base + L::ROWS);

    const bl_bwd_dims &dm = p.dm;
    // Persistent (ws_column): the mbarrier rings run on over column boundaries (gi / gj count
    // the CTA's entries so far), so the producer loads a column's first row tiles while the
    // consumers finish the last one.
    const int tiles_m = (int)dm.tiles_m;
    const int4 *col_slots = reinterpret_cast<const int4 *>(smem_base + L::BARS + ws_bars::COLS);
    volatile int *s_dq_flags = reinterpret_cast<volatile int *>(smem_base + L::BARS + WS_DQ_FLAGS);

    if (threadIdx.x == 0) ws_init_bars(bars, 2);
    __syncthreads();

    const int role_wg = bl_warpgroup_uniform();  // 0: producer, 1 and 2: consumers
    if (role_wg == 0) {
        // ---- producer warpgroup ----
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            // The CTA's entry gi into buffer gi & 1 once entry gi-2 has been read; a column's K /
            // V (its kc-th load) right behind its first row tile, once the consumers are done
            // with the last column's (parity trick: the first wait on each EMPTY passes at once).
            // So the loads overlap the last column's dK / dV epilogue.
            int gi = 0, kc = 0;
            for (int k = 0;; ++k) {
                BL_TLCOL(true, 1, 0, 0);
                const int64_t rec = ws_draw_column<SPLIT>(p, bars, k);
                if (rec < 0) break;
                ws_column cl = ws_decode(p, ws_records(p)[rec]);
                if constexpr (SPLIT) ws_part_range(p, cl);
                BL_TLCOL(true, 1, 1, 0);
                // DIRECT: each entry's flag (WS_DQ_FLAGS), from its row tile's entry count
                // loaded an entry ahead (the first at the column's start), published by the FULL
                // arrive, which therefore comes after the TMA issues (and for a column's first
                // entry after its K / V's), so that the count's latency passes under them; the
                // next entry's count is loaded after the arrive (its address waits for a list
                // read, which would hold the arrive back where the row tile lands from L2).
                // row tile (b, q head g * group + e / tiles_m, e % tiles_m) of list entry e
                const int64_t tile0 = (cl.b * dm.heads_q + cl.g * dm.group) * tiles_m;
                const bool direct = DIRECT && p.dq_direct;  // a run-time test: the kernel's comment
                uint4 next_writers = make_uint4(0u, 0u, 0u, 0u);
                if (direct && cl.count > 0)
                    next_writers = bl_bwd_tile_writer_runs(p.dq_writers, tile0 + cl.list[0]);
                for (int it = 0; it < cl.count; ++it, ++gi) {
                    const int buf = gi & 1;
                    mbarrier_wait(bars + ws_bars::EMPTY + 8 * buf, ((uint32_t)(gi >> 1) & 1u) ^ 1u);
                    if (it == 0) BL_TLCOL(true, 1, 2, 0);
                    int e_hl, e_m;
                    ws_split_code(cl.list[it], tiles_m, dm.group == 1, e_hl, e_m);
                    const uint4 writers = next_writers;
                    if (DIRECT)
                        wg_tma_row_tile<D, false>(p, s0, buf, cl.b, cl.g * dm.group + e_hl, e_m);
                    else
                        wg_tma_row_tile<D>(p, s0, buf, cl.b, cl.g * dm.group + e_hl, e_m);
                    if (it == 0) {
                        mbarrier_wait(bars + ws_bars::KVEMPTY, ((uint32_t)kc & 1u) ^ 1u);
                        BL_TLCOL(true, 1, 3, 0);
                        ws_tma_kv_tile<D>(p, s0 + L::K, s0 + L::V, bars + ws_bars::KVFULL, cl.b, cl.g,
                                          cl.n * BN);
                        ++kc;
                    }
                    if (DIRECT) {
                        s_dq_flags[gi & 3] = direct && bl_bwd_dq16_tile(bl_bwd_tile_writers(writers));
                        mbarrier_arrive(bars + ws_bars::FULL + 8 * buf);
                        if (direct && it + 1 < cl.count)
                            next_writers = bl_bwd_tile_writer_runs(p.dq_writers, tile0 + cl.list[it + 1]);
                    }
                }
            }
        } else if (threadIdx.x == 32) {
            // The CTA's entry gj's dQ, staged by the 8 consumer warps in staging buffer gj & 1.
            int gj = 0;
            for (int k = 0;; ++k) {
                ws_column cl = ws_take_column(p, bars, col_slots, k);
                if (cl.count < 0) break;
                if constexpr (SPLIT) ws_part_range(p, cl);
                // The entries of an entry's row tile (p.dq_writers: bwd_kernel_common.cuh), read
                // one entry ahead so that the load's latency passes under the previous entry.
                // The row tile of entry `it`, (b, q head g * group + hl, m), is tile0 + the
                // entry's code: its index in dq_writers and dq_claims.
                auto tile_of = [&](int it) {
                    return (cl.b * dm.heads_q + cl.g * dm.group) * tiles_m + cl.list[it];
                };
                auto writers = [&](int it) {
                    return bl_bwd_tile_writer_runs(p.dq_writers, tile_of(it));
                };
                uint4 next_writers = make_uint4(0u, 0u, 0u, 0u);
                if (p.dq_writers != nullptr && cl.count > 0) next_writers = writers(0);
                for (int it = 0; WITH_DQ && it < cl.count; ++it, ++gj) {
                    const int buf = gj & 1;
                    int h, m;
                    ws_split_code(cl.list[it], tiles_m, dm.group == 1, h, m);
                    h += (int)(cl.g * dm.group);
                    // A row tile's only entry stores its dQ: no read of the zeros. In the
                    // DIRECT form a light tile's entries go to dq in 16-bit (the consumers
                    // staged them so), stored or added (ws_put_dq16).
                    const unsigned tile_writers = bl_bwd_tile_writers(next_writers);
                    const bool store = tile_writers == 1;
                    const bool dq16 = DIRECT && p.dq_direct && bl_bwd_dq16_tile(tile_writers);
                    // A light tile of several entries: claimed here, its latency under the wait
                    unsigned *const claim = p.dq_claims + tile_of(it);
                    const bool claimed = dq16 && bl_bwd_dq16_claimed(tile_writers);
                    unsigned before = 0;
                    if (claimed) before = ws_dq16_claim(claim);
                    if (p.dq_writers != nullptr && it + 1 < cl.count)
                        next_writers = writers(it + 1);
                    BL_TLR(0);
                    mbarrier_wait(bars + ws_bars::DQFULL + 8 * buf, (uint32_t)(gj >> 1) & 1u);
                    BL_TLR(1);
                    if (dq16) {
                        const bool add = bl_bwd_dq16_adds(tile_writers, claimed, before);
                        if (bl_bwd_dq16_waits(claimed, before)) ws_dq16_wait_stored(claim, before);
                        ws_put_dq16(p, s0 + L::DQS + (uint32_t)(buf * WARPS) * DQ_WARP_BYTES, h, m,
                                    (int)cl.b, add);
                    } else {
#pragma unroll 1
                        for (int w = 0; w < WARPS; ++w) {
                            const uint32_t sdq =
                                s0 + L::DQS + (uint32_t)(buf * WARPS + w) * DQ_WARP_BYTES;
                            const int col0 = 64 * (w >> 2), row = m * BM + 16 * (w & 3);
                            if (store)
                                dq_block_reduce<true>(p, sdq, col0, h, row, (int)cl.b);
                            else
                                dq_block_reduce(p, sdq, col0, h, row, (int)cl.b);
                        }
                    }
                    BL_TLR(2);
                    // The staging may be rewritten once the copy engine has read it.
                    bulk_wait_group_read<0>();
                    BL_TLR(3);
                    mbarrier_arrive(bars + ws_bars::DQEMPTY + 8 * buf);
                    if (claimed && before == 0) ws_dq16_publish_stored(claim);
                }
                // The column's dK and dV (ws_stage_dkv): the ring's next two positions.
                for (int x = 0; x < 2; ++x, ++gj) {
                    const int buf = gj & 1;
                    const uint32_t src = s0 + L::DQS + (uint32_t)(buf * WARPS) * DQ_WARP_BYTES;
                    mbarrier_wait(bars + ws_bars::DQFULL + 8 * buf, (uint32_t)(gj >> 1) & 1u);
                    // (SPLIT: the consumers stored the partials; the hand-overs stay the same.)
                    if constexpr (!SPLIT) ws_store_dkv(p, src, x, cl);
                    mbarrier_arrive(bars + ws_bars::DQEMPTY + 8 * buf);
                }
            }
            // The reduce-adds and stores must complete before the CTA (and its shared memory)
            // goes away.
            bulk_wait_group<0>();
        }
        return;
    }

    // ---- consumer warpgroups ----
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;            // consumer thread 0..255
    const int lane = ct & 31, warp = ct >> 5;     // consumer warp 0..7
    const int wg = role_wg - 1;                   // keys 64wg..64wg+63
    const int lg = lane >> 2, lt = lane & 3;
    const int kw = warp * KEYS_PER_WARP;

    int g0 = 0;  // the CTA's entries before this column: the rings' position
    int kc = 0;  // the CTA's K / V loads before this column
    if (SPLIT && ct == 0) ws_split_list_init(bars + WS_SPLIT_HEAD);
    for (int k = 0;; ++k) {
        BL_TLCOL(ct == 0, 0, 0, 0);
        ws_column cl = ws_take_column(p, bars, col_slots, k);
        BL_TLCOL(ct == 0, 0, 1, cl.count);
        if (cl.count < 0) break;
        if constexpr (SPLIT) ws_part_range(p, cl);
        const int64_t n = cl.n;
        const int count = cl.count;
        const int *list = cl.list;
        const int64_t key0 = n * BN;

        float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
        for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;

        if (count > 0) {
            mbarrier_wait(bars + ws_bars::KVFULL, (uint32_t)kc & 1u);  // the column's K / V
            BL_TLCOL(ct == 0, 0, 2, 0);

            // S^T = K Q^T of entry `it` (this warpgroup's 64 keys x 64 queries), into s; committed as
            // one group. Issued for entry it+1 right behind entry it's dQ so that the tensor cores do not
            // drain between entries.
            // it == count (after the column's last entry) issues a product whose result nobody reads,
            // on whatever the next ring buffer holds (the next column's first row tile may be landing
            // there): ptxas serialises the products when the issue or the wait sits under a branch
            // (C7511 / C7517).
            float s[NQ * 4], ds[NQ * 4];
            auto issue_s = [&](int it) {
                const int gq = g0 + it;  // position in the rings
                const uint32_t sQ = s0 + L::Q + (gq & 1) * TILE_BYTES;
                bl_acc_overwritten(s);  // the first step does not accumulate: no zeroing
                // Past the column's last entry the wait must pass without looking at FULL: the
                // producer may already have filled that buffer for the next column, and a
                // "previous phase" parity would then wait for a phase that never completes.
                const bool real = it < count;
                mbarrier_wait(bars + (real ? ws_bars::FULL + 8 * (gq & 1) : ws_bars::NEVER),
                              real ? (uint32_t)(gq >> 1) & 1u : 1u);
                bl_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < KSTEPS_D; ++kk) {
                    const uint32_t koff = (kk / 4) * KPANEL + (kk % 4) * K16_BYTES_KMAJOR;
                    const uint32_t qoff = (kk / 4) * QPANEL + (kk % 4) * K16_BYTES_KMAJOR;
                    bl_wgmma_ss_n64<T, 0>(
                        s, bl_wgmma_desc(s0 + L::K + wg * WG_KEYS * PANEL_ROW_BYTES + koff, 16, BL_WGMMA_GROUP_BYTES),
                        bl_wgmma_desc(sQ + qoff, 16, BL_WGMMA_GROUP_BYTES), kk > 0);
                }
                bl_wgmma_commit();
            };
            // The column's first S^T completes before the loop: in flight into it, ptxas copies its
            // registers at the loop head and waits for them there anyway (C7517).
            issue_s(0);
            bl_wgmma_wait<0>();
            bl_reg_fence(s);
            BL_TLCOL(ct == 0, 0, 3, 0);
            // The list entries are read ahead: entry it+1's query tile is known when entry it starts
            // (its split -- where the group has several heads a reciprocal and conversions on the
            // MUFU pipe, ws_split_code -- stays off the path from the S^T wait to the
            // exponentials), and entry it+2 is loaded during entry it. Where the group is one
            // head the code is the tile: no division at all (up to 1.7 % of this kernel on causal
            // calls keeping 3-10 %, bench/results/bwd-s70-packed-producer.txt run 3).
            const bool one_head = dm.group == 1;
            int m_next = ws_code_row_tile(list[0], tiles_m, one_head);
            int e_ahead = list[count > 1 ? 1 : 0];  // entry it+1 (the last one past the end)

            for (int it = 0; it < count; ++it) {
                const int gi = g0 + it;  // position in the row-tile ring
                const int buf = gi & 1;  // and in the staging ring, gi + 2k (ws_stage_dkv)
                const int m = m_next;
                BL_TLE(0);
                const uint32_t sQ = s0 + L::Q + buf * TILE_BYTES;
                const uint32_t sdO = s0 + L::DO + buf * TILE_BYTES;
                const uint32_t sDS = s0 + (buf ? WS_DS1 : L::DS);
                const float *lse2 = s_rows + buf * BM;
                const float *dlt = s_rows + (2 + buf) * BM;

                // ---- dP^T = V dO^T (S^T was issued at the end of the last iteration) ----
                bl_acc_overwritten(ds);
                bl_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < KSTEPS_D; ++kk) {
                    const uint32_t koff = (kk / 4) * KPANEL + (kk % 4) * K16_BYTES_KMAJOR;
                    const uint32_t qoff = (kk / 4) * QPANEL + (kk % 4) * K16_BYTES_KMAJOR;
                    bl_wgmma_ss_n64<T, 0>(
                        ds, bl_wgmma_desc(s0 + L::V + wg * WG_KEYS * PANEL_ROW_BYTES + koff, 16, BL_WGMMA_GROUP_BYTES),
                        bl_wgmma_desc(sdO + qoff, 16, BL_WGMMA_GROUP_BYTES), kk > 0);
                }
                bl_wgmma_commit();
                BL_TLE(1);
                if (WITH_DQ && it > 0) {
                    // Entry it-1's dQ, staged at the end of the last iteration, goes to the reducer now:
                    // its stores have long completed, so the proxy fence costs little here (right after
                    // the stores it waited for them, ~3 % of the time).
                    bl_fence_proxy_async();
                    __syncwarp();
                    if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL + 8 * (buf ^ 1));
                }
                float2 lse_r[NQ];  // this thread's queries 8t + 2lt (+1)
#pragma unroll
                for (int t = 0; t < NQ; ++t) lse_r[t] = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
                // Dlt this early too: read right before dS it waited behind dV's operand reads.
                float2 dlt_r[NQ];
#pragma unroll
                for (int t = 0; t < NQ; ++t) dlt_r[t] = *reinterpret_cast<const float2 *>(dlt + 8 * t + 2 * lt);
                BL_TLE(2);
                bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
                bl_reg_fence(s);
                BL_TLE(3);

                // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
                const int64_t row0 = (int64_t)m * BM;
                const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag
                const bool need_mask = !KEYS_FULL && (key0 + BN > dm.seqlen_k ||
                                                      (p.causal && key0 + BN - 1 > row0 + diag));
                const int64_t key_room = dm.seqlen_k - key0;
                const int key_limit = key_room < BN ? (int)key_room : BN;
                int64_t causal_room = row0 + diag - key0;
                causal_room = causal_room > 2 * BN ? 2 * BN : causal_room;
                causal_room = causal_room < -2 * BN ? -2 * BN : causal_room;
                const int causal_limit = p.causal ? (int)causal_room : 2 * BN;
                // dV += P^T dO, P^T from registers, issued k-step by k-step (16 queries: n8 tiles
                // 2ks, 2ks + 1) as their exponentials come out: the P^T phase is bound by its
                // latency chain (S^T wait -> exp -> mask -> pack -> dV issue); -1.6..-2.6 % of
                // the main kernel at 3 % kept against all four issued after the whole P^T
                // (bench/results/bwd-s36-early-dv.txt run 8).
                uint32_t pa[BM / 16][4];
                auto issue_dv = [&](int ks) {
                    pa[ks][0] = bl_pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
                    pa[ks][1] = bl_pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
                    pa[ks][2] = bl_pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
                    pa[ks][3] = bl_pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
                    bl_wgmma_fence();
                    bl_wgmma_rs<T, D>(dv_acc, pa[ks],
                                      bl_wgmma_desc(sdO + ks * K16_BYTES_MNMAJOR, QPANEL, BL_WGMMA_GROUP_BYTES));
                };
#pragma unroll
                for (int ks = 0; ks < BM / 16; ++ks) {
#pragma unroll
                    for (int t = 2 * ks; t < 2 * ks + 2; ++t) {
                        const float2 l = lse_r[t];
                        p_from_s_n8(s, t, l, p.scale_log2);
                        if (need_mask)
                            mask_n8(s, t, kw + lg, 8 * t + 2 * lt, key_limit, causal_limit);
                    }
                    issue_dv(ks);
                }
                BL_TLE(4);  // P^T computed and dV issued
                bl_wgmma_commit();
                bl_wgmma_wait<1>();  // dP^T is done; dV may still run
                bl_reg_fence(ds);
                BL_TLE(5);

                // ---- dS^T = P^T * (dP^T - Dlt) ----
                ds_from_dp<NQ>(ds, s, dlt_r);
                uint32_t dsa[BM / 16][4];
                pack_a_fragments<T>(dsa, ds);

                // ---- dK += dS^T Q (registers), and dS to shared memory (buffer it & 1) for dQ ----
                bl_wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BM / 16; ++ks)
                    bl_wgmma_rs<T, D>(dk_acc, dsa[ks],
                                      bl_wgmma_desc(sQ + ks * K16_BYTES_MNMAJOR, QPANEL, BL_WGMMA_GROUP_BYTES));
                bl_wgmma_commit();
                if constexpr (!WITH_DQ) {
                    // dK only: entry it+1's S^T queues behind dK, the buffer goes back once dV
                    // and dK have read it.
                    const int e_ahead2 = list[it + 2 < count ? it + 2 : count - 1];
                    m_next = ws_code_row_tile(e_ahead, tiles_m, one_head);
                    e_ahead = e_ahead2;
                    issue_s(it + 1);
                    bl_wgmma_wait<1>();
                    bl_reg_fence(dsa);
                    bl_reg_fence(pa);
                    mbarrier_arrive(bars + ws_bars::EMPTY + 8 * buf);
                    bl_wgmma_wait<0>();
                    bl_reg_fence(s);
                    continue;
                }
                store_ds_tile(sDS + wg * QPANEL, dsa, warp, lane);
                bl_fence_proxy_async();  // the dS stores are read by wgmma next
                BL_TLE(6);
                // Every consumer warp's dS of entry it is in shared memory. This is also what frees the
                // other dS buffer: both warpgroups waited for their dQ of entry it-1 (which read it)
                // before arriving here.
                named_barrier_sync(WS_BAR_DS, THREADS);
                BL_TLE(7);
                // Entry it+2 of the list, from global memory: behind the two fences of this
                // iteration and an iteration before its use, because a fence waits for every load
                // in flight (the list read behind the next entry's hand-over fence was ~3 % of the
                // stall samples, bench/results/bwd-s10-ncu-src.txt).
                const int e_ahead2 = list[it + 2 < count ? it + 2 : count - 1];

                // ---- dQ(64 x 64) = dS K: warpgroup wg takes d columns 64wg.., all 128 keys ----
                float dq[32];
                bl_acc_overwritten(dq);  // the first step does not accumulate: no zeroing
                bl_wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BN / 16; ++ks)
                    bl_wgmma_ss_n64<T, 1>(
                        dq,
                        bl_wgmma_desc(sDS + (ks / 4) * QPANEL + (ks % 4) * K16_BYTES_KMAJOR, 16,
                                      BL_WGMMA_GROUP_BYTES),
                        bl_wgmma_desc(s0 + L::K + wg * KPANEL + ks * K16_BYTES_MNMAJOR, KPANEL,
                                      BL_WGMMA_GROUP_BYTES),
                        ks > 0);
                bl_wgmma_commit();
                bl_wgmma_wait<1>();  // dV and dK are done (dQ may still run): buffer buf is read
                bl_reg_fence(dsa);
                bl_reg_fence(pa);
                // Every consumer thread releases the buffer itself: its lse / Dlt reads then come before
                // the producer's next TMA writes there in the order compute-sanitizer racecheck checks
                // (one arrive per warp after a __syncwarp is reported as a WAR hazard).
                mbarrier_arrive(bars + ws_bars::EMPTY + 8 * buf);
                // This entry's dQ flag (slot gi & 3 is rewritten only after entry gi + 2's EMPTY),
                // read here so that its latency passes under the next S^T's issue.
                const bool dq16 = DIRECT && s_dq_flags[gi & 3];
                BL_TLE(8);
                m_next = ws_code_row_tile(e_ahead, tiles_m, one_head);
                e_ahead = e_ahead2;
                issue_s(it + 1);
                // dQ and entry it+1's S^T are done. Waiting for the S^T too is faster than staging
                // while it runs (537-542 vs 547-550 TFLOP/s, bench/results/bwd128-v9-run.txt), and
                // S^T registers in flight across the back edge make ptxas serialise the products
                // (C7514, 453).
                bl_wgmma_wait<0>();
                bl_reg_fence(s);
                bl_reg_fence(dq);
                BL_TLE(9);

                // Warp w's 16 x 64 block of dQ (rows 16(w%4).., columns 64wg..) into staging buffer
                // buf, once entry it-2's reduce-adds have read it; handed to the producer's warp 1 in
                // the next iteration (or below, after the last).
                // (gi + 2k) >> 1 = (gi >> 1) + k: the staging ring's phase parity
                mbarrier_wait(bars + ws_bars::DQEMPTY + 8 * buf,
                              ((uint32_t)((gi >> 1) ^ k) & 1u) ^ 1u);
                BL_TLE(10);
                if (dq16)  // 16-bit, straight to dq (the DIRECT form)
                    ws_stage_dkv<T, 32, BM>(s0 + L::DQS + (uint32_t)(buf * WARPS) * DQ_WARP_BYTES +
                                                (uint32_t)wg * WS_DQ16_PANEL_BYTES,
                                            dq, p.scale, warp & 3, lane);
                else
                    dq_block_stage<false>(s0 + L::DQS + (uint32_t)(buf * WARPS + warp) * DQ_WARP_BYTES, dq);
                BL_TLE(11);
            }
            // the last entry's staged dQ
            if constexpr (WITH_DQ) {
                bl_fence_proxy_async();
                __syncwarp();
                if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL + 8 * ((g0 + count - 1) & 1));
            }
            // The column's last product that reads K / V (the S^T issued past its last entry) has
            // completed: the producer may load the next column's while this one's dK / dV go out.
            mbarrier_arrive(bars + ws_bars::KVEMPTY);
            ++kc;
            BL_TLCOL(ct == 0, 0, 4, 0);
        }
        bl_reg_fence(dk_acc);
        bl_reg_fence(dv_acc);
        // dK and dV to the staging ring's positions g0 + count + 2k and the next (ws_stage_dkv);
        // the second is the last entry's dQ buffer, free once the reducer's adds have read it.
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const int gd = (WITH_DQ ? g0 + count : 0) + 2 * k + x, sb = gd & 1;
            mbarrier_wait(bars + ws_bars::DQEMPTY + 8 * sb, ((uint32_t)(gd >> 1) & 1u) ^ 1u);
            const uint32_t sbuf = s0 + L::DQS + (uint32_t)(sb * WARPS) * DQ_WARP_BYTES;
            if constexpr (SPLIT)
                ws_store_dkv_part(p, cl, x, x == 0 ? dk_acc : dv_acc, warp, lane);
            else if (x == 0)
                ws_stage_dkv<T>(sbuf, dk_acc, p.scale, warp, lane);
            else
                ws_stage_dkv<T>(sbuf, dv_acc, 1.0f, warp, lane);
            bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
            __syncwarp();
            if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL + 8 * sb);
        }
        if constexpr (SPLIT) ws_split_count_column(p, cl.b, cl.g, cl.n, ct, bars + WS_SPLIT_HEAD);
        BL_TLCOL(ct == 0, 0, 5, 0);
        g0 += count;
    }  // columns
    if constexpr (SPLIT) ws_split_sum_owned<T>(p, ct, bars + WS_SPLIT_HEAD);
}

}  // namespace bl_bwd
