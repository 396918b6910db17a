// select_sm90.cu -- tile selection on the GPU (W -> block mask) and the backward's work lists
// (block mask -> per-key-tile lists of kept (q head, row tile) pairs, and a schedule of the key
// tiles). Implements bl_cuda_select_tiles.
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
// steps, to 26 us with the high bits first; at E = 4 (Tn 128) 31 steps cost more than the sort
// (14 -> 17.7 us, beside the preprocess), the high bits first level with it (14.3 -> 13.6 us,
// one round: bench/results/bwd-s91-select-search.txt, calls 1 and 5), so E = 4 keeps the sort.
// E = 16 / 32 (Tn to 1024) take the search too, as the sort's cost grows faster (N log^2 N
// against ~16 E); their times are not measured.
constexpr int SEL_SEARCH_MIN_KEYS = 8;

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
    if (!STRIDE) {
        if (first < rows)
            select_warp_row_any<E>(w_all + first * tn, tn, negl_prob, mask_all + first * tn,
                                   s_share[wid], s_w[wid], lane);
        return;
    }
    for (int64_t row = first; row < rows; row += (int64_t)gridDim.x * SEL_WARP_ROWS) {
        __syncwarp();  // the last row's w / share are read
        select_warp_row_any<E>(w_all + row * tn, tn, negl_prob, mask_all + row * tn, s_share[wid],
                               s_w[wid], lane);
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
                   unsigned long long *__restrict__ totals) {
    extern __shared__ unsigned col_bits[];
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
// Heaviest first within windows of whole rounds of the persistent head-dim-128 kernel, the
// windows in the natural (b, kv head, key tile) order (bl_bwd_schedule_window_kernel):
// concurrent CTAs then work on a few heads, whose Q / dO rows and dq accumulator stay in L2,
// where a global sort spreads them over all heads. Causal calls at head dim 64 (one CTA per
// column, in the hardware's order) keep the global heaviest-first sort (bl_bwd_schedule_kernel).
// Measured, random tile masks: non-causal (bench/results/bwd-s9-schedule.txt, two-round windows,
// then with a static snake walk; the rounds per call now: bl_bwd_schedule_window) 1 x 16k x 16 x
// 128 at 10 % kept 1.49 -> 1.31 ms (-12 %), 25 % kept -1.6 %, head dim 64 (16k, 4 x 4k)
// -2..-6 %, dense level; causal at head dim 128
// (bench/results/bwd-s10-causal-windows.txt, four-round windows, dynamic walk) 32k x 24 dense
// -5 %, sparse -10..-18 %, 16k x 16 dense level, sparse -3..-9 %. (With the static snake the
// causal windows had lost 7-8 %: their columns differ too much in length.)

// sched_split_order: a split call's records (bl_bwd_head_split: P per column) go part-major --
// every column of the window in count order for part 0, then again for part 1, ... -- so that
// the CTAs running at once walk the rows of few query heads, many key tiles each: the Q / dO rows
// and dQ accumulator blocks they share are then read and reduce-added in L2 by many of them.
// With a column's P records side by side instead, the SMs held ~16 columns x all P parts (every
// query head), each head's rows shared by ~16 CTAs: MQA 1 x 16k x 32 q x 128 causal at 25 %
// kept moved 6.7 GB of DRAM in its packed walk against GQA-8's 3.5 GB for the same entries
// (L2 hit rate 58 against 75 %: bench/results/bwd-s73-split-more.txt, call 4).
enum { SCHED_THREADS = 1024, SCHED_BUCKETS = 2048 };

// Both schedule kernels run as the lists kernel's programmatic dependent (bl_cuda_backward): the
// preprocess behind them may start at once (it reads nothing they write, and waits for them
// before it completes); the counts are read once the lists kernel is done.
static __device__ __forceinline__ void sched_dependent_start() {
    griddep_launch_dependents();
    griddep_wait();
}

// counts: (num_cols); schedule: (num_cols), a permutation of 0..num_cols-1. Buckets of equal
// width over [0, max count]: heavy columns start first, which is what load balance needs; the
// order inside a bucket does not matter.
__global__ void __launch_bounds__(SCHED_THREADS)
bl_bwd_schedule_kernel(const int *__restrict__ counts, int num_cols, int split,
                       int *__restrict__ schedule, int4 *__restrict__ recs, int *__restrict__ next) {
    __shared__ int hist[SCHED_BUCKETS];
    __shared__ int warp_sums[SCHED_THREADS / 32];
    __shared__ int s_max;
    sched_dependent_start();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) s_max = 1;
    for (int i = tid; i < SCHED_BUCKETS; i += SCHED_THREADS) hist[i] = 0;
    __syncthreads();
    int local_max = 0;
    for (int c = tid; c < num_cols; c += SCHED_THREADS) local_max = max(local_max, counts[c]);
    atomicMax(&s_max, local_max);
    __syncthreads();
    const int64_t maxc = s_max;
    // Bucket 0 holds the heaviest columns.
    for (int c = tid; c < num_cols; c += SCHED_THREADS) {
        int bkt = (SCHED_BUCKETS - 1) - (int)((int64_t)counts[c] * (SCHED_BUCKETS - 1) / maxc);
        atomicAdd(&hist[bkt], 1);
    }
    __syncthreads();
    // Exclusive scan of hist: each thread owns SCHED_BUCKETS / SCHED_THREADS adjacent buckets.
    constexpr int PER = SCHED_BUCKETS / SCHED_THREADS;
    int mine[PER], sum = 0;
    for (int i = 0; i < PER; ++i) {
        mine[i] = hist[tid * PER + i];
        sum += mine[i];
    }
    int incl = sum;
    for (int off = 1; off < 32; off <<= 1) {
        int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int warp_base = 0;
    for (int w = 0; w < warp; ++w) warp_base += warp_sums[w];
    int run = warp_base + incl - sum;
    __syncthreads();
    for (int i = 0; i < PER; ++i) {
        hist[tid * PER + i] = run;
        run += mine[i];
    }
    __syncthreads();
    for (int c = tid; c < num_cols; c += SCHED_THREADS) {
        int bkt = (SCHED_BUCKETS - 1) - (int)((int64_t)counts[c] * (SCHED_BUCKETS - 1) / maxc);
        const int pos = atomicAdd(&hist[bkt], 1);
        schedule[pos] = c;
        // a split call's column as `split` records, one per part of its query heads, part-major
        // (sched_split_order)
        for (int j = 0; j < split; ++j)
            recs[(int64_t)j * num_cols + pos] = make_int4(c, counts[c], 0, j);
    }
    if (tid == 0) {
        recs[(int64_t)num_cols * split] = make_int4(-1, 0, 0, 0);
        *next = 0;
    }
}

// Window schedule: the columns in their natural order cut into windows of `window` columns, each
// window sorted by count, descending and stable (rank by counting). A window's ranks are split
// over SCHED_RANK_THREADS-column parts, one CTA each: every CTA reads the whole window (at most
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
__global__ void __launch_bounds__(SCHED_RANK_THREADS)
bl_bwd_schedule_window_kernel(bl_bwd_dims dm, int causal, const int *__restrict__ counts,
                              const int *__restrict__ counts80, int num_cols, int window, int low,
                              int parts, int split, int *__restrict__ schedule, int4 *__restrict__ recs,
                              int4 *__restrict__ recs_low, int *__restrict__ next,
                              unsigned long long *__restrict__ totals) {
    sched_dependent_start();
    const int w0 = (blockIdx.x / parts) * window;
    const int n = min(window, num_cols - w0);
    const int i = (blockIdx.x % parts) * SCHED_RANK_THREADS + threadIdx.x;  // in the window
    // i's sub-window [lo, lo + low) of the window (low = 0: an empty one, nothing counted)
    const int lo = low > 0 ? i / low * low : 0;
    // The window's counts in registers, count 32 k + lane in own[k], all loaded at once (one
    // round trip), then broadcast by shuffles (a scan through L1 / L2 took 50-100 us beside the
    // preprocess's traffic: a round trip per step).
    constexpr int PER_LANE = SCHED_WINDOW_MAX / 32;
    const int lane = threadIdx.x & 31;
    int own[PER_LANE];
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int j = 32 * k + lane;
        own[k] = j < n ? counts[w0 + j] : INT_MIN;  // INT_MIN ranks below every count
    }
    const int ci = i < n ? counts[w0 + i] : 0;
    const int c80 = counts80 && i < n ? counts80[w0 + i] : 0;
    // rank = heavier columns + equal ones before i (all lanes take part in the shuffles); the
    // sub-window's rank counts those of them in [lo, lo + low)
    int r0 = 0, r1 = 0, s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        if (32 * k >= n) break;
#pragma unroll 8
        for (int src = 0; src < 32; src += 2) {
            const int j = 32 * k + src;
            const int a = __shfl_sync(0xffffffffu, own[k], src);
            const int b = __shfl_sync(0xffffffffu, own[k], src + 1);
            const int ha = (a > ci) | ((a == ci) & (j < i));
            const int hb = (b > ci) | ((b == ci) & (j + 1 < i));
            r0 += ha;
            r1 += hb;
            s0 += ha & ((unsigned)(j - lo) < (unsigned)low);
            s1 += hb & ((unsigned)(j + 1 - lo) < (unsigned)low);
        }
    }
    if (i < n) {
        const int rank = r0 + r1;
        schedule[w0 + rank] = w0 + i;
        // a split call's column as `split` records, one per part of its query heads: the
        // window's columns in count order for part 0, then for part 1, ... (sched_split_order)
        for (int j = 0; j < split; ++j)
            recs[(int64_t)w0 * split + (int64_t)j * n + rank] = make_int4(w0 + i, ci, c80, j);
        if (low > 0) recs_low[w0 + lo + s0 + s1] = make_int4(w0 + i, ci, c80, 0);
    }
    if (counts80) {
        // The call's entry totals (bl_bwd_rows80_chosen, bl_bwd_masked_full): a warp sum, one
        // global atomic per warp.
        unsigned long long s[BL_BWD_TOTALS] = {0ull, 0ull, 0ull, 0ull};
        if (i < n) {
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
    BL_CUDA_CHECK(bl_launch(few ? bl_bwd_list_kernel<LIST_THREADS_FEW>
                                : bl_bwd_list_kernel<LIST_THREADS>,
                            dim3((unsigned)ctas), dim3(few ? LIST_THREADS_FEW : LIST_THREADS),
                            bits_bytes + LIST_TEAM_BYTES, stream, dependent, dm, causal, mask, per,
                            ws->counts, ws->lists, rows80 ? ws->counts80 : (int *)NULL,
                            rows80 ? ws->lists80 : (int *)NULL, ws->dq_writers,
                            rows80 ? ws->totals : (unsigned long long *)NULL));
    return BL_OK;
}

// Windows of whole rounds of the persistent head-dim-128 kernel (one CTA per SM, dynamic walk):
// four for causal calls, two at head dim 64 (bench/results/bwd-s11-noncausal-dynamic.txt: four
// cost 1.3 % at 16k x 16 dense non-causal). Non-causal at head dim 128, the columns running at
// once share fewer heads' Q / dO rows and dq accumulator blocks in L2 with one round: where a
// head has SCHED_LONG_HEAD_TILES key tiles or more, where kv heads are shared (G > 1) or where
// the call splits its columns, one round whatever the keep (32k x 24 x 128 at 50 / 10 / 3 %
// kept -169 / -87 / -88 us against two, 2 x 16k x 8 q x 1 kv at 10 / 3 % -9 / -48,
// bench/results/bwd-s82-window-keep-ab.txt; -9 / -51 in bwd-s81-window-rounds-ab.txt; smaller G
// not measured); else two rounds, and one (`low`, ws->sched_rec_low) for the masked calls that
// keep little (bl_bwd_low_keep): at 16k x 16 x 128 one round was -10 / -14 us at 3 / 5 % kept
// but +8 / +15 / +18 us at 8 / 10 / 25 % (bwd-s82-window-keep-ab.txt). Head dim 64 lost 12-17
// us at 10-25 % with one round, and causal calls 16-67 us with two, 8-68 us with six
// (bwd-s81-window-rounds-ab.txt, bwd-s82-causal-rounds-ab.txt).
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

bl_status bl_bwd_schedule_launch(const bl_bwd_dims &dm, int causal, bool rows80, int split,
                                 bl_bwd_workspace *ws, cudaStream_t stream) {
    const int64_t cols = dm.batch * dm.heads_k * dm.tiles_n;  // < 2^31: bl_bwd_lists_launch
    int window = 0, low = 0;
    BL_TRY(bl_bwd_schedule_window(dm, causal != 0, split, &window, &low));
    // the low-keep records only where the kernels can tell the keep (the totals: rows80)
    if (!rows80) low = 0;
    if (low == 0) ws->sched_rec_low = NULL;
    if (causal && dm.head_dim != 128) {
        BL_CUDA_CHECK(bl_launch(bl_bwd_schedule_kernel, dim3(1), dim3(SCHED_THREADS), 0, stream,
                                /*dependent=*/true, (const int *)ws->counts, (int)cols, split,
                                ws->schedule, ws->sched_rec, ws->sched_next));
        return BL_OK;
    }
    const int parts = (window + SCHED_RANK_THREADS - 1) / SCHED_RANK_THREADS;  // CTAs per window
    const int64_t windows = (cols + window - 1) / window;
    BL_CUDA_CHECK(bl_launch(bl_bwd_schedule_window_kernel, dim3((unsigned)(windows * parts)),
                            dim3(SCHED_RANK_THREADS), 0, stream, /*dependent=*/true, dm, causal,
                            (const int *)ws->counts,
                            rows80 ? (const int *)ws->counts80 : (const int *)NULL, (int)cols,
                            window, low, parts, split, ws->schedule, ws->sched_rec,
                            ws->sched_rec_low, ws->sched_next, ws->totals));
    return BL_OK;
}
