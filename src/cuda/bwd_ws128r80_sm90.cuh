// bwd_ws128r80_sm90.cuh -- backward main kernel version 11, head dim 128: version 10
// (bwd_ws128_sm90.cuh: producer warpgroup, persistent CTAs, the next S^T behind dQ, dK / dV by
// TMA stores) on entries of 80 query rows instead of 64. Dense calls (with or without a causal
// mask) always; masked and selected calls where the device finds it cheaper (LISTS with a
// causal mask, MASKED without one: aligned or packed entries).
//
// Why: at 16k and 32k the non-causal dense backward ran at 0.96x cuDNN while our causal calls ran
// as fast per entry as cuDNN's; the gap is the main loop's rate per entry -- the fixed work of an
// entry (dS barrier, dQ staging and hand-over, waits) -- not the schedule's tail
// (bench/notes-bwd.md, twelfth session). FlashAttention-3 takes 80-row entries for exactly these
// calls: 25 % more rows share that fixed work. FlashAttention-3 keeps 64 rows for causal calls;
// here 80 rows with the diagonal masked element-wise measured 3.5-8 % faster than version 10 at
// 16k / 32k (bench/notes-bwd.md, fourteenth session).
// Masked calls: the 64-row tile stays the granularity of the statistics and of what is skipped.
// An 80-row entry overlaps two 64-row tiles; it is listed where either is kept, and the rows of
// the other, where that is not, load lse = +inf and Dlt = 0 instead of theirs, so that their P
// and dS are 0 and the consumers run the dense kernel's code. At high sparsity that computes up
// to twice the rows, so the call takes this kernel only where its entries cost less in all than
// version 10's (bl_bwd_rows80_chosen, on the device: attn_bwd_sm90.cu launches both).
//
// What changes against version 10 (same warp roles, same barriers, same rings):
//   - the entries of a dense call's column are every (q head hl of the group, 80-row tile m), hl
//     major, from the first tile a causal mask leaves anything in (r80_first_tile): no lists; no
//     masks but the key limit of the last key tile (rows past Sq load as zeros and have lse =
//     +inf, so their P is 0) or the causal diagonal; a masked call's come from p.lists80, each
//     with its two tiles' bits, which decide the lse / Dlt rows the producer loads;
//   - S^T, dP^T are m64n80 products (40 accumulator registers each); dV, dK reduce over 80
//     queries (5 k16 steps);
//   - dQ is computed transposed, dQ^T (d x queries) = K^T dS^T: M must be 64 per warpgroup and
//     80 rows cannot be split so; warpgroup wg takes d rows 64wg.. (K^T as the MN-major A
//     operand), N = 80;
//   - dQ^T leaves the registers as 10 16-byte shared stores per thread, in the accumulator's own
//     order (r80_dq_offset), into one 40 KB staging buffer; the reducer adds it into the fp32
//     accumulator's 80 x 128 block with a single bulk reduce-add; the postprocess
//     (BL_DQ_TILES80, bwd_prepost_sm90.cu) undoes the order;
//   - lse / Dlt are read from shared memory where they are used (40 preloaded registers would
//     not fit beside S^T, dP^T and dK / dV);
//   - the column's end: dK is staged in the dS buffers and dV in the dQ staging (version 10 has
//     two staging buffers for them), and the next column's V loads before its K, with both
//     prefetched into L2 at the draw.
#pragma once
#include "bwd_ws128_sm90.cuh"

namespace bl_bwd {

constexpr int BM80 = BL_BWD_TM_DENSE;  // query rows per entry
// The column's dK is staged in the two dS buffers (40 KB, free at the column's end), the dQ ring
// having one buffer here: its second pair of barriers (ws_init_bars(bars, 2)) hands that over.
constexpr uint32_t R80_DKFULL = ws_bars::DQFULL + 8;   // dK staged by all 8 consumer warps
constexpr uint32_t R80_DSFREE = ws_bars::DQEMPTY + 8;  // dK read by its TMA stores

// The BN x D tile of K or V (map, keys key0.., kv head g, batch b; zero past Sk) into its panels
// at `dst`, completing on `bar` (whose expected bytes the caller set for both).
template <int D>
__device__ __forceinline__ void r80_tma_kv_half(const CUtensorMap *map, uint32_t dst, uint32_t bar,
                                                int64_t b, int64_t g, int64_t key0) {
#pragma unroll
    for (int panel = 0; panel < D / PANEL_COLS; ++panel)
        tma_load_4d(dst + panel * BN * PANEL_ROW_BYTES, map, bar, panel * PANEL_COLS, (int)key0,
                    (int)g, (int)b);
}

// Byte offsets from the kernel's 1024-aligned shared-memory base (every panel on a 1024-byte
// boundary: 80 rows x 128 bytes = 10 KB).
struct r80_smem {
    static constexpr int D = 128;
    static constexpr uint32_t QPANEL = BM80 * PANEL_ROW_BYTES;  // 64 columns of a Q / dO / dS tile
    static constexpr uint32_t TILE = BM80 * D * 2;              // one Q or dO buffer
    static constexpr uint32_t DS_TILE = BM80 * BN * 2;          // one dS buffer (2 panels)
    static constexpr uint32_t DQ_BYTES = BM80 * D * sizeof(float);  // the dQ^T staging
    static constexpr uint32_t K = 0;                  // BN x D
    static constexpr uint32_t V = K + BN * D * 2;     // BN x D
    static constexpr uint32_t Q = V + BN * D * 2;     // 2 buffers
    static constexpr uint32_t DO = Q + 2 * TILE;      // 2 buffers
    static constexpr uint32_t DS = DO + 2 * TILE;     // 2 buffers: entry it+1's dS is written
                                                      // while entry it's dQ^T still reads
    static constexpr uint32_t DQS = DS + 2 * DS_TILE;  // dQ^T, then each column's dV
    static constexpr uint32_t ROWS = DQS + DQ_BYTES;  // fp32 lse_log2[2][BM80], dlt[2][BM80]
    // int [4]: each buffer's entry's row tile m, then (without a causal mask) its key limit
    static constexpr uint32_t ENTRY = ROWS + 4 * BM80 * sizeof(float);
    static constexpr uint32_t BARS = ENTRY + 16;
    static constexpr uint32_t USED = BARS + WS_SPLIT_HEAD + sizeof(int);  // (version 10's bars)
    static constexpr uint32_t BASE_ALIGN = 1024;
    static constexpr size_t BYTES = USED + BASE_ALIGN;
    static_assert(Q % 1024 == 0 && DO % 1024 == 0 && DS % 1024 == 0 && DQS % 1024 == 0 &&
                      QPANEL % 1024 == 0,
                  "panels start on 1024-byte boundaries");
    static_assert(DQ_BYTES >= 2 * BN * PANEL_ROW_BYTES, "dV (ws_stage_dkv) fits the staging");
    static_assert(2 * DS_TILE >= 2 * BN * PANEL_ROW_BYTES, "dK (ws_stage_dkv) fits the dS buffers");
    static_assert(BARS % 16 == 0, "TMA writes the column records 16-byte aligned");
    static_assert(BYTES <= 232448, "227 KB of shared memory per CTA on sm_90");
};

// Float offset, in the accumulator's 80 x 128 block of an entry, of consumer warp `warp`'s
// 16-byte vector `t` for lane `lane`: registers dq[4t .. 4t + 3] of the dQ^T fragment (d rows
// 16 warp + lane / 4 (+ 8 for the last two), queries 8t + 2(lane % 4) (+1)). The postprocess
// (postprocess_tile in bwd_prepost_sm90.cu) reads the block in this order.
constexpr int R80_WARP_FLOATS = 16 * BM80;
__device__ __forceinline__ uint32_t r80_dq_offset(int warp, int t, int lane) {
    return (uint32_t)(warp * R80_WARP_FLOATS + (32 * t + lane) * 4);
}
// The same query-group major (the masked walks but the causal aligned one): vector t of every
// warp, then t + 1, so that each piece of a packed entry (whole groups of 8 queries) is one
// contiguous run of the staging, and of the BL_DQ_TILES64R block it adds into
// (r80_reduce_packed); aligned entries add theirs whole into BL_DQ_TILES80G blocks. Takes the
// consumer thread ct = 32 warp + lane: written with warp and lane, ptxas rebuilt the address
// from them for every t (a shift, two LOP3 and a LEA per store; ncu, bench/results/bwd-s22.txt
// run 7) instead of an immediate offset (bench/results/bwd-s31-causal-packed.txt run 2).
__device__ __forceinline__ uint32_t r80_dq_offset_grouped(int ct, int t) {
    return (uint32_t)((t * WARPS * 32 + ct) * 4);
}

// An entry of p.lists80, hl << 20 | m << 2 | bits (bwd_lists_sm90.cu) -> q head hl of the group,
// row tile m, bits: shifts, no division (the producer and the reducer run on 24 registers).
__device__ __forceinline__ void r80_list_entry(int code, int &hl, int &m, int &bits) {
    hl = code >> BL_R80_ENTRY_HL_SHIFT;
    m = (code >> 2) & ((1 << (BL_R80_ENTRY_HL_SHIFT - 2)) - 1);
    bits = code & 3;
}
// The column's p.lists80 entries (masked calls).
__device__ __forceinline__ const int *r80_list(const bwd_params &p, const ws_column &cl) {
    const bl_bwd_dims &dm = p.dm;
    return p.lists80 + ((cl.b * dm.heads_k + cl.g) * dm.tiles_n + cl.n) * (dm.group * dm.tiles_m80);
}

// Granularity of the rows an entry loads apart: packed entries' pieces, aligned entries' kept
// and unkept rows (p.tm_qp: boxes of 16, 32, 48 rows).
constexpr int R80_PACKED_BOX = 16;

// Q / dO rows [lo, hi) of an 80-row entry into buffer `buf` from sequence row `row` of q head h,
// by maps mq / mdo whose box is hi - lo rows. From row Sq_pad on TMA fills the box with zeros.
__device__ __forceinline__ void r80_tma_rows(const CUtensorMap *mq, const CUtensorMap *mdo,
                                             uint32_t s0, int buf, int64_t b, int64_t h, int row,
                                             int lo) {
    using L = r80_smem;
    const uint32_t bar = s0 + L::BARS + ws_bars::FULL + 8 * buf;
    const uint32_t sq = s0 + L::Q + buf * L::TILE + lo * PANEL_ROW_BYTES;
    const uint32_t sdo = s0 + L::DO + buf * L::TILE + lo * PANEL_ROW_BYTES;
#pragma unroll
    for (int panel = 0; panel < L::D / PANEL_COLS; ++panel) {
        tma_load_4d(sq + panel * L::QPANEL, mq, bar, panel * PANEL_COLS, row, (int)h, (int)b);
        tma_load_4d(sdo + panel * L::QPANEL, mdo, bar, panel * PANEL_COLS, row, (int)h, (int)b);
    }
}

// TMA of the 80-row tile (q head h, rows 80m..) of Q and dO into buffer `buf`, and its lse_log2
// / Dlt rows, completing on the buffer's FULL mbarrier; m into the buffer's entry slot first
// (the arrive releases it to the waiters: the causal diagonal needs it). bits (3 on dense calls):
// which of the entry's two 64-row tiles are kept. The entry's rows 80m.. start 16 (m % 4) rows
// into 64-row tile 80m / 64, so the next tile starts at row `split` of the entry. The rows of an
// unkept one are zeros (Q and dO from past the sequence end) with lse_log2 / Dlt from
// p.unkept_rows (+inf / 0), so that their P and dS are exactly 0 and they add nothing to dK / dV
// even where the inputs hold NaN or inf (with their real Q / dO rows, lse = +inf alone left
// exp2(NaN - inf) = NaN, and dS^T Q spread a NaN Q row into the column's dK). The bytes on the
// barrier are the same, the consumers' code is the dense call's. MASKED: bits may be other than 3
// (the dense walks compile without that code: their SASS stays the one measured).
template <bool MASKED>
__device__ __forceinline__ void r80_tma_row_tile(const bwd_params &p, uint32_t s0, int *entry_slots,
                                                 int buf, int64_t b, int64_t h, int64_t m, int bits) {
    using L = r80_smem;
    constexpr uint32_t ROW_BYTES = BM80 * sizeof(float);
    static_assert(BM80 == 5 * R80_PACKED_BOX && BL_BWD_TM == 4 * R80_PACKED_BOX,
                  "an entry's kept and unkept rows are whole boxes of p.tm_qp / p.tm_q");
    const uint32_t bar = s0 + L::BARS + ws_bars::FULL + 8 * buf;
    entry_slots[buf] = (int)m;
    mbarrier_arrive_expect_tx(bar, 2 * L::TILE + 2 * ROW_BYTES);
    const int row0 = (int)(m * BM80);
    if (!MASKED || bits == 3) {
#pragma unroll
        for (int panel = 0; panel < L::D / PANEL_COLS; ++panel) {
            tma_load_4d(s0 + L::Q + buf * L::TILE + panel * L::QPANEL, &p.tm_q80, bar,
                        panel * PANEL_COLS, row0, (int)h, (int)b);
            tma_load_4d(s0 + L::DO + buf * L::TILE + panel * L::QPANEL, &p.tm_do80, bar,
                        panel * PANEL_COLS, row0, (int)h, (int)b);
        }
    }
    const int64_t rows = (b * p.dm.heads_q + h) * p.dm.seqlen_q_pad + row0;
    const uint32_t s_lse = s0 + L::ROWS + buf * ROW_BYTES;
    const uint32_t s_dlt = s0 + L::ROWS + (2 + buf) * ROW_BYTES;
    if (!MASKED || bits == 3) {
        bulk_load(s_lse, p.lse_log2 + rows, ROW_BYTES, bar);
        bulk_load(s_dlt, p.dlt + rows, ROW_BYTES, bar);
        return;
    }
    // Kept rows [lo, hi), the rest [ulo, uhi): one range each (multiples of 16 rows: 64 bytes).
    const int split = BL_BWD_TM - (BM80 - BL_BWD_TM) * (int)(m & 3);
    const int lo = (bits & 1) ? 0 : split, hi = (bits & 2) ? BM80 : split;
    const int ulo = (bits & 1) ? split : 0, uhi = (bits & 1) ? BM80 : (bits & 2) ? split : BM80;
    // the map of a range of x rows: 80 (bits 0: the padding entry of a column with nothing
    // kept), 64, or 48 / 32 / 16 (p.tm_qp)
    auto rows_tma = [&](int x, int row, int at) {
        const int i = x / R80_PACKED_BOX - 1;
        if (i == 4)
            r80_tma_rows(&p.tm_q80, &p.tm_do80, s0, buf, b, h, row, at);
        else if (i == 3)
            r80_tma_rows(&p.tm_q, &p.tm_do, s0, buf, b, h, row, at);
        else
            r80_tma_rows(&p.tm_qp[i], &p.tm_dop[i], s0, buf, b, h, row, at);
    };
    if (hi > lo) {
        rows_tma(hi - lo, row0 + lo, lo);
        bulk_load(s_lse + 4 * lo, p.lse_log2 + rows + lo, 4 * (hi - lo), bar);
        bulk_load(s_dlt + 4 * lo, p.dlt + rows + lo, 4 * (hi - lo), bar);
    }
    rows_tma(uhi - ulo, (int)p.dm.seqlen_q_pad, ulo);
    bulk_load(s_lse + 4 * ulo, p.unkept_rows + ulo, 4 * (uhi - ulo), bar);
    bulk_load(s_dlt + 4 * ulo, p.unkept_rows + BM80 + ulo, 4 * (uhi - ulo), bar);
}

// ---- packed entries (masked calls; with a causal mask each piece has its own diagonal: the
// producer hands the consumers both pieces' rooms with the entry, s_entry) ----
// The column's kept 64-row tiles -- version 10's list (p.lists: c64 codes hl * Tm + m) -- laid
// end to end and cut into 80-row entries: ceil(4 c64 / 5) of them, so that a masked call
// computes only its kept rows, on 80-row entries (aligned entries compute the rows of every
// unkept tile they overlap: 1.5x the kept rows at 50 % random kept; version 10's 64-row entries
// run ~7 % slower per row). Measured: a packed entry still costs ~3-6 % more than an aligned
// one (bench/results/bwd-s21.txt), hence the choice, bl_bwd_packed_chosen.
// Entry it starts off = 80 it - 64 a = 16 (it % 4) rows into list tile a = 5 it / 4: its rows
// 0 .. rows_a - 1 (rows_a = 64 - off) are rows off.. of tile a, the rest rows 0.. of tile a + 1.
// A piece past the list's end is padding: TMA loads rows past Sq (zeros), lse = +inf and Dlt =
// 0 from p.unkept_rows, so its P and dS are exactly 0 (even for NaN inputs), and it adds no dQ.
// A column with nothing kept gets one entry of padding (its dK = dV = 0 come out of the loop).
struct r80_packed_entry {
    int ha, ma;  // piece A: q head, 64-row tile; ha < 0: padding
    int hb, mb;  // piece B, the same
    int rows_a;  // entry rows of piece A: 64, 48, 32 or 16
};
__device__ __forceinline__ r80_packed_entry r80_packed(const bwd_params &p, const ws_column &cl,
                                                       int it) {
    const int a = (5 * it) >> 2, tm = (int)p.dm.tiles_m, h0 = (int)(cl.g * p.dm.group);
    const bool one_head = p.dm.group == 1;
    r80_packed_entry e;
    e.rows_a = BL_BWD_TM - 16 * (it & 3);
    e.ha = e.hb = -1;
    e.ma = e.mb = 0;
    int hl;
    if (a < cl.count) {
        ws_split_code(cl.list[a], tm, one_head, hl, e.ma);
        e.ha = h0 + hl;
    }
    if (a + 1 < cl.count) {
        ws_split_code(cl.list[a + 1], tm, one_head, hl, e.mb);
        e.hb = h0 + hl;
    }
    return e;
}

// TMA of packed entry e into buffer `buf` (as r80_tma_row_tile): Q and dO per piece, by the
// map whose box is the piece's rows (p.tm_qp, p.tm_q: one load per 64-column panel), or as one
// 80-row box where piece B is the tile right after piece A; padding takes rows from Sq_pad on,
// which TMA fills with zeros. lse_log2 / Dlt as one bulk copy per piece. The bytes on the barrier
// are the dense entry's. (Five 16-row boxes per panel ran 9 % slower at 10-25 % kept than one
// 80-row box: bench/results/bwd-s21.txt.)
__device__ __forceinline__ void r80_tma_packed(const bwd_params &p, uint32_t s0, int buf, int64_t b,
                                               const r80_packed_entry &e) {
    using L = r80_smem;
    static_assert(BL_BWD_TM % R80_PACKED_BOX == 0 && BM80 - BL_BWD_TM == R80_PACKED_BOX,
                  "pieces are whole boxes of p.tm_qp or p.tm_q");
    constexpr uint32_t ROW_BYTES = BM80 * sizeof(float);
    const uint32_t bar = s0 + L::BARS + ws_bars::FULL + 8 * buf;
    mbarrier_arrive_expect_tx(bar, 2 * L::TILE + 2 * ROW_BYTES);
    const int off = BL_BWD_TM - e.rows_a;
    const uint32_t sq = s0 + L::Q + buf * L::TILE, sdo = s0 + L::DO + buf * L::TILE;
    // rows [lo, hi) of the entry from (q head h, sequence row r0), by maps of hi - lo rows (the
    // loop of r80_tma_rows written out: through that helper ptxas schedules this kernel
    // differently, and its SASS is the one measured)
    auto piece = [&](const CUtensorMap *mq, const CUtensorMap *mdo, int h, int r0, int lo) {
        const int hh = h < 0 ? 0 : h, row = h < 0 ? (int)p.dm.seqlen_q_pad : r0;
#pragma unroll
        for (int panel = 0; panel < L::D / PANEL_COLS; ++panel) {
            const uint32_t at = panel * L::QPANEL + lo * PANEL_ROW_BYTES;
            tma_load_4d(sq + at, mq, bar, panel * PANEL_COLS, row, hh, (int)b);
            tma_load_4d(sdo + at, mdo, bar, panel * PANEL_COLS, row, hh, (int)b);
        }
    };
    const int ra = BL_BWD_TM * e.ma + off, rb = BL_BWD_TM * e.mb;
    if (e.ha >= 0 && e.hb == e.ha && e.mb == e.ma + 1) {
        piece(&p.tm_q80, &p.tm_do80, e.ha, ra, 0);
    } else {
        const int ia = e.rows_a / R80_PACKED_BOX - 1, ib = (BM80 - e.rows_a) / R80_PACKED_BOX - 1;
        piece(ia == 3 ? &p.tm_q : &p.tm_qp[ia], ia == 3 ? &p.tm_do : &p.tm_dop[ia], e.ha, ra, 0);
        piece(ib == 3 ? &p.tm_q : &p.tm_qp[ib], ib == 3 ? &p.tm_do : &p.tm_dop[ib], e.hb, rb,
              e.rows_a);
    }
    const uint32_t s_lse = s0 + L::ROWS + buf * ROW_BYTES;
    const uint32_t s_dlt = s0 + L::ROWS + (2 + buf) * ROW_BYTES;
    // entry rows [lo, hi) from (q head h, sequence row r0), or from p.unkept_rows
    auto rows_piece = [&](int h, int64_t r0, int lo, int hi) {
        const uint32_t bytes = 4 * (hi - lo);
        if (h < 0) {
            bulk_load(s_lse + 4 * lo, p.unkept_rows + lo, bytes, bar);
            bulk_load(s_dlt + 4 * lo, p.unkept_rows + BM80 + lo, bytes, bar);
            return;
        }
        const int64_t at = (b * p.dm.heads_q + h) * p.dm.seqlen_q_pad + r0;
        bulk_load(s_lse + 4 * lo, p.lse_log2 + at, bytes, bar);
        bulk_load(s_dlt + 4 * lo, p.dlt + at, bytes, bar);
    };
    rows_piece(e.ha, ra, 0, e.rows_a);
    rows_piece(e.hb, rb, e.rows_a, BM80);
}

// The reducer's dQ reduce-adds of packed entry e from the staging (r80_dq_offset_grouped's order)
// into the BL_DQ_TILES64R accumulator, whose 64 x 128 blocks have the same order: 8 groups of 8
// queries, 1024 floats each. Piece A's groups go to tile (ha, ma) from group off / 8 on, piece
// B's to tile (hb, mb) from group 0: one bulk reduce-add per piece.
__device__ __forceinline__ void r80_reduce_packed(const bwd_params &p, uint32_t s_stage, int64_t b,
                                                  const r80_packed_entry &e) {
    constexpr int GROUP = 8 * 128;                     // floats of 8 queries x 128 d
    constexpr int TILE_FLOATS = BL_BWD_TM / 8 * GROUP;  // 64 x 128
    const int groups_a = e.rows_a / 8, off_groups = (BL_BWD_TM - e.rows_a) / 8;
    const int64_t bq = b * p.dm.heads_q;
    if (e.ha >= 0)
        bulk_reduce_add_f32(p.dq_accum + ((bq + e.ha) * p.dm.tiles_m + e.ma) * TILE_FLOATS +
                                off_groups * GROUP,
                            s_stage, groups_a * GROUP * 4);
    if (e.hb >= 0)
        bulk_reduce_add_f32(p.dq_accum + ((bq + e.hb) * p.dm.tiles_m + e.mb) * TILE_FLOATS,
                            s_stage + groups_a * GROUP * 4, (BM80 / 8 - groups_a) * GROUP * 4);
}

// The first 80-row tile of key tile n that a causal mask leaves anything in: tile m's last row
// 80m + 79 sees the keys j <= 80m + 79 + diag (bwd_params::diag: Sk - Sq on causal calls). (The
// last tile always does: its last row is Sq - 1, which sees every key.) 0 without a causal mask.
template <bool CAUSAL>
__device__ __forceinline__ int r80_first_tile(int64_t diag, int64_t n) {
    if (!CAUSAL) return 0;
    const int64_t need = n * BN - diag - (BM80 - 1);  // 80 m >= need
    return need <= 0 ? 0 : (int)((need + BM80 - 1) / BM80);
}

// What a launch of version 11 walks: every entry a causal mask leaves (DENSE), a masked causal
// call's aligned 80-row entries (LISTS: p.lists80; the rows of an entry's unkept 64-row tile get
// P = 0 through their lse, r80_tma_row_tile), or a masked non-causal call's aligned entries
// (MASKED), or a masked call's packed ones (PACKED: r80_packed, with or without a causal mask),
// whichever the entry totals find cheaper (bl_bwd_packed_chosen). Aligned and packed entries are
// two instantiations, not a branch in one kernel: with the packed code beside it the aligned
// walk ran 1-2.5 % slower on the bench's nearly full video masks (bench/results/bwd-s22.txt,
// run 4).
enum r80_entries { R80_DENSE = 0, R80_LISTS = 1, R80_MASKED = 2, R80_PACKED = 3 };

// How the products' accumulators start. Each product's first wgmma does not accumulate (scale-d
// 0), so nothing is zeroed: ptxas had folded some zeroed accumulators into their first wgmma and
// zeroed others with one move per register in the loop (40 per entry for dQ^T here).
// Except in the dense non-causal walk, which keeps its zeroed accumulators: without the moves it
// ran 3.8 % slower under ncu (bench/results/bwd-s30-zero-acc.txt run 1), while the causal walks
// gained 1.8-3.5 %.
template <bool CAUSAL, int ENTRIES>
__device__ __forceinline__ constexpr bool r80_zero_acc() {
    return !CAUSAL && ENTRIES == R80_DENSE;
}
template <bool ZERO, int N>
__device__ __forceinline__ void r80_start_acc(float (&acc)[N]) {
    if constexpr (ZERO) {
#pragma unroll
        for (int x = 0; x < N; ++x) acc[x] = 0.0f;
        bl_reg_fence(acc);
    } else {
        bl_acc_overwritten(acc);
    }
}

// SPLIT: the column's entries of its part's query heads. The dense walk counts them itself
// (heads part * G / P ..); packed walks take the part's run of the 64-row list (ws_part_range);
// aligned walks the run of lists80 (codes hl << 20 | m << 2 | bits ascend), into cl.list /
// cl.count80. An empty aligned run becomes one entry that keeps no row (r80_no_rows: hl 0, m 0,
// bits 0), as the lists kernel writes for an empty key tile: a column without entries would
// wait for K / V that are never loaded; this one loads them, adds nothing and stores dK = dV = 0.
static __device__ int r80_no_rows[1];
template <bool ALIGNED, bool PACKED>
__device__ __forceinline__ void r80_split_column(const bwd_params &p, ws_column &cl) {
    if (cl.count < 0) return;  // past the schedule's end
    if constexpr (PACKED) ws_part_range(p, cl);
    if constexpr (ALIGNED) {
        const int *list = r80_list(p, cl);
        const int hpp = (int)p.dm.group / bl_bwd_split_parts(p.head_split, p.split_rule, p.totals);
        const int a = ws_list_lower_bound(list, cl.count80, (cl.part * hpp) << BL_R80_ENTRY_HL_SHIFT);
        const int z =
            ws_list_lower_bound(list, cl.count80, ((cl.part + 1) * hpp) << BL_R80_ENTRY_HL_SHIFT);
        cl.list = z > a ? list + a : r80_no_rows;
        cl.count80 = z > a ? z - a : 1;
    }
}

// p.dq_accum is zeroed, in the BL_DQ_TILES80 layout; MASKED: BL_DQ_TILES80G, PACKED:
// BL_DQ_TILES64R. CAUSAL: the walk cuts at p.diag (p.causal set, or a non-causal call's dense
// walk with p.diag = BL_BWD_DIAG_NONE: attn_bwd_sm90.cu). KEYS_FULL (non-causal masked walks):
// Sk is a multiple of BN, so every column's keys fill it and the key-limit selects go.
// SPLIT (bwd_params::head_split > 1): each drawn column is one part of a column's query heads
// (r80_split_column), its dK / dV stored as fp32 partials from registers (ws_store_dkv_part)
// instead of staged and stored by the reducer; an instantiation of its own, so that the unsplit
// kernels keep their SASS.
template <typename T, bool CAUSAL, int ENTRIES, bool KEYS_FULL = false, bool SPLIT = false>
__global__ void __launch_bounds__(WS_THREADS, 1) bwd_ws128r80_kernel(const __grid_constant__ bwd_params p) {
    constexpr bool ZERO_ACC = r80_zero_acc<CAUSAL, ENTRIES>();
    static_assert(!(CAUSAL && ENTRIES == R80_MASKED) && !(!CAUSAL && ENTRIES == R80_LISTS),
                  "aligned masked entries: LISTS with a causal mask, MASKED without one");
    static_assert(!KEYS_FULL || (!CAUSAL && ENTRIES != R80_DENSE),
                  "KEYS_FULL: the non-causal masked walks (the dense one takes the causal walk)");
    constexpr bool LISTS = ENTRIES == R80_LISTS, PACKED = ENTRIES == R80_PACKED;
    constexpr bool MASKED = ENTRIES == R80_MASKED || PACKED;  // (staged query-group major)
    // A masked call launches version 10 and this kernel, with a causal mask on LISTS, without
    // one on MASKED, then PACKED entries, then on the dense walk, each the programmatic
    // dependent of the one before (attn_bwd_sm90.cu). They start after the preprocess has
    // completed (version 10's first form lets its dependents launch only then), so each reads
    // the entry totals at once and returns unless they pick it: the dense walk where the mask
    // keeps every tile (bl_bwd_masked_full), else the 80-row entries where they cost less than
    // version 10's (bl_bwd_rows80_cheaper), packed or aligned (bl_bwd_packed_chosen). The
    // postprocess, launched after the last, waits for that one to complete, and each grid
    // completes only after the one before it: a returning grid's CTA 0 waits for it
    // (griddepcontrol.wait) while its other CTAs leave at once, so that returning kernels do not
    // take turns holding every SM. (The causal kernels keep their own form of these tests:
    // their SASS, and so their speed, moves with any change here; bench/results/bwd-s17.txt.)
    if (p.totals != nullptr) {
        bool picked;
        if constexpr (CAUSAL && PACKED) {
            griddep_launch_dependents();  // the dense walk behind it
            picked = !bl_bwd_masked_full(p.totals) && bl_bwd_rows80_cheaper(p.totals, true, false) &&
                     bl_bwd_packed_chosen(p.totals, true);
        } else if constexpr (CAUSAL && LISTS) {
            griddep_launch_dependents();  // the packed kernel behind it
            picked = !bl_bwd_masked_full(p.totals) && bl_bwd_rows80_cheaper(p.totals, true, false) &&
                     !bl_bwd_packed_chosen(p.totals, true);
        } else if constexpr (CAUSAL) {
            picked = bl_bwd_masked_full(p.totals);
        } else {
            if (MASKED) griddep_launch_dependents();
            const bool full = bl_bwd_masked_full(p.totals);
            picked = MASKED ? !full && bl_bwd_rows80_cheaper(p.totals, false, KEYS_FULL) &&
                                  bl_bwd_packed_chosen(p.totals, false) == PACKED
                            : full;
        }
        if (!picked && blockIdx.x != 0) return;
        // The dense walk is the chain's last candidate, its dependent the postprocess. Not
        // picked, its CTA 0 lets that launch before waiting: the postprocess reads the totals
        // and writers only (final since version 10's trigger), its CTAs without rows to convert
        // leave at once and the others wait, CTA 0 among them. Else the postprocess's grid
        // started only once this one completed, after the main kernels: ~20 us of CTAs that
        // return at the end of a call whose light tiles DIRECT wrote
        // (bench/results/bwd-s125-ncu-dram.txt).
        if constexpr (ENTRIES == R80_DENSE) {
            if (!picked) griddep_launch_dependents();
        }
        griddep_wait();
        if (!picked) return;
    }
    // (Without totals, where a dev variant forces the 80-row kernel, MASKED runs aligned entries.)
    constexpr bool packed = PACKED;
    constexpr bool aligned = LISTS || (MASKED && !PACKED);
    constexpr int D = 128;
    using L = r80_smem;
    constexpr int NQ = BM80 / 8;  // n8 tiles of queries (S^T, dP^T, dQ^T): 10
    constexpr int ND = D / 8;     // n8 tiles of head dim (dK, dV)
    constexpr int KSTEPS_D = D / 16;
    constexpr int KSTEPS_Q = BM80 / 16;  // dV, dK: reduction over the entry's queries
    constexpr int KSTEPS_K = BN / 16;    // dQ^T: reduction over the column's keys
    constexpr uint32_t KPANEL = BN * PANEL_ROW_BYTES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
    const uint32_t s0 = bl_smem_addr(smem_base);
    const uint32_t bars = s0 + L::BARS;
    const float *s_rows = reinterpret_cast<const float *>(smem_base + L::ROWS);
    int *s_entry = reinterpret_cast<int *>(smem_base + L::ENTRY);  // [4]: r80_smem::ENTRY

    const bl_bwd_dims &dm = p.dm;
    // SPLIT: schedule positions are (column, part) pairs of the parts the call uses
    // (ws_draw_column), each part's heads R80_HPP from part * R80_HPP (a macro: a variable moved
    // the non-causal dense walk's SASS, and one held through the kernel spilled more)
#define R80_HPP \
    (SPLIT ? (int)dm.group / bl_bwd_split_parts(p.head_split, p.split_rule, p.totals) \
           : (int)dm.group)
    const int tiles_m = (int)dm.tiles_m80;
    const int4 *col_slots = reinterpret_cast<const int4 *>(smem_base + L::BARS + ws_bars::COLS);

    // One dQ staging buffer: the second pair of dQ barriers serves the dK staging (R80_DKFULL,
    // R80_DSFREE).
    if (threadIdx.x == 0) ws_init_bars(bars, 2);
    __syncthreads();

    // The roles split on a warp-uniform warpgroup index (bl_warpgroup_uniform) where that measured
    // faster; the dense and masked non-causal walks keep the split on threadIdx.x, with which
    // their loops stay spill-free.
    constexpr bool UNIFORM_ROLES = CAUSAL || PACKED;
    const int role_wg = UNIFORM_ROLES ? bl_warpgroup_uniform() : (int)threadIdx.x / 128;
    if (UNIFORM_ROLES ? role_wg == 0 : threadIdx.x < 128) {
        // ---- producer warpgroup (as version 10) ----
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            int gi = 0, kc = 0;
            for (int k = 0;; ++k) {
                BL_TLCOL(true, 1, 0, 0);
                const int64_t rec = ws_draw_column<SPLIT>(p, bars, k);
                if (rec < 0) break;
                ws_column cl = ws_decode(p, ws_records(p)[rec]);
                if constexpr (SPLIT) r80_split_column<aligned, packed>(p, cl);
                BL_TLCOL(true, 1, 1, 0);
                // The column's K / V into L2 now, one to two entries before the last column's
                // end frees their buffers (the draw follows the last column's last row-tile
                // issue): loaded from DRAM at that end, they landed up to ~3000 clocks after the
                // next column's start; prefetched, most land before it (16k x 16 x 128,
                // bench/results/bwd-s69-column-end.txt run 3).
                if (k > 0) {
#pragma unroll
                    for (int panel = 0; panel < D / PANEL_COLS; ++panel) {
                        tma_prefetch_l2_4d(&p.tm_k, panel * PANEL_COLS, (int)(cl.n * BN), (int)cl.g,
                                           (int)cl.b);
                        tma_prefetch_l2_4d(&p.tm_v, panel * PANEL_COLS, (int)(cl.n * BN), (int)cl.g,
                                           (int)cl.b);
                    }
                }
                const int m_first = LISTS || MASKED ? 0 : r80_first_tile<CAUSAL>(p.diag, cl.n);
                const int count = aligned  ? cl.count80
                                  : packed ? bl_bwd_packed_count(cl.count)
                                           : R80_HPP * (tiles_m - m_first);
                const int *list = SPLIT && aligned ? cl.list : r80_list(p, cl);
                // the column's keys before Sk, handed to the consumers with each entry (see P^T)
                const int64_t key_room = dm.seqlen_k - cl.n * BN;
                const int key_limit = key_room < BN ? (int)key_room : BN;
                // CAUSAL packed: query q sees key cl.n * BN + jr where jr <= q + causal_base
                const int causal_base = (int)(p.diag - cl.n * BN);
                // A masked call's entries are read one ahead: the load's latency then overlaps
                // the waits instead of delaying the TMA issue.
                int code_next = aligned && count > 0 ? list[0] : 0;
                // entry it: q head hl of the group, row tile m
                int hl = SPLIT ? cl.part * R80_HPP : 0, m = m_first, bits = 3;
                for (int it = 0; it < count; ++it, ++gi) {
                    if (aligned) {
                        r80_list_entry(code_next, hl, m, bits);
                        if (it + 1 < count) code_next = list[it + 1];
                    }
                    const int buf = gi & 1;
                    r80_packed_entry e;
                    if (packed) e = r80_packed(p, cl, it);  // (its list loads before the wait)
                    BL_TL80(true, 2, 4);
                    mbarrier_wait(bars + ws_bars::EMPTY + 8 * buf, ((uint32_t)(gi >> 1) & 1u) ^ 1u);
                    BL_TL80(true, 2, 5);
                    if (it == 0) BL_TLCOL(true, 1, 2, 0);
                    if (!CAUSAL && !KEYS_FULL) s_entry[2 + buf] = key_limit;  // released by the FULL arrive
                    if (CAUSAL && packed) {
                        // Each piece's room (the consumers' causal branch): entry row ir of
                        // piece A is query 64 ma + 64 - rows_a + ir, of piece B
                        // 64 mb - rows_a + ir.
                        s_entry[buf] = BL_BWD_TM * (e.ma + 1) - e.rows_a + causal_base;
                        s_entry[2 + buf] = BL_BWD_TM * e.mb - e.rows_a + causal_base;
                    }
                    if (packed)
                        r80_tma_packed(p, s0, buf, cl.b, e);
                    else
                        r80_tma_row_tile<aligned>(p, s0, s_entry, buf, cl.b, cl.g * dm.group + hl,
                                                  m, bits);
                    BL_TL80(true, 2, 6);
                    if (it == 0) {
                        const uint32_t kvfull = bars + ws_bars::KVFULL;
                        // V first, once the last column's last entry is released (its
                        // EMPTY: that entry's dP^T, the last product to read V, is done; the
                        // same wait entry gi + 1 makes below), K at KVEMPTY after the last
                        // dQ^T. Both at KVEMPTY, they landed 400-3000 clocks into the next
                        // column once the column's end had shortened (run 1 of
                        // bench/results/bwd-s69-column-end.txt; 90 before, when the end hid them).
                        mbarrier_wait(bars + ws_bars::EMPTY + 8 * (buf ^ 1),
                                      ((uint32_t)((gi + 1) >> 1) & 1u) ^ 1u);
                        mbarrier_arrive_expect_tx(kvfull, 2 * BN * D * 2);
                        r80_tma_kv_half<D>(&p.tm_v, s0 + L::V, kvfull, cl.b, cl.g, cl.n * BN);
                        mbarrier_wait(bars + ws_bars::KVEMPTY, ((uint32_t)kc & 1u) ^ 1u);
                        BL_TLCOL(true, 1, 3, 0);
                        r80_tma_kv_half<D>(&p.tm_k, s0 + L::K, kvfull, cl.b, cl.g, cl.n * BN);
                        ++kc;
                    }
                    if (ENTRIES == R80_DENSE && ++m == tiles_m) m = m_first, ++hl;
                }
            }
        } else if (threadIdx.x == 32) {
            // Staging position gj: each entry's dQ^T, then the column's dK and dV.
            int gj = 0;
            for (int k = 0;; ++k) {
                ws_column cl = ws_take_column(p, bars, col_slots, k);
                if (cl.count < 0) break;
                if constexpr (SPLIT) r80_split_column<aligned, packed>(p, cl);
                BL_TLCOL(true, 2, 0, 0);
                const int m_first = LISTS || MASKED ? 0 : r80_first_tile<CAUSAL>(p.diag, cl.n);
                const int count = aligned  ? cl.count80
                                  : packed ? bl_bwd_packed_count(cl.count)
                                           : R80_HPP * (tiles_m - m_first);
                const int *list = SPLIT && aligned ? cl.list : r80_list(p, cl);
                int code_next = aligned && count > 0 ? list[0] : 0;  // one ahead, as the producer
                int hl = SPLIT ? cl.part * R80_HPP : 0, m = m_first, bits = 3;
                for (int it = 0; it < count; ++it, ++gj) {
                    if (aligned) {
                        r80_list_entry(code_next, hl, m, bits);
                        if (it + 1 < count) code_next = list[it + 1];
                    }
                    r80_packed_entry e;
                    if (packed) e = r80_packed(p, cl, it);
                    mbarrier_wait(bars + ws_bars::DQFULL, (uint32_t)gj & 1u);
                    BL_TL80(true, 2, 0);
                    const int64_t h = cl.g * dm.group + hl;
                    if (packed)
                        r80_reduce_packed(p, s0 + L::DQS, cl.b, e);
                    else
                        bulk_reduce_add_f32(p.dq_accum + ((cl.b * dm.heads_q + h) * tiles_m + m) *
                                                             (int64_t)(BM80 * D),
                                            s0 + L::DQS, L::DQ_BYTES);
                    bulk_commit_group();
                    // The staging may be rewritten once the copy engine has read it.
                    bulk_wait_group_read<0>();
                    BL_TL80(true, 2, 1);
                    mbarrier_arrive(bars + ws_bars::DQEMPTY);
                    if (it + 1 == count) BL_TLCOL(true, 2, 1, 0);
                    if (ENTRIES == R80_DENSE && ++m == tiles_m) m = m_first, ++hl;
                }
                // dK from the dS buffers, then dV from the dQ staging (position gj)
                // (SPLIT: the consumers stored the partials; the hand-overs stay the same.)
                mbarrier_wait(bars + R80_DKFULL, (uint32_t)k & 1u);
                BL_TLCOL(true, 2, 2, 0);
                if constexpr (!SPLIT) ws_store_dkv(p, s0 + L::DS, 0, cl);
                mbarrier_arrive(bars + R80_DSFREE);
                BL_TLCOL(true, 2, 3, 0);
                mbarrier_wait(bars + ws_bars::DQFULL, (uint32_t)gj & 1u);
                BL_TLCOL(true, 2, 4, 0);
                if constexpr (!SPLIT) ws_store_dkv(p, s0 + L::DQS, 1, cl);
                mbarrier_arrive(bars + ws_bars::DQEMPTY);
                BL_TLCOL(true, 2, 5, 0);
                ++gj;
            }
            bulk_wait_group<0>();
        }
        return;
    }

    // ---- consumer warpgroups ----
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;
    const int lane = ct & 31, warp = ct >> 5;
    // keys 64wg..64wg+63 (S^T, dP^T, dK, dV); d rows 64wg.. (dQ^T)
    const int wg = UNIFORM_ROLES ? role_wg - 1 : warp >> 2;
    const int lg = lane >> 2, lt = lane & 3;
    const int kw = warp * KEYS_PER_WARP;

    // dev builds' entry stamps (`timeline80`): lane 0 of warps 0 and 4, row wg
#define BL_TL80C(i) BL_TL80(lane == 0 && (warp & 3) == 0, wg, i)
    int g0 = 0;  // the CTA's entries before this column
    int kc = 0;  // its K / V loads before this column
    if (SPLIT && ct == 0) ws_split_list_init(bars + WS_SPLIT_HEAD);
    for (int k = 0;; ++k) {
        BL_TLCOL(ct == 0, 0, 0, 0);
        ws_column cl = ws_take_column(p, bars, col_slots, k);
        if (cl.count < 0) break;
        if constexpr (SPLIT) r80_split_column<aligned, packed>(p, cl);
        const int count = aligned  ? cl.count80
                          : packed ? bl_bwd_packed_count(cl.count)
                                   : R80_HPP * (tiles_m - r80_first_tile<CAUSAL>(p.diag, cl.n));
        BL_TLCOL(ct == 0, 0, 1, count);
        const int64_t key0 = cl.n * BN;
        // SPLIT, the non-causal aligned walk with whole key tiles: this thread's dK partial row,
        // formed before the loop (with the column's fields live across it instead, that loop
        // spilled; the other SPLIT forms keep the column and were measured so)
        constexpr bool PART_ROW = SPLIT && aligned && KEYS_FULL;
        float *part_row = PART_ROW ? ws_dkv_part_row(p, cl, warp, lane) : nullptr;
        // CAUSAL: query 80m + ir sees key key0 + jr where jr - ir <= 80m + causal_base.
        const int causal_base = (int)(p.diag - key0);

        float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
        for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;

        mbarrier_wait(bars + ws_bars::KVFULL, (uint32_t)kc & 1u);
        BL_TLCOL(ct == 0, 0, 2, 0);

        // acc (this warpgroup's 64 keys x 80 queries) = [K or V panel rows] [Q or dO tile]^T,
        // both K-major over the head dim; the caller commits.
        auto products_kmajor = [&](float (&acc)[NQ * 4], uint32_t s_kv, uint32_t s_rows_tile) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS_D; ++kk) {
                const uint32_t koff = (kk / 4) * KPANEL + (kk % 4) * K16_BYTES_KMAJOR;
                const uint32_t qoff = (kk / 4) * L::QPANEL + (kk % 4) * K16_BYTES_KMAJOR;
                bl_wgmma_ss_n80<T, 0>(
                    acc, bl_wgmma_desc(s_kv + wg * WG_KEYS * PANEL_ROW_BYTES + koff, 16, BL_WGMMA_GROUP_BYTES),
                    bl_wgmma_desc(s_rows_tile + qoff, 16, BL_WGMMA_GROUP_BYTES),
                    ZERO_ACC || kk > 0);
            }
        };
        // S^T = K Q^T of entry `it`; as version 10, issued for entry it+1 right behind entry it's
        // dQ^T, and past the last entry on the NEVER barrier.
        float s[NQ * 4], ds[NQ * 4];
        auto issue_s = [&](int it) {
            const int gq = g0 + it;
            const uint32_t sQ = s0 + L::Q + (gq & 1) * L::TILE;
            r80_start_acc<ZERO_ACC>(s);
            const bool real = it < count;
            mbarrier_wait(bars + (real ? ws_bars::FULL + 8 * (gq & 1) : ws_bars::NEVER),
                          real ? (uint32_t)(gq >> 1) & 1u : 1u);
            bl_wgmma_fence();
            products_kmajor(s, s0 + L::K, sQ);
            bl_wgmma_commit();
        };
        issue_s(0);
        bl_wgmma_wait<0>();
        bl_reg_fence(s);
        BL_TLCOL(ct == 0, 0, 3, 0);
        // The last column's dK staging in the dS buffers has been read by its TMA stores.
        mbarrier_wait(bars + R80_DSFREE, ((uint32_t)k & 1u) ^ 1u);

        for (int it = 0; it < count; ++it) {
            const int gi = g0 + it;
            const int buf = gi & 1;
            const uint32_t sQ = s0 + L::Q + buf * L::TILE;
            const uint32_t sdO = s0 + L::DO + buf * L::TILE;
            const uint32_t sDS = s0 + L::DS + buf * L::DS_TILE;
            const float *lse2 = s_rows + buf * BM80 + 2 * lt;  // this thread's queries
            const float *dlt = lse2 + 2 * BM80;
            BL_TL80C(0);

            // ---- dP^T = V dO^T ----
            r80_start_acc<ZERO_ACC>(ds);
            bl_wgmma_fence();
            products_kmajor(ds, s0 + L::V, sdO);
            bl_wgmma_commit();
            if (it > 0) {
                // entry it-1's dQ^T, staged at the end of the last iteration, to the reducer
                bl_fence_proxy_async();
                __syncwarp();
                if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL);
            }
            BL_TL80C(1);
            bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
            bl_reg_fence(s);
            BL_TL80C(2);

            // ---- P^T = exp2(S^T scale log2e - lse log2e), 0 where a mask drops the pair (an
            // unkept 64-row tile's rows have lse = +inf: r80_tma_row_tile); dV += P^T dO issued
            // before dP^T is waited for (issued after dS, with dK, the call ran 1-3 % slower:
            // bench/results/bwd-s14-rows80.txt) ----
            // P^T's k-steps (16 queries: n8 tiles 2ks, 2ks + 1) [k0, k1) packed and issued into dV.
            // The P^T phase is bound by its latency chain (S^T wait -> exp -> mask -> pack -> dV
            // issue), so dV goes out by parts: each k-step as its exponentials come out in the
            // aligned and packed non-causal walks; in the others (per k-step spilled in the dense
            // / aligned causal walks and ran 2.4 % slower in the dense non-causal one) in two
            // parts after all the exponentials, split where it measured best (causal 2 + 3
            // k-steps, non-causal 3 + 2; bench/results/bwd-s36-early-dv.txt). The causal packed
            // walk took the per-k-step form until the two parts measured faster there too (16k
            // causal 50 % kept -1.1 %, 32k x 24 causal 25 % -1.4..-4 %:
            // bench/results/bwd-s61-causal-packed-dv-parts.txt).
            uint32_t pa[KSTEPS_Q][4];
            auto issue_dv = [&](int k0, int k1) {
#pragma unroll
                for (int ks = k0; ks < k1; ++ks) {
                    pa[ks][0] = bl_pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
                    pa[ks][1] = bl_pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
                    pa[ks][2] = bl_pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
                    pa[ks][3] = bl_pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
                }
                bl_wgmma_fence();
#pragma unroll
                for (int ks = k0; ks < k1; ++ks)
                    bl_wgmma_rs<T, D>(dv_acc, pa[ks],
                                      bl_wgmma_desc(sdO + ks * K16_BYTES_MNMAJOR, L::QPANEL, BL_WGMMA_GROUP_BYTES));
            };
            if constexpr (!CAUSAL) {
                // Keys past Sk: this thread's two keys (rows kw + lg and kw + lg + 8 of S^T) exist
                // below the column's key limit. A select per P element instead of a branch per n8
                // tile, against a 32-bit limit (compared with a 64-bit one, ptxas kept both halves
                // and spilled them across the entry loop, whose fences then waited for the
                // reloads: 2-4 % of the dense call, bench/results/bwd-s14-rows80.txt, run 11). The
                // limit comes from the producer with each entry (s_entry[2 + buf]): held in a
                // register across the entry loop, ptxas spilled it to local memory once per entry.
                const int key_limit = KEYS_FULL ? BN : s_entry[2 + buf];
                const bool key_ok0 = KEYS_FULL || kw + lg < key_limit;
                const bool key_ok1 = KEYS_FULL || kw + lg + 8 < key_limit;
                // Two forms of the same select, by what ptxas makes of each (ncu, locked clocks,
                // bench/results/bwd-s28-r80-key-limit.txt run 7): written as one expression,
                // key_ok ? exp2f(fmaf(..)) : 0, it predicates each element's FFMA and MUFU and
                // reloads the scale from the constant bank under the predicate (40 LDC per entry),
                // which the dense walk runs 1-1.6 % faster with; the FFMA first and only the
                // exponential selected (no LDC, 38-51 fewer instructions per entry) makes the
                // aligned and packed walks 1.9-2.5 % faster. KEYS_FULL: no selects; its loops
                // take the dense walk's form, dV in two parts after all the exponentials (the
                // aligned walk 3 + 2 k-steps, the packed one 1 + 4: its only split that compiles
                // without spills in the loop, 611 instructions against 647).
                if constexpr (ENTRIES == R80_DENSE || KEYS_FULL) {
#pragma unroll
                    for (int t = 0; t < NQ; ++t) {
                        const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t);
                        s[4 * t + 0] =
                            key_ok0 ? exp2f(fmaf(s[4 * t + 0], p.scale_log2, -l.x)) : 0.0f;
                        s[4 * t + 1] =
                            key_ok0 ? exp2f(fmaf(s[4 * t + 1], p.scale_log2, -l.y)) : 0.0f;
                        s[4 * t + 2] =
                            key_ok1 ? exp2f(fmaf(s[4 * t + 2], p.scale_log2, -l.x)) : 0.0f;
                        s[4 * t + 3] =
                            key_ok1 ? exp2f(fmaf(s[4 * t + 3], p.scale_log2, -l.y)) : 0.0f;
                    }
                    issue_dv(0, PACKED ? 1 : 3);
                    issue_dv(PACKED ? 1 : 3, KSTEPS_Q);
                } else {
#pragma unroll
                    for (int ks = 0; ks < KSTEPS_Q; ++ks) {
#pragma unroll
                        for (int t = 2 * ks; t < 2 * ks + 2; ++t) {
                            const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t);
                            float x[4];
                            x[0] = fmaf(s[4 * t + 0], p.scale_log2, -l.x);
                            x[1] = fmaf(s[4 * t + 1], p.scale_log2, -l.y);
                            x[2] = fmaf(s[4 * t + 2], p.scale_log2, -l.x);
                            x[3] = fmaf(s[4 * t + 3], p.scale_log2, -l.y);
#pragma unroll
                            for (int c = 0; c < 4; ++c)
                                s[4 * t + c] = (c < 2 ? key_ok0 : key_ok1) ? exp2f(x[c]) : 0.0f;
                        }
                        issue_dv(ks, ks + 1);
                    }
                }
            } else {
                // Key j of query i is kept where j <= i + Sk - Sq; that also drops keys past Sk
                // for every real row (i + Sk - Sq <= Sk - 1), and rows past Sq have lse = +inf.
                // Query 80m + ir sees key key0 + jr where jr - ir <= room (room >= -79 on the
                // entries a causal mask leaves). With jr = kw + lg + 8h and ir = 8t + 2lt + c the
                // pair is dropped where 8t - 8h + c < cut: one compare against a constant per
                // element, on every entry (behind a branch on entries that cross the diagonal,
                // ptxas spilled; past the diagonal cut <= -8 drops nothing). 32-bit, as the key
                // limit (a 64-bit value here is a spill).
                // Packed entries: the rooms of pieces A and B from the producer (s_entry), the
                // n8 tiles t < rows_a / 8 in piece A.
                const int room = PACKED ? s_entry[buf] : s_entry[buf] * BM80 + causal_base;
                const int cut = kw + lg - 2 * lt - room;
                const int cut_b = PACKED ? kw + lg - 2 * lt - s_entry[2 + buf] : cut;
                const int tiles_a = (BL_BWD_TM - 16 * (it & 3)) / 8;
                auto exp_tile = [&](int t) {
                    const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t);
                    p_from_s_n8(s, t, l, p.scale_log2);
                };
                auto mask_tile = [&](int t) {
                    const int cut_t = PACKED && t >= tiles_a ? cut_b : cut;
#pragma unroll
                    for (int x = 0; x < 4; ++x)
                        if (8 * t - 8 * (x >> 1) + (x & 1) < cut_t) s[4 * t + x] = 0.0f;
                };
#pragma unroll
                for (int t = 0; t < NQ; ++t) exp_tile(t);
#pragma unroll
                for (int t = 0; t < NQ; ++t) mask_tile(t);
                issue_dv(0, 2);
                issue_dv(2, KSTEPS_Q);
            }
            BL_TL80C(3);
            bl_wgmma_commit();
            bl_wgmma_wait<1>();  // dP^T is done; dV may still run
            bl_reg_fence(ds);
            BL_TL80C(4);

            // ---- dS^T = P^T * (dP^T - Dlt) ----
            ds_from_dp_smem<NQ>(ds, s, dlt, 0);
            uint32_t dsa[KSTEPS_Q][4];
            pack_a_fragments<T>(dsa, ds);
            BL_TL80C(5);

            // ---- dK += dS^T Q, and dS (query rows, keys along the panels) for dQ^T ----
            bl_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KSTEPS_Q; ++ks)
                bl_wgmma_rs<T, D>(dk_acc, dsa[ks],
                                  bl_wgmma_desc(sQ + ks * K16_BYTES_MNMAJOR, L::QPANEL, BL_WGMMA_GROUP_BYTES));
            bl_wgmma_commit();
            store_ds_tile(sDS + wg * L::QPANEL, dsa, warp, lane);  // 80-row panels
            bl_fence_proxy_async();
            // Every warp's dS of entry it is in shared memory; the other dS buffer is free (both
            // warpgroups waited for their dQ^T of entry it-1 before arriving here).
            BL_TL80C(6);
            named_barrier_sync(WS_BAR_DS, THREADS);
            BL_TL80C(7);

            // ---- dQ^T (64 d x 80 queries) = K^T dS^T: warpgroup wg takes d rows 64wg.. ----
            float dq[NQ * 4];
            r80_start_acc<ZERO_ACC>(dq);
            bl_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KSTEPS_K; ++ks)
                bl_wgmma_ss_n80<T, 1>(
                    dq,
                    bl_wgmma_desc(s0 + L::K + wg * KPANEL + ks * K16_BYTES_MNMAJOR, KPANEL,
                                  BL_WGMMA_GROUP_BYTES),
                    bl_wgmma_desc(sDS + (ks / 4) * L::QPANEL + (ks % 4) * K16_BYTES_KMAJOR, 16,
                                  BL_WGMMA_GROUP_BYTES),
                    ZERO_ACC || ks > 0);
            bl_wgmma_commit();
            bl_wgmma_wait<1>();  // dV and dK are done: buffer buf is read
            bl_reg_fence(dsa);
            bl_reg_fence(pa);
            BL_TL80C(8);
            mbarrier_arrive(bars + ws_bars::EMPTY + 8 * buf);
            issue_s(it + 1);
            BL_TL80C(9);
            // dQ^T and entry it+1's S^T are done (staging dQ^T while S^T runs: level to +3 %,
            // bench/results/bwd-s14-rows80.txt).
            bl_wgmma_wait<0>();
            bl_reg_fence(s);
            bl_reg_fence(dq);
            BL_TL80C(10);

            // This warp's 16 x 80 block of dQ^T into the staging buffer once the reducer has
            // read the last one (staging position gi + k: each column adds its dV).
            mbarrier_wait(bars + ws_bars::DQEMPTY, ((uint32_t)(gi + k) & 1u) ^ 1u);
            BL_TL80C(11);
            float4 *stage = reinterpret_cast<float4 *>(smem_base + L::DQS);
#pragma unroll
            for (int t = 0; t < NQ; ++t)
                stage[(MASKED ? r80_dq_offset_grouped(ct, t) : r80_dq_offset(warp, t, lane)) / 4] =
                    make_float4(dq[4 * t + 0], dq[4 * t + 1], dq[4 * t + 2], dq[4 * t + 3]);
        }
        BL_TLCOL(ct == 0, 0, 4, 0);
        // the last entry's staged dQ^T
        bl_fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL);
        mbarrier_arrive(bars + ws_bars::KVEMPTY);
        ++kc;

        bl_reg_fence(dk_acc);
        bl_reg_fence(dv_acc);
        // dK (times scale) into the dS buffers, free once both warpgroups' last dQ^T has read
        // them, while the reducer still reads the last dQ^T from the staging; then dV into the
        // staging, position g0 + count + k (ws_stage_dkv). Through the staging both, each waiting
        // for the read of the one before, the column's end took ~4200 clocks from the loop's end;
        // so ~2500 (16k x 16 x 128, `attn_bwd timelinecols80`,
        // bench/results/bwd-s69-column-end.txt).
        named_barrier_sync(WS_BAR_DS, THREADS);
        if constexpr (SPLIT)
            if constexpr (PART_ROW)
                ws_store_dkv_part_at(p, part_row, key0 + warp * KEYS_PER_WARP + lg, dk_acc);
            else
                ws_store_dkv_part(p, cl, 0, dk_acc, warp, lane);
        else
            ws_stage_dkv<T>(s0 + L::DS, dk_acc, p.scale, warp, lane);
        bl_fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbarrier_arrive(bars + R80_DKFULL);
        mbarrier_wait(bars + ws_bars::DQEMPTY, ((uint32_t)(g0 + count + k) & 1u) ^ 1u);
        if constexpr (SPLIT)
            if constexpr (PART_ROW)
                ws_store_dkv_part_at(p, part_row + (int64_t)p.head_split * p.dm.batch *
                                                       p.dm.seqlen_k * p.dm.heads_k * 128,
                                     key0 + warp * KEYS_PER_WARP + lg, dv_acc);
            else
                ws_store_dkv_part(p, cl, 1, dv_acc, warp, lane);
        else
            ws_stage_dkv<T>(s0 + L::DQS, dv_acc, 1.0f, warp, lane);
        bl_fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL);
        if constexpr (SPLIT) ws_split_count_column(p, cl.b, cl.g, cl.n, ct, bars + WS_SPLIT_HEAD);
        BL_TLCOL(ct == 0, 0, 5, 0);
        g0 += count;
    }  // columns
    if constexpr (SPLIT) ws_split_sum_owned<T>(p, ct, bars + WS_SPLIT_HEAD);
#undef BL_TL80C
#undef R80_HPP
}

}  // namespace bl_bwd
