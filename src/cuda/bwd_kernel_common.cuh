// bwd_kernel_common.cuh -- what the backward's main-kernel variants share: the tile shape, the
// CTA shape and the kernel parameters. Included by attn_bwd_sm90.cu only.
#pragma once
#include <stdint.h>
#include <cuda.h>
#include "bwd_common.cuh"

namespace bl_bwd {

constexpr int BM = BL_BWD_TM;            // query rows per list entry
constexpr int BN = BL_BWD_TN;            // keys per CTA
constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
constexpr int KEYS_PER_WARP = BN / WARPS;  // 16: one mma M tile
constexpr int CHUNK = 8;                 // 16-bit elements in one 16-byte chunk
constexpr float LOG2E = 1.4426950408889634f;

static_assert(KEYS_PER_WARP == 16, "each warp owns one m16 tile of keys");
static_assert(BM == 64 && WARPS == 8, "the dQ product splits 64 rows x D over 8 warps as 4 x 2");

struct bwd_params {
    // Q and dO as (D, Sq, Hq, B) with (64, BM, 1, 1) boxes (tensor_map.cuh), for the kernels that
    // load row tiles with TMA; dq_accum as (D, Hq, Sq, B) fp32 with (32, 1, 16, 1) boxes, for
    // those kernels' dQ reduce-adds (dq_block_reduce); K and V as (D, Sk, Hk, B) with (64, BN,
    // 1, 1) boxes, for the persistent head-dim-128 kernel, which also stores dK and dV by TMA
    // (tm_dk, tm_dv: like K and V). Left unset where TMA cannot be used.
    // tm_q80 / tm_do80: Q and dO with (64, 80, 1, 1) boxes, for the 80-row kernel
    // (bwd_ws128r80_sm90.cuh); tm_qp[i] / tm_dop[i]: (64, 16 (i + 1), 1, 1) boxes, for its
    // packed entries (r80_tma_packed), which gather 80 rows from two 64-row tiles.
    CUtensorMap tm_q, tm_do, tm_dq, tm_k, tm_v, tm_dk, tm_dv, tm_q80, tm_do80;
    CUtensorMap tm_qp[3], tm_dop[3];
    const void *q, *k, *v, *dout;
    void *dk, *dv;
    int64_t q_sb, q_ss, q_sh;
    int64_t k_sb, k_ss, k_sh;
    int64_t v_sb, v_ss, v_sh;
    int64_t do_sb, do_ss, do_sh;
    int64_t dk_sb, dk_ss, dk_sh;
    int64_t dv_sb, dv_ss, dv_sh;
    const float *lse_log2;  // (B, Hq, Sq_pad)
    const float *dlt;       // (B, Hq, Sq_pad)
    const float *unkept_rows;  // bl_bwd_workspace::unkept_rows (the 80-row kernel's masked calls)
    float *dq_accum;        // (B, Sq, Hq, D) fp32 (8-column groups permuted by dq_block_stage)
    const int *counts, *lists, *schedule;
    const int *lists80;  // the 80-row entries of masked calls (bl_bwd_workspace::lists80)
    const int4 *sched_rec;  // the schedule as 16-byte records, for the persistent kernel's TMA
    int *sched_next;        // its work counter
    bl_bwd_dims dm;
    float scale;       // softmax scale (dK's factor)
    float scale_log2;  // scale * log2(e): S -> base-2 exponent
    // Masked head-dim-128 calls launch both the 64- and the 80-row kernel; each returns at once
    // unless bl_bwd_rows80_chosen(totals) picks it. NULL: the launched kernel runs.
    const unsigned long long *totals;
    int causal;
    // Version 10 on a masked call: bl_bwd_workspace::dq_writers, the list entries of each row
    // tile: a row tile's only entry stores its dQ (dq_block_reduce<true>) instead of adding it
    // into the zeros. NULL: every entry adds. Last, so that the other fields keep their offsets: a
    // shift changed ptxas's schedule of the causal 80-row kernel (+1.2 % under ncu,
    // bench/results/bwd-s26-dq-writers.txt).
    const uint8_t *dq_writers;
    // Version 10 on a masked call with dq_writers, where TMA can describe dq: the entries of a
    // light row tile (bl_bwd_dq16_tile) write their dQ (times scale) to dq itself, as 16-bit
    // values through tm_dq16 (dq as Q is: (64, BM, 1, 1) boxes) -- stored by a tile's only entry,
    // else reduce-added -- and the dq conversion neither reads nor writes that tile: 2 bytes per
    // element for a one-entry tile instead of 10 (4 stored into the accumulator, 4 read back and
    // 2 written by the conversion). 0: every entry goes to the accumulator. After dq_writers for the
    // same reason as it.
    int dq_direct;
    CUtensorMap tm_dq16;
    // The head-dim-64 kernel (one CTA per column and per SM): the CTA handed the SM after this
    // one takes schedule position blockIdx.x + prefetch_ahead (CTAs start in blockIdx order as
    // SMs free up), whose K / V and first pair this CTA prefetches into L2. 0: no prefetch.
    int prefetch_ahead;
    // The 80-row kernel's causal walks: query i sees key j where j <= i + diag. Sk - Sq on causal
    // calls; BL_BWD_DIAG_NONE where a non-causal call's dense walk (a dense call's; a masked
    // call's whose mask keeps every tile) takes the causal dense walk, whose loop measured 2-8 %
    // cheaper a tile than the non-causal one (bench/results/bwd-s63-causal-code-ab.txt run 4,
    // bwd-s64-nc-on-causal-walk.txt). Last, for the reason dq_writers gives.
    int64_t diag;
    // A split call (bl_bwd_head_split > 1; the SPLIT forms of the 80-row kernel's dense walk and
    // of version 10): each column's query heads in head_split parts, part j of a column its G / head_split heads from
    // j G / head_split, its dK / dV (unscaled) stored as fp32 partials into dkv_part,
    // (2, head_split, B, Sk, Hk, D). 1 / NULL elsewhere. Last, for the reason dq_writers gives.
    int head_split;
    float *dkv_part;
    // How many of the head_split parts a masked call uses (bl_bwd_split_parts with totals; its
    // records and partials keep head_split's layout). Last, for the reason dq_writers gives.
    bl_bwd_split_rule split_rule;
    // bl_bwd_workspace::sched_rec_low (NULL where the call has none: then it walks sched_rec),
    // walked in place of sched_rec where the totals say the call keeps little (ws_records).
    // Last, for the reason dq_writers gives.
    const int4 *sched_rec_low;
    // A split call's parts counted per column (bl_bwd_workspace::dkv_done): the CTA whose count
    // completes a column sums its partials (bwd_split_sum_sm90.cuh). Last, for the reason
    // dq_writers gives.
    int *dkv_done;
    // Version 10's DIRECT form: bl_bwd_workspace::dq_claims (ws_dq16_claim). Last, for the reason
    // dq_writers gives.
    unsigned *dq_claims;
};

// The schedule records a head-dim-128 kernel walks (read after the totals are complete).
__device__ __forceinline__ const int4 *ws_records(const bwd_params &p) {
    return p.sched_rec_low != nullptr && p.totals != nullptr && bl_bwd_low_keep(p.totals, p.dm)
               ? p.sched_rec_low
               : p.sched_rec;
}
// A diagonal no entry reaches: every cut of the causal walk falls below every element (room and
// cut stay 32-bit: Sq < 2^29 wherever it is used).
constexpr int64_t BL_BWD_DIAG_NONE = int64_t(1) << 30;

}  // namespace bl_bwd
