// bwd_lists_sm90.cu -- the backward's work lists (block mask -> per-key-tile lists of kept
// (q head, row tile) pairs) and the schedules of the key tiles ("columns") the main kernels walk.
// The mask comes from the caller or from the selection (select_sm90.cu).
#include <limits.h>
#include "backend.h"
#include "cuda_check.cuh"
#include "bwd_common.cuh"
#include "ptx_sm90.cuh"

// ---- lists: one unit per (b, kv head g, run of up to LIST_COLS_MAX key tiles) ----

// Threads per lists CTA: LIST_THREADS, or LIST_THREADS_FEW where the units are fewer than the SMs
// (few kv heads: B x Hk x 16 runs < SMs). Both phases of a unit are latency-bound loops per warp
// (~3.4 us a phase-1 round of mask loads beside the preprocess, ~0.13 us a word and column in
// phase 2: fitted to the seventy-fourth session's sweep, bench/results/bwd-s78-split-sweep.txt),
// so a unit's time falls with its warps: 1 x 16k x 32 q x 1 kv took 170 us in 16 CTAs of 256
// threads, 1 x 32k x 16 q x 1 kv 230 us, against a preprocess of ~140 beside them. Where the
// units fill the SMs the small CTAs stay: each holds thread slots the preprocess's latency-bound
// loads would use.
enum { LIST_THREADS = 256, LIST_THREADS_FEW = 1024, LIST_CTAS_PER_SM = 1 };
// Key tiles per CTA where the column bitmaps allow: 16 fills one wave at 16k x 16 heads; at most
// 32, one per lane of the ballot transpose.
constexpr int LIST_COLS = 16, LIST_COLS_MAX = 32;
static_assert(LIST_COLS <= LIST_COLS_MAX, "a key tile per lane in the ballot transpose");
// Dynamic shared memory the column bitmaps may take: 48 KB (no opt-in attribute) less the phase-2
// teams' counts (list_unit: two ints per warp).
enum { LIST_TEAM_BYTES = 2 * (LIST_THREADS_FEW / 32) * (int)sizeof(int),
       LIST_BITS_MAX_BYTES = 48 * 1024 - LIST_TEAM_BYTES };
// bl_bwd_lists_launch refuses calls whose G*Tm bits overflow these bytes, so every call with lists
// has G*Tm < 2^19: a list code's head index (< G) stays below the 2^21 up to which the kernels'
// float split of the codes is exact (ws_split_code).
static_assert(LIST_BITS_MAX_BYTES / sizeof(unsigned) * 32 < (1u << 21),
              "list codes split exactly by ws_split_code");

// The kept bits of mask row r (its `cols` bytes from key tile n0): bit c = r[c] != 0.
static __device__ __forceinline__ unsigned mask_row_bits(const uint8_t *__restrict__ r, int cols) {
    unsigned bits = 0;
    if ((((uintptr_t)r) & 3u) == 0 && (cols & 3) == 0) {
        for (int c = 0; c < cols; c += 4) {
            const unsigned x = *reinterpret_cast<const unsigned *>(r + c);
            bits |= ((unsigned)((x & 0xffu) != 0) | (unsigned)((x & 0xff00u) != 0) << 1 |
                     (unsigned)((x & 0xff0000u) != 0) << 2 | (unsigned)((x >> 24) != 0) << 3)
                    << c;
        }
    } else {
        for (int c = 0; c < cols; ++c) bits |= (unsigned)(r[c] != 0) << c;
    }
    return bits;
}

// mask: (B, Hq, Tm, Tn) uint8 or NULL (dense); counts: (B*Hk*Tn); lists: (B*Hk*Tn, G*Tm).
// Compaction is order-preserving (hl, then m ascending) so dK/dV sum in a fixed order.
// counts80 / lists80 (B*Hk*Tn, G*Tm80), unless NULL: the 80-row entries (bwd_common.cuh); their
// totals are summed by the window schedule kernel. dq_writers (B, Hq, Tm, BL_BWD_WRITER_RUNS),
// unless NULL: each row tile's entries in this CTA's byte (bl_bwd_workspace::dq_writers).
// A unit is key tiles n0 .. n0 + cols - 1 (cols <= cols_per_cta <= 32) of one (b, kv head g);
// the CTAs walk the units grid-stride, at most LIST_CTAS_PER_SM per SM.
// Its entries e = hl * Tm + m are the mask rows (b, g * G + hl, m), consecutive in memory.
// Phase 1: each warp reads 32 entries' rows (lane l: entry 32 k + l, `cols` bytes, one sector)
// and transposes them by ballots into one word per key tile (bit l: entry 32 k + l kept), kept in
// shared memory (col_bits: cols_per_cta x stride words). Phase 2: each warp compacts whole key
// tiles from their words; a kept entry's list position is the popcount of the bits below it.
// (One CTA per key tile reading its mask column, one byte per row and sector, took 12 / 54 us at
// 16k x 16 / 32k x 24 against 7 / 27 us for the same kernel without a mask; this one took 8 / 20
// and 3 / 7 us with a CTA per unit: bench/results/bwd-s24-fixed-costs.txt runs 1-2,
// dev/cuda/bwd_call_timeline.py. With one CTA per SM it takes ~11 / ~48 us, beside the preprocess
// and off the call's critical path: bench/results/bwd-s56-small-kernels-beside.txt.)
template <int THREADS>
static __device__ __forceinline__ void list_unit(const bl_bwd_dims &dm, int causal,
                                                 const uint8_t *__restrict__ mask,
                                                 int cols_per_cta, int64_t runs, int64_t unit,
                                                 int *__restrict__ counts,
                                                 int *__restrict__ lists,
                                                 int *__restrict__ counts80,
                                                 int *__restrict__ lists80,
                                                 uint8_t *__restrict__ dq_writers,
                                                 unsigned *col_bits) {
    constexpr int WARPS = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bg = unit / runs;                                       // b * Hk + g
    const int64_t n0 = (unit % runs) * cols_per_cta;
    const int cols = (int)min((int64_t)cols_per_cta, dm.tiles_n - n0);
    // Entries decoded in 32 bits (G*Tm and G*Tm80 < 2^31: bl_bwd_lists_launch): a 64-bit
    // division per entry kept the kernel's issue slots busy.
    const int tm = (int)dm.tiles_m, tm80 = (int)dm.tiles_m80;
    const int cap = (int)(dm.group * dm.tiles_m), cap80 = (int)(dm.group * dm.tiles_m80);
    const int words = (cap + 31) / 32;
    const int stride = words | 1;  // odd: the lanes' stores below fall in distinct banks
    const unsigned all = cols == 32 ? 0xffffffffu : (1u << cols) - 1u;
    // (b, g * G, m = 0)'s row: the G * Tm rows of (b, g) follow it
    const uint8_t *rows = mask ? mask + bg * dm.group * dm.tiles_m * dm.tiles_n + n0 : nullptr;
    for (int k = warp; k < words; k += WARPS) {
        const int e = 32 * k + lane;
        unsigned kept = 0;
        if (e < cap) {
            kept = all;
            if (causal) {
                // key tiles n <= (last row + Sk - Sq) / TN share an allowed (query, key) pair
                // with row tile m (bottom-right rule j <= i + Sk - Sq; the last row sees most)
                const int m = e % tm;
                const int64_t last = min((int64_t)(m + 1) * BL_BWD_TM, dm.seqlen_q) - 1 +
                                     dm.seqlen_k - dm.seqlen_q;
                const int64_t live = last < 0 ? 0 : last / BL_BWD_TN + 1 - n0;  // from n0 on
                kept = live <= 0 ? 0u : live >= 32 ? kept : kept & ((1u << live) - 1u);
            }
            if (rows && kept) kept &= mask_row_bits(rows + (int64_t)e * dm.tiles_n, cols);
        }
        if (dq_writers && e < cap) {
            // row tile bg * cap + e = (b, q head g * G + hl, m): this run's byte; the first run
            // also zeroes the bytes no run owns
            const int run = (int)(unit % runs);
            uint8_t *tile = dq_writers + (bg * cap + e) * BL_BWD_WRITER_RUNS;
            tile[run] = (uint8_t)__popc(kept);
            if (run == 0)
                for (int r = (int)runs; r < BL_BWD_WRITER_RUNS; ++r) tile[r] = 0;
        }
        unsigned mine = 0;  // lane c: key tile c's word
        for (int c = 0; c < cols; ++c) {
            const unsigned w = __ballot_sync(0xffffffffu, (kept >> c) & 1u);
            if (lane == c) mine = w;
        }
        if (lane < cols) col_bits[lane * stride + k] = mine;
    }
    __syncthreads();

    // Phase 2: a group of `team` warps per key tile, each compacting one slice of its words (64-
    // and 80-row entries alike) at the slice's offset: the popcounts of the slices before it,
    // counted in a first pass where the team has more than one warp (the count80 pass decodes
    // its entries twice). Teams are a power of two and the rounds the same for every warp, so the
    // barriers below are reached by all.
    const unsigned below = (1u << lane) - 1u;
    int team = 1;
    while (2 * team * cols <= WARPS) team *= 2;
    const int teams = WARPS / team, member = warp % team;
    const int words80 = lists80 ? (cap80 + 31) / 32 : 0;
    const int slice = (words + team - 1) / team, slice80 = (words80 + team - 1) / team;
    const int k0 = member * slice, k1 = min(words, k0 + slice);
    const int j0 = member * slice80, j1 = min(words80, j0 + slice80);
    int *team_counts = reinterpret_cast<int *>(col_bits + cols * stride);  // [WARPS][2]
    // The 80-row entry code of entry e (< cap80), -1 where it keeps no 64-row tile.
    auto code80 = [&](const unsigned *bits, int e) {
        if (e >= cap80) return -1;
        // rows 80 m .. 80 m + 79 overlap 64-row tiles a = 80 m / 64 (< Tm) and a + 1
        const int hl = e / tm80, m = e - hl * tm80;
        const int a = m * BL_BWD_TM_DENSE / BL_BWD_TM, x = hl * tm + a;
        const unsigned lo = (bits[x >> 5] >> (x & 31)) & 1u;
        const unsigned hi = a + 1 < tm ? (bits[(x + 1) >> 5] >> ((x + 1) & 31)) & 1u : 0u;
        return (lo | hi) ? (int)((unsigned)hl << BL_R80_ENTRY_HL_SHIFT | (unsigned)m << 2 | lo |
                                 hi << 1)
                         : -1;
    };
    for (int c0 = 0; c0 < cols; c0 += teams) {
        const int c = c0 + warp / team;
        const bool live = c < cols;
        const unsigned *bits = col_bits + (live ? c : 0) * stride;
        int count = 0, count80 = 0;  // this slice's offsets in the key tile's lists
        if (team > 1) {
            int n = 0, n80 = 0;
            if (live) {
                for (int k = k0 + lane; k < k1; k += 32) n += __popc(bits[k]);
                for (int j = j0; j < j1; ++j)
                    n80 += __popc(__ballot_sync(0xffffffffu, code80(bits, 32 * j + lane) >= 0));
            }
            for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
            if (lane == 0) team_counts[2 * warp] = n, team_counts[2 * warp + 1] = n80;
            __syncthreads();
            for (int w = warp - member; w < warp; ++w)
                count += team_counts[2 * w], count80 += team_counts[2 * w + 1];
        }
        if (live) {
            const int64_t col = bg * dm.tiles_n + n0 + c;
            int *list = lists + col * cap, *list80 = lists80 ? lists80 + col * cap80 : nullptr;
            for (int k = k0; k < k1; ++k) {
                const unsigned w = bits[k];
                if ((w >> lane) & 1u) list[count + __popc(w & below)] = 32 * k + lane;
                count += __popc(w);
            }
            if (lists80) {
                for (int j = j0; j < j1; ++j) {
                    const int code = code80(bits, 32 * j + lane);
                    const unsigned ballot = __ballot_sync(0xffffffffu, code >= 0);
                    if (code >= 0) list80[count80 + __popc(ballot & below)] = code;
                    count80 += __popc(ballot);
                }
            }
            // the team's last warp holds the key tile's totals
            if (member == team - 1) {
                // A key tile with nothing kept gets one entry that keeps no row (bits 0), so
                // that the 80-row kernel writes its dK = dV = 0 without a branch around its loop
                // (one cost it spills: bench/notes-bwd.md, fourteenth session).
                if (lists80 && count80 == 0) {
                    if (lane == 0) list80[0] = 0;
                    count80 = 1;
                }
                if (lane == 0) {
                    counts[col] = count;
                    if (lists80) counts80[col] = count80;
                }
            }
        }
        if (team > 1) __syncthreads();  // team_counts are read before the next round's
    }
}

// The kernel: the units grid-stride over its CTAs (bl_bwd_lists_launch sizes the grid).
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
bl_bwd_list_kernel(bl_bwd_dims dm, int causal, const uint8_t *__restrict__ mask, int cols_per_cta,
                   int *__restrict__ counts, int *__restrict__ lists, int *__restrict__ counts80,
                   int *__restrict__ lists80, uint8_t *__restrict__ dq_writers,
                   unsigned long long *__restrict__ totals, int *__restrict__ zeros_pick) {
    extern __shared__ unsigned col_bits[];
    // The zeros' pick (bl_bwd_workspace::zeros_pick) reset before this CTA lets the schedule
    // start: the preprocess's zero CTAs behind it read it without waiting for this grid, ~20 us
    // later, so they never see the last call's (the fence: stored before the trigger).
    if (zeros_pick && blockIdx.x == 0 && threadIdx.x == 0) {
        for (int k = 0; k < BL_ZEROS_PICK_INTS; ++k) zeros_pick[k] = 0;  // (1: BL_ZEROS_UNKNOWN)
        __threadfence();
    }
    // The schedule follows as a programmatic dependent (bl_cuda_backward): its CTAs start now
    // and wait for this grid, so that the preprocess behind them can start too. Where this
    // kernel is itself the selection's dependent, the mask is read only once that one is done.
    griddep_launch_dependents();
    griddep_wait();
    // The call's entry totals, summed by the window schedule kernel behind this one.
    if (totals && blockIdx.x == 0 && threadIdx.x < BL_BWD_TOTALS) totals[threadIdx.x] = 0;
    const int64_t runs = (dm.tiles_n + cols_per_cta - 1) / cols_per_cta;  // units per (b, g)
    const int64_t units = dm.batch * dm.heads_k * runs;
    for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
        if (unit != blockIdx.x) __syncthreads();  // the last unit's col_bits are read
        list_unit<THREADS>(dm, causal, mask, cols_per_cta, runs, unit, counts, lists, counts80,
                           lists80, dq_writers, col_bits);
    }
}

// ---- schedules: the order in which the main kernel takes the key tiles ("columns") ----
// Heaviest first within windows of whole rounds of the SMs, the windows in the natural (b, kv
// head, key tile) order (bl_bwd_schedule_window_kernel): concurrent CTAs then work on a few
// heads, whose Q / dO rows and dq accumulator stay in L2, where a global sort spreads them over
// all heads. Measured, random tile masks: non-causal (bench/results/bwd-s9-schedule.txt,
// two-round windows, then with a static snake walk; the rounds per call now:
// bl_bwd_schedule_window) 1 x 16k x 16 x 128 at 10 % kept 1.49 -> 1.31 ms (-12 %), 25 % kept
// -1.6 %, head dim 64 (16k, 4 x 4k) -2..-6 %, dense level; causal at head dim 128
// (bench/results/bwd-s10-causal-windows.txt, four-round windows, dynamic walk) 32k x 24 dense
// -5 %, sparse -10..-18 %, 16k x 16 dense level, sparse -3..-9 %. (With the static snake the
// causal windows had lost 7-8 %: their columns differ too much in length.) Causal calls at head
// dim 64 (version 6: one CTA per column, in the hardware's order) took one global heaviest-first
// sort until the hundred-and-thirteenth session; there the heavy columns' pairs cost ~50 % more
// than the light ones' at 10 % kept (the first key tiles of all 16 heads at once, their entries
// at random row tiles: 128 MB of Q / dO / dq accumulator against 50 MB of L2), and four-round
// windows took 16k x 16 x 64 causal at 25 / 10 / 3 % kept 899 / 565 / 292 -> 798 / 431 / 263 us
// and 4 x 4k x 16 x 64 causal dense 927 -> 798 us (-14 %), 16k dense and negl 0.5 level, 0.8 %
// 170 -> 178 us (two-round windows: 25 / 10 % less, 3 % more; H100,
// bench/results/bwd-s113-hd64-causal-windows.txt).

// sched_split_order: a split call's records (bl_bwd_head_split: P per column) go part-major --
// every column of the window in count order for part 0, then again for part 1, ... -- so that
// the CTAs running at once walk the rows of few query heads, many key tiles each: the Q / dO rows
// and dQ accumulator blocks they share are then read and reduce-added in L2 by many of them.
// With a column's P records side by side instead, the SMs held ~16 columns x all P parts (every
// query head), each head's rows shared by ~16 CTAs: MQA 1 x 16k x 32 q x 128 causal at 25 %
// kept moved 6.7 GB of DRAM in its packed walk against GQA-8's 3.5 GB for the same entries
// (L2 hit rate 58 against 75 %: bench/results/bwd-s73-split-more.txt, call 4).
// The schedule kernel runs as the lists kernel's programmatic dependent (bl_cuda_backward): the
// preprocess behind it may start at once (it reads nothing the schedule writes, and waits for it
// before it completes); the counts are read once the lists kernel is done.
static __device__ __forceinline__ void sched_dependent_start() {
    griddep_launch_dependents();
    griddep_wait();
}

// Window schedule: the columns in their natural order cut into windows of `window` columns, each
// window sorted by count, descending and stable (rank by counting). A window's ranks are split
// over parts of SCHED_RANK_THREADS / SPLIT columns, one CTA each: every CTA reads the whole window (at most
// 1024 counts) and ranks its part against it, so the O(window^2) compares of a 4-round causal
// window (~280 k at 4 x 132) run on many SMs (one CTA per window took 16.5 us at 16k x 16 x 128
// causal under ncu, bench/results/bwd-s16-r80-masked.txt run 6).
// No shared memory: each warp holds the window's counts in registers. With a 4 KB shared copy of
// the window the kernel's CTAs found no room on the SMs the lists kernel's CTAs held under the
// driver's default carveout, and started -- letting the preprocess behind them start -- only as
// those left: 12-13 us into a 32k x 24 x 128 call against ~1 us at 16k x 16
// (bench/results/bwd-s55-small-kernels-start.txt; now ~1.3 us: bwd-s56-small-kernels-beside.txt).
// low > 0 (an unsplit call; window a multiple of low): the same ranks within each window's
// sub-windows of low columns too, as recs_low (bl_bwd_workspace::sched_rec_low).
enum { SCHED_WINDOW_MAX = 1024, SCHED_WINDOW_ROUNDS = 2, SCHED_WINDOW_ROUNDS_CAUSAL = 4,
       SCHED_WINDOW_ROUNDS_NC128 = 1, SCHED_LONG_HEAD_TILES = 256, SCHED_RANK_THREADS = 64 };
// Threads that rank one column (SPLIT): one against the whole window, or four, each against a
// quarter of it (lane = q x 8 + c: quarter q, column slot c of the warp's 8), their counts summed
// by shuffles. With one thread a column, masked causal calls at 16k x 16 x 128 waited for this
// kernel: its 67 us (beside the lists kernel and the preprocess) ended ~10 us after the
// preprocess's bytes, and the main kernel started at ~73 us; with four, 43 us, the main kernel at
// ~63 us, spans -9..-11 us at 50 / 25 / 3 % kept (two rounds; dense and non-causal calls level,
// the preprocess binding them: bench/results/bwd-s92-schedule-rank-split.txt). Where the
// preprocess is long it binds anyway, and the split's four times as many warps beside it for ~60
// us cost it time: 32k x 24 causal +6 us at negl 0.5, +3..+7 at 10 % kept, 24k x 24 causal +1..+4
// (two rounds each, bench/results/bwd-s93-rank-split-boundary.txt). So calls whose preprocess moves
// more than SCHED_RANK_SPLIT_MAX_ELEMS elements keep one thread a column (sched_rank_split). Each
// instantiation's SASS is the one measured: <1> the kernel before the split (20f0ccf), <4> the
// split of 26d83e3 (the SPLIT == 1 forms of the expressions below keep <1>'s instructions).
template <int SPLIT>
__global__ void __launch_bounds__(SCHED_RANK_THREADS)
bl_bwd_schedule_window_kernel(bl_bwd_dims dm, int causal, const int *__restrict__ counts,
                              const int *__restrict__ counts80, int num_cols, int window, int low,
                              int parts, int split, int *__restrict__ schedule, int4 *__restrict__ recs,
                              int4 *__restrict__ recs_low, int *__restrict__ next,
                              unsigned long long *__restrict__ totals,
                              int *__restrict__ zeros_pick) {
    static_assert(SPLIT == 1 || SPLIT == 4, "one thread a column, or a quarter of the window each");
    constexpr int COLS = SCHED_RANK_THREADS / SPLIT;  // columns a CTA ranks
    constexpr int SEG = 32 / SPLIT;                   // lanes that share a quarter
    sched_dependent_start();
    const int w0 = (blockIdx.x / parts) * window;
    const int n = min(window, num_cols - w0);
    const int lane = threadIdx.x & 31;
    const int q = SPLIT == 1 ? 0 : lane / SEG;  // this lane's quarter of the window
    const int c = SPLIT == 1 ? lane : lane % SEG;  // and its column slot
    const int i = SPLIT == 1 ? (blockIdx.x % parts) * SCHED_RANK_THREADS + threadIdx.x
                             : (blockIdx.x % parts) * COLS + (threadIdx.x >> 5) * SEG + c;
    // i's sub-window [lo, lo + low) of the window (low = 0: an empty one, nothing counted)
    const int lo = low > 0 ? i / low * low : 0;
    // The quarter's counts in registers, count qn q + SEG k + c in own[k], all loaded at once (one
    // round trip), then broadcast by shuffles within the quarter's SEG lanes (a scan through L1 /
    // L2 took 50-100 us beside the preprocess's traffic: a round trip per step).
    const int qn = SPLIT == 1 ? n : (n + SPLIT - 1) / SPLIT;  // window columns a quarter
    const int qend = SPLIT == 1 ? n : min(n, qn * (q + 1));
    constexpr int PER_LANE = SCHED_WINDOW_MAX / SPLIT / SEG;  // a quarter's counts a lane
    int own[PER_LANE];
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int j = SPLIT == 1 ? 32 * k + lane : qn * q + SEG * k + c;
        own[k] = j < qend ? counts[w0 + j] : INT_MIN;  // INT_MIN ranks below every count
    }
    const int ci = i < n ? counts[w0 + i] : 0;
    const int c80 = counts80 && i < n ? counts80[w0 + i] : 0;
    if (counts80 || zeros_pick) {
        // The call's entry totals (bl_bwd_rows80_chosen, bl_bwd_masked_full; at head dim 64
        // bl_bwd_ws64p_dq16_chosen): a warp sum, one global atomic per warp; before the ranks, so
        // that the preprocess's zero CTAs learn the pick early (zeros_pick).
        unsigned long long s[BL_BWD_TOTALS] = {0ull, 0ull, 0ull, 0ull};
        if (i < n && q == 0) {  // one lane a column
            s[0] = (unsigned long long)ci;
            s[1] = (unsigned long long)c80;
            // the pairs the mask drops of the G x (row tiles the column allows) (bl_bwd_masked_full)
            s[2] = (unsigned long long)(dm.group * bl_bwd_allowed_row_tiles(dm, causal,
                                                                            (w0 + i) % dm.tiles_n) -
                                        ci);
            // the packed 80-row entries (bl_bwd_packed_chosen)
            s[3] = (unsigned long long)bl_bwd_packed_count(ci);
        }
#pragma unroll
        for (int t = 0; t < BL_BWD_TOTALS; ++t) {
            for (int off = 16; off > 0; off >>= 1) s[t] += __shfl_xor_sync(0xffffffffu, s[t], off);
            if ((threadIdx.x & 31) == 0) atomicAdd(&totals[t], s[t]);
        }
    }
    if (zeros_pick != nullptr) {
        // The last CTA to add its share reads the final totals and publishes the zeros the call
        // needs (bl_bwd_zeros_chosen: the main kernels' own pick from the same totals; a
        // head-dim-64 call, without counts80, the persistent kernel's, bl_bwd_ws64p_dq16_chosen).
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(&zeros_pick[0], 1) == (int)gridDim.x - 1) {
                __threadfence();
                unsigned long long t[BL_BWD_TOTALS];
#pragma unroll
                for (int k = 0; k < BL_BWD_TOTALS; ++k) t[k] = __ldcg(totals + k);
                const int kind = counts80 ? bl_bwd_zeros_chosen(t, dm, causal != 0)
                                 : bl_bwd_ws64p_dq16_chosen(t, dm) ? BL_ZEROS_DQ16
                                                                   : BL_ZEROS_ACCUM;
                asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(zeros_pick + 1), "r"(kind)
                             : "memory");
            }
        }
    }
    // rank = heavier columns + equal ones before i (all lanes take part in the shuffles); the
    // sub-window's rank counts those of them in [lo, lo + low)
    int r0 = 0, r1 = 0, s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        if (SEG * k >= qn) break;
#pragma unroll 8
        for (int src = 0; src < SEG; src += 2) {
            const int j = SPLIT == 1 ? 32 * k + src : qn * q + SEG * k + src;
            const int a = SPLIT == 1 ? __shfl_sync(0xffffffffu, own[k], src)
                                     : __shfl_sync(0xffffffffu, own[k], src, SEG);
            const int b = SPLIT == 1 ? __shfl_sync(0xffffffffu, own[k], src + 1)
                                     : __shfl_sync(0xffffffffu, own[k], src + 1, SEG);
            const int ha = (a > ci) | ((a == ci) & (j < i));
            const int hb = (b > ci) | ((b == ci) & (j + 1 < i));
            r0 += ha;
            r1 += hb;
            s0 += ha & ((unsigned)(j - lo) < (unsigned)low);
            s1 += hb & ((unsigned)(j + 1 - lo) < (unsigned)low);
        }
    }
    if constexpr (SPLIT > 1) {  // the quarters' counts summed (into r0 and s0)
        r0 += r1, s0 += s1, r1 = s1 = 0;
#pragma unroll
        for (int off = SEG; off < 32; off <<= 1) {
            r0 += __shfl_xor_sync(0xffffffffu, r0, off);
            s0 += __shfl_xor_sync(0xffffffffu, s0, off);
        }
    }
    if (i < n && q == 0) {
        const int rank = r0 + r1;
        schedule[w0 + rank] = w0 + i;
        // a split call's column as `split` records, one per part of its query heads: the
        // window's columns in count order for part 0, then for part 1, ... (sched_split_order)
        for (int j = 0; j < split; ++j)
            recs[(int64_t)w0 * split + (int64_t)j * n + rank] = make_int4(w0 + i, ci, c80, j);
        if (low > 0) recs_low[w0 + lo + s0 + s1] = make_int4(w0 + i, ci, c80, 0);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        recs[(int64_t)num_cols * split] = make_int4(-1, 0, 0, 0);
        if (low > 0) recs_low[num_cols] = make_int4(-1, 0, 0, 0);
        *next = 0;
    }
}

// Key tiles per lists CTA: LIST_COLS, fewer where their bitmaps would pass LIST_BITS_MAX_BYTES.
// Fewer again where the units (B * Hk * ceil(Tn / per)) would not fill the SMs, as long as the
// runs per kv head stay within the dq writers' BL_BWD_WRITER_RUNS bytes: a few-kv-head call's
// units are few and long (MQA at 16k: 8 units of 16 key tiles x 32 heads, ~230 us against the
// preprocess's ~135 us beside it, which the main kernel waits for: bench/results/
// bwd-s72-head-split.txt, call 6; 16 units here, 182 us: bwd-s73-split-more.txt).
static int list_cols_per_cta(const bl_bwd_dims &dm) {
    const int64_t stride = ((dm.group * dm.tiles_m + 31) / 32) | 1;  // bl_bwd_list_kernel's
    int per = LIST_COLS;
    while (per > 1 && per * stride * (int64_t)sizeof(unsigned) > LIST_BITS_MAX_BYTES) per >>= 1;
    int sms = 0;
    if (bl_sm_count(&sms) != BL_OK) return per;
    auto runs = [&](int cols) { return (dm.tiles_n + cols - 1) / cols; };
    while (per > 1 && dm.batch * dm.heads_k * runs(per) < sms &&
           runs(per / 2) <= BL_BWD_WRITER_RUNS)
        per >>= 1;
    return per;
}

int64_t bl_bwd_list_runs(const bl_bwd_dims &dm) {
    const int per = list_cols_per_cta(dm);
    return (dm.tiles_n + per - 1) / per;
}

bl_status bl_bwd_lists_launch(const bl_bwd_dims &dm, int causal, const uint8_t *mask, bool rows80,
                              bool dependent, const bl_bwd_workspace *ws, cudaStream_t stream) {
    const int64_t cols = dm.batch * dm.heads_k * dm.tiles_n;
    if (cols > INT32_MAX || dm.group * dm.tiles_m > INT32_MAX)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "B*Hk*Tn = %lld key tiles (or G*Tm = %lld row tiles per key tile) "
                            "exceeds the backward's 32-bit work lists",
                            (long long)cols, (long long)(dm.group * dm.tiles_m));
    if (rows80 && !bl_bwd_r80_lists_fit(dm))
        return bl_set_error(BL_ERR_INTERNAL, "G = %lld, Tm80 = %lld: 80-row entries do not fit",
                            (long long)dm.group, (long long)dm.tiles_m80);
    const int per = list_cols_per_cta(dm);
    const int64_t stride = ((dm.group * dm.tiles_m + 31) / 32) | 1;  // bl_bwd_list_kernel's
    const size_t bits_bytes = (size_t)(per * stride) * sizeof(unsigned);
    if (bits_bytes > LIST_BITS_MAX_BYTES)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "G*Tm = %lld row tiles per key tile exceeds the backward's work lists "
                            "(at most %d)", (long long)(dm.group * dm.tiles_m),
                            (int)(LIST_BITS_MAX_BYTES / sizeof(unsigned) - 1) * 32);
    // Fewer CTAs than units where the units outnumber LIST_CTAS_PER_SM per SM: the lists kernel
    // runs beside the preprocess, and each of its 256-thread CTAs holds thread slots the
    // preprocess's latency-bound loads would use. Where the units are fewer than the SMs, CTAs
    // of LIST_THREADS_FEW threads (their warps split each unit's loops).
    const int64_t units = dm.batch * dm.heads_k * ((dm.tiles_n + per - 1) / per);
    int sms = 0;
    BL_TRY(bl_sm_count(&sms));
    const int64_t wave = (int64_t)LIST_CTAS_PER_SM * sms;
    const int64_t ctas = units < wave ? units : wave;
    if (ws->dq_writers && bl_bwd_list_runs(dm) > BL_BWD_WRITER_RUNS)
        return bl_set_error(BL_ERR_INTERNAL,
                            "%lld key tiles: more lists units per kv head than writer bytes",
                            (long long)dm.tiles_n);
    const bool few = units < sms;
    auto kernel = few ? bl_bwd_list_kernel<LIST_THREADS_FEW> : bl_bwd_list_kernel<LIST_THREADS>;
    BL_CUDA_CHECK(bl_launch_carveout(kernel, dim3((unsigned)ctas),
                            dim3(few ? LIST_THREADS_FEW : LIST_THREADS),
                            bits_bytes + LIST_TEAM_BYTES, stream, dependent,
                            bl_bwd_chain_carveout(dependent), dm, causal, mask, per,
                            ws->counts, ws->lists, rows80 ? ws->counts80 : (int *)NULL,
                            rows80 ? ws->lists80 : (int *)NULL, ws->dq_writers,
                            rows80 || ws->dq_writers ? ws->totals : (unsigned long long *)NULL,
                            rows80 || ws->dq_writers ? ws->zeros_pick : (int *)NULL));
    return BL_OK;
}

// Windows of whole rounds of the SMs (the persistent kernels: one CTA per SM): four for causal
// calls (at head dim 64 too: two there, on version 6 before the persistent walk, were 20 / 4 us
// slower at 25 / 10 % kept, 13 us faster at 3 %, bwd-s113-hd64-causal-windows.txt), two at head
// dim 64 without a causal mask (bench/results/bwd-s11-noncausal-dynamic.txt: four
// cost 1.3 % at 16k x 16 dense non-causal). Non-causal at head dim 128, the columns running at
// once share fewer heads' Q / dO rows and dq accumulator blocks in L2 with one round: where a
// head has SCHED_LONG_HEAD_TILES key tiles or more, where kv heads are shared (G > 1) or where
// the call splits its columns, one round whatever the keep (32k x 24 x 128 at 50 / 10 / 3 %
// kept -169 / -87 / -88 us against two, 2 x 16k x 8 q x 1 kv at 10 / 3 % -9 / -48,
// bench/results/bwd-s82-window-keep-ab.txt; -9 / -51 in bwd-s81-window-rounds-ab.txt; smaller G
// not measured); else two rounds, and one (`low`, ws->sched_rec_low) for the masked calls that
// keep little (bl_bwd_low_keep): at 16k x 16 x 128 one round was -10 / -14 us at 3 / 5 % kept
// but +8 / +15 / +18 us at 8 / 10 / 25 % (bwd-s82-window-keep-ab.txt). Head dim 64 lost 12-17
// us at 10-25 % with one round, and causal calls at head dim 128 16-67 us with two, 8-68 us
// with six (bwd-s81-window-rounds-ab.txt, bwd-s82-causal-rounds-ab.txt).
bl_status bl_bwd_schedule_window(const bl_bwd_dims &dm, bool causal, int split, int *window,
                                 int *low) {
    int sms = 0;
    BL_TRY(bl_sm_count(&sms));
    const bool nc128 = !causal && dm.head_dim == 128;
    const bool one_round =
        nc128 && (split > 1 || dm.group > 1 || dm.tiles_n >= SCHED_LONG_HEAD_TILES);
    const int rounds = causal      ? SCHED_WINDOW_ROUNDS_CAUSAL
                       : one_round ? SCHED_WINDOW_ROUNDS_NC128
                                   : SCHED_WINDOW_ROUNDS;
    *window = rounds * sms < SCHED_WINDOW_MAX ? rounds * sms : SCHED_WINDOW_MAX;
    if (low) {
        const int sub = SCHED_WINDOW_ROUNDS_NC128 * sms;
        // sub-windows nest in the windows only where the cap left them whole rounds
        *low = nc128 && !one_round && *window % sub == 0 ? sub : 0;
    }
    return BL_OK;
}

// The preprocess's elements (B x Hq x Sq x D) above which the window schedule ranks a column with
// one thread (bl_bwd_schedule_window_kernel<1>): 16k x 16 x 128 (2^25, its schedule binding masked
// causal calls) takes four, 24k and 32k x 24 x 128 (~2^26.2 and ~2^26.6, their preprocess binding)
// one -- both measured slower with four.
constexpr int64_t SCHED_RANK_SPLIT_MAX_ELEMS = int64_t(1) << 26;
static int sched_rank_split(const bl_bwd_dims &dm) {
#ifdef BL_SCHED_RANK_SPLIT_FORCE
    // Dev builds only, to time the rule's boundary (used for
    // bench/results/bwd-s93-rank-split-boundary.txt): every call ranks with this split (1 or 4).
    static_assert(BL_SCHED_RANK_SPLIT_FORCE == 1 || BL_SCHED_RANK_SPLIT_FORCE == 4, "1 or 4");
    (void)dm;
    return BL_SCHED_RANK_SPLIT_FORCE;
#else
    return dm.batch * dm.heads_q * dm.seqlen_q * dm.head_dim <= SCHED_RANK_SPLIT_MAX_ELEMS ? 4 : 1;
#endif
}

bl_status bl_bwd_schedule_launch(const bl_bwd_dims &dm, int causal, bool rows80, int split,
                                 int carveout, bool zeros_pick, bl_bwd_workspace *ws,
                                 cudaStream_t stream) {
    // (the pick needs the totals, which only the window kernel sums: masked head-dim-128 calls,
    // and at head dim 64 the persistent kernel's DQ16 candidates, which it sums them for)
    if (zeros_pick && (rows80 ? dm.head_dim != 128 : dm.head_dim != 64))
        return bl_set_error(BL_ERR_INTERNAL, "zeros pick without totals (head dim %lld)",
                            (long long)dm.head_dim);
    const int64_t cols = dm.batch * dm.heads_k * dm.tiles_n;  // < 2^31: bl_bwd_lists_launch
    int window = 0, low = 0;
    BL_TRY(bl_bwd_schedule_window(dm, causal != 0, split, &window, &low));
    // the low-keep records only where the kernels can tell the keep (the totals: rows80)
    if (!rows80) low = 0;
    if (low == 0) ws->sched_rec_low = NULL;
    const int rank_split = sched_rank_split(dm);
    const int rank_cols = SCHED_RANK_THREADS / rank_split;  // columns a CTA ranks
    const int parts = (window + rank_cols - 1) / rank_cols;  // CTAs per window
    const int64_t windows = (cols + window - 1) / window;
    auto kernel = rank_split == 4 ? bl_bwd_schedule_window_kernel<4>
                                  : bl_bwd_schedule_window_kernel<1>;
    BL_CUDA_CHECK(bl_launch_carveout(kernel, dim3((unsigned)(windows * parts)),
                            dim3(SCHED_RANK_THREADS), 0, stream, /*dependent=*/true, carveout,
                            dm, causal, (const int *)ws->counts,
                            rows80 ? (const int *)ws->counts80 : (const int *)NULL, (int)cols,
                            window, low, parts, split, ws->schedule, ws->sched_rec,
                            ws->sched_rec_low, ws->sched_next, ws->totals,
                            zeros_pick ? ws->zeros_pick : (int *)NULL));
    return BL_OK;
}
