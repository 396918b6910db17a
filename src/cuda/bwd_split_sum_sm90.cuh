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
// parts end in -- and writes dK (times scale) and dV in the dtype, while the other SMs still
// work on other columns.
#pragma once
#include "bwd_kernel_common.cuh"
#include "bwd_ptx.cuh"
#include "ptx_sm90.cuh"

namespace bl_bwd {

// Named barrier of the consumer threads for the count (the kernels' others: 1-4).
constexpr int WS_BAR_SPLIT_SUM = 5;

// Called by all THREADS consumer threads (`ct` 0..THREADS-1) of a CTA once each has stored its
// partials of column (b, g, n); returns when the column is done, or this CTA is not its last.
// Not inlined: inlined, its address arithmetic was hoisted out of the callers' column loops and
// the head-dim-128 SPLIT forms spilled 14-23 registers inside their entry loops
// (dev/cuda/sass_loops.py).
template <typename T, int D>
__device__ __noinline__ void ws_split_sum_column(const bwd_params &p, int64_t b, int64_t g,
                                                    int64_t n, int ct) {
    const bl_bwd_dims &dm = p.dm;
    // Release: every thread's partial stores before the count (fence, then the barrier that
    // orders them before thread 0's atomic).
    __threadfence();
    named_barrier_sync(WS_BAR_SPLIT_SUM, THREADS);
    bool last = false;
    if (ct == 0) {
        const int parts = bl_bwd_split_parts(p.head_split, p.split_rule, p.totals);
        int *done = p.dkv_done + (b * dm.heads_k + g) * dm.tiles_n + n;
        last = atomicAdd(done, 1) == parts - 1;
    }
    if (!named_barrier_or(WS_BAR_SPLIT_SUM, THREADS, last)) return;
    __threadfence();  // acquire: the other parts' partials, read below past L1 (ld.global.cg)

    // One float4 of a partial row per thread and step: D / 4 threads a key's row, dK's BN rows
    // then dV's.
    constexpr int ROW_VECS = D / 4;
    constexpr int ROWS_PER_STEP = THREADS / ROW_VECS;
    static_assert(THREADS % ROW_VECS == 0 && (2 * BN) % ROWS_PER_STEP == 0, "whole steps");
    const int parts = bl_bwd_split_parts(p.head_split, p.split_rule, p.totals);
    const int64_t part_floats = dm.batch * dm.seqlen_k * dm.heads_k * D;
    const int c = (ct % ROW_VECS) * 4;
#pragma unroll 4
    for (int r = ct / ROW_VECS; r < 2 * BN; r += ROWS_PER_STEP) {
        const int x = r / BN;  // 0: dK, 1: dV
        const int64_t key = n * BN + r % BN;
        if (key >= dm.seqlen_k) continue;  // no partial there (ws_store_dkv_part)
        const float *src = p.dkv_part + (int64_t)x * p.head_split * part_floats +
                           ((b * dm.seqlen_k + key) * dm.heads_k + g) * D + c;
        // from +0, as the former reduction kernel summed (the same bits): a -0 partial sum gives +0
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j = 0; j < parts; ++j) {
            const float4 v = __ldcg(reinterpret_cast<const float4 *>(src + j * part_floats));
            acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
        }
        const float mul = x == 0 ? p.scale : 1.0f;
        T *dst = x == 0 ? static_cast<T *>(p.dk) + b * p.dk_sb + key * p.dk_ss + g * p.dk_sh + c
                        : static_cast<T *>(p.dv) + b * p.dv_sb + key * p.dv_ss + g * p.dv_sh + c;
        *reinterpret_cast<uint2 *>(dst) =
            make_uint2(bl_pack2<T>(acc.x * mul, acc.y * mul), bl_pack2<T>(acc.z * mul, acc.w * mul));
    }
}

}  // namespace bl_bwd
