// select_sm90.cu -- tile selection on the GPU (W -> block mask): one warp per row tile up to
// 1024 key tiles, one CTA per row beyond. Implements bl_cuda_select_tiles. The backward's work
// lists and schedules built from the mask are in bwd_lists_sm90.cu.
#include <float.h>
#include <limits.h>
#include <math.h>
#include "backend.h"
#include "cuda_check.cuh"
#include "bwd_common.cuh"
#include "ptx_sm90.cuh"

// ---- selection: one CTA per (b, h, m) row of W, the sort in shared memory ----
// Rows of more than 32 * SEL_WARP_MAX_KEYS tiles (Sk > 131072); shorter ones take the warp
// kernel below. Small CTAs: the row's two sums are sequential on one thread (the contract's
// order, bit for bit with the CPU rule), so the SM needs many rows in flight to hide them (at
// 16k x 16 x 128, 256 threads: 100 us a call, 64 threads: 51 us; bench/results/bwd-s17.txt).
enum { SEL_THREADS = 64 };
// Padding key of the sort: sorts after every real (W, n) key.
#define SEL_PAD_KEY 0xffffffffffffffffull

// Maps a float to a uint32 that orders like the float (negatives flipped); -0 is folded into +0
// first so that equal p values tie and fall back to the tile index.
static __device__ __forceinline__ uint32_t sel_order_bits(float w) {
    if (w == 0.0f) w = 0.0f;
    uint32_t u = __float_as_uint(w);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Dynamic shared memory of one row: the sort keys (tn_pow2 uint64: W's order bits above the tile
// index, so (p asc, n asc) is one integer order), the sorted tiles' shares p (tn doubles), the
// row's Tn values of W.
static size_t sel_smem_bytes(int64_t tn, int64_t tn_pow2) {
    return (size_t)tn_pow2 * sizeof(unsigned long long) + (size_t)tn * sizeof(double) +
           (size_t)tn * sizeof(float);
}

// w: (rows, Tn) fp32 row-major; mask: (rows, Tn) uint8.
__global__ void __launch_bounds__(SEL_THREADS)
bl_select_kernel(const float *__restrict__ w_all, int tn, int tn_pow2, double negl_prob,
                 uint8_t *__restrict__ mask_all) {
    extern __shared__ unsigned long long sel_smem[];
    unsigned long long *keys = sel_smem;
    double *share = reinterpret_cast<double *>(keys + tn_pow2);
    float *w = reinterpret_cast<float *>(share + tn);
    __shared__ double s_total;
    __shared__ int s_skip;

    // the backward's lists kernel starts now and waits for this grid (bl_cuda_backward)
    griddep_launch_dependents();
    const int64_t row = blockIdx.x;
    const float *w_row = w_all + row * tn;
    uint8_t *mask_row = mask_all + row * tn;

    for (int i = threadIdx.x; i < tn_pow2; i += SEL_THREADS) {
        if (i < tn) {
            float x = w_row[i];
            w[i] = x;
            keys[i] = ((unsigned long long)sel_order_bits(x) << 32) | (unsigned)i;
        } else {
            keys[i] = SEL_PAD_KEY;
        }
    }
    __syncthreads();

    // Bitonic sort, ascending. Keys are distinct (the index is in them), so the order is the
    // stable one the contract asks for.
    for (int k = 2; k <= tn_pow2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < tn_pow2; i += SEL_THREADS) {
                int ixj = i ^ j;
                if (ixj > i) {
                    unsigned long long a = keys[i], b = keys[ixj];
                    bool ascending = (i & k) == 0;
                    if ((a > b) == ascending) {
                        keys[i] = b;
                        keys[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }

    // The sums are sequential in double, in the contract's order (T over n ascending, the
    // cumulative sum over the sorted order), so the mask matches the CPU backend bit for bit.
    // The shares between them are independent correctly rounded divisions, as on the CPU: those
    // run in parallel, not inside the sequential loop.
    if (threadIdx.x == 0) {
        double total = 0.0;
#pragma unroll 8
        for (int n = 0; n < tn; ++n) total += (double)w[n];
        s_total = total;
    }
    __syncthreads();
    const double total = s_total;
    const bool shares = isfinite(total) && total > 0.0;
    if (shares)
        for (int i = threadIdx.x; i < tn; i += SEL_THREADS)
            share[i] = (double)w[(int)(keys[i] & 0xffffffffu)] / total;
    __syncthreads();
    if (threadIdx.x == 0) {
        int skip;
        if (!isfinite(total)) {
            skip = 0;  // NaN/inf statistics: keep everything so NaN reaches the gradients
        } else if (!shares) {
            skip = tn;  // no mass at all (no valid row): nothing to compute
        } else {
            double cum = 0.0;
            skip = 0;
            while (skip < tn) {
                cum += share[skip];
                if (!(cum < negl_prob)) break;
                ++skip;
            }
        }
        s_skip = skip;
    }
    __syncthreads();
    const int skip = s_skip;
    for (int i = threadIdx.x; i < tn; i += SEL_THREADS) {
        int n = (int)(keys[i] & 0xffffffffu);
        mask_row[n] = (uint8_t)(i >= skip);
    }
}

// ---- selection, one warp per row (Tn <= 32 * SEL_WARP_MAX_KEYS): the sort in registers ----
// The shared-memory sort above is bound by shared-memory bandwidth (every pass reads and writes
// the row's keys: 36 passes over 2 KB per row at Tn = 256). Here lane l holds sorted positions
// l*E .. l*E+E-1 in registers: pairs closer than E are compare-exchanged in the lane, the others
// through shuffles. The sums stay sequential on lane 0 (the contract's order), the shares
// parallel; a parallel decision (sel_fast_skip) takes every row where it provably agrees with
// the sequential one. 16k x 16 x 128 (Tn = 256): 15 us a call (23.6 us with every row decided
// sequentially), against 51 us for the shared-memory sort on 64 threads and 120 us for the
// single-CTA-per-row kernel with its divisions inside the sequential loop that came before
// (bench/results/bwd-s17.txt). Rows of more than 4 keys a lane are first searched without a
// sort (select_warp_row_search below); this sort decides the rows the search cannot.
enum { SEL_WARP_ROWS = 4, SEL_WARP_MAX_KEYS = 32 };  // rows (warps) per CTA; keys per lane

// The contract's decision for a row whose sorted keys the warp holds (lane l: sorted positions
// l*E + r), exactly as the CPU rule computes it: the total T in tile order, the shares
// p = w / T, their running sum in sorted order, each sequential in double on lane 0 (the
// divisions in parallel). Returns the skipped prefix's length on every lane. Needs share[tn].
// The running sum is most of the kernel's time where every row takes this path (ncu source
// page, bench/results/bwd-s17.txt run 6).
template <int E>
__device__ __forceinline__ int sel_exact_skip(const float *w, double *share,
                                              const unsigned long long (&key)[E], int tn,
                                              double negl_prob, int lane) {
    constexpr unsigned FULL = 0xffffffffu;
    double total = 0.0;
    if (lane == 0) {
#pragma unroll 8
        for (int n = 0; n < tn; ++n) total += (double)w[n];
    }
    total = __shfl_sync(FULL, total, 0);
    const bool shares = isfinite(total) && total > 0.0;
    if (shares) {
#pragma unroll
        for (int r = 0; r < E; ++r) {
            const int i = lane * E + r;
            if (i < tn) share[i] = (double)w[(int)(key[r] & 0xffffffffu)] / total;
        }
    }
    __syncwarp();  // share is complete
    int skip = 0;
    if (lane == 0) {
        if (!isfinite(total)) {
            skip = 0;  // NaN/inf statistics: keep everything so NaN reaches the gradients
        } else if (!shares) {
            skip = tn;  // no mass at all (no valid row): nothing to compute
        } else {
            // The running sum over every share, in chunks of 8 loaded ahead, and the first
            // position that reaches negl_prob taken by a min, not a branch: the additions are the
            // only chain (an early exit's compare-and-branch per share cost 14 %: 27.0 -> 23.4
            // us at 16k x 16, bench/results/bwd-s17.txt).
            constexpr int CHUNK = 8;
            double cum = 0.0;
            skip = tn;
            for (int base = 0; base < tn; base += CHUNK) {
                double v[CHUNK];
#pragma unroll
                for (int u = 0; u < CHUNK; ++u) v[u] = base + u < tn ? share[base + u] : 0.0;
#pragma unroll
                for (int u = 0; u < CHUNK; ++u) {
                    cum += v[u];
                    skip = min(skip, !(cum < negl_prob) ? base + u : tn);
                }
            }
        }
    }
    return __shfl_sync(FULL, skip, 0);
}

// Margin of the parallel decision: the sums it compares with negl_prob are within
// 4 gamma_n + 3u < 5e-13 of the sequential ones (below), n <= 1024 terms; twice that, rounded up.
#define SEL_FAST_MARGIN 1e-12

// The same decision from sums in parallel, where it provably agrees with the sequential one;
// else -1 (then sel_exact_skip decides). Why it agrees: for shares x_i >= 0 every summation
// order of k + 1 terms is within gamma_k = k u / (1 - k u) (u = 2^-53) of the exact sum, relative
// to it; so the tree total T' is within 2 gamma_n of the sequential T, the shares w / T' within
// 2 gamma_n + 3u of w / T, and the warp's prefix sums P(k) within 4 gamma_n + 3u (< 5e-13 for
// n <= 1024) of the sequential running sums S(k), which never decrease (x_i >= 0, rounding is
// monotone). With k* the first position where P(k*) >= negl_prob: if P(k*) >= negl_prob + margin
// then S(k*) >= negl_prob, and if P(k* - 1) < negl_prob - margin then S(k) < negl_prob for every
// k < k*: the sequential rule skips exactly k*. Rows with a NaN, an infinity, a negative value or
// no mass, and those whose negl_prob falls within the margin of the crossing, go the exact way.
template <int E>
__device__ __forceinline__ int sel_fast_skip(const float *w, const unsigned long long (&key)[E],
                                             int tn, double negl_prob, int lane) {
    constexpr unsigned FULL = 0xffffffffu;
    double total = 0.0;  // a butterfly: every lane ends with the same bits
    bool clean = true;
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const int i = lane * E + r;
        if (i < tn) {
            const float x = w[i];
            clean = clean && x >= 0.0f && x <= FLT_MAX;  // finite, not negative, not NaN
            total += (double)x;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(FULL, total, off);
    if (!__all_sync(FULL, clean) || !(total > 0.0)) return -1;
    if (!(negl_prob > 0.0)) return 0;  // S(0) >= 0 >= negl_prob: nothing is skipped
    // P(l*E + r) = (sum of the lanes before l) + (lane l's own shares up to r)
    double p[E];
    double run = 0.0;
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const int i = lane * E + r;
        run += i < tn ? (double)w[(int)(key[r] & 0xffffffffu)] / total : 0.0;
        p[r] = run;
    }
    double incl = run;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const double v = __shfl_up_sync(FULL, incl, off);
        if (lane >= off) incl += v;
    }
    double before = __shfl_up_sync(FULL, incl, 1);
    if (lane == 0) before = 0.0;
    int first = INT_MAX;
#pragma unroll
    for (int r = E - 1; r >= 0; --r) {
        p[r] = before + p[r];
        if (lane * E + r < tn && p[r] >= negl_prob) first = lane * E + r;
    }
    int k = __reduce_min_sync(FULL, first);
    if (k == INT_MAX) k = tn;  // no prefix reaches negl_prob: check P(tn - 1) only
    // The lane holding position k (or tn - 1) checks the margins on both sides of the crossing.
    // (Every lane runs the loop with static indices; a dynamic p[at % E] went to local memory.)
    const int at = k < tn ? k : tn - 1;
    bool ok = true;
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const double below = r > 0 ? p[r - 1] : before;  // P(at - 1) (none where at == 0)
        const bool mine = lane * E + r == at;
        const bool up = p[r] >= negl_prob + SEL_FAST_MARGIN;
        const bool down = at == 0 || below < negl_prob - SEL_FAST_MARGIN;
        if (mine) ok = k < tn ? up && down : p[r] < negl_prob - SEL_FAST_MARGIN;
    }
    ok = __shfl_sync(FULL, ok, at / E);
    return ok ? k : -1;
}

// One row of the warp kernel: sort the row's keys, decide the skipped prefix, write the mask.
template <int E>
__device__ __forceinline__ void select_warp_row(const float *__restrict__ w_row, int tn,
                                                double negl_prob, uint8_t *__restrict__ mask_row,
                                                double *share, float *w, int lane) {
    constexpr int N = 32 * E;  // the row's keys, padded to a power of two
    constexpr unsigned FULL = 0xffffffffu;

    unsigned long long key[E];
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const int i = lane * E + r;
        const float x = i < tn ? w_row[i] : 0.0f;
        if (i < tn) w[i] = x;
        key[r] = i < tn ? ((unsigned long long)sel_order_bits(x) << 32) | (unsigned)i : SEL_PAD_KEY;
    }

    // Bitonic sort, ascending: position i = l*E + r ends up holding the i-th smallest key. The
    // element of the pair (i, i ^ j) with the lower index takes the minimum where the run of k
    // ascends ((i & k) == 0), the other the maximum.
#pragma unroll
    for (int k = 2; k <= N; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j >= E) {
#pragma unroll
                for (int r = 0; r < E; ++r) {
                    const int i = lane * E + r;
                    const unsigned long long other = __shfl_xor_sync(FULL, key[r], j / E);
                    const bool take_min = ((i & j) == 0) == ((i & k) == 0);
                    key[r] = take_min ? min(key[r], other) : max(key[r], other);
                }
            } else {
#pragma unroll
                for (int r = 0; r < E; ++r) {
                    if (r & j) continue;
                    const bool ascending = ((lane * E + r) & k) == 0;
                    const unsigned long long a = key[r], b = key[r | j];
                    if ((a > b) == ascending) {
                        key[r] = b;
                        key[r | j] = a;
                    }
                }
            }
        }
    }
    __syncwarp();  // w is complete
    int skip = sel_fast_skip<E>(w, key, tn, negl_prob, lane);
    if (skip < 0) skip = sel_exact_skip<E>(w, share, key, tn, negl_prob, lane);
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const int i = lane * E + r;  // sorted position; the padding keys sort last
        if (i < tn) mask_row[(int)(key[r] & 0xffffffffu)] = (uint8_t)(i >= skip);
    }
}

// Bits of select_warp_row_search's guess: a non-negative finite float's bits are below 2^31;
// the high ones (exponent and 7 mantissa bits) are searched first.
enum { SEL_SEARCH_HIGH_BIT = 30, SEL_SEARCH_SPLIT_BIT = 15 };

// One binary-search pass over bits hi..lo of v: a bit is set where the tiles whose weight's bits
// are below the candidate weigh < bound, summed in float in a fixed butterfly (the same bits on
// every lane, so the warp branches as one).
template <int E>
__device__ __forceinline__ void sel_search_bits(const float (&x)[E], const uint32_t (&u)[E],
                                                float bound, int hi, int lo, uint32_t &v) {
    constexpr unsigned FULL = 0xffffffffu;
#pragma unroll 1
    for (int b = hi; b >= lo; --b) {
        const uint32_t cand = v | (1u << b);
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < E; ++r) acc += u[r] < cand ? x[r] : 0.0f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(FULL, acc, off);
        if (acc < bound) v = cand;
    }
}

// The row's decision without a sort, where it provably agrees with the sequential rule; false
// where it cannot tell (then select_warp_row sorts and decides). Lane l holds tiles r * 32 + l
// (coalesced loads and mask stores). Since the shares are w / T, the order by (p, n) is the order
// by (w, n), and the skipped prefix is the set of tiles lighter than the crossing tile c, the
// first in that order whose running sum reaches negl_prob. Its weight w_c is found by a binary
// search over the 31 bits of a non-negative float (sel_search_bits): the largest v with F(v) =
// (sum of w below v) < negl_prob * T, from float sums in a fixed butterfly (monotone in v: the
// terms are >= 0 and rounding is monotone, so every lane takes the same branches); its 16 high
// bits first, and where one tile alone has them, that tile is c. The search is only a guess; the
// decision is checked in double with sel_fast_skip's margin: B = (sum of w below w_c) / T' and
// I = (that sum + w_c) / T', each any-order sum of the k* and k* + 1 lightest tiles over the
// tree total T', are within 2 gamma_n + u of the exact prefix sums, as the sequential S(k* - 1)
// and S(k*) are (4 gamma_n + 2u < 5e-13 apart, n <= 1024; the checks are made as products with
// T', one more rounding). So I >= negl_prob + margin gives S(k*) >= negl_prob, and B <
// negl_prob - margin (or nothing lighter) gives S(k) < negl_prob for every k < k*: the rule
// skips exactly the tiles lighter than w_c. A row falls back where that check fails, where
// several tiles weigh exactly w_c (their order by index would matter), where no tile crosses,
// and where a value is NaN, infinite or negative, or the row has no mass.
// Cost at Tn = 256: 16 steps of ~42 instructions (31 where the high bits do not single c out)
// against ~2700 for the sort's 64-bit compare-exchanges.
template <int E>
__device__ __forceinline__ bool select_warp_row_search(const float *__restrict__ w_row, int tn,
                                                       double negl_prob,
                                                       uint8_t *__restrict__ mask_row, int lane) {
    constexpr unsigned FULL = 0xffffffffu;
    constexpr uint32_t PAD_BITS = 0xffffffffu;  // above every finite weight's bits: never lighter
    float x[E];
    uint32_t u[E];  // the weight's float bits (+0 for -0), ordered like the weights
    bool clean = true;
    double total = 0.0;  // a butterfly: every lane ends with the same bits
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const int i = r * 32 + lane;
        x[r] = i < tn ? w_row[i] : 0.0f;
        clean = clean && x[r] >= 0.0f && x[r] <= FLT_MAX;  // finite, not negative, not NaN
        u[r] = i >= tn ? PAD_BITS : x[r] > 0.0f ? __float_as_uint(x[r]) : 0u;
        total += (double)x[r];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(FULL, total, off);
    if (!__all_sync(FULL, clean) || !(total > 0.0)) return false;
    if (negl_prob > 0.0) {
        // v: the largest bit pattern whose lighter tiles weigh < negl_prob * T (float guess),
        // its high bits first; where one tile alone has them, its bits are v (it is the tile
        // whose weight takes the sum past the bound), else the low bits are searched too.
        const float bound = (float)(negl_prob * total);
        uint32_t v = 0;
        sel_search_bits<E>(x, u, bound, SEL_SEARCH_HIGH_BIT, SEL_SEARCH_SPLIT_BIT, v);
        int in_bucket = 0;
        uint32_t mine = 0;
#pragma unroll
        for (int r = 0; r < E; ++r) {
            if ((u[r] >> SEL_SEARCH_SPLIT_BIT) == (v >> SEL_SEARCH_SPLIT_BIT)) {
                ++in_bucket;
                mine = u[r];
            }
        }
        if (__reduce_add_sync(FULL, in_bucket) == 1)
            v = __reduce_max_sync(FULL, mine);  // lanes without it hold 0
        else
            sel_search_bits<E>(x, u, bound, SEL_SEARCH_SPLIT_BIT - 1, 0, v);
        double below = 0.0, at = 0.0;
        int at_count = 0;
        bool lighter = false;
#pragma unroll
        for (int r = 0; r < E; ++r) {
            if (u[r] < v) { below += (double)x[r]; lighter = true; }
            if (u[r] == v) { at += (double)x[r]; ++at_count; }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            below += __shfl_xor_sync(FULL, below, off);
            at += __shfl_xor_sync(FULL, at, off);
        }
        if (__reduce_add_sync(FULL, at_count) != 1) return false;  // ties at w_c, or no crossing
        // B < negl_prob - margin and I >= negl_prob + margin, as products with T' (no division:
        // the product's rounding, u relative, is far inside the margin's slack)
        const bool up = below + at >= (negl_prob + SEL_FAST_MARGIN) * total;
        const bool down =
            !__any_sync(FULL, lighter) || below < (negl_prob - SEL_FAST_MARGIN) * total;
        if (!(up && down)) return false;
#pragma unroll
        for (int r = 0; r < E; ++r) {
            const int i = r * 32 + lane;
            if (i < tn) mask_row[i] = (uint8_t)(u[r] >= v);
        }
    } else {  // S(0) >= 0 >= negl_prob: nothing is skipped
#pragma unroll
        for (int r = 0; r < E; ++r) {
            const int i = r * 32 + lane;
            if (i < tn) mask_row[i] = 1;
        }
    }
    return true;
}

// Keys per lane from which a row is searched first (select_warp_row_search), not sorted. At E = 8
// (Tn 129..256) the search took the 32k x 24 causal selection from 72 to 33 us a call with 31
// steps, to 26 us with the high bits first. At E = 4 (Tn 65..128) 31 steps cost more than the
// sort (14 -> 17.7 us, beside the preprocess), but the high bits first beat it: 16k x 16 x 128
// causal negl 0.5 selection 16.5 -> 13.5 us, span -2.7 us in two rounds, non-causal level
// (bench/results/bwd-s91-select-search.txt, calls 1 and 5; bwd-s92-select-e4.txt). Below E = 4
// (Tn <= 64) the sort of 64 keys stays. E = 16 / 32 (Tn to 1024) take the search too, as the
// sort's cost grows faster (N log^2 N against ~16 E); their times are not measured.
constexpr int SEL_SEARCH_MIN_KEYS = 4;

template <int E>
__device__ __forceinline__ void select_warp_row_any(const float *__restrict__ w_row, int tn,
                                                    double negl_prob,
                                                    uint8_t *__restrict__ mask_row, double *share,
                                                    float *w, int lane) {
    if (E >= SEL_SEARCH_MIN_KEYS && select_warp_row_search<E>(w_row, tn, negl_prob, mask_row, lane))
        return;
    select_warp_row<E>(w_row, tn, negl_prob, mask_row, share, w, lane);
}

// STRIDE: the warps take rows in turn (a capped grid: launch_select_warp), else one row each.
template <int E, bool STRIDE>
__global__ void __launch_bounds__(32 * SEL_WARP_ROWS)
bl_select_warp_kernel(const float *__restrict__ w_all, int64_t rows, int tn, double negl_prob,
                      uint8_t *__restrict__ mask_all) {
    constexpr int N = 32 * E;  // the row's keys, padded to a power of two
    __shared__ double s_share[SEL_WARP_ROWS][N];  // the shares p in sorted order
    __shared__ float s_w[SEL_WARP_ROWS][N];       // the row of W in tile order
    // the backward's lists kernel starts now and waits for this grid (bl_cuda_backward)
    griddep_launch_dependents();
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    // A whole warp takes a row, and nothing below syncs beyond the warp. (The loop is a form of
    // its own: kept out of the one-row form, it would cost that form registers -- 64 -> 80 a
    // thread at E = 8 -- and so occupancy.)
    const int64_t first = (int64_t)blockIdx.x * SEL_WARP_ROWS + wid;
    if constexpr (!STRIDE) {
        if (first < rows)
            select_warp_row_any<E>(w_all + first * tn, tn, negl_prob, mask_all + first * tn,
                                   s_share[wid], s_w[wid], lane);
    } else {
        for (int64_t row = first; row < rows; row += (int64_t)gridDim.x * SEL_WARP_ROWS) {
            __syncwarp();  // the last row's w / share are read
            select_warp_row_any<E>(w_all + row * tn, tn, negl_prob, mask_all + row * tn,
                                   s_share[wid], s_w[wid], lane);
        }
    }
}

// The warp kernel's grid where one CTA per SEL_WARP_ROWS rows fits the SMs in one wave at the
// kernel's occupancy: at most SEL_CTAS_PER_SM CTAs an SM, the warps taking rows in turn. The
// selection, the lists kernel, the schedule and the preprocess are a chain of programmatic
// dependents (bl_cuda_backward), each launched once every CTA of the kernel before it has
// started and only where the SMs have room: a one-wave selection that holds most of the SMs'
// registers started the preprocess ~9 us into a 16k x 16 x 128 call, the capped one at ~5 us
// (calls -2..-4 us at negl 0.5 / 0.2, non-causal and causal; head dim 64 level). Where the grid is
// several waves (32k x 24, Tn 256: 2.9) it stays one CTA per 4 rows: capped there, the
// preprocess started ~50 us sooner but ran ~55 us longer beside the selection, the call +4 us
// (bench/results/bwd-s90-select-preprocess-waves.txt, calls 1, 3 and 4).
constexpr int SEL_CTAS_PER_SM = 4;

template <int E>
static bl_status launch_select_warp(int64_t rows, int tn, const float *tile_mass, float negl_prob,
                                    uint8_t *mask, cudaStream_t stream) {
    const int64_t ctas = (rows + SEL_WARP_ROWS - 1) / SEL_WARP_ROWS;
    int sms = 0, per_sm = 0;
    BL_TRY(bl_sm_count(&sms));
    BL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, bl_select_warp_kernel<E, false>, 32 * SEL_WARP_ROWS, 0));
    const int64_t cap = (int64_t)SEL_CTAS_PER_SM * sms;
    if (ctas > cap && ctas <= (int64_t)per_sm * sms) {
        bl_select_warp_kernel<E, true><<<(unsigned)cap, 32 * SEL_WARP_ROWS, 0, stream>>>(
            tile_mass, rows, tn, (double)negl_prob, mask);
    } else {
        if (ctas > INT32_MAX)
            return bl_set_error(BL_ERR_UNSUPPORTED,
                                "B*Hq*Tm = %lld row tiles exceeds the grid limit", (long long)rows);
        bl_select_warp_kernel<E, false><<<(unsigned)ctas, 32 * SEL_WARP_ROWS, 0, stream>>>(
            tile_mass, rows, tn, (double)negl_prob, mask);
    }
    BL_CUDA_CHECK_LAUNCH("bl_select_warp_kernel");
    return BL_OK;
}

bl_status bl_select_launch(const bl_bwd_dims &dm, const float *tile_mass, float negl_prob,
                           uint8_t *mask, cudaStream_t stream) {
    const int64_t rows = dm.batch * dm.heads_q * dm.tiles_m;
    const int64_t tn = dm.tiles_n;
    int64_t tn_pow2 = 1;
    while (tn_pow2 < tn) tn_pow2 <<= 1;
    if (rows == 0) return BL_OK;
    if (tn_pow2 <= 32 * SEL_WARP_MAX_KEYS) {
        const int e = tn_pow2 <= 32 ? 1 : (int)(tn_pow2 / 32);
        const float *w = tile_mass;
        switch (e) {
            case 1: return launch_select_warp<1>(rows, (int)tn, w, negl_prob, mask, stream);
            case 2: return launch_select_warp<2>(rows, (int)tn, w, negl_prob, mask, stream);
            case 4: return launch_select_warp<4>(rows, (int)tn, w, negl_prob, mask, stream);
            case 8: return launch_select_warp<8>(rows, (int)tn, w, negl_prob, mask, stream);
            case 16: return launch_select_warp<16>(rows, (int)tn, w, negl_prob, mask, stream);
            default: return launch_select_warp<32>(rows, (int)tn, w, negl_prob, mask, stream);
        }
    }
    const size_t smem = sel_smem_bytes(tn, tn_pow2);
    int dev = 0, smem_max = 0;
    BL_CUDA_CHECK(cudaGetDevice(&dev));
    BL_CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    // (room for the static s_total / s_skip)
    if (smem > (size_t)smem_max - 1024)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "seqlen_k = %lld gives %lld key tiles per row; the CUDA selection "
                            "sorts a row in shared memory (%zu bytes; this device allows %d)",
                            (long long)dm.seqlen_k, (long long)tn, smem, smem_max - 1024);
    if (rows > INT32_MAX)
        return bl_set_error(BL_ERR_UNSUPPORTED, "B*Hq*Tm = %lld row tiles exceeds the grid limit",
                            (long long)rows);
    if (smem > 48 * 1024)
        BL_CUDA_CHECK(cudaFuncSetAttribute(bl_select_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
    bl_select_kernel<<<(unsigned)rows, SEL_THREADS, smem, stream>>>(
        tile_mass, (int)tn, (int)tn_pow2, (double)negl_prob, mask);
    BL_CUDA_CHECK_LAUNCH("bl_select_kernel");
    return BL_OK;
}

extern "C" bl_status bl_cuda_select_tiles(const bl_attn_desc *d, const float *tile_mass,
                                          float negl_prob, uint8_t *mask) {
    if (!bl_cuda_available())
        return bl_set_error(BL_ERR_NO_BACKEND,
                            "bl_select_tiles: no CUDA device of compute capability 9.0 is usable "
                            "(the CUDA backend needs an H100/H200 and a working driver)");
    bl_bwd_dims dm = bl_bwd_make_dims(d);
    return bl_select_launch(dm, tile_mass, negl_prob, mask, (cudaStream_t)d->stream);
}
