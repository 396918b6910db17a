// bwd_prepost_sm90.cu -- the backward's memory-bound stages around the main kernel:
// preprocess (Dlt = rowsum(dO * out), lse in base 2, zero the fp32 dq accumulator) and
// postprocess (dq = scale * accumulator, in the input dtype). Also the workspace layout and
// bl_cuda_bwd_workspace_size.
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "backend.h"
#include "cuda_check.cuh"
#include "bwd_common.cuh"
#include "bwd_workspace.h"
#include "ptx_sm90.cuh"
#include "pp_block_order.h"

// Every workspace piece starts on this boundary (16-byte vector and cp.async alignment, with room).
#define BWD_WS_ALIGN 256
#define BL_LOG2E 1.4426950408889634f

bl_bwd_dims bl_bwd_make_dims(const bl_attn_desc *d) {
    bl_bwd_dims dm;
    dm.batch = d->batch;
    dm.seqlen_q = d->seqlen_q;
    dm.seqlen_k = d->seqlen_k;
    dm.heads_q = d->heads_q;
    dm.heads_k = d->heads_k;
    dm.head_dim = d->head_dim;
    dm.group = d->heads_k > 0 ? d->heads_q / d->heads_k : 1;
    dm.tiles_m = (d->seqlen_q + BL_BWD_TM - 1) / BL_BWD_TM;
    dm.tiles_n = (d->seqlen_k + BL_BWD_TN - 1) / BL_BWD_TN;
    dm.tiles_m80 = (d->seqlen_q + BL_BWD_TM_DENSE - 1) / BL_BWD_TM_DENSE;
    const int64_t pad64 = dm.tiles_m * BL_BWD_TM, pad80 = dm.tiles_m80 * BL_BWD_TM_DENSE;
    dm.seqlen_q_pad = pad64 > pad80 ? pad64 : pad80;
    return dm;
}

// Rows per (batch, q head) the dq accumulator spans in `layout`.
static int64_t bl_bwd_dq_accum_rows(const bl_bwd_dims &dm, bl_dq_layout layout) {
    const int64_t rows80 = dm.tiles_m80 * BL_BWD_TM_DENSE, rows64 = dm.tiles_m * BL_BWD_TM;
    switch (layout) {
    case BL_DQ_TILES80:
    case BL_DQ_TILES80G: return rows80;
    case BL_DQ_TILES64R: return rows64;
    case BL_DQ_NONE: return 0;
    case BL_DQ_CHOSEN:
    case BL_DQ_PACKED: return rows80 > rows64 ? rows80 : rows64;
    default: return dm.seqlen_q;
    }
}

size_t bl_bwd_dq_accum_floats(const bl_bwd_dims &dm, bl_dq_layout layout) {
    return (size_t)(dm.batch * bl_bwd_dq_accum_rows(dm, layout) * dm.heads_q * dm.head_dim);
}

static size_t ws_take(size_t *offset, size_t bytes) {
    size_t at = (*offset + BWD_WS_ALIGN - 1) / BWD_WS_ALIGN * BWD_WS_ALIGN;
    *offset = at + bytes;
    return at;
}

// bl_bwd_head_split's rule. The call's makespan in units of one whole column's time L (G query
// heads x every row tile) for a split into P parts (columns of L / P) on `sms` CTAs at a time
// (head dim 64 launches a CTA per column and part, which the hardware starts in schedule order
// as SMs free up: the persistent kernels' greedy draw):
// - without a causal mask every column is L long: ceil(V / sms) rounds of L / P, V = cols x P;
// - with one, a column's length falls from L to ~0 along the key tiles (L / 2 on average); the
//   heaviest-first schedule ends at about the average load plus half a last column, and never
//   before its longest column: max(L / P, cols L / (2 sms) + L / (2 P)).
// With a causal mask each part adds part_cost L per round of columns (cols / sms): each part
// gives every SM cols / sms more column starts and ends and the reduction cols more blocks to
// read. (Without one a split must save whole rounds; ties keep fewer parts.) Measured, dense and
// masked calls at every P (bench/results/bwd-s75-split-parts.txt): at head dim 128, 256 columns
// (2 x 16k x 8 q heads, one K / V head) 4 parts beat 8 (dense -1.0 %, masked -68..-96 us) and at
// 128 columns (16k x 32 q heads) 8 beat 4 (dense -8 %): SPLIT_PART_COST_D128 picks 8 below ~172
// columns, 4 from there. At head dim 64 a part costs more against a column (a CTA per column and
// part, each with its own start and end): 256 columns 2 parts best (dense -2 % against 4, -6 %
// against 8), 128 columns 4 (dense level with 8, masked -27..-55 us): SPLIT_PART_COST_D64 picks 8
// below ~59 columns, 4 to ~235, 2 from there. (It was 0.01 L a part whatever the columns, which
// picked 8 for all four.)
// At most SPLIT_MAX parts, and only where the columns fill fewer than SPLIT_MIN_ROUNDS rounds of
// the SMs (more rounds balance themselves).
static constexpr double SPLIT_PART_COST_D128 = 0.012, SPLIT_PART_COST_D64 = 0.035;
enum { SPLIT_MAX = 8, SPLIT_MIN_ROUNDS = 4 };
// The causal makespan without the parts' cost, and that cost.
static double split_balance_causal(int64_t cols, int sms, int parts) {
    const double longest = 1.0 / parts, balanced = (double)cols / (2.0 * sms) + 0.5 / parts;
    return longest > balanced ? longest : balanced;
}
static double split_part_cost(int64_t cols, int sms, int parts, double part_cost) {
    return part_cost * parts * (double)cols / sms;
}
static double split_makespan(int64_t cols, int sms, bool causal, int parts, double part_cost) {
    if (!causal) return (double)((cols * parts + sms - 1) / sms) / parts;
    return split_balance_causal(cols, sms, parts) + split_part_cost(cols, sms, parts, part_cost);
}

static int g_head_split_cap = SPLIT_MAX;
void bl_bwd_set_head_split_cap(int cap) { g_head_split_cap = cap < 1 ? 1 : cap; }

int bl_bwd_head_split(const bl_bwd_dims &dm, bool causal) {
    int sms = 0;
    if ((dm.head_dim != 128 && dm.head_dim != 64) || dm.group < 2 || g_head_split_cap < 2 ||
        bl_sm_count(&sms) != BL_OK || sms <= 0)
        return 1;
    const int64_t cols = dm.batch * dm.heads_k * dm.tiles_n;
#ifdef BL_HEAD_SPLIT_NC_FORCE
    // dev A/B only: non-causal calls split in this many parts (a divisor of G)
    if (!causal && dm.group % BL_HEAD_SPLIT_NC_FORCE == 0) return BL_HEAD_SPLIT_NC_FORCE;
#endif
    if (cols >= (int64_t)SPLIT_MIN_ROUNDS * sms) return 1;
    const double part_cost = dm.head_dim == 64 ? SPLIT_PART_COST_D64 : SPLIT_PART_COST_D128;
    int best = 1;
    double best_cost = split_makespan(cols, sms, causal, 1, part_cost);
    for (int parts = 2; parts <= g_head_split_cap && parts <= SPLIT_MAX && dm.group % parts == 0;
         parts *= 2) {
        const double cost = split_makespan(cols, sms, causal, parts, part_cost);
        if (cost < best_cost) best = parts, best_cost = cost;
    }
    return best;
}

// The device's part count for masked causal calls at head dim 128 (bl_bwd_split_parts), a cost
// in microseconds fitted to sweeps of every part count P >> k at 5 keeps
// (bench/results/bwd-s78-split-sweep.txt: 9 shapes of C = 64..256 columns of E = G x Tm =
// 1024..8192 entries; bwd-s79-split-sweep.txt: 6 shapes of C = 384 / 512, E = 512..4096, and
// C = 256 again; dev/cuda/split_rule_fit.py scores a rule on them):
//   f x SPLIT_FIT_ENTRY_US x E x balance(C, p) x (1 + SPLIT_FIT_HEAD_COST x p / G)
//     + SPLIT_FIT_PART_US x C x p
// - balance: the makespan of a full causal mask in units of one column, the longest part (1 / p)
//   or the average load plus a tail of SPLIT_FIT_TAIL of the largest part;
// - the head term: a part's entries cost more where it holds few query heads (at 50 % kept the
//   best p left G / p = 4 heads a part on 4 of the 5 shapes with C = 128);
// - the part cost: each column and part is one more column start and end and one more dK / dV
//   partial written and summed (the reduction alone ~0.035 us a block at C = 128), absolute
//   time, not a share of a column (the seventy-third session's rule priced it in columns and so
//   overpriced the parts of long columns). (Fitted when a kernel of its own summed the partials;
//   since the eighty-second session the main kernels do, bwd_split_sum_sm90.cuh, and the rule
//   was not refitted.)
// Every split call applies it (the host splits only below SPLIT_MIN_ROUNDS rounds of columns).
// On the sweeps' 85 rows (one round each) its picks miss the fastest p on 20, by 48 us at most,
// 344 us in all; the seventy-fourth session's form (a tail of 0.4, at most two columns per SM)
// missed 2296 us in all (the host's P at C = 384 / 512 lost up to 128 us a call: 1 x 8k x 32 q x
// 8 kv heads, Llama-3-8B's heads at 8k, ran 1.07 / 1.13 / 1.22 / 1.41 / 1.49x the time of one
// part at 50 / 25 / 10 / 3 / 0.8 % kept), its tail of 0.4 under the gate of 4 rounds 521 us (189
// at 1 x 32k x 16 q x 2 kv, 50 %), the host's P 3656.
static constexpr double SPLIT_FIT_ENTRY_US = 1.93, SPLIT_FIT_TAIL = 0.5, SPLIT_FIT_HEAD_COST = 0.2,
                        SPLIT_FIT_PART_US = 0.08;
bl_status bl_bwd_split_rule_make(const bl_bwd_dims &dm, bool causal, int split,
                                 bl_bwd_split_rule *rule) {
    *rule = bl_bwd_split_rule{};
    rule->levels = 1;
    BL_TRY(bl_bwd_schedule_window(dm, causal, split, &rule->window, NULL));
#ifdef BL_BWD_SPLIT_FORCE_LEVEL
    // Dev builds only, for sweeps of the parts a masked call uses (bench/notes-bwd.md, the
    // seventy-third session's Next): every masked causal head-dim-128 split call uses
    // split >> BL_BWD_SPLIT_FORCE_LEVEL parts (at least 1), whatever its totals and the gates
    // below; balance 0 and part cost 0 at that level only, so it is the cheapest.
    static_assert(BL_BWD_SPLIT_FORCE_LEVEL >= 0 && BL_BWD_SPLIT_FORCE_LEVEL < BL_BWD_SPLIT_LEVELS,
                  "BL_BWD_SPLIT_FORCE_LEVEL: 0 .. BL_BWD_SPLIT_LEVELS - 1");
    if (causal && dm.head_dim == 128 && split >= 2) {
        int k = BL_BWD_SPLIT_FORCE_LEVEL;
        while (k > 0 && (split >> k) < 1) --k;
        for (int j = 0; j <= k; ++j) rule->part_cost[j] = j == k ? 0 : 1;
        rule->levels = k + 1;
        return BL_OK;
    }
#endif
    if (!causal || dm.head_dim != 128 || split < 2) return BL_OK;
    int sms = 0;
    BL_TRY(bl_sm_count(&sms));
    const int64_t cols = dm.batch * dm.heads_k * dm.tiles_n;
    // A column's time at the dense per-entry rate, us. The products on the device stay in 64
    // bits: E = G x Tm < 2^19 where the lists fit (bl_bwd_lists_launch), and a split call has
    // cols < SPLIT_MIN_ROUNDS x SMs < 2^11 (bl_bwd_head_split; SMs < 512), so kept and pairs <=
    // cols x E < 2^30, balance[k] < 2^8 x 1.93 x 2^19 x 3 < 2^30 (balance <= (2 + 0.5) x 1.2:
    // C / (2 SMs) < 2, p <= G) and part_cost[k] < 2^8 x 0.08 x 2^11 x 8 < 2^19, so a cost is
    // < 2^61.
    const double column_us = SPLIT_FIT_ENTRY_US * (double)(dm.group * dm.tiles_m);
    for (int k = 0; k < BL_BWD_SPLIT_LEVELS && (split >> k) >= 1; ++k) {
        const int parts = split >> k;
        const double longest = 1.0 / parts,
                     average = (double)cols / (2.0 * sms) + SPLIT_FIT_TAIL / parts;
        const double balance = (longest > average ? longest : average) *
                               (1.0 + SPLIT_FIT_HEAD_COST * parts / (double)dm.group);
        rule->balance[k] =
            (unsigned long long)(column_us * balance * BL_BWD_SPLIT_FIXED_ONE + 0.5);
        rule->part_cost[k] = (unsigned long long)(SPLIT_FIT_PART_US * (double)(cols * parts) *
                                                      BL_BWD_SPLIT_FIXED_ONE + 0.5);
        rule->levels = k + 1;
    }
    return BL_OK;
}

size_t bl_bwd_workspace_layout(const bl_bwd_dims &dm, void *base, bl_bwd_workspace *ws) {
    const size_t rows_q = (size_t)(dm.batch * dm.heads_q * dm.seqlen_q_pad);
    const size_t tiles = (size_t)(dm.batch * dm.heads_q * dm.tiles_m * dm.tiles_n);
    const size_t cols = (size_t)(dm.batch * dm.heads_k * dm.tiles_n);
    size_t off = 0;
    // Room for every layout of the dq accumulator (the tile ones pad the last row tile).
    const size_t dq_rows = bl_bwd_dq_accum_floats(dm, BL_DQ_ROWS);
    const size_t dq_tiles = bl_bwd_dq_accum_floats(dm, BL_DQ_PACKED);
    size_t o_dq = ws_take(&off, (dq_rows > dq_tiles ? dq_rows : dq_tiles) * sizeof(float));
    size_t o_dlt = ws_take(&off, rows_q * sizeof(float));
    size_t o_lse = ws_take(&off, rows_q * sizeof(float));
    size_t o_mask = ws_take(&off, tiles);
    size_t o_counts = ws_take(&off, cols * sizeof(int));
    size_t o_lists = ws_take(&off, tiles * sizeof(int));  // G*Tm per key tile = Hq*Tm*Tn in all
    const size_t tiles80 = (size_t)(dm.batch * dm.heads_q * dm.tiles_m80 * dm.tiles_n);
    size_t o_counts80 = ws_take(&off, cols * sizeof(int));
    size_t o_lists80 = ws_take(&off, tiles80 * sizeof(int));
    size_t o_totals = ws_take(&off, BL_BWD_TOTALS * sizeof(unsigned long long));
    size_t o_writers = ws_take(&off, (size_t)(dm.batch * dm.heads_q * dm.tiles_m) *
                                         BL_BWD_WRITER_RUNS);
    size_t o_sched = ws_take(&off, cols * sizeof(int));
    // the head split of either mask (bl_bwd_head_split): its records and dK / dV partials
    const int split_c = bl_bwd_head_split(dm, true), split_n = bl_bwd_head_split(dm, false);
    const size_t split = (size_t)(split_c > split_n ? split_c : split_n);
    size_t o_rec = ws_take(&off, (cols * split + 1) * sizeof(int4));
    size_t o_rec_low = ws_take(&off, (cols + 1) * sizeof(int4));
    const size_t part_floats =
        split > 1 ? 2 * split * (size_t)(dm.batch * dm.seqlen_k * dm.heads_k * dm.head_dim) : 0;
    size_t o_part = ws_take(&off, part_floats * sizeof(float));
    size_t o_done = ws_take(&off, split > 1 ? cols * sizeof(int) : 0);
    size_t o_next = ws_take(&off, sizeof(int));
    size_t o_unkept = ws_take(&off, 2 * BL_BWD_TM_DENSE * sizeof(float));
    size_t o_pick = ws_take(&off, BL_ZEROS_PICK_INTS * sizeof(int));
    size_t o_claims =
        ws_take(&off, (size_t)(dm.batch * dm.heads_q * dm.tiles_m) * sizeof(unsigned));
    if (base && ws) {
        char *p = (char *)base;
        ws->dq_accum = (float *)(p + o_dq);
        ws->dlt = (float *)(p + o_dlt);
        ws->lse_log2 = (float *)(p + o_lse);
        ws->mask = (uint8_t *)(p + o_mask);
        ws->counts = (int *)(p + o_counts);
        ws->lists = (int *)(p + o_lists);
        ws->counts80 = (int *)(p + o_counts80);
        ws->lists80 = (int *)(p + o_lists80);
        ws->totals = (unsigned long long *)(p + o_totals);
        ws->schedule = (int *)(p + o_sched);
        ws->sched_rec = (int4 *)(p + o_rec);
        ws->sched_rec_low = (int4 *)(p + o_rec_low);
        ws->sched_next = (int *)(p + o_next);
        ws->unkept_rows = (float *)(p + o_unkept);
        ws->zeros_pick = (int *)(p + o_pick);
        ws->dq_claims = (unsigned *)(p + o_claims);
        ws->dq_writers = (uint8_t *)(p + o_writers);
        ws->dkv_part = part_floats ? (float *)(p + o_part) : NULL;
        ws->dkv_done = split > 1 ? (int *)(p + o_done) : NULL;
    }
    return off + BWD_WS_ALIGN;  // slack: the caller's base need only be 16-byte aligned
}

extern "C" bl_status bl_cuda_bwd_workspace_size(const bl_attn_desc *d, size_t *bytes) {
    *bytes = bl_bwd_workspace_layout(bl_bwd_make_dims(d), NULL, NULL);
    return BL_OK;
}

// Elements one thread handles: one 16-byte vector of a 16-bit dtype.
enum { PP_VEC = 8, PP_THREADS = 256 };

union bl_vec16 {
    uint4 u;
    uint16_t h[PP_VEC];
};

// Zeros for one thread's PP_VEC floats of the fp32 dq accumulator (16-byte aligned).
static __device__ __forceinline__ void pp_zero_vec(float *p) {
    float4 *acc = reinterpret_cast<float4 *>(p);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
}

template <typename T>
static __device__ __forceinline__ float bits_to_float(uint16_t x);
template <>
__device__ __forceinline__ float bits_to_float<__nv_bfloat16>(uint16_t x) {
    return __bfloat162float(__ushort_as_bfloat16(x));
}
template <>
__device__ __forceinline__ float bits_to_float<__half>(uint16_t x) {
    return __half2float(__ushort_as_half(x));
}
template <typename T>
static __device__ __forceinline__ uint16_t float_to_bits(float x);
template <>
__device__ __forceinline__ uint16_t float_to_bits<__nv_bfloat16>(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ uint16_t float_to_bits<__half>(float x) {
    return __half_as_ushort(__float2half_rn(x));
}

// The zero CTAs of a call with a DIRECT candidate (bl_bwd_preprocess_launch, dq16_zeros): which
// zeros the call needs is known only once the window schedule has summed its totals (it writes
// zeros_pick[1]), while the preprocess runs beside it. Every form that chose the accumulator's
// zeros in the preprocess cost the calls that pick the accumulator's kernel 7-13 us (v2's zero
// CTAs of either kind among the row CTAs: 68-71 us against 58; v3 / v3b / v3c's pick read in
// the row CTAs: bench/results/bwd-s103-dq16-v3.txt, bwd-s105-dq16-v3c.txt). So here the row
// CTAs zero the whole fp32 accumulator as in every other call -- what every kernel but the
// DIRECT form needs, and a phase that costs little beside their reads -- unless (head dim 128,
// and 64 without a selection: pp_rows_read_pick) the pick they read, one relaxed load a warp
// beside their out / dO loads, is already DIRECT. The zero CTAs (PP_ZERO_TILES tiles each) run
// after every row CTA, when the pick is known (the schedule publishes it once the lists are
// counted, ~20 us into a 16k x 16 call, long before the row CTAs end):
// - where it is the accumulator's they return at once;
// - where it is DIRECT they zero the fp32 rows of the heavy tiles (READ_PICK kernels) -- no
//   other tile's rows are read: the light ones are in dq, the ones without entries are zeros in
//   the conversion (postprocess_rows_block) -- and dq's light tiles that have other than one
//   entry and no claim (bl_bwd_dq16_zeroed);
// - a zero CTA that finds no pick yet zeroes the fp32 rows of all its tiles (READ_PICK kernels)
//   and dq in all of them (the writer counts may not be there).
// Why every heavy tile's rows are zeros where the pick is DIRECT: the pick is written once a call
// (after the lists kernel's reset, fenced before the chain launches the preprocess), so the zero
// CTA that owns the tile reads DIRECT or nothing yet, and zeroes its rows either way -- whatever
// the row CTAs read. Where it is not DIRECT no row CTA can have read DIRECT, so they zeroed all.
// (A first form zeroed an even share of the whole accumulator where the pick was not there yet:
// a zero CTA that read nothing while the row CTAs over its tiles' rows read DIRECT, and the one
// whose share held those rows read DIRECT too, would have left them unzeroed.)
// The row CTAs that run before the pick is published (~25 % of them at 16k x 16) still zero
// their part. Moving every accumulator zero into the zero CTAs (all of it behind the reads where
// the pick is the accumulator's) made those calls' preprocess 77 -> 146 us on an H100
// (bench/results/bwd-s130-zeros-heavy-only.txt, call 2).
// Dev builds (dev/cuda/dq16_device.sh time): -DBL_PP_ZERO_FIRST_ROWS=N puts the first zero CTA
// after N row CTAs and spreads the rest evenly over the grid (v2's placement);
// -DBL_PP_ZERO_TILES=N gives each zero CTA N tiles; -DBL_PP_ZERO_COUNTS counts the zero CTAs by
// the kind they found (bl_bwd_workspace::zeros_pick[2..5]) and the last of them prints the counts.
#ifndef BL_PP_ZERO_FIRST_ROWS
#define BL_PP_ZERO_FIRST_ROWS (-1)  // after every row CTA
#endif
#ifdef BL_PP_ZERO_COUNTS
#include <cstdio>
#endif
// PP_ZERO_TILES: 64-row tiles a zero CTA (few CTAs, so that returning ones cost little; at 4, 1024
// CTAs at 16k x 16 cost an accumulator call ~1.5 us of preprocess, bench/results/
// bwd-s105-dq16-v4.txt; dev builds: -DBL_PP_ZERO_TILES=N)
#ifndef BL_PP_ZERO_TILES
#define BL_PP_ZERO_TILES 4
#endif
enum { PP_ZERO_MIN_CTAS = 8, PP_ZERO_FIRST_ROWS = BL_PP_ZERO_FIRST_ROWS,
       PP_ZERO_TILES = BL_PP_ZERO_TILES };
// Whether the row CTAs read the pick and leave the accumulator's zeros of a DIRECT call to the
// zero CTAs (above): at head dim 128 always; at head dim 64 (the persistent kernel's DQ16 form)
// only where no selection kernel runs in the call. There the read takes 2-4 us off light calls,
// but in a call with a selection the pick is published late, so nearly every row CTA reads it
// for nothing, and ~65k warp loads of one address made the preprocess and the window schedule
// beside it ~20 us longer (16k x 16 x 64 video negl 0.5 268 -> 290 us a call, causal negl 0.5
// 235 -> 258: bench/results/bwd-s130-zeros-heavy-only.txt call 5, bwd-s132-pick-own-line.txt).
// (The kernels take it as READ_PICK.)
__host__ __forceinline__ bool pp_rows_read_pick(int head_dim, bool selecting) {
    return head_dim == 128 || !selecting;
}
struct pp_zero_args {
    uint16_t *dq;            // (B, Sq, Hq, D) in the dtype, strides below
    int64_t sb, ss, sh;
    int *zeros_pick;         // bl_bwd_workspace::zeros_pick
    const uint8_t *dq_writers;
    unsigned *dq_claims;     // bl_bwd_workspace::dq_claims at head dim 128, else NULL
    int64_t row_blocks;      // the row CTAs (preprocess_rows)
    int64_t zero_blocks;     // the zero CTAs, PP_ZERO_TILES 64-row tiles each
    int64_t tiles;           // the 64-row tiles, B x Hq x tiles_m
    int64_t first_rows;      // the row CTAs before the first zero CTA
    unsigned period;         // then a zero CTA every `period` CTAs (>= 1)
    // (last, so that the members above keep their offsets: the head-dim-64 kernel, which does
    // not use it, compiles to the SASS measured before it)
    float *dq_accum;         // bl_bwd_workspace::dq_accum, (B, Sq, Hq, D) where DIRECT runs
};

// Zero CTA `cta`: tiles cta * PP_ZERO_TILES .. of (b, h, m) in dq_writers' order; with
// BL_ZEROS_DQ16 the fp32 accumulator's rows of those that are heavy (not bl_bwd_dq16_tile: the
// DIRECT form's layout, (B, Sq, Hq, D); READ_PICK) and the rows of dq of those that are light
// with other than one entry -- with z.dq_claims (head dim 128) only those with none: there the
// first entry of a tile of several stores and the others add behind it
// (bl_bwd_workspace::dq_claims) --, with BL_ZEROS_UNKNOWN the accumulator's rows (READ_PICK)
// and dq's rows of all, with BL_ZEROS_ACCUM none. Both of the first two reset the tiles' claims.
template <int D, bool READ_PICK>
__device__ __forceinline__ void preprocess_zero_tiles(const bl_bwd_dims &dm, const pp_zero_args &z,
                                                      int64_t cta) {
    constexpr int TPR = D / PP_VEC;  // 16-byte pieces of a dq row
    int kind;
    // acquire: the tiles' writers, read below, were written before the pick was (the schedule's
    // last CTA waited for the lists kernel)
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(kind) : "l"(z.zeros_pick + 1)
                 : "memory");
#ifdef BL_PP_ZERO_COUNTS
    if (threadIdx.x == 0 && kind >= 0 && kind <= BL_ZEROS_ACCUM) {
        int *counts = z.zeros_pick + 2;  // per kind, then the zero CTAs counted
        atomicAdd(counts + kind, 1);
        __threadfence();
        if (atomicAdd(counts + 3, 1) == (int)z.zero_blocks - 1)
            printf("bl zero CTAs: unknown %d dq16 %d accum %d of %lld\n", atomicAdd(counts, 0),
                   atomicAdd(counts + 1, 0), atomicAdd(counts + 2, 0), (long long)z.zero_blocks);
    }
#endif
    if (kind == BL_ZEROS_ACCUM) return;
    for (int j = 0; j < PP_ZERO_TILES; ++j) {
        const int64_t tile = cta * PP_ZERO_TILES + j;
        if (tile >= z.tiles) return;
        if (z.dq_claims != nullptr && threadIdx.x == 0) z.dq_claims[tile] = 0u;
        // the tile's fp32 rows (where the row CTAs read the pick: READ_PICK), its dq rows
        // (BL_ZEROS_ACCUM returned above, so a pick read here is DIRECT's)
        bool accum = READ_PICK && bl_bwd_zero_cta_zeroes_accum(false, false, 0u);
        bool rows16 = true;
        if (kind == BL_ZEROS_DQ16) {
            const unsigned w = bl_bwd_tile_writers(
                __ldcg(reinterpret_cast<const uint4 *>(z.dq_writers) + tile));
            accum = READ_PICK && bl_bwd_zero_cta_zeroes_accum(true, true, w);
            rows16 = bl_bwd_dq16_zeroed(w, z.dq_claims != nullptr);
            if (!accum && !rows16) continue;
        }
        const int64_t m = tile % dm.tiles_m;
        const int64_t h = (tile / dm.tiles_m) % dm.heads_q;
        const int64_t b = tile / (dm.tiles_m * dm.heads_q);
        const int rows = (int)min((int64_t)BL_BWD_TM, dm.seqlen_q - m * BL_BWD_TM);
        if (accum) {
            float *acc0 = z.dq_accum + ((b * dm.seqlen_q + m * BL_BWD_TM) * dm.heads_q + h) * D;
            for (int x = threadIdx.x; x < rows * TPR; x += PP_THREADS)
                pp_zero_vec(acc0 + (int64_t)(x / TPR) * dm.heads_q * D + (x % TPR) * PP_VEC);
        }
        if (!rows16) continue;
        uint16_t *row0 = z.dq + b * z.sb + m * BL_BWD_TM * z.ss + h * z.sh;
        for (int x = threadIdx.x; x < rows * TPR; x += PP_THREADS)
            *reinterpret_cast<uint4 *>(row0 + (x / TPR) * z.ss + (x % TPR) * PP_VEC) =
                make_uint4(0u, 0u, 0u, 0u);
    }
}

// The tensors and sizes, one kernel parameter for both preprocess kernels (members in the order
// the separate parameters had, so the parameter space is laid out as before).
struct pp_rows_args {
    const uint16_t *out;
    int64_t o_sb, o_ss, o_sh;
    const uint16_t *dout;
    int64_t do_sb, do_ss, do_sh;
    const float *lse;
    float *dlt, *lse_log2, *dq_accum;
    int64_t zero_rows;
    float *unkept_rows;
    int *dkv_done;
    int64_t done_cols;
};

// One row (b, h, i) of D elements per D/PP_VEC consecutive threads, i fastest, so that the
// per-row lse reads and dlt / lse_log2 writes are contiguous across a warp (with h fastest they
// were one 4-byte access per sector, and the kernel 2.5 % slower:
// bench/results/bwd-s39-prepost.txt); each row's D elements of out / dout are one contiguous
// piece either way. Rows i in [Sq, Sq_pad)
// only write the padding of dlt / lse_log2.
// out, dout: (B, Sq, Hq, D); lse: (B, Hq, Sq) fp32; dlt, lse_log2: (B, Hq, Sq_pad);
// dq_accum: its first zero_rows * B * Hq * D floats zeroed, 8 per thread in thread order:
// zero_rows = Sq covers the (B, Sq, Hq, D) layouts, the padded rows of the tile layouts theirs
// (bl_bwd_dq_accum_rows, <= Sq_pad, so the grid covers the range). unkept_rows
// (bl_bwd_workspace) is filled too, and a split call's dkv_done (done_cols ints; NULL: none)
// zeroed (all of them members of `a`). block: this CTA's index among those that run this, blocks
// their number (0: the grid).
template <typename T, int D, bool PICK = false>
__device__ __forceinline__ void preprocess_rows(const bl_bwd_dims &dm, const pp_rows_args &a,
                                                int64_t block, int64_t blocks,
                                                const int *zeros_pick = nullptr) {
    const uint16_t *__restrict__ out = a.out;
    const uint16_t *__restrict__ dout = a.dout;
    const float *__restrict__ lse = a.lse;
    float *__restrict__ dlt = a.dlt;
    float *__restrict__ lse_log2 = a.lse_log2;
    float *__restrict__ dq_accum = a.dq_accum;
    float *__restrict__ unkept_rows = a.unkept_rows;
    int *__restrict__ dkv_done = a.dkv_done;
    const int64_t o_sb = a.o_sb, o_ss = a.o_ss, o_sh = a.o_sh;
    const int64_t do_sb = a.do_sb, do_ss = a.do_ss, do_sh = a.do_sh;
    const int64_t zero_rows = a.zero_rows, done_cols = a.done_cols;
    constexpr int TPR = D / PP_VEC;  // threads per row
    const int64_t tid = block * PP_THREADS + threadIdx.x;
    const int64_t row = tid / TPR;
    const int part = (int)(tid % TPR);
    const int64_t rows = dm.batch * dm.seqlen_q_pad * dm.heads_q;
    // No early return: the whole warp takes part in the shuffles below.
    const bool live = row < rows;
    if (tid < 2 * BL_BWD_TM_DENSE) unkept_rows[tid] = tid < BL_BWD_TM_DENSE ? INFINITY : 0.0f;
    // (a stride: with Sq << Sk the columns can outnumber the threads)
    if (dkv_done)
        for (int64_t c = tid; c < done_cols; c += (blocks ? blocks : (int64_t)gridDim.x) * PP_THREADS)
            dkv_done[c] = 0;
    const int64_t i = row % dm.seqlen_q_pad;
    const int64_t h = (row / dm.seqlen_q_pad) % dm.heads_q;
    const int64_t b = row / (dm.heads_q * dm.seqlen_q_pad);
    float dot = 0.0f;
    if (live && i < dm.seqlen_q) {
        bl_vec16 o, g;
        // (read-only loads, LDG.CONSTANT: the struct's pointers carry no __restrict__ that would
        // let the compiler choose them)
        o.u = __ldg(reinterpret_cast<const uint4 *>(out + b * o_sb + i * o_ss + h * o_sh +
                                                    part * PP_VEC));
        g.u = __ldg(reinterpret_cast<const uint4 *>(dout + b * do_sb + i * do_ss + h * do_sh +
                                                    part * PP_VEC));
#pragma unroll
        for (int e = 0; e < PP_VEC; ++e) dot += bits_to_float<T>(o.h[e]) * bits_to_float<T>(g.h[e]);
    }
    bool zero = tid * PP_VEC < dm.batch * zero_rows * dm.heads_q * D;
    if (PICK) {
        // (relaxed: a DIRECT seen here is this call's -- the lists kernel reset the pick and
        // fenced before this grid could launch -- and any other value means zero as before)
        int kind = BL_ZEROS_UNKNOWN;
        if ((threadIdx.x & 31) == 0)
            asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(kind) : "l"(zeros_pick + 1));
        zero = zero && bl_bwd_rows_zero_accum(__shfl_sync(0xffffffffu, kind, 0) == BL_ZEROS_DQ16);
    }
    if (zero) pp_zero_vec(dq_accum + tid * PP_VEC);
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (live && part == 0) {
        const int64_t at = (b * dm.heads_q + h) * dm.seqlen_q_pad + i;
        float l2 = INFINITY;  // exp2(s - inf) = 0: pad rows and rows with no allowed key
        if (i < dm.seqlen_q) {
            float l = __ldg(lse + (b * dm.heads_q + h) * dm.seqlen_q + i);
            if (l != -INFINITY) l2 = l * BL_LOG2E;
        }
        dlt[at] = (i < dm.seqlen_q) ? dot : 0.0f;
        lse_log2[at] = l2;
    }
}

// Launched behind the schedule kernel (a programmatic dependent, beside which it runs, and
// beside the lists kernel and the selection before that): the schedule must complete before
// this grid does, so that the main kernel launched behind this one sees the lists and the
// schedule (the schedule waited for the lists kernel, that one for the selection). One CTA
// waiting is enough for that -- the grid completes when its last CTA does -- so only the last
// one, which starts last, waits: with every CTA waiting, the first wave held its SMs until
// the schedule was done, and the kernel ran 7 us (16k x 16 x 128) to 28 us (32k x 24) longer
// (bench/results/bwd-s49-fixed-chain.txt, run 1).
template <typename T, int D>
__global__ void __launch_bounds__(PP_THREADS)
bl_bwd_preprocess_kernel(bl_bwd_dims dm, const __grid_constant__ pp_rows_args a) {
    preprocess_rows<T, D>(dm, a, blockIdx.x, 0);
    if (blockIdx.x == gridDim.x - 1) griddep_wait();
}

// The same with zero CTAs beside the row CTAs (preprocess_zero_tiles; head dim 128: version
// 10's DIRECT form; head dim 64: the persistent kernel's DQ16 form, bwd_ws64p_sm90.cuh), at the
// shipped form's 8 CTAs an SM (<= 32 registers): at 40 the row CTAs would run 6 an SM, fewer
// loads in flight in a bandwidth-bound kernel. READ_PICK: pp_rows_read_pick.
template <typename T, int D, bool READ_PICK>
__global__ void __launch_bounds__(PP_THREADS, PP_ZERO_MIN_CTAS)
bl_bwd_preprocess_zeros_kernel(bl_bwd_dims dm, const __grid_constant__ pp_rows_args a,
                               pp_zero_args z) {
    // Past the first z.first_rows row CTAs, groups of z.period CTAs whose last is a zero CTA (the
    // group's index its number) until there are z.zero_blocks, then the rest of the row CTAs.
    // 32-bit: the grid's size is.
    const unsigned p = blockIdx.x - (unsigned)z.first_rows;  // (wraps below first_rows)
    const unsigned group = p / z.period;
    const bool zero = blockIdx.x >= (unsigned)z.first_rows && group < (unsigned)z.zero_blocks &&
                      p % z.period == z.period - 1;
    // the zero CTAs before this one
    const unsigned zeros_before = blockIdx.x < (unsigned)z.first_rows ? 0u
                                  : min((unsigned)z.zero_blocks, (p + 1) / z.period);
    if (zero)
        preprocess_zero_tiles<D, READ_PICK>(dm, z, group);
    else
        preprocess_rows<T, D, READ_PICK>(dm, a, blockIdx.x - zeros_before, z.row_blocks,
                                         z.zeros_pick);
    if (blockIdx.x == gridDim.x - 1) griddep_wait();
}

// Eight accumulator columns (a0, a1), in the order 0 2 4 6 1 3 5 7 where cols_permuted, times
// scale as T into out[0..7].
template <typename T>
__device__ __forceinline__ void store_row_part(float4 a0, float4 a1, bool cols_permuted,
                                               float scale, uint16_t *out) {
    float v[PP_VEC] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    if (cols_permuted) {
        v[1] = a1.x; v[2] = a0.y; v[3] = a1.y;
        v[4] = a0.z; v[5] = a1.z; v[6] = a0.w; v[7] = a1.w;
    }
    bl_vec16 o;
#pragma unroll
    for (int e = 0; e < PP_VEC; ++e) o.h[e] = float_to_bits<T>(v[e] * scale);
    *reinterpret_cast<uint4 *>(out) = o.u;
}

// Columns 8 part.. of row (b, i, h).
template <typename T, int D>
__device__ __forceinline__ void postprocess_row_part(const bl_bwd_dims &dm, float scale,
                                                     const float *__restrict__ dq_accum,
                                                     bool cols_permuted, uint16_t *__restrict__ dq,
                                                     int64_t sb, int64_t ss, int64_t sh, int64_t b,
                                                     int64_t i, int64_t h, int part) {
    static_assert(PP_VEC == 8, "one thread converts one 8-column group");
    const int64_t row = (b * dm.seqlen_q + i) * dm.heads_q + h;
    const float4 *acc = reinterpret_cast<const float4 *>(dq_accum + row * D + part * PP_VEC);
    store_row_part<T>(acc[0], acc[1], cols_permuted, scale,
                      dq + b * sb + i * ss + h * sh + part * PP_VEC);
}

// dq: (B, Sq, Hq, D) in T with strides; dq_accum (the BL_DQ_ROWS layouts): (B, Sq, Hq, D) fp32
// contiguous, with the columns of each 8-column group in the order 0 2 4 6 1 3 5 7 where
// cols_permuted (what the kernels that stage dQ for TMA reduce-adds write: dq_block_stage).
template <typename T, int D>
__global__ void __launch_bounds__(PP_THREADS)
bl_bwd_postprocess_kernel(bl_bwd_dims dm, float scale, const float *__restrict__ dq_accum,
                          bool cols_permuted, uint16_t *__restrict__ dq, int64_t sb, int64_t ss,
                          int64_t sh) {
    griddep_wait();  // a programmatic dependent of the main kernel (bl_bwd_postprocess_launch)
    constexpr int TPR = D / PP_VEC;
    const int64_t tid = (int64_t)blockIdx.x * PP_THREADS + threadIdx.x;
    const int64_t row = tid / TPR;
    if (row >= dm.batch * dm.seqlen_q * dm.heads_q) return;
    postprocess_row_part<T, D>(dm, scale, dq_accum, cols_permuted, dq, sb, ss, sh,
                               row / (dm.heads_q * dm.seqlen_q), (row / dm.heads_q) % dm.seqlen_q,
                               row % dm.heads_q, (int)(tid % TPR));
}

// The tile layouts: one CTA per ROWS x 128 block (b, h, row tile m), stored as (B, Hq, rows'
// tiles) and taken in pp_block_coords' order; BL_DQ_TILES80 and TILES80G (ROWS = 80), TILES64R
// (64). A block is the 8 consumer warps' staging (bwd_ws128r80_sm90.cuh): vector (lane, x) of
// warp w's group t holds query 8t + 2(lane % 4) + (x & 1), column 16w + lane / 4 + 8(x >> 1);
// TILES80 has each warp's groups one after the other (r80_dq_offset), the others (GROUPED) each
// group's warps (r80_dq_offset_grouped). The block goes through shared memory in the warp-major
// order, each warp's part 4 floats apart (bank offsets: the 16 chunks of a row then fall in
// distinct banks), and every thread converts 8 consecutive columns of a row (16-byte stores).
constexpr int PP80_ROWS = BL_BWD_TM_DENSE, PP80_D = 128;
// The (b, h, row tile m) block CTA blk of a tile layout's grid converts, and why in that order:
// pp_block_order.h (plain C, checked on the CPU by tests/c/test_pp_block_order.c).
__device__ __forceinline__ void pp_block_coords(const bl_bwd_dims &dm, int64_t tiles, int64_t blk,
                                                int64_t *b, int64_t *h, int64_t *m) {
    int b32, h32, m32;
    bl_pp_block_coords((int)dm.batch, (int)dm.heads_q, (int)tiles, (int)blk, &b32, &h32, &m32);
    *b = b32, *h = h32, *m = m32;
}
// CTAs per block of the conversions: each converts a part of the block's rows (whole groups of
// 8), so that a half block's shared memory and registers let 8 CTAs of 256 threads share an SM
// where 5 (tile layouts) or 3 (version 10's rows, 70 registers) whole blocks fit
// (bench/results/bwd-s39-prepost.txt runs 3-4).
constexpr int PP_TILE_PARTS = 2;
// Shared memory (floats) of a part of a ROWS-row block: each staging warp's 16 columns x the
// part's rows, 4 floats apart.
__host__ __device__ constexpr int pp_tile_floats(int rows) {
    return (PP80_D / 16) * (16 * rows / PP_TILE_PARTS + 4);
}
// Part `part` (of PP_TILE_PARTS) of CTA blk's block, through `tile` (pp_tile_floats(ROWS)).
template <typename T, int ROWS, bool GROUPED>
__device__ __forceinline__ void postprocess_tile(const bl_bwd_dims &dm, float scale,
                                                 const float *__restrict__ dq_accum,
                                                 uint16_t *__restrict__ dq, int64_t sb, int64_t ss,
                                                 int64_t sh, int64_t blk, int part, float *tile) {
    constexpr int PARTS = PP_TILE_PARTS;
    constexpr int WARPS = PP80_D / 16;
    constexpr int GROUPS = ROWS / 8 / PARTS;  // groups of 8 rows in a part
    static_assert(GROUPS * 8 * PARTS == ROWS, "a part is whole groups");
    constexpr int PART_ROWS = 8 * GROUPS;
    constexpr int WARP_FLOATS = 16 * PART_ROWS;  // one staging warp's 16 columns x the part's rows
    constexpr int WARP_STRIDE = WARP_FLOATS + 4;
    constexpr int WARP_VEC = WARP_FLOATS / 4;
    static_assert(WARPS * WARP_STRIDE <= pp_tile_floats(ROWS), "the part fits the buffer");
    const int64_t tiles = ROWS == PP80_ROWS ? dm.tiles_m80 : dm.tiles_m;
    int64_t b, h, m;
    pp_block_coords(dm, tiles, blk, &b, &h, &m);
    const int64_t block = (b * dm.heads_q + h) * tiles + m;  // where the layout stores it
    const float4 *src = reinterpret_cast<const float4 *>(dq_accum + block * ROWS * PP80_D);
    // vector f of the part: warp f / WARP_VEC, its vector f % WARP_VEC; GROUPED: group f / 256,
    // warp (f / 32) % 8. In the block, a warp's part starts GROUPS * 32 vectors into its
    // ROWS / 8 * 32 (TILES80); a GROUPED part is GROUPS * 256 contiguous vectors.
    for (int f = threadIdx.x; f < WARPS * WARP_VEC; f += PP_THREADS) {
        const int w = GROUPED ? (f >> 5) % WARPS : f / WARP_VEC;
        const int v = GROUPED ? (f / (32 * WARPS)) * 32 + (f & 31) : f % WARP_VEC;
        const int from = GROUPED ? part * WARPS * WARP_VEC + f
                                 : w * PARTS * WARP_VEC + part * WARP_VEC + v;
        *reinterpret_cast<float4 *>(&tile[w * WARP_STRIDE + 4 * v]) = src[from];
    }
    __syncthreads();
    for (int item = threadIdx.x; item < PART_ROWS * (PP80_D / PP_VEC); item += PP_THREADS) {
        const int q = item / (PP80_D / PP_VEC), c = item % (PP80_D / PP_VEC);
        const int64_t i = m * ROWS + part * PART_ROWS + q;
        if (i >= dm.seqlen_q) continue;
        // columns 8c..8c+7: warp c / 2, register pair x >> 1 = c % 2, lanes 4 lg + lt for lg = 0..7
        const int t = q >> 3, lt = (q & 7) >> 1;
        const float *at = tile + (c >> 1) * WARP_STRIDE + (32 * t + lt) * 4 + 2 * (c & 1) + (q & 1);
        bl_vec16 o;
#pragma unroll
        for (int lg = 0; lg < PP_VEC; ++lg) o.h[lg] = float_to_bits<T>(at[16 * lg] * scale);
        *reinterpret_cast<uint4 *>(dq + b * sb + i * ss + h * sh + c * PP_VEC) = o.u;
    }
}
template <typename T, int ROWS, bool GROUPED>
__global__ void __launch_bounds__(PP_THREADS)
bl_bwd_postprocess_tile_kernel(bl_bwd_dims dm, float scale, const float *__restrict__ dq_accum,
                               uint16_t *__restrict__ dq, int64_t sb, int64_t ss, int64_t sh) {
    __shared__ __align__(16) float tile[pp_tile_floats(ROWS)];
    griddep_wait();  // a programmatic dependent of the main kernel (bl_bwd_postprocess_launch)
    const int64_t blk = blockIdx.x / PP_TILE_PARTS;
    postprocess_tile<T, ROWS, GROUPED>(dm, scale, dq_accum, dq, sb, ss, sh, blk,
                                       (int)(blockIdx.x % PP_TILE_PARTS), tile);
}

// Part `part` (of PP_TILE_PARTS) of the ROWS rows (b, h, ROWS m..) of the (B, Sq, Hq, D)
// accumulator with permuted columns (version 10's), converted by a CTA of tile blk in a tile
// layout's grid: every load first,
// then the conversions (a tile layout's shared memory caps the grid's occupancy, so each thread
// keeps its items' loads in flight together). Rows of a 64-row tile no entry wrote (dq_writers
// 0) are zeros, not read; with dq_direct those of a light tile (bl_bwd_dq16_tile) are in dq
// already and are skipped. The writers are read before this grid's wait for the main kernels
// (final by then: bl_bwd_postprocess_picked_kernel), and a CTA with no row to write returns
// without waiting; the others wait before reading the accumulator. D: the head dim (the
// persistent head-dim-64 kernel's light tiles, bl_bwd_postprocess_light_kernel, at 64).
template <typename T, int ROWS, int D = PP80_D>
__device__ __forceinline__ void postprocess_rows_block(const bl_bwd_dims &dm, float scale,
                                                       const float *__restrict__ dq_accum,
                                                       const uint8_t *__restrict__ dq_writers,
                                                       bool dq_direct, uint16_t *__restrict__ dq,
                                                       int64_t sb, int64_t ss, int64_t sh,
                                                       int64_t blk, int part) {
    const int64_t tiles = ROWS == PP80_ROWS ? dm.tiles_m80 : dm.tiles_m;
    int64_t b, h, m;
    pp_block_coords(dm, tiles, blk, &b, &h, &m);
    constexpr int TPR = D / PP_VEC;
    constexpr int PART_ROWS = ROWS / PP_TILE_PARTS;
    static_assert(PART_ROWS * PP_TILE_PARTS == ROWS, "the block splits evenly");
    constexpr int PART_ITEMS = PART_ROWS * TPR;  // (row, 8-column part) pairs of the part
    constexpr int ITEMS = (PART_ITEMS + PP_THREADS - 1) / PP_THREADS;  // per thread
    const int64_t row0 = m * ROWS + part * PART_ROWS;
    float4 a[ITEMS][2];
    bool mine[ITEMS];    // the item's row is this kernel's to write
    bool read[ITEMS];    // ... and an entry wrote it (else zeros)
    bool any = false;
#pragma unroll
    for (int x = 0; x < ITEMS; ++x) {
        const int item = threadIdx.x + x * PP_THREADS;
        const int64_t i = row0 + item / TPR;
        // unknown without dq_writers: read as written by several entries
        const unsigned writers =
            dq_writers ? bl_bwd_tile_writers(bl_bwd_tile_writer_runs(
                             dq_writers, (b * dm.heads_q + h) * dm.tiles_m + i / BL_BWD_TM))
                       : 2u;
        // (the DIRECT form's light tiles are in dq already: bl_bwd_dq16_tile)
        mine[x] = item < PART_ITEMS && i < dm.seqlen_q && !(dq_direct && bl_bwd_dq16_tile(writers));
        read[x] = mine[x] && writers != 0;
        any |= mine[x];
    }
    if (!__syncthreads_or(any)) return;
    griddep_wait();
#pragma unroll
    for (int x = 0; x < ITEMS; ++x) {
        const int item = threadIdx.x + x * PP_THREADS;
        const int64_t i = row0 + item / TPR;
        const float4 *acc = reinterpret_cast<const float4 *>(
            dq_accum + ((b * dm.seqlen_q + i) * dm.heads_q + h) * D + (item % TPR) * PP_VEC);
        a[x][0] = a[x][1] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (read[x]) a[x][0] = acc[0], a[x][1] = acc[1];
    }
#pragma unroll
    for (int x = 0; x < ITEMS; ++x) {
        const int item = threadIdx.x + x * PP_THREADS;
        const int64_t i = row0 + item / TPR;
        if (mine[x])
            store_row_part<T>(a[x][0], a[x][1], true, scale,
                              dq + b * sb + i * ss + h * sh + (item % TPR) * PP_VEC);
    }
}

// The DIRECT forms' conversion (version 10's at head dim 128, the persistent head-dim-64
// kernel's DQ16 form): only heavy tiles' rows are left to convert -- the light ones are in dq,
// those without entries zeroed by the preprocess -- so at low keeps nearly every block part has
// no row to write. With a CTA a part (the other layouts' grid) the kernel ended 11-20 us after
// the main kernels at 16k x 16 x 128 (~56 us at 32k x 24 causal), a few CTAs an SM at a time
// each loading a part's writers to find nothing; a one-wave grid striding part by part ran as long
// (bench/results/bwd-s131-post-direct-strided.txt). Here the first `ctas` CTAs (one wave: the
// kernel's CTAs an SM) take every ctas-th part in the grid's order, read the writers of up to
// PP_THREADS of their parts at once (a part a thread), and convert only the parts with a heavy
// tile; the others return. That took those calls' spans -7..-11 us at 16k x 16 x 128 and
// -32..-46 us at 32k x 24 causal 3 % on an H100. (A ~23 us tail is left there; the grid's
// other CTAs, which still launch to return, are the suspect, not measured.) blocks: the
// ROWS-row blocks. Dev checks: -DBL_PP_DIRECT_CTAS=N uses N CTAs, so that the GPU tests' small
// calls take several rounds.
#ifndef BL_PP_DIRECT_CTAS
#define BL_PP_DIRECT_CTAS 0
#endif
enum { PP_DIRECT_CTAS = BL_PP_DIRECT_CTAS };
// The conversion kernels' CTAs an SM, as before this path: their register counts without it
// (48 causal, 32 without a causal mask, 30 light) held in spite of its loop, whose extra
// registers (64 / 48 / 40) would take the accumulator's conversions to fewer CTAs an SM.
__host__ __device__ constexpr int pp_picked_min_ctas(bool causal) { return causal ? 5 : 8; }
enum { PP_LIGHT_MIN_CTAS = 8 };
// Whether part `part` of block blk (postprocess_rows_block's) may have a row to write in a
// DIRECT call: a row before Sq in a heavy 64-row tile (a superset is safe: the part rechecks).
template <int ROWS>
__device__ __forceinline__ bool pp_part_has_heavy(const bl_bwd_dims &dm,
                                                  const uint8_t *__restrict__ dq_writers, int blk,
                                                  int part) {
    const int tiles = (int)(ROWS == PP80_ROWS ? dm.tiles_m80 : dm.tiles_m);
    // the block's coordinates as postprocess_rows_block takes them (pp_block_order.h), without
    // pp_block_coords' widening: this runs for every part of a DIRECT call, in a kernel held to
    // its register count (pp_picked_min_ctas)
    int b, h, m;
    bl_pp_block_coords((int)dm.batch, (int)dm.heads_q, tiles, blk, &b, &h, &m);
    constexpr int PART_ROWS = ROWS / PP_TILE_PARTS;
    const int first = m * ROWS + part * PART_ROWS;
    if (first >= dm.seqlen_q) return false;
    const int last = (int)min((int64_t)first + PART_ROWS, dm.seqlen_q) - 1;
    // (b, h)'s row tiles' writer runs, a uint4 a tile (bl_bwd_tile_writer_runs)
    const uint8_t *row_tiles =
        dq_writers + 16 * ((int64_t)(b * (int)dm.heads_q + h) * dm.tiles_m);
    auto heavy = [&](int t) {
        return !bl_bwd_dq16_tile(bl_bwd_tile_writers(bl_bwd_tile_writer_runs(row_tiles, t)));
    };
    // (the part's rows lie in one or two 64-row tiles)
    return heavy(first / BL_BWD_TM) ||
           (last / BL_BWD_TM != first / BL_BWD_TM && heavy(last / BL_BWD_TM));
}
template <typename T, int ROWS, int D = PP80_D>
__device__ __forceinline__ void postprocess_rows_strided(const bl_bwd_dims &dm, float scale,
                                                         const float *__restrict__ dq_accum,
                                                         const uint8_t *__restrict__ dq_writers,
                                                         uint16_t *__restrict__ dq, int64_t sb,
                                                         int64_t ss, int64_t sh, int64_t blocks,
                                                         int64_t ctas) {
    // 32-bit part indices (a call's parts, B x Hq x Sq / 32, are far below 2^31) and the round's
    // bits taken from shared memory one at a time: little is live across the conversion, which
    // keeps the kernel's register count (pp_picked_min_ctas).
    __shared__ unsigned heavy_parts[PP_THREADS / 32];  // a bit a part of the round
    const int n = (int)min(ctas, (int64_t)gridDim.x);
    if ((int)blockIdx.x >= n) return;
    const int parts = (int)(blocks * PP_TILE_PARTS);
    for (int w0 = (int)blockIdx.x; w0 < parts; w0 += PP_THREADS * n) {  // (uniform in the CTA)
        const int w = w0 + (int)threadIdx.x * n;  // parts blockIdx.x + k n
        const bool heavy = w < parts && pp_part_has_heavy<ROWS>(dm, dq_writers, w / PP_TILE_PARTS,
                                                               w % PP_TILE_PARTS);
        const unsigned votes = __ballot_sync(0xffffffffu, heavy);
        if ((threadIdx.x & 31) == 0) heavy_parts[threadIdx.x / 32] = votes;
        __syncthreads();
        for (;;) {
            int x = -1;  // the round's first part left (the same in every thread)
            for (int j = 0; j < PP_THREADS / 32 && x < 0; ++j)
                if (heavy_parts[j] != 0) x = 32 * j + __ffs(heavy_parts[j]) - 1;
            if (x < 0) break;
            __syncthreads();  // (all have read the bits)
            if (threadIdx.x == 0) heavy_parts[x / 32] &= ~(1u << (x % 32));
            const int v = w0 + x * n;
            // (its __syncthreads_or orders the cleared bit before the next search)
            postprocess_rows_block<T, ROWS, D>(dm, scale, dq_accum, dq_writers, true, dq, sb, ss,
                                               sh, v / PP_TILE_PARTS, v % PP_TILE_PARTS);
        }
        __syncthreads();  // (heavy_parts: the next round's)
    }
}

// The layout of the kernel the device picked, one launch (a second, empty one cost ~4 us per
// call, bench/results/bwd-s14-rows80.txt run 7):
// - BL_DQ_CHOSEN (CAUSAL: a masked causal call), whose picks are the aligned entries'
//   80-row blocks (or the dense kernel's, the same layout, where the mask keeps every tile the
//   causal mask allows), the packed entries' 64-row ones (grouped), or version 10's rows,
//   converted 80 per block straight from the (B, Sq, Hq, D) accumulator (a grid over rows would
//   run at the occupancy the 80-row path's shared memory allows);
// - BL_DQ_PACKED (a masked call without a causal mask), whose picks are the dense kernel's
//   80-row blocks (a mask keeping every tile), aligned entries' 80-row ones (grouped), packed
//   entries' 64-row ones, or version 10's rows (converted 64 per block).
// Both on the larger of the 64- and 80-row grids (PP_TILE_PARTS CTAs per block, each converting
// its part of the rows: 40 or 32 of version 10's), whose extra CTAs return.
template <typename T, bool CAUSAL>
__global__ void __launch_bounds__(PP_THREADS, pp_picked_min_ctas(CAUSAL))
bl_bwd_postprocess_picked_kernel(bl_bwd_dims dm, float scale, const float *__restrict__ dq_accum,
                                 const unsigned long long *__restrict__ totals,
                                 const uint8_t *__restrict__ dq_writers, bool dq_direct,
                                 uint16_t *__restrict__ dq, int64_t sb, int64_t ss, int64_t sh,
                                 int64_t direct_ctas) {
    __shared__ __align__(16) float tile[pp_tile_floats(PP80_ROWS)];  // the larger part
    // A programmatic dependent of the main kernels (bl_bwd_postprocess_launch). The totals and
    // dq_writers are final before it launches: the first main kernel lets its dependents launch
    // only after its wait for the preprocess (which waited for the schedule, that one for the
    // lists kernel), and each kernel after it launches behind the one before. So a CTA reads them
    // before its own wait, and one whose rows version 10's DIRECT form wrote returns without it:
    // at 3 % kept every CTA of a ~8-wave grid, 24 us of a 355 us call at 16k x 16 x 128 causal
    // (bench/results/bwd-s106-timeline-h100.txt). CTA 0 always waits, so that the grid still
    // completes after the main kernels.
    if (blockIdx.x == 0) griddep_wait();
    const int64_t blk = blockIdx.x / PP_TILE_PARTS;
    const int part = (int)(blockIdx.x % PP_TILE_PARTS);
    const int64_t r80_blocks = dm.batch * dm.heads_q * dm.tiles_m80;
    const int64_t r64_blocks = dm.batch * dm.heads_q * dm.tiles_m;
    // whether version 10 ran in its DIRECT form (bwd_ws128_kernel)
    dq_direct = dq_direct && bl_bwd_dq_direct_chosen(totals, dm);
    if (CAUSAL) {
        if (!bl_bwd_rows80_chosen(totals, true, false)) {
            if (dq_direct)
                postprocess_rows_strided<T, PP80_ROWS>(dm, scale, dq_accum, dq_writers, dq, sb, ss,
                                                       sh, r80_blocks, direct_ctas);
            else if (blk < r80_blocks)  // (waits where it writes)
                postprocess_rows_block<T, PP80_ROWS>(dm, scale, dq_accum, dq_writers, dq_direct,
                                                     dq, sb, ss, sh, blk, part);
            return;
        }
        griddep_wait();
        if (!bl_bwd_masked_full(totals) && bl_bwd_packed_chosen(totals, true)) {
            if (blk < r64_blocks)
                postprocess_tile<T, BL_BWD_TM, true>(dm, scale, dq_accum, dq, sb, ss, sh, blk,
                                                     part, tile);
        } else if (blk < r80_blocks) {
            postprocess_tile<T, PP80_ROWS, false>(dm, scale, dq_accum, dq, sb, ss, sh, blk,
                                                  part, tile);
        }
        return;
    }
    const bool full = bl_bwd_masked_full(totals);
    const bool rows80 = bl_bwd_rows80_cheaper(totals, false, bl_bwd_keys_full(dm, false));
    if (!full && !rows80) {
        if (dq_direct)
            postprocess_rows_strided<T, BL_BWD_TM>(dm, scale, dq_accum, dq_writers, dq, sb, ss, sh,
                                                   r64_blocks, direct_ctas);
        else if (blk < r64_blocks)  // (waits where it writes)
            postprocess_rows_block<T, BL_BWD_TM>(dm, scale, dq_accum, dq_writers, dq_direct, dq,
                                                 sb, ss, sh, blk, part);
        return;
    }
    griddep_wait();
    if (full || (rows80 && !bl_bwd_packed_chosen(totals, false))) {
        if (blk >= r80_blocks) return;
        if (full)
            postprocess_tile<T, PP80_ROWS, false>(dm, scale, dq_accum, dq, sb, ss, sh, blk,
                                                  part, tile);
        else
            postprocess_tile<T, PP80_ROWS, true>(dm, scale, dq_accum, dq, sb, ss, sh, blk,
                                                 part, tile);
    } else if (blk < r64_blocks) {  // packed entries
        postprocess_tile<T, BL_BWD_TM, true>(dm, scale, dq_accum, dq, sb, ss, sh, blk, part, tile);
    }
}

// The persistent head-dim-64 kernel's conversion on a call with its DQ16 form (bwd_params::
// dq_direct; BL_DQ_ROWS_PERMUTED): a CTA per part of a 64-row tile; where the device picked that
// form (bl_bwd_ws64p_dq16_chosen, from the totals, final before this grid launches) the light
// tiles are in dq and their CTAs return before any wait (postprocess_rows_block). CTA 0 always
// waits, so that the grid still completes after the main kernels.
template <typename T>
__global__ void __launch_bounds__(PP_THREADS, PP_LIGHT_MIN_CTAS)
bl_bwd_postprocess_light_kernel(bl_bwd_dims dm, float scale, const float *__restrict__ dq_accum,
                                const unsigned long long *__restrict__ totals,
                                const uint8_t *__restrict__ dq_writers, uint16_t *__restrict__ dq,
                                int64_t sb, int64_t ss, int64_t sh, int64_t direct_ctas) {
    if (blockIdx.x == 0) griddep_wait();
    if (bl_bwd_ws64p_dq16_chosen(totals, dm))
        postprocess_rows_strided<T, BL_BWD_TM, 64>(dm, scale, dq_accum, dq_writers, dq, sb, ss, sh,
                                                   dm.batch * dm.heads_q * dm.tiles_m, direct_ctas);
    else
        postprocess_rows_block<T, BL_BWD_TM, 64>(dm, scale, dq_accum, dq_writers, false, dq, sb,
                                                 ss, sh, blockIdx.x / PP_TILE_PARTS,
                                                 (int)(blockIdx.x % PP_TILE_PARTS));
}

template <typename T, int D>
static bl_status preprocess_typed(const bl_bwd_dims &dm, bl_tensor out, bl_tensor dout,
                                  const float *lse, bl_dq_layout layout, int carveout,
                                  bool dq16_zeros, bool selecting, bl_tensor dq,
                                  const bl_bwd_workspace *ws, cudaStream_t stream) {
    const int64_t threads = dm.batch * dm.seqlen_q_pad * dm.heads_q * (D / PP_VEC);
    const int64_t blocks = (threads + PP_THREADS - 1) / PP_THREADS;
    const int64_t zero_rows = bl_bwd_dq_accum_rows(dm, layout);
    pp_zero_args z = {};
    int64_t zero_blocks = 0;
    if (dq16_zeros) {
        // (version 10's DIRECT form at head dim 128, the persistent kernel's light tiles at 64:
        // dq writers counted)
        if ((D != 128 && D != 64) || ws->dq_writers == NULL || ws->zeros_pick == NULL)
            return bl_set_error(BL_ERR_INTERNAL, "dq16 zeros at head dim %d", D);
        z.tiles = dm.batch * dm.heads_q * dm.tiles_m;
        zero_blocks = (z.tiles + PP_ZERO_TILES - 1) / PP_ZERO_TILES;
        z.dq = (uint16_t *)dq.data;
        z.sb = dq.stride_b, z.ss = dq.stride_s, z.sh = dq.stride_h;
        z.zeros_pick = ws->zeros_pick;
        z.dq_writers = ws->dq_writers;
        z.dq_claims = D == 128 ? ws->dq_claims : NULL;  // (the DQ16 form adds onto zeros)
        z.dq_accum = ws->dq_accum;
        z.row_blocks = blocks;
        z.zero_blocks = zero_blocks;
        z.first_rows = PP_ZERO_FIRST_ROWS < 0          ? blocks
                       : blocks / 2 < PP_ZERO_FIRST_ROWS ? blocks / 2
                                                         : PP_ZERO_FIRST_ROWS;
        // (period - 1) x zero_blocks <= the row CTAs left: the zero CTAs all fit among them
        z.period = (unsigned)((blocks - z.first_rows + zero_blocks) / zero_blocks);
        if (blocks + zero_blocks >= (int64_t(1) << 31))
            return bl_set_error(BL_ERR_INTERNAL, "preprocess grid of %lld CTAs",
                                (long long)(blocks + zero_blocks));
    }
    const pp_rows_args a = {(const uint16_t *)out.data, out.stride_b, out.stride_s, out.stride_h,
                            (const uint16_t *)dout.data, dout.stride_b, dout.stride_s,
                            dout.stride_h, lse, ws->dlt, ws->lse_log2, ws->dq_accum, zero_rows,
                            ws->unkept_rows, ws->dkv_done, dm.batch * dm.heads_k * dm.tiles_n};
    if (dq16_zeros) {
        auto kernel = bl_bwd_preprocess_zeros_kernel<T, D, true>;
        if constexpr (D == 64)  // (head dim 128 always reads the pick)
            if (!pp_rows_read_pick(D, selecting))
                kernel = bl_bwd_preprocess_zeros_kernel<T, D, false>;
        BL_CUDA_CHECK(bl_launch_carveout(kernel, dim3((unsigned)(blocks + zero_blocks)),
                                         dim3(PP_THREADS), 0, stream, /*dependent=*/true, carveout,
                                         dm, a, z));
        return BL_OK;
    }
    BL_CUDA_CHECK(bl_launch_carveout(bl_bwd_preprocess_kernel<T, D>, dim3((unsigned)blocks),
                            dim3(PP_THREADS), 0, stream, /*dependent=*/true, carveout, dm, a));
    return BL_OK;
}

// Each conversion kernel is the programmatic dependent of the kernel before it (the last main
// kernel): its CTAs may take the SMs as that kernel's leave
// them, and every CTA waits (griddepcontrol.wait) for it to complete before reading anything, so
// only the launch's latency leaves the call's critical path. That kernel completes after all
// before it: it is a plain launch, or (a candidate kernel of a masked call) it or its CTA 0
// waits for the one before it.
template <typename T, int D>
static bl_status postprocess_typed(const bl_bwd_dims &dm, float scale, bl_dq_layout layout,
                                   bool dq_direct, bl_tensor dq, const bl_bwd_workspace *ws,
                                   cudaStream_t stream) {
    const int64_t r80_blocks = dm.batch * dm.heads_q * dm.tiles_m80;
    const int64_t r64_blocks = dm.batch * dm.heads_q * dm.tiles_m;
    const int64_t threads = dm.batch * dm.seqlen_q * dm.heads_q * (D / PP_VEC);
    const int64_t blocks = (threads + PP_THREADS - 1) / PP_THREADS;
    int sms = 0;
    BL_TRY(bl_sm_count(&sms));
    // postprocess_rows_strided's CTAs: one wave of the kernel's
    auto direct_ctas = [sms](int per_sm) {
        return PP_DIRECT_CTAS > 0 ? (int64_t)PP_DIRECT_CTAS : (int64_t)sms * per_sm;
    };
    if (layout != BL_DQ_ROWS && layout != BL_DQ_ROWS_PERMUTED && D != PP80_D)
        return bl_set_error(BL_ERR_INTERNAL, "dq accumulator in tiles at head dim %d", D);
    if (layout == BL_DQ_TILES64R || layout == BL_DQ_TILES80G) {
        const bool r64 = layout == BL_DQ_TILES64R;
        auto kernel = r64 ? bl_bwd_postprocess_tile_kernel<T, BL_BWD_TM, true>
                          : bl_bwd_postprocess_tile_kernel<T, PP80_ROWS, true>;
        const int64_t grid = (r64 ? r64_blocks : r80_blocks) * PP_TILE_PARTS;
        BL_CUDA_CHECK(bl_launch(kernel, dim3((unsigned)grid), dim3(PP_THREADS), 0, stream, true,
                                dm, scale, (const float *)ws->dq_accum, (uint16_t *)dq.data,
                                dq.stride_b, dq.stride_s, dq.stride_h));
        return BL_OK;
    }
    if (layout == BL_DQ_CHOSEN || layout == BL_DQ_PACKED) {
        // the grid covers the 64-row picks too
        const bool packed = layout == BL_DQ_PACKED;
        const int64_t grid = (r64_blocks > r80_blocks ? r64_blocks : r80_blocks) * PP_TILE_PARTS;
        auto kernel = packed ? bl_bwd_postprocess_picked_kernel<T, false>
                             : bl_bwd_postprocess_picked_kernel<T, true>;
        // ws->dq_writers: the entries of each row tile (NULL unless bl_bwd_dq_writers_used)
        BL_CUDA_CHECK(bl_launch(kernel, dim3((unsigned)grid), dim3(PP_THREADS), 0, stream, true,
                                dm, scale, (const float *)ws->dq_accum,
                                (const unsigned long long *)ws->totals,
                                (const uint8_t *)ws->dq_writers, dq_direct, (uint16_t *)dq.data,
                                dq.stride_b, dq.stride_s, dq.stride_h,
                                direct_ctas(pp_picked_min_ctas(!packed))));
        return BL_OK;
    }
    if (layout == BL_DQ_TILES80) {
        BL_CUDA_CHECK(bl_launch(bl_bwd_postprocess_tile_kernel<T, PP80_ROWS, false>,
                                dim3((unsigned)(r80_blocks * PP_TILE_PARTS)), dim3(PP_THREADS), 0,
                                stream, true, dm, scale, (const float *)ws->dq_accum,
                                (uint16_t *)dq.data, dq.stride_b, dq.stride_s, dq.stride_h));
        return BL_OK;
    }
    const bool cols_permuted = layout == BL_DQ_ROWS_PERMUTED;
    if (dq_direct && D == 64) {
        // the persistent kernel's light tiles are in dq (bwd_ws64p_sm90.cuh)
        if (!cols_permuted || ws->dq_writers == NULL)
            return bl_set_error(BL_ERR_INTERNAL, "light dq tiles without their writers");
        BL_CUDA_CHECK(bl_launch(bl_bwd_postprocess_light_kernel<T>,
                                dim3((unsigned)(r64_blocks * PP_TILE_PARTS)), dim3(PP_THREADS), 0,
                                stream, true, dm, scale, (const float *)ws->dq_accum,
                                (const unsigned long long *)ws->totals,
                                (const uint8_t *)ws->dq_writers, (uint16_t *)dq.data, dq.stride_b,
                                dq.stride_s, dq.stride_h, direct_ctas(PP_LIGHT_MIN_CTAS)));
        return BL_OK;
    }
    BL_CUDA_CHECK(bl_launch(bl_bwd_postprocess_kernel<T, D>, dim3((unsigned)blocks),
                            dim3(PP_THREADS), 0, stream, true, dm, scale,
                            (const float *)ws->dq_accum, cols_permuted, (uint16_t *)dq.data,
                            dq.stride_b, dq.stride_s, dq.stride_h));
    return BL_OK;
}

bl_status bl_bwd_preprocess_launch(const bl_bwd_dims &dm, bl_dtype dtype, bl_tensor out,
                                   bl_tensor dout, const float *lse, bl_dq_layout layout,
                                   int carveout, bool dq16_zeros, bool selecting, bl_tensor dq,
                                   const bl_bwd_workspace *ws, cudaStream_t stream) {
    const bool bf16 = dtype == BL_DTYPE_BF16;
    auto typed = dm.head_dim == 64 ? (bf16 ? preprocess_typed<__nv_bfloat16, 64>
                                           : preprocess_typed<__half, 64>)
                                   : (bf16 ? preprocess_typed<__nv_bfloat16, 128>
                                           : preprocess_typed<__half, 128>);
    return typed(dm, out, dout, lse, layout, carveout, dq16_zeros, selecting, dq, ws, stream);
}

bl_status bl_bwd_postprocess_launch(const bl_bwd_dims &dm, bl_dtype dtype, float scale,
                                    bl_dq_layout layout, bool dq_direct, bl_tensor dq,
                                    const bl_bwd_workspace *ws, cudaStream_t stream) {
    const bool bf16 = dtype == BL_DTYPE_BF16;
    const bl_dq_layout perm = layout;
    if (dm.head_dim == 64)
        return bf16 ? postprocess_typed<__nv_bfloat16, 64>(dm, scale, perm, dq_direct, dq, ws, stream)
                    : postprocess_typed<__half, 64>(dm, scale, perm, dq_direct, dq, ws, stream);
    return bf16 ? postprocess_typed<__nv_bfloat16, 128>(dm, scale, perm, dq_direct, dq, ws, stream)
                : postprocess_typed<__half, 128>(dm, scale, perm, dq_direct, dq, ws, stream);
}
