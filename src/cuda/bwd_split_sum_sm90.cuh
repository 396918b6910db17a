// bwd_split_sum_sm90.cuh -- a split call's dK / dV summed by the CTA that stores a column's last
// partial, inside the main kernel.
//
// A call whose columns are too few for the SMs splits each column's query heads into parts
// (bl_bwd_head_split); every (column, part) stores its dK / dV as fp32 partials into
// bwd_params::dkv_part, (2, P, B, Sk, Hk, D). Those used to be summed by a kernel of their own
// after the main one (~40 us at 2 x 16k x 8 q x 1 kv heads with 4 parts, 24 us with 2:
// bench/results/bwd-s75-split-parts.txt), on the call's critical path. Here each part's CTA
// counts itself into its column's counter (bwd_params::dkv_done, zeroed by the preprocess) once
// its partials are out, and the one that completes the count sums the column's partials -- in
// part order, as that kernel did, so dK / dV keep their bits from call to call whatever order the
// parts end in -- and writes dK (times scale) and dV in the dtype: at once in the head-dim-64
// kernel (a CTA per column and part), after its last column in the persistent head-dim-128
// ones, so that CTAs that run out of columns early sum while others still work.
#pragma once
#include "bwd_kernel_common.cuh"
#include "bwd_ptx.cuh"
#include "ptx_sm90.cuh"

namespace bl_bwd {

// Named barrier of the consumer threads for the count (the kernels' others: 1-4).
constexpr int WS_BAR_SPLIT_SUM = 5;

// The functions below start by passing the kernel parameters' address and their arguments
// through an empty asm statement: else ptxas's loop-invariant motion lifts their address
// arithmetic and parameter loads in front of the callers' column loops, and the head-dim-64 and
// -128 SPLIT forms spilled inside their entry loops (tests/gpu/test_gpu_sass.py).
#define BL_SPLIT_OPAQUE(p, ...)                       \
    const bwd_params *p##_at = &p##_in;               \
    asm volatile("" : "+l"(p##_at), __VA_ARGS__);     \
    const bwd_params &p = *p##_at

// Column (b, g, n)'s dK (times scale) and dV in the dtype: the sum of its `parts` partials, read
// by all THREADS consumer threads (`ct`) once every part is stored. One float4 of a key's
// partial row per thread: ROW_VECS threads a row, ROWS_PER_STEP keys at a time. One CTA reads
// the column's P x 256 KB (head dim 128), so the loads go out CHUNK keys x two parts at a time,
// unconditional (keys past Sk read the last key's row and store nothing): a row at a time, its
// parts in turn, the sums ran ~75 us a call longer than the separate kernel's ~40, and with
// each load behind its own key check ptxas still issued them two at a time
// (bench/results/bwd-s86-split-sum.txt).
template <typename T, int D>
__device__ __forceinline__ void ws_split_sum_rows(const bwd_params &p, int parts, int64_t b,
                                                  int64_t g, int64_t n, int ct) {
    const bl_bwd_dims &dm = p.dm;
    constexpr int ROW_VECS = D / 4;
    constexpr int ROWS_PER_STEP = THREADS / ROW_VECS;  // 8 (D = 128) or 16 (64)
    constexpr int STEPS = BN / ROWS_PER_STEP;
    constexpr int CHUNK = STEPS < 16 ? STEPS : 16;
    static_assert(THREADS % ROW_VECS == 0 && STEPS % CHUNK == 0, "whole chunks");
    const int64_t part_floats = dm.batch * dm.seqlen_k * dm.heads_k * D;
    const int64_t key_floats = dm.heads_k * D;
    const int64_t key0 = n * BN + ct / ROW_VECS;  // this thread's first key
    const int c = (ct % ROW_VECS) * 4;
#pragma unroll 1
    for (int x = 0; x < 2; ++x) {  // 0: dK, 1: dV
        const float *src = p.dkv_part + (int64_t)x * p.head_split * part_floats +
                           (b * dm.seqlen_k * dm.heads_k + g) * D + c;
        T *dst = x == 0 ? static_cast<T *>(p.dk) + b * p.dk_sb + g * p.dk_sh + c
                        : static_cast<T *>(p.dv) + b * p.dv_sb + g * p.dv_sh + c;
        const int64_t dst_key = x == 0 ? p.dk_ss : p.dv_ss;
        const float mul = x == 0 ? p.scale : 1.0f;
#pragma unroll 1
        for (int s0 = 0; s0 < STEPS; s0 += CHUNK) {
            const float *row[CHUNK];
#pragma unroll
            for (int i = 0; i < CHUNK; ++i) {
                const int64_t key = key0 + (s0 + i) * ROWS_PER_STEP;
                row[i] = src + (key < dm.seqlen_k ? key : dm.seqlen_k - 1) * key_floats;
            }
            // from +0 in part order, as the former reduction kernel summed: the same bits, and
            // the same in every call whatever order the parts end in
            float4 acc[CHUNK];
#pragma unroll
            for (int i = 0; i < CHUNK; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            int j = 0;
            for (; j < parts; j += 2) {
                const bool two = j + 1 < parts;
                float4 v0[CHUNK], v1[CHUNK];
#pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    v0[i] = __ldcg(reinterpret_cast<const float4 *>(row[i] + j * part_floats));
                    v1[i] = __ldcg(reinterpret_cast<const float4 *>(
                        row[i] + (two ? j + 1 : j) * part_floats));
                }
#pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    acc[i].x += v0[i].x; acc[i].y += v0[i].y;
                    acc[i].z += v0[i].z; acc[i].w += v0[i].w;
                    if (two) {
                        acc[i].x += v1[i].x; acc[i].y += v1[i].y;
                        acc[i].z += v1[i].z; acc[i].w += v1[i].w;
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < CHUNK; ++i) {
                const int64_t key = key0 + (s0 + i) * ROWS_PER_STEP;
                if (key >= dm.seqlen_k) continue;
                *reinterpret_cast<uint2 *>(dst + key * dst_key) =
                    make_uint2(bl_pack2<T>(acc[i].x * mul, acc[i].y * mul),
                               bl_pack2<T>(acc[i].z * mul, acc[i].w * mul));
            }
        }
    }
}

// Column (b, g, n)'s index in (B, Hk, Tn) order: its part counter in bwd_params::dkv_done
// (< 2^31: ws_decode).
__device__ __forceinline__ int ws_split_col(const bwd_params &p, int64_t b, int64_t g, int64_t n) {
    return (int)((b * p.dm.heads_k + g) * p.dm.tiles_n + n);
}

// Counts this CTA's part of column `col` (ws_split_col; read only in thread 0), called by
// all THREADS consumer threads once each has stored its partials; true in thread 0 where that
// completed the column's count.
__device__ __forceinline__ bool ws_split_count(const bwd_params &p, int parts, int col, int ct) {
    // Release: every thread's partial stores before the count (a fence, then the barrier that
    // orders them before thread 0's atomic).
    __threadfence();
    named_barrier_sync(WS_BAR_SPLIT_SUM, THREADS);
    if (ct != 0) return false;
    if (atomicAdd(p.dkv_done + col, 1) != parts - 1) return false;
    __threadfence();  // acquire: the other parts' partials
    return true;
}

// Head dim 64 (a CTA per column and part): the column's dK / dV where this CTA's part completed
// its count, at once.
template <typename T, int D>
__device__ __forceinline__ void ws_split_sum_column(const bwd_params &p_in, int64_t b, int64_t g,
                                                    int64_t n, int ct) {
    BL_SPLIT_OPAQUE(p, "+l"(b), "+l"(g), "+l"(n), "+r"(ct));
    const int parts = bl_bwd_split_parts(p.head_split, p.split_rule, p.totals);
    const int col = ws_split_col(p, b, g, n);
    const bool last = ws_split_count(p, parts, col, ct);
    if (!named_barrier_or(WS_BAR_SPLIT_SUM, THREADS, last)) return;
    __threadfence();  // (the partials are read past L1: ld.global.cg)
    ws_split_sum_rows<T, D>(p, parts, b, g, n, ct);
}

// The persistent head-dim-128 kernels count each column in their column loop
// (ws_split_count_column) and sum the columns whose count they completed after it
// (ws_split_sum_owned): summed in the loop, the sum's registers made ptxas spill inside the entry
// loops, inlined or called (tests/gpu/test_gpu_sass.py). Those columns form a list: its head in
// shared memory (an int at `s_split`, WS_SPLIT_HEAD in the mbarriers' area; -1 when empty),
// each column's link in its counter, which nothing reads again in the call. (Counting each
// column one column late, so that the count's fence would not wait for the column's own
// stores, was level on 2 x 16k x 8 q x 1 kv and +24 us on 16k x 32 q x 1 kv: the late counts
// hand the last columns' sums to the CTAs that end last; bench/results/bwd-s86-split-sum.txt.)
__device__ __forceinline__ void ws_split_list_init(uint32_t s_split) {  // thread 0, before
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_split), "r"(-1) : "memory");
}
__device__ __forceinline__ void ws_split_count_column(const bwd_params &p_in, int64_t b, int64_t g,
                                                      int64_t n, int ct, uint32_t s_split) {
    BL_SPLIT_OPAQUE(p, "+l"(b), "+l"(g), "+l"(n), "+r"(ct), "+r"(s_split));
    const int parts = bl_bwd_split_parts(p.head_split, p.split_rule, p.totals);
    const int col = ws_split_col(p, b, g, n);
    if (!ws_split_count(p, parts, col, ct)) return;
    int head;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(head) : "r"(s_split) : "memory");
    p.dkv_done[col] = head;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_split), "r"(col) : "memory");
}
// (A call, not inlined: after the column loop nothing is live across it, and its registers stay
// out of the kernel's allocation.)
template <typename T>
__device__ __noinline__ void ws_split_sum_owned(const bwd_params &p_in, int ct, uint32_t s_split) {
    BL_SPLIT_OPAQUE(p, "+r"(ct), "+r"(s_split));
    __threadfence();  // thread 0's links
    named_barrier_sync(WS_BAR_SPLIT_SUM, THREADS);
    const int parts = bl_bwd_split_parts(p.head_split, p.split_rule, p.totals);
    const int tn = (int)p.dm.tiles_n, hk = (int)p.dm.heads_k;
    int first;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(first) : "r"(s_split) : "memory");
    for (int col = first; col >= 0; col = __ldcg(p.dkv_done + col)) {
        const int bg = col / tn;
        ws_split_sum_rows<T, 128>(p, parts, bg / hk, bg % hk, col % tn, ct);
    }
}

#undef BL_SPLIT_OPAQUE

}  // namespace bl_bwd
