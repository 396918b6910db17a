// bwd_common.cuh -- what the backward's three translation units share: the problem's tile
// counts, the workspace layout, and the host launchers each file provides to the others.
//
// The backward runs as: [selection: W -> mask] -> per-key-tile lists of kept (q head, row tile)
// pairs -> schedule (heaviest key tiles first) -> preprocess (Dlt, log2-scaled lse, zero the
// fp32 dq accumulator; it runs beside the three before it) -> main kernel (dK, dV per key tile;
// dq by fp32 atomics) -> postprocess (dq accumulator -> dtype, times scale).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include "backend.h"
#include "cuda_check.cuh"  // BL_CARVEOUT_DEFAULT
#include "dq16_rule.h"

// Tile shape of the backward (DESIGN §1): BL_TILE_M query rows x BL_TILE_N keys.
#define BL_BWD_TM BL_TILE_M
#define BL_BWD_TN BL_TILE_N
// Query rows per entry of the head-dim-128 kernel version 11 (bwd_ws128r80_sm90.cuh):
// FlashAttention-3's tile for dense calls without a causal mask; the 64-row tile stays the
// granularity of the statistics and of what a masked call skips.
#define BL_BWD_TM_DENSE 80

// Problem sizes the kernels need, derived once from bl_attn_desc.
struct bl_bwd_dims {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim;
    int64_t group;       // Hq / Hk: query heads sharing one kv head
    int64_t tiles_m;     // Tm = ceil(Sq / TM)
    int64_t tiles_n;     // Tn = ceil(Sk / TN)
    int64_t tiles_m80;   // ceil(Sq / TM_DENSE): the 80-row entries of bwd_ws128r80_sm90.cuh
    // max(Tm * TM, Tm80 * TM_DENSE): per-row arrays are padded so that 64- and 80-row tiles load
    // without bounds checks
    int64_t seqlen_q_pad;
};

// Carved out of bl_attn_desc.workspace, each piece 256-byte aligned.
struct bl_bwd_workspace {
    float *dq_accum;  // (B, Sq, Hq, D) fp32, unscaled sum of dS k; or BL_DQ_TILES80's layout
    float *dlt;       // (B, Hq, Sq_pad): rowsum(dO * out); 0 on pad rows
    float *lse_log2;  // (B, Hq, Sq_pad): lse * log2(e); +inf where the row has no gradient
    uint8_t *mask;    // (B, Hq, Tm, Tn): the selection's mask when selecting from W
    int *counts;      // (B, Hk, Tn): kept (q head, row tile) pairs per key tile
    int *lists;       // (B, Hk, Tn, G*Tm): those pairs, encoded hl * Tm + m, in that order
    // The same at 80-row granularity, for the 80-row kernel on masked calls: the (q head, 80-row
    // tile) entries that overlap a kept 64-row tile, encoded hl << BL_R80_ENTRY_HL_SHIFT |
    // m80 << 2 | bits, bit 0: the 64-row tile of the entry's first row is kept, bit 1: the next
    // one (r80_list_entry in bwd_ws128r80_sm90.cuh).
    int *counts80;    // (B, Hk, Tn)
    int *lists80;     // (B, Hk, Tn, G*Tm80)
    // TM_DENSE floats +inf, then TM_DENSE zeros: the lse_log2 / Dlt the 80-row kernel loads for
    // the rows of an entry's unkept 64-row tile (P = exp2(S - inf) = 0 there, dS = 0)
    float *unkept_rows;
    // (B, Hq, Tm, BL_BWD_WRITER_RUNS) bytes: the list entries of each 64-row tile, one byte per
    // lists CTA (run of key tiles; bytes past the last run 0), where bl_bwd_dq_writers_used;
    // NULL (the host sets it so) elsewhere. Where version 10 runs, a tile's only entry then
    // stores its dQ instead of adding it (no read of the zeros), and the postprocess writes a
    // tile with none as zeros without reading it. Bytes, not counters: nothing to zero first.
    uint8_t *dq_writers;
    // BL_BWD_TOTALS sums over the call's key tiles: {counts, counts80, tiles missing, packed
    // entries (bl_bwd_packed_count)}, where the third counts the (q head, row tile) pairs of
    // each key tile that the mask drops (with a causal mask, of those the causal mask allows):
    // which kernel takes a masked head-dim-128 call, read by all of them on the device
    // (bl_bwd_rows80_chosen, bl_bwd_packed_chosen, bl_bwd_masked_full).
    unsigned long long *totals;
    int *schedule;    // (B*Hk*Tn): key-tile indices, heaviest first (in windows: bwd_lists_sm90.cu)
    // (B*Hk*Tn*P + 1): {column, its count, its count80, part} in schedule order, P records a
    // column with P the call's head split (bl_bwd_head_split; 1 where a call does not split),
    // part-major within each schedule window (bwd_lists_sm90.cu, sched_split_order); the last
    // {-1, 0, 0, 0}
    int4 *sched_rec;
    // (B*Hk*Tn + 1): sched_rec's records again, sorted within windows of half the size, which
    // the head-dim-128 kernels walk where the call keeps little (bl_bwd_low_keep); written where
    // bl_bwd_schedule_window gives such windows (else the schedule launch sets it NULL)
    int4 *sched_rec_low;
    int *sched_next;  // the persistent kernel's next schedule position minus the grid; 0 at start
    // (2, P, B, Sk, Hk, D) fp32: a split call's dK and dV partials, one per part of each
    // column's query heads (bl_bwd_head_split), summed inside the main kernel by the CTA that
    // stores a column's last part (bwd_split_sum_sm90.cuh)
    float *dkv_part;
    // (B*Hk*Tn): the parts of each column stored so far; zeroed by the preprocess
    int *dkv_done;
    // [BL_ZEROS_PICK_INTS]: the window schedule CTAs that have added their totals, then the kind
    // of zeros the call needs (bl_bwd_zeros_kind) once the last of them has (dev builds: then the
    // zero CTAs' counts, bwd_prepost_sm90.cu); all reset by lists CTA 0 before any dependent
    // starts. Read by the preprocess's zero CTAs (bl_bwd_preprocess_launch, dq16_zeros).
    int *zeros_pick;
    // (B, Hq, Tm): claims on dq's light row tiles of several entries (bl_bwd_dq16_tile) in
    // version 10's DIRECT form: the entry that claims a tile first stores its 16-bit dQ there and
    // then sets BL_DQ_CLAIM_STORED, the others add theirs once that bit is set, so that the
    // preprocess writes no zeros there (ws_dq16_claim). Reset by the preprocess's zero CTAs. (The
    // head-dim-64 DQ16 form still adds onto zeros: with claims its main kernel ran 4-57 us longer
    // than the zeros' 7 us, bench/results/bwd-s123-dq16-claims.txt.)
    unsigned *dq_claims;
};
// bl_bwd_workspace::dq_claims: a tile's claims are counted in the low bits; this bit is set once
// the first claimant's store has completed.
#define BL_DQ_CLAIM_STORED 0x80000000u

// Whether the call's list entries (totals[0]: 64-row entries) average at most `limit` per 64-row
// row tile (B x Hq x Tm of them), in integers.
__host__ __device__ inline bool bl_bwd_mean_entries_at_most(const unsigned long long *totals,
                                                           const bl_bwd_dims &dm,
                                                           unsigned long long limit) {
    const unsigned long long row_tiles =
        (unsigned long long)(dm.batch * dm.heads_q * dm.tiles_m);
    return totals[0] <= limit * row_tiles;
}

// Relative cost of one 80-row entry against one 64-row entry of the head-dim-128 kernels: 1.25x
// the rows at ~7 % less per row (dense 16k / 32k, bench/results/bwd-s14-rows80.txt) -> 75 / 64.
// A masked call takes the 80-row kernel where its entries cost less in all. Packed entries
// (bwd_ws128r80_sm90.cuh: rows gathered from two 64-row tiles, every row kept) count 78 against
// version 10's 64 without a causal mask and 77 with one: every kernel of the call under ncu, a
// build forced onto each kind of entry (bench/results/bwd-s37-pick-costs.txt run 2: break-evens
// 77.6-78.6 without a causal mask at 10 % and 3 % kept, where the calls are near the rule's
// threshold; with one 77.1-77.6 at 10 / 25 / 50 % kept, 16k x 16 and 32k x 24,
// bwd-s62-pick-costs.txt, since the causal packed walk issues dV in two parts, 11a4f9b; 78.9-79.7
// before it).
// Against aligned 80-row entries, without a causal mask, a packed entry costs what an aligned
// one does (8k x 16 at 95 % kept: 26.3 ns an entry both; the packed call 4.7 % faster where
// the older rule, 80 against 75, had kept aligned entries), so packed entries run wherever they
// are fewer. With a causal mask a packed entry costs 1.1 % more (the per-tile diagonal cuts:
// 8k x 16 causal at 96 % kept, 25.96 against 25.68 ns an entry, ncu's 10 us steps +-0.4 % each,
// bwd-s62-pick-costs.txt run 2; 2.6 % before 11a4f9b), so there they count 76 against 75.
// Where no causal mask is given and the keys fill whole key tiles (bl_bwd_keys_full) version 10
// and the packed walk run their KEYS_FULL forms, without mask code: there a packed entry
// costs 79 (break-evens 78.9-79.5 at 5 / 10 / 25 % kept, 16k x 16 and 32k x 24,
// bench/results/bwd-s66-v10-keys-full.txt run 2).
enum {
    BL_R80_ENTRY_COST = 75,
    BL_R64_ENTRY_COST = 64,
    BL_PACKED_ENTRY_COST = 78,
    BL_PACKED_ENTRY_COST_KEYS_FULL = 79,
    BL_PACKED_ENTRY_COST_CAUSAL = 77,
    BL_PACKED_VS_ALIGNED_COST = 75,
    BL_PACKED_VS_ALIGNED_COST_CAUSAL = 76
};
// An 80-row list entry: hl << BL_R80_ENTRY_HL_SHIFT | m << 2 | bits (m < 2^18, hl < 2^11).
enum { BL_R80_ENTRY_HL_SHIFT = 20 };
inline bool bl_bwd_r80_lists_fit(const bl_bwd_dims &dm) {
    return dm.tiles_m80 < (1 << (BL_R80_ENTRY_HL_SHIFT - 2)) &&
           dm.group < (1 << (31 - BL_R80_ENTRY_HL_SHIFT));
}
enum { BL_BWD_TOTALS = 4 };
// The row tiles that share an allowed (query, key) pair with key tile n: all Tm without a causal
// mask; with one, the tiles m whose last row min(TM (m + 1), Sq) - 1 sees a key of tile n (key j
// of query i where j <= i + Sk - Sq): the lists kernel's rule, counted.
__host__ __device__ inline int64_t bl_bwd_allowed_row_tiles(const bl_bwd_dims &dm, int causal,
                                                            int64_t n) {
    if (!causal) return dm.tiles_m;
    const int64_t need = n * BL_BWD_TN + 1 - (dm.seqlen_k - dm.seqlen_q);  // min(.., Sq) >= need
    if (need <= 0) return dm.tiles_m;
    if (need > dm.seqlen_q) return 0;
    return dm.tiles_m - ((need + BL_BWD_TM - 1) / BL_BWD_TM - 1);
}
// A masked call whose mask keeps every tile (every tile a causal mask allows) computes exactly
// the dense gradients: the dense 80-row kernel runs it (without a causal mask the masked one's
// list decoding cost 1.4-2 % on such calls, bench/results/bench-2026-11-30-s16.txt; with one
// the aligned entries ran 1.2-1.9 % over the dense call in bench s34, 0.0-0.7 % since in s35 /
// s35r, bench/results/bwd-s35-causal.txt).
__host__ __device__ inline bool bl_bwd_masked_full(const unsigned long long *totals) {
    return totals[2] == 0;
}
// The packed 80-row entries of a column whose list keeps c64 64-row tiles (r80_packed in
// bwd_ws128r80_sm90.cuh): ceil(64 c64 / 80), and one entry of padding where nothing is kept.
__host__ __device__ inline int bl_bwd_packed_count(int c64) {
    return c64 == 0 ? 1 : (4 * c64 + 4) / 5;
}
// Whether a masked call runs its 80-row entries packed rather than aligned.
__host__ __device__ inline bool bl_bwd_packed_chosen(const unsigned long long *totals,
                                                     bool causal) {
    const unsigned long long packed_cost =
        causal ? BL_PACKED_VS_ALIGNED_COST_CAUSAL : BL_PACKED_VS_ALIGNED_COST;
    return totals[3] != 0 && totals[3] * packed_cost < totals[1] * BL_R80_ENTRY_COST;
}
// Whether a call's kernels run their KEYS_FULL forms (no causal mask, Sk a multiple of the key
// tile: no entry needs a mask): version 10 (bwd_ws128_sm90.cuh) and the non-causal masked 80-row
// walks (bwd_ws128r80_sm90.cuh), launched in attn_bwd_sm90.cu.
__host__ __device__ inline bool bl_bwd_keys_full(const bl_bwd_dims &dm, bool causal) {
    return !causal && dm.seqlen_k % BL_BWD_TN == 0;
}
// Whether a masked call's 80-row entries (the cheaper of the aligned and the packed ones) cost
// less than its 64-row ones. keys_full: bl_bwd_keys_full (a compile-time constant in the kernels).
__host__ __device__ inline bool bl_bwd_rows80_cheaper(const unsigned long long *totals,
                                                      bool causal, bool keys_full) {
    const unsigned long long packed_cost = causal      ? BL_PACKED_ENTRY_COST_CAUSAL
                                           : keys_full ? BL_PACKED_ENTRY_COST_KEYS_FULL
                                                       : BL_PACKED_ENTRY_COST;
    const unsigned long long cost80 = bl_bwd_packed_chosen(totals, causal)
                                          ? totals[3] * packed_cost
                                          : totals[1] * BL_R80_ENTRY_COST;
    return cost80 < totals[0] * BL_R64_ENTRY_COST;
}
// Whether version 10's DIRECT form runs (bwd_params::dq_direct: light row tiles write their dQ to
// dq itself): where the call's 64-row entries average at most BL_DQ_DIRECT_MAX_ENTRIES_X2 / 2 per
// row tile. First (when only a tile's single entry wrote dq) at most 4.5 (in integers: 2 x entries
// <= 9 x row tiles). The gain goes with the tiles of one entry (at an average of c
// per tile, a share e^-c of the entries with a random mask), the DIRECT form's cost with all
// entries. Measured (bench/results/bwd-s53-direct-threshold.txt, timelines of both forms on the
// bench's random masks): 32k x 24 causal c 4.03 -8 us (1433 against 1441), c 5.02 +7 us, c 6.53
// +24 us, c 13.1 +83 us; 16k x 16 x 128 c 1 -38 us, c 4 (no tile of one entry) level, c 6 +8 us.
// 4.5 is where the two causal readings either side of it would cross.
// Since version 10's DIRECT form stages every entry's dQ of a light row tile in 16-bit (dq is the
// accumulator, bl_bwd_dq16_tile) its gain grows with the entries: 16.5 measured better than 4.5
// at 16k x 16 x 128 (3 % kept -41 us, 10 % -61, causal 10 % -41; the causal 25 % row, 16
// entries a tile, level: bench/results/bwd-s97-dq16-probe-timelines.txt, bwd-s97-dq16-probe3.txt).
constexpr unsigned long long BL_DQ_DIRECT_MAX_ENTRIES_X2 = 33;  // 2 x 16.5
__host__ __device__ inline bool bl_bwd_dq_direct_chosen(const unsigned long long *totals,
                                                        const bl_bwd_dims &dm) {
    const unsigned long long row_tiles =
        (unsigned long long)(dm.batch * dm.heads_q * dm.tiles_m);
    return 2 * totals[0] <= BL_DQ_DIRECT_MAX_ENTRIES_X2 * row_tiles;
}
// The persistent head-dim-64 kernel's form with light row tiles in 16-bit (bwd_params::dq_direct
// at head dim 64, bwd_ws64p_sm90.cuh): where the call's 64-row entries average at most
// BL_WS64P_DQ16_MAX_ENTRIES per row tile. That form's pair loop (two staging forms) runs 2-3 %
// slower a pair than the plain one (causal 25 % kept +16 us as the only form), which its saving
// (the light tiles' dq conversion, half the staging bytes) outweighs on light calls: on an H100,
// 16k x 16 x 64 spans -42 / -10 us at 0.8 / 3 % kept, causal -11 / -23, 4 x 4k x 16 causal 3 /
// 10 % -11 / -19, causal 10 % (6.4 entries a tile) level; calls past the gate pay the returning
// launch, +2..+8 us (bench/results/bwd-s117-ws64p-dq16.txt, calls 7 and 8). With the two forms
// chained since (bwd_ws64p_kernel: light calls -11..-17 us more, the others +3..+10) the
// break-even is higher: at 12.8 entries the DQ16 form was 20 us faster, at 16 level
// (bench/results/bwd-s118-ws64p-pdl.txt call 5), so the gate moved 8 -> 16 (hundred-and-
// nineteenth session, bench/results/bwd-s119-gate16-spacer.txt: 16k 10 % kept 663 -> 648 us).
constexpr unsigned long long BL_WS64P_DQ16_MAX_ENTRIES = 16;
__host__ __device__ inline bool bl_bwd_ws64p_dq16_chosen(const unsigned long long *totals,
                                                         const bl_bwd_dims &dm) {
    return bl_bwd_mean_entries_at_most(totals, dm, BL_WS64P_DQ16_MAX_ENTRIES);
}
// Whether a masked head-dim-128 call runs on 80-row entries (the dense kernel where the mask is
// full, else the masked one) rather than on version 10's 64-row ones.
__host__ __device__ inline bool bl_bwd_rows80_chosen(const unsigned long long *totals,
                                                     bool causal, bool keys_full) {
    return bl_bwd_masked_full(totals) || bl_bwd_rows80_cheaper(totals, causal, keys_full);
}
// The DIRECT form's light row tiles and how their entries write dq: dq16_rule.h.
// The zeros a call with a DIRECT candidate needs (bl_bwd_workspace::zeros_pick): only the device
// knows which kernel runs, from totals the window schedule sums while the preprocess runs.
#ifdef BL_PP_ZERO_COUNTS
enum { BL_ZEROS_PICK_INTS = 6 };
#else
enum { BL_ZEROS_PICK_INTS = 2 };
#endif
enum bl_bwd_zeros_kind {
    BL_ZEROS_UNKNOWN = 0,  // not known yet: both kinds
    BL_ZEROS_DQ16 = 1,     // DIRECT runs: dq's light tiles (bl_bwd_dq16_tile) too
    BL_ZEROS_ACCUM = 2     // another kernel: the accumulator's zeros only (the row CTAs')
};
__host__ __device__ inline int bl_bwd_zeros_chosen(const unsigned long long *totals,
                                                   const bl_bwd_dims &dm, bool causal) {
    const bool direct = !bl_bwd_rows80_chosen(totals, causal, bl_bwd_keys_full(dm, causal)) &&
                        bl_bwd_dq_direct_chosen(totals, dm);
    return direct ? BL_ZEROS_DQ16 : BL_ZEROS_ACCUM;
}

// A split call's parts on the device. The host picks the head split P (bl_bwd_head_split) for
// the dense call before the lists exist; a masked call's work is its kept share f of that, while
// what each part costs (its column starts and ends, its blocks in the dK / dV reduction) is not:
// at low keeps fewer parts win (2 x 16k x 8 q x 1 kv x 128 causal: at 25 / 10 / 3 / 0.8 % kept
// P = 2, 2, 2, 1 against the dense call's 4; bench/results/bwd-s78-split-sweep.txt). The host
// prices each candidate P >> k once (bl_bwd_split_rule_make: a fitted cost in microseconds, a
// kept-share term and a fixed one); the kernels and the dK / dV reduction then take the cheapest
// from the call's totals (f = kept / (kept + dropped) pairs), all the same one: integer
// arithmetic on the same inputs. Records of parts >= the choice are never drawn
// (bl_bwd_split_record); partials of those parts are never read.
enum { BL_BWD_SPLIT_LEVELS = 4, BL_BWD_SPLIT_FIXED_ONE = 1 << 8 };
struct bl_bwd_split_rule {
    int levels;  // candidates P >> k for k < levels; 1: P whatever the totals
    int window;  // schedule window in columns (the records' part-major runs: sched_split_order)
    // per candidate, in microseconds x BL_BWD_SPLIT_FIXED_ONE: the main kernel's time for a full
    // mask (to be scaled by f) and the fixed cost of its parts
    unsigned long long balance[BL_BWD_SPLIT_LEVELS], part_cost[BL_BWD_SPLIT_LEVELS];
};
// The parts a call of head split `split` uses (totals: bl_bwd_workspace::totals, NULL on calls
// without them). Cost k times (kept + dropped): kept balance[k] + (kept + dropped) part_cost[k].
__host__ __device__ inline int bl_bwd_split_parts(int split, const bl_bwd_split_rule &rule,
                                                  const unsigned long long *totals) {
    if (totals == nullptr || rule.levels <= 1) return split;
    const unsigned long long kept = totals[0], pairs = totals[0] + totals[2];
    int best = 0;
    unsigned long long best_cost = kept * rule.balance[0] + pairs * rule.part_cost[0];
    // unrolled: a runtime index into the kernel parameter would copy it to local memory
#pragma unroll
    for (int k = 1; k < BL_BWD_SPLIT_LEVELS; ++k) {
        const unsigned long long cost = kept * rule.balance[k] + pairs * rule.part_cost[k];
        if (k < rule.levels && cost < best_cost) best = k, best_cost = cost;
    }
    return split >> best;
}
// The schedule record of draw position pos (< columns x parts) of a call that uses `parts` of
// its `split`: each window of w columns holds w x split records, part-major, so its first w x
// parts records are those of parts < parts; the last window is shorter but starts at the same
// stride.
__host__ __device__ inline int64_t bl_bwd_split_record(int64_t pos, int parts, int split,
                                                       int window) {
    if (parts == split) return pos;
    const int64_t per = (int64_t)window * parts;
    return pos / per * ((int64_t)window * split) + pos % per;
}

bl_bwd_dims bl_bwd_make_dims(const bl_attn_desc *d);

// How many parts a call splits each column's G query heads into (1: none). The main kernels
// walk one column (b, kv head, key tile) per draw (head dim 128) or per CTA (head dim 64), all G
// query heads of it; where the columns are too few for the SMs -- few kv heads (GQA / MQA after
// tensor parallelism), short sequences, causal columns as long as two average ones -- the call's
// time is its longest column's. A split column is P columns of G / P heads each, whose dK / dV go
// to fp32 partials (bl_bwd_workspace::dkv_part) that the CTA storing a column's last part sums
// (bwd_split_sum_sm90.cuh); every main
// kernel a call may pick has a SPLIT form (a part's entries: one run of the column's list).
// bwd_prepost_sm90.cu; the workspace holds the partials of the larger of the causal and
// non-causal choices.
int bl_bwd_head_split(const bl_bwd_dims &dm, bool causal);
// The device's choice among split, split / 2, ... (bl_bwd_split_parts) for a call of head split
// `split`: candidates where the call is causal at head dim 128 (whose masked calls carry the
// totals), P alone elsewhere.
// bwd_prepost_sm90.cu.
bl_status bl_bwd_split_rule_make(const bl_bwd_dims &dm, bool causal, int split,
                                 bl_bwd_split_rule *rule);
// Dev only (dev/cuda/attn_bwd.cu): the most parts bl_bwd_head_split may choose (1: no split), so
// that the checker runs its GQA / MQA cases unsplit too (it does on 3 CTAs).
void bl_bwd_set_head_split_cap(int cap);

// Lays the workspace out from `base` (NULL: sizes only); returns the bytes it needs.
size_t bl_bwd_workspace_layout(const bl_bwd_dims &dm, void *base, bl_bwd_workspace *ws);

// select_sm90.cu: the selection kernel, W (B,Hq,Tm,Tn) -> mask (B,Hq,Tm,Tn), on `stream`.
bl_status bl_select_launch(const bl_bwd_dims &dm, const float *tile_mass, float negl_prob,
                           uint8_t *mask, cudaStream_t stream);
// bwd_lists_sm90.cu: mask (NULL = dense) -> ws->counts, ws->lists; with rows80 also ws->counts80
// and ws->lists80; ws->dq_writers unless NULL. Tiles with no allowed key under `causal` are left
// out whatever the mask says. With rows80 ws->totals are zeroed (the schedule sums them).
// dependent: launched as the programmatic dependent of the kernel before it (the selection),
// whose mask it reads once that one is done. Its own dependent (the schedule) starts at once.
bl_status bl_bwd_lists_launch(const bl_bwd_dims &dm, int causal, const uint8_t *mask, bool rows80,
                              bool dependent, const bl_bwd_workspace *ws, cudaStream_t stream);
// The shared-memory carveout preference (bl_launch_carveout) of the small kernels ahead of the
// main one: lists, schedule, preprocess. An SM holds CTAs of one carveout at a time, and a
// kernel's CTAs wait for SMs whose configuration suits it (their other CTAs to drain). With
// the driver's defaults, where the lists kernel is a call's first kernel, the schedule's CTAs
// found no SM beside its one-per-SM CTAs until some ended: the schedule started at ~5 us and the
// preprocess behind it at ~6, not ~1 and ~2. Where all three ask for the most L1 they share the
// SMs at once (bench/results/bwd-s95-chain-carveout.txt). Behind the selection (dependent) the
// defaults stay: its SMs take them as they are, where asking for the most L1 held the lists
// kernel ~9 us until the selection's SMs drained.
// Middle values lose everywhere (bench/results/bwd-s96-carveout-sweep.txt: 4 / 14 / 28 % for all
// calls cost 0..+4 us mask-first and +4..+11 us behind the selection). Dev builds sweep with
// -DCMAKE_CUDA_FLAGS=-DBL_CHAIN_CARVEOUT_FORCE=P (every call's three kernels at P %, selection
// calls too), as -DBL_SCHED_RANK_SPLIT_FORCE sweeps the schedule's ranks.
inline int bl_bwd_chain_carveout(bool behind_selection) {
#ifdef BL_CHAIN_CARVEOUT_FORCE
    static_assert(BL_CHAIN_CARVEOUT_FORCE >= 0 && BL_CHAIN_CARVEOUT_FORCE <= 100, "a percentage");
    (void)behind_selection;
    return BL_CHAIN_CARVEOUT_FORCE;
#else
    return behind_selection ? (int)BL_CARVEOUT_DEFAULT : (int)cudaSharedmemCarveoutMaxL1;
#endif
}
// bwd_lists_sm90.cu: ws->counts (and with rows80 ws->counts80) -> ws->schedule, ws->sched_rec,
// ws->sched_next, with rows80 ws->totals, and ws->sched_rec_low where rows80 and
// bl_bwd_schedule_window give it windows (else it sets ws->sched_rec_low NULL). Launched as the
// programmatic dependent of the lists kernel (it reads the counts once that one is done); its
// own dependent (the preprocess) starts at once.
// split: the call's head split (bl_bwd_head_split): each column's record repeated for its parts.
// carveout: bl_bwd_chain_carveout.
// zeros_pick: the call has a DIRECT candidate (bwd_params::dq_direct): the schedule's last CTA
// then writes ws->zeros_pick[1].
bl_status bl_bwd_schedule_launch(const bl_bwd_dims &dm, int causal, bool rows80, int split,
                                 int carveout, bool zeros_pick, bl_bwd_workspace *ws,
                                 cudaStream_t stream);
// bwd_lists_sm90.cu: the schedule's window in columns (the records' part-major runs) for a call of
// head split `split`; with low != NULL also the windows of ws->sched_rec_low (0: none).
bl_status bl_bwd_schedule_window(const bl_bwd_dims &dm, bool causal, int split, int *window,
                                 int *low);
// Whether a masked call keeps so little that its head-dim-128 kernels walk ws->sched_rec_low:
// its 64-row entries average at most BL_SCHED_LOW_MAX_ENTRIES per row tile (totals:
// bl_bwd_workspace::totals), how often each row tile's Q / dO rows and dq block are touched.
// Measured one round against two (bench/results/bwd-s82-window-keep-ab.txt, call 5): 16k x 16 x
// 128 at 6.4 / 7.7 / 10.2 entries (5 / 6 / 8 % kept) -14 / -1 / +8 us, 8k x 32 x 128 at 6.4 /
// 16 (10 / 25 %) -6 / +1 us.
constexpr unsigned long long BL_SCHED_LOW_MAX_ENTRIES = 7;
__host__ __device__ inline bool bl_bwd_low_keep(const unsigned long long *totals,
                                                const bl_bwd_dims &dm) {
    return bl_bwd_mean_entries_at_most(totals, dm, BL_SCHED_LOW_MAX_ENTRIES);
}

// How the main kernel laid out the fp32 dq accumulator.
enum bl_dq_layout {
    BL_DQ_ROWS = 0,           // (B, Sq, Hq, D), columns in order (atomics)
    BL_DQ_ROWS_PERMUTED = 1,  // (B, Sq, Hq, D), each 8-column group as columns 0 2 4 6 1 3 5 7
                              // (TMA reduce-adds of dq_block_stage's staging, bwd_wgmma_sm90.cuh)
    BL_DQ_TILES80 = 2,        // (B, Hq, Tm80) blocks of 80 x 128 in the order the 80-row kernel
                              // stages them (bwd_ws128r80_sm90.cuh, r80_dq_offset)
    BL_DQ_CHOSEN = 3,         // a masked causal call: where 80-row entries ran
                              // (bl_bwd_rows80_chosen on ws->totals) TILES64R for packed ones
                              // (bl_bwd_packed_chosen), TILES80 for aligned ones, else
                              // ROWS_PERMUTED (version 10)
    BL_DQ_TILES64R = 4,       // (B, Hq, Tm) blocks of 64 x 128, each 8 runs of 8 queries per
                              // staging warp in the 80-row kernel's order (its packed entries:
                              // r80_reduce_packed)
    BL_DQ_TILES80G = 5,       // as TILES80, each block in TILES64R's order (the aligned
                              // entries of a masked call without a causal mask)
    BL_DQ_PACKED = 6,         // a masked call without a causal mask: TILES80 where the mask
                              // keeps every tile (bl_bwd_masked_full on ws->totals), else
                              // where 80-row entries ran (bl_bwd_rows80_cheaper) TILES64R for
                              // packed ones (bl_bwd_packed_chosen), TILES80G for aligned ones,
                              // else ROWS_PERMUTED (version 10)
    BL_DQ_NONE = 7            // no accumulator: the dq-rows kernel writes dq itself
                              // (bwd_dqrows_sm90.cuh; dev variant DQ_ROWS)
};

// Floats of the dq accumulator in `layout` (the tile layouts cover the padded last row tile).
size_t bl_bwd_dq_accum_floats(const bl_bwd_dims &dm, bl_dq_layout layout);

// A row tile's list entries, one byte per lists CTA (bl_bwd_workspace::dq_writers): calls with
// more lists CTAs per (b, kv head) -- key tiles past 16 x 16 at 16 per CTA -- go without.
#define BL_BWD_WRITER_RUNS 16
// bwd_lists_sm90.cu: how many lists CTAs share the key tiles of one (b, kv head).
int64_t bl_bwd_list_runs(const bl_bwd_dims &dm);

// Whether a call counts the list entries of each row tile (bl_bwd_workspace::dq_writers), so
// that version 10 stores the dQ of a tile's only entry and the postprocess skips tiles with none:
// masked head-dim-128 calls whose kernel the device picks (at 1 % kept most 64-row tiles have at
// most one entry; bench/results/bwd-s25-dq-writers.txt).
inline bool bl_bwd_dq_writers_used(const bl_bwd_dims &dm, bl_dq_layout layout) {
    return (layout == BL_DQ_CHOSEN || layout == BL_DQ_PACKED) &&
           bl_bwd_list_runs(dm) <= BL_BWD_WRITER_RUNS;
}
// The entries of a row tile from its BL_BWD_WRITER_RUNS bytes (16-byte aligned).
__device__ __forceinline__ unsigned bl_bwd_tile_writers(uint4 runs) {
    return __dp4a(runs.x, 0x01010101u, __dp4a(runs.y, 0x01010101u, __dp4a(runs.z, 0x01010101u,
                  __dp4a(runs.w, 0x01010101u, 0u))));
}
__device__ __forceinline__ uint4 bl_bwd_tile_writer_runs(const uint8_t *dq_writers, int64_t tile) {
    return reinterpret_cast<const uint4 *>(dq_writers)[tile];
}

// bwd_prepost_sm90.cu: ws->dlt, ws->lse_log2, and zero ws->dq_accum for `layout`. Launched as
// the programmatic dependent of the schedule kernel, beside which (and the lists kernel and the
// selection before it) it runs: it touches nothing they read or write, and waits for the
// schedule before it completes, so that the main kernel launched behind it sees all of them.
// carveout: bl_bwd_chain_carveout.
// dq16_zeros (a call with a DIRECT candidate, bwd_params::dq_direct): zero CTAs after the row
// CTAs (which zero the whole accumulator as in every call) also write dq's zeros in its dtype for
// the light tiles (bl_bwd_dq16_tile) once ws->zeros_pick says DIRECT or DQ16 -- at head dim 128
// those without entries (a tile's first entry stores: bl_bwd_workspace::dq_claims, which they
// reset), at 64 those of other than one entry -- and for all their tiles while it is not known
// yet. selecting: a selection kernel runs in the call (the pick comes late; pp_rows_read_pick).
bl_status bl_bwd_preprocess_launch(const bl_bwd_dims &dm, bl_dtype dtype, bl_tensor out,
                                   bl_tensor dout, const float *lse, bl_dq_layout layout,
                                   int carveout, bool dq16_zeros, bool selecting, bl_tensor dq,
                                   const bl_bwd_workspace *ws, cudaStream_t stream);
// bwd_prepost_sm90.cu: dq = scale * ws->dq_accum in the dtype, read in `layout`. dq_direct
// (bwd_params::dq_direct): where version 10's DIRECT form was picked, the light row tiles
// (bl_bwd_dq16_tile) are in dq already and are left alone.
bl_status bl_bwd_postprocess_launch(const bl_bwd_dims &dm, bl_dtype dtype, float scale,
                                    bl_dq_layout layout, bool dq_direct, bl_tensor dq,
                                    const bl_bwd_workspace *ws, cudaStream_t stream);

// Main-kernel variant of bl_cuda_backward: a development switch for dev/cuda/attn_bwd.cu.
//   WGMMA: the shipped kernels (head dim 64: bwd_ws64_sm90.cuh; 128: bwd_ws128_sm90.cuh; where
//     TMA cannot be used bwd_wgmma64p_sm90.cuh and bwd_wgmma_sm90.cuh).
//   MMA: the mma.sync kernel, only in builds with -DBL_BWD_WITH_MMA_VARIANT (else WGMMA runs).
//   WGMMA64_V1: bwd_wgmma_sm90.cuh (version 3b) at head dim 64 too (one list entry per
//     iteration).
//   WGMMA128_V3B: bwd_wgmma_sm90.cuh at head dim 128 as version 3b (dK waits for dV; 16-bit dS
//     stores) instead of version 6.
//   CPASYNC_ROWS: the shipped kernels with their row tiles loaded by cp.async from every thread
//     instead of TMA (head dim 128: version 4; 64: the paired kernel as first measured), as the
//     library runs them where TMA cannot describe Q or dO.
//   WGMMA64_V4: head dim 64 as the paired kernel with TMA (bwd_wgmma64p_sm90.cuh version 4: no
//     producer warpgroup) instead of version 6 (bwd_ws64_sm90.cuh).
//   WGMMA128_V6: head dim 128 as version 6 (bwd_wgmma_sm90.cuh: no producer warpgroup, every
//     warp issues its own dQ reduce-adds) instead of version 10 (bwd_ws128_sm90.cuh).
//   WS128_FEW_CTAS: the shipped head-dim-128 kernels (persistent) on at most 3 CTAs instead of
//     one per SM, so that small checks make each CTA walk several columns.
//   WS128_ROWS64: head-dim-128 calls on the 64-row kernel (version 10) only, never the 80-row
//     one (version 11, bwd_ws128r80_sm90.cuh).
//   WS128_ROWS80: masked and selected head-dim-128 calls on the 80-row kernel whatever their
//     lists (the shipped choice, bl_bwd_rows80_chosen, is the device's), on at most 3 CTAs.
//   DQ_ROWS: head-dim-128 calls with TMA as version 10 without dQ (bwd_ws128_kernel<T, false>)
//     and the dq-rows kernel (bwd_dqrows_sm90.cuh): no dq accumulator.
enum {
    BL_BWD_VARIANT_WGMMA = 0,
    BL_BWD_VARIANT_MMA = 1,
    BL_BWD_VARIANT_WGMMA64_V1 = 2,
    BL_BWD_VARIANT_WGMMA128_V3B = 3,
    BL_BWD_VARIANT_CPASYNC_ROWS = 4,
    BL_BWD_VARIANT_WGMMA128_V6 = 5,
    BL_BWD_VARIANT_WGMMA64_V4 = 6,
    BL_BWD_VARIANT_WS128_FEW_CTAS = 7,
    BL_BWD_VARIANT_WS128_ROWS64 = 8,
    BL_BWD_VARIANT_WS128_ROWS80 = 9,
    BL_BWD_VARIANT_DQ_ROWS = 10
};
void bl_bwd_set_variant(int variant);
