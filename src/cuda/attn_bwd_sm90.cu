// attn_bwd_sm90.cu -- the block-sparse attention backward for sm_90a: host entry point
// bl_cuda_backward and the main-kernel launch.
//
// Stages (all on the caller's stream, scratch from the workspace): [selection W -> mask],
// per-key-tile lists and the heaviest-first schedule (bwd_lists_sm90.cu), preprocess Dlt / lse / dq
// accumulator (bwd_prepost_sm90.cu; it runs beside the three before it), the main kernel,
// postprocess dq.
//
// Main kernel: one CTA per (batch b, kv head g, key tile n of BN keys), launched heaviest first.
// It walks the compact list of kept (q head, row tile) pairs of its key tile, so skipped tiles
// cost neither loads nor math. Per list entry (64 query rows of one q head):
//   S^T  = K Q^T;  P^T = exp2(S^T * scale*log2e - lse*log2e), causal / length masked
//   dV  += P^T dO                 (registers, for the whole list)
//   dP^T = V dO^T; dS^T = P^T * (dP^T - Dlt)
//   dK  += dS^T Q                 (registers; times scale at the end)
//   dQ  += dS K                   (dS through shared memory; added into the workspace's fp32
//                                  accumulator: TMA reduce-adds, or atomics without TMA)
// Main kernels: wgmma, with a producer warpgroup that issues the TMA row-tile loads and the dQ
// reduce-adds: head dim 128 bwd_ws128_sm90.cuh, head dim 64 bwd_ws64_sm90.cuh (the same steps on
// two list entries at a time); dense head-dim-128 calls take 80 query rows per entry
// (bwd_ws128r80_sm90.cuh, version 11), masked ones too where the device finds that cheaper. Where tensor maps cannot describe Q, dO and
// the dq accumulator, both run with cp.async row tiles from every thread and fp32 atomics
// (bwd_wgmma_sm90.cuh version 4, bwd_wgmma64p_sm90.cuh). The earlier mma.sync kernel
// (dev/cuda/bwd_mma_sm90.cuh) is kept for the dev checker.
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "backend.h"
#include "cuda_check.cuh"
#include "bwd_common.cuh"
#include "bwd_kernel_common.cuh"
#include "tensor_map.cuh"
// The mma.sync kernel (version 2) is built only into the dev checker (-DBL_BWD_WITH_MMA_VARIANT),
// which compares both kernels; the library carries the wgmma kernel alone.
#ifdef BL_BWD_WITH_MMA_VARIANT
#include "bwd_mma_sm90.cuh"
#endif
#include "bwd_wgmma_sm90.cuh"
// Head dim 128 with TMA: version 10: version 6 with a producer warpgroup, the next S^T behind dQ, persistent.
#include "bwd_ws128_sm90.cuh"
// Head dim 128, dense calls (and masked ones where the device picks it): version 11, version 10
// on 80-row entries.
#include "bwd_ws128r80_sm90.cuh"
// Head dim 128, dev variant DQ_ROWS: dQ by row tiles (no dq accumulator), beside version 10
// without its dQ.
#include "bwd_dqrows_sm90.cuh"
// Head dim 64: version 3, two list entries per iteration (see its header for the measurements),
// and with TMA version 6, the same with a producer warpgroup and warpgroups that take turns.
#include "bwd_wgmma64p_sm90.cuh"
#include "bwd_ws64_sm90.cuh"
// Head dim 64, unsplit calls: version 6 persistent, one CTA per SM walking the columns (its
// rotated snake), with and without a causal mask. Causal calls took it in two steps. The
// hundred-and-fourteenth session gave it to causal calls of at most 8192 query rows (H100s,
// against a CTA a column, on the plain snake causal calls walked then; four-round windows since
// the hundred-and-thirteenth session: bench/results/bwd-s114-pcw4-causal.txt): 8 x 2k x 16 dense
// -6 %, 4 x 4k x 16 dense -2.8 %, video masks -1..-8 %, but random masks keeping 25 / 10 / 3 %
// +1.1 / +0.8 / +3.3 % there and 16k x 16 25 / 10 % +6 / +5 %, where the plain snake left the
// CTAs' loads uneven. The hundred-and-fifteenth turned the snake on causal calls too
// (ws64p_position) and gave the persistent form every causal call (H100, span against the
// library before, bench/results/bwd-s115-causal-rotate.txt): 4 x 4k x 16 random 25 / 10 / 3 %
// -8 / -10 / -11 %, 2 x 8k 25 / 10 % -6 %, 16k 25 / 10 / 3 / 0.8 % -1.2 / -3.7 / -7.7 / -8.8 %,
// negl 0.2 -2 %, 32k 1 % -5 %, dense level at every length; in the bench's 16k rows those keeping
// 25 % and more 0.3-1.3 % slower (bench-2026-12-06-s115-ab-h100.txt), the price of the low keeps'.
#include "bwd_ws64p_sm90.cuh"
// Dev builds only: -DBL_BWD_WS64P_MAX_CTAS=N runs the persistent version 6 on at most N CTAs (a
// small cap makes every CTA walk many columns, for the checks); -DBL_BWD_WS64_PER_COLUMN runs
// version 6 with a CTA a column on every unsplit call (the form before, for A/B timings).
#ifndef BL_BWD_WS64P_MAX_CTAS
#define BL_BWD_WS64P_MAX_CTAS 0
#endif

namespace bl_bwd {

// Which main kernel bl_cuda_backward launches (bl_bwd_set_variant, for the dev checker).
static int g_variant = BL_BWD_VARIANT_WGMMA;

// The one-CTA link between the persistent head-dim-64 kernel's two chained forms (DQ16 first,
// the plain one behind it): the DQ16 form's programmatic dependent, it lets the plain form launch
// at once and completes only once the DQ16 form has, so that the plain form's wait still orders
// it after the DQ16 form. Why: a picked plain form launched straight behind the DQ16 form's
// (returning) grid ran 6-8 us longer (not understood); behind the link a 16k x 16 x 64 call
// picking it is 4-10 us shorter and one picking the DQ16 form level. Version 10's two forms at
// head dim 128 measured level with it (non-causal 25 / 3 % kept, where the 80-row or the DIRECT
// form ran: in front of no picked kernel) and do without for now.
// (bench/results/bwd-s119-gate16-spacer.txt)
constexpr int CHAIN_LINK_THREADS = 32;
__global__ void __launch_bounds__(CHAIN_LINK_THREADS) bl_bwd_chain_link_kernel() {
    griddep_launch_dependents();
    griddep_wait();
}
static bl_status launch_chain_link(cudaStream_t stream) {
    BL_CUDA_CHECK(bl_launch(bl_bwd_chain_link_kernel, dim3(1), dim3(CHAIN_LINK_THREADS), 0, stream,
                            /*dependent=*/true));
    return BL_OK;
}
// At head dim 64 p.dq_direct belongs to the unsplit persistent kernel alone (bl_cuda_backward's
// ws64p_direct repeats launch_main's choice of it): on any other kernel the conversion would skip
// light tiles whose dQ that kernel added into the fp32 accumulator.
static bl_status dq16_without_ws64p() {
    return bl_set_error(BL_ERR_INTERNAL,
                        "bl_cuda_backward: head-dim-64 DQ16 zeros without the persistent kernel");
}

// tma_rows: p.tm_q, p.tm_do and p.tm_dq are valid; tma_kv: p.tm_k, p.tm_v, p.tm_dk and p.tm_dv
// too (the head-dim-64 kernel uses the last two). *dq_cols_permuted: the kernel launched
// added dQ through dq_block_stage's staging (TMA reduce-adds), whose column order the dq
// postprocess undoes; the others add with atomics in the natural order. without_dq: the dq-rows
// kernel computes dQ (version 10 runs without it; only with tma_rows and tma_kv at head dim 128).
template <typename T, int D>
bl_status launch_main(const bwd_params &p, bool tma_rows, bool tma_kv, int64_t num_cols,
                      cudaStream_t stream, bool *dq_cols_permuted, bool without_dq = false) {
    *dq_cols_permuted = false;
#ifdef BL_BWD_WITH_MMA_VARIANT
    if (g_variant == BL_BWD_VARIANT_MMA) {
        const size_t smem = smem_layout<D>::BYTES;
        BL_CUDA_CHECK(cudaFuncSetAttribute(bwd_mma_kernel<T, D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        bwd_mma_kernel<T, D><<<(unsigned)num_cols, THREADS, smem, stream>>>(p);
        BL_CUDA_CHECK_LAUNCH("bwd_mma_kernel");
        return BL_OK;
    }
#endif
    // The shipped kernels load their row tiles with TMA where the tensor maps could be made;
    // else, and on request (CPASYNC_ROWS), with cp.async from every thread.
    const bool tma = tma_rows && g_variant != BL_BWD_VARIANT_CPASYNC_ROWS;
    if (D == 64 && tma && tma_kv && g_variant != BL_BWD_VARIANT_WGMMA64_V1 &&
        g_variant != BL_BWD_VARIANT_WGMMA64_V4) {
        const size_t smem = wg64p_smem::BYTES;
        // a split call (bl_bwd_head_split): its SPLIT form, a CTA per (column, part)
        const bool split = p.head_split > 1;
#ifndef BL_BWD_WS64_PER_COLUMN
        if (!split) {
            int sms = 0;
            BL_TRY(bl_sm_count(&sms));
            const int64_t cap = BL_BWD_WS64P_MAX_CTAS > 0 ? BL_BWD_WS64P_MAX_CTAS : sms;
            const int64_t grid = num_cols < cap ? num_cols : cap;
            // With p.dq_direct (a masked call) the DQ16 form first, the preprocess's programmatic
            // dependent, then the link (launch_chain_link) and the plain form, each the dependent
            // of the one before; the device picks one form (p.totals), the other returns at once
            // (bwd_ws64p_kernel).
            if (p.dq_direct) {
                // (the DQ16 form runs only where the totals pick it: without them both would run)
                if (p.totals == nullptr)
                    return bl_set_error(BL_ERR_INTERNAL,
                                        "bl_cuda_backward: head-dim-64 DQ16 form without totals");
                BL_CUDA_CHECK(cudaFuncSetAttribute(bwd_ws64p_kernel<T, true>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)WS64P_SMEM_BYTES));
                BL_CUDA_CHECK(bl_launch(bwd_ws64p_kernel<T, true>, dim3((unsigned)grid),
                                        dim3(WS_THREADS), WS64P_SMEM_BYTES, stream,
                                        /*dependent=*/true, p));
                BL_TRY(launch_chain_link(stream));
            }
            BL_CUDA_CHECK(cudaFuncSetAttribute(bwd_ws64p_kernel<T>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)WS64P_SMEM_BYTES));
            // (a programmatic dependent of the link behind the DQ16 form where there is one, else
            // of the preprocess; it waits exactly where p.totals is set, as version 10's forms)
            BL_CUDA_CHECK(bl_launch(bwd_ws64p_kernel<T>, dim3((unsigned)grid), dim3(WS_THREADS),
                                    WS64P_SMEM_BYTES, stream, p.totals != nullptr, p));
            *dq_cols_permuted = true;
            return BL_OK;
        }
#endif
        if (p.dq_direct) return dq16_without_ws64p();
        auto kernel = split ? bwd_ws64_kernel<T, true> : bwd_ws64_kernel<T>;
        BL_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        bwd_params pk = p;
        int sms = 0;
        BL_TRY(bl_sm_count(&sms));
        pk.prefetch_ahead = sms;  // one CTA per SM (200 KB of shared memory)
        const int64_t ctas = split ? num_cols * p.head_split : num_cols;
        kernel<<<(unsigned)ctas, WS_THREADS, smem, stream>>>(pk);
        BL_CUDA_CHECK_LAUNCH("bwd_ws64_kernel");
        *dq_cols_permuted = true;
        return BL_OK;
    }
    if (D == 64 && p.dq_direct) return dq16_without_ws64p();
    if (D == 64 && g_variant != BL_BWD_VARIANT_WGMMA64_V1) {
        const size_t smem = wg64p_smem::BYTES;
        auto kernel = tma ? bwd_wgmma64p_kernel<T, true> : bwd_wgmma64p_kernel<T, false>;
        *dq_cols_permuted = tma;
        BL_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<(unsigned)num_cols, THREADS, smem, stream>>>(p);
        BL_CUDA_CHECK_LAUNCH("bwd_wgmma64p_kernel");
        return BL_OK;
    }
    if constexpr (D == 128) {
        if (tma && tma_kv && g_variant != BL_BWD_VARIANT_WGMMA128_V3B &&
            g_variant != BL_BWD_VARIANT_WGMMA128_V6) {
            const size_t smem = WS_SMEM_BYTES;
            // Without a causal mask and with whole key tiles no entry is masked (KEYS_FULL).
            const bool keys_full = bl_bwd_keys_full(p.dm, p.causal != 0);
            // a split call (bl_bwd_head_split): its SPLIT form, a draw per (column, part)
            const bool split = p.head_split > 1 && !without_dq;
            if (split) num_cols *= p.head_split;
            auto kernel = without_dq  ? bwd_ws128_kernel<T, false>
                          : split     ? (keys_full ? bwd_ws128_kernel<T, true, false, true, true>
                                                   : bwd_ws128_kernel<T, true, false, false, true>)
                          : keys_full ? bwd_ws128_kernel<T, true, false, true>
                                      : bwd_ws128_kernel<T, true>;
            // Persistent: one CTA per SM walks the schedule (at most one fits: 227 KB).
            int sms = 0;
            BL_TRY(bl_sm_count(&sms));
            const int64_t ctas = g_variant == BL_BWD_VARIANT_WS128_FEW_CTAS ? 3 : sms;
            const int64_t grid = num_cols < ctas ? num_cols : ctas;
            // With p.dq_direct the DIRECT form first: the device picks one of the two, the
            // other returns at once (bl_bwd_dq_direct_chosen). On a masked call (p.totals set)
            // each form is the programmatic dependent of the kernel before it: the first waits
            // for the preprocess before it reads the totals and lets the second launch only
            // then (bwd_ws128_kernel), so that the second's launch, and the 80-row kernels'
            // behind it, no longer wait for the first to complete. (The forty-ninth session
            // measured the second as a dependent 6-11 us slower where picked, when the first
            // released it before its wait: bench/results/bwd-s53-direct-threshold.txt.)
            const bool dependent = p.totals != nullptr;
            if (p.dq_direct && !without_dq && !split) {
                auto direct = keys_full ? bwd_ws128_kernel<T, true, true, true>
                                        : bwd_ws128_kernel<T, true, true>;
                BL_CUDA_CHECK(cudaFuncSetAttribute(
                    direct, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                BL_CUDA_CHECK(bl_launch(direct, dim3((unsigned)grid), dim3(WS_THREADS), smem,
                                        stream, dependent, p));
            }
            BL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
            BL_CUDA_CHECK(bl_launch(kernel, dim3((unsigned)grid), dim3(WS_THREADS), smem, stream,
                                    dependent, p));
            *dq_cols_permuted = true;
            return BL_OK;
        }
    }
    // Version 3b at D = 64 (WGMMA64_V1) and on request at D = 128; at D = 128 version 6 (TMA row
    // tiles and dQ reduce-adds) on request, or version 4 without TMA.
    auto kernel = bwd_wgmma_kernel<T, D, false, false>;
    if constexpr (D == 128)
        if (g_variant != BL_BWD_VARIANT_WGMMA128_V3B) {
            kernel = tma ? bwd_wgmma_kernel<T, D, true, true> : bwd_wgmma_kernel<T, D, true, false>;
            *dq_cols_permuted = tma;
        }
    const size_t smem = wg_smem<D>::BYTES;
    BL_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<(unsigned)num_cols, THREADS, smem, stream>>>(p);
    BL_CUDA_CHECK_LAUNCH("bwd_wgmma_kernel");
    return BL_OK;
}

// The 80-row kernel's instantiation for a walk: the causal walk (a causal call's, or a
// non-causal dense call's with an unreachable diagonal), the non-causal masked walks with or
// without key-limit selects (KEYS_FULL); SPLIT: a split call's forms (bl_bwd_head_split).
template <typename T, bool SPLIT>
static void (*rows80_kernel(bool causal_walk, bool keys_full, r80_entries entries))(bwd_params) {
    if (causal_walk)
        return entries == R80_LISTS    ? bwd_ws128r80_kernel<T, true, R80_LISTS, false, SPLIT>
               : entries == R80_PACKED ? bwd_ws128r80_kernel<T, true, R80_PACKED, false, SPLIT>
                                       : bwd_ws128r80_kernel<T, true, R80_DENSE, false, SPLIT>;
    if (entries == R80_MASKED)
        return keys_full ? bwd_ws128r80_kernel<T, false, R80_MASKED, true, SPLIT>
                         : bwd_ws128r80_kernel<T, false, R80_MASKED, false, SPLIT>;
    if (entries == R80_PACKED)
        return keys_full ? bwd_ws128r80_kernel<T, false, R80_PACKED, true, SPLIT>
                         : bwd_ws128r80_kernel<T, false, R80_PACKED, false, SPLIT>;
    return bwd_ws128r80_kernel<T, false, R80_DENSE, false, SPLIT>;
}

// Version 11 (bwd_ws128r80_sm90.cuh) on a persistent grid (p.tm_q80 / p.tm_do80 set; in a
// masked call p.tm_qp / p.tm_dop too), walking `entries` (r80_entries): R80_DENSE, or a masked
// call's p.lists80 (R80_LISTS with a causal mask, R80_MASKED without) or packed entries.
template <typename T>
bl_status launch_rows80(const bwd_params &p, r80_entries entries, int64_t num_cols,
                        cudaStream_t stream) {
    // a split call (bl_bwd_head_split): the SPLIT forms, a draw per (column, part)
    const bool split = p.head_split > 1;
    if (split) num_cols *= p.head_split;
    const size_t smem = r80_smem::BYTES;
    // a non-causal call's dense walk with a diagonal no entry reaches takes the causal one
    const bool causal_walk = p.causal || p.diag == BL_BWD_DIAG_NONE;
    // a non-causal masked call's walks without the key-limit selects where Sk fills whole columns
    const bool keys_full = bl_bwd_keys_full(p.dm, false);
    auto kernel = split ? rows80_kernel<T, true>(causal_walk, keys_full, entries)
                        : rows80_kernel<T, false>(causal_walk, keys_full, entries);
    BL_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int sms = 0;
    BL_TRY(bl_sm_count(&sms));
    const bool few = g_variant == BL_BWD_VARIANT_WS128_FEW_CTAS ||
                     g_variant == BL_BWD_VARIANT_WS128_ROWS80;
    const int64_t ctas = few ? 3 : sms;
    const int64_t grid = num_cols < ctas ? num_cols : ctas;
    // On a masked call (p.totals set) a programmatic dependent launch behind the kernel before
    // it (version 10, or this one on a masked call's entries), so that its launch overlaps that
    // kernel's run (the sparse calls, where microseconds count); where picked the kernel waits
    // for the other to complete, where not its CTA 0 alone does (bwd_ws128r80_kernel).
    BL_CUDA_CHECK(bl_launch(kernel, dim3((unsigned)grid), dim3(WS_THREADS), smem, stream,
                            p.totals != nullptr, p));
    return BL_OK;
}

// The dq-rows kernel's shared memory for a call (its key tiles' step list grows with Tn), and
// whether the SM has that much (227 KB).
constexpr size_t DQR_MAX_SMEM = 232448;
size_t dqrows_smem(int64_t head_dim, int64_t tiles_n) {
    return head_dim == 64 ? dqr_smem<64>::bytes(tiles_n) : dqr_smem<128>::bytes(tiles_n);
}

// The dq-rows kernel (bwd_dqrows_sm90.cuh): one CTA per (b, q head, row tile).
template <typename T, int D>
bl_status launch_dqrows(const dqrows_params &rp, cudaStream_t stream) {
    const bl_bwd_dims &dm = rp.dm;
    const size_t smem = dqrows_smem(D, dm.tiles_n);
    if (smem > DQR_MAX_SMEM)
        return bl_set_error(BL_ERR_UNSUPPORTED, "dq-rows kernel: %lld key tiles need %zu bytes of "
                            "shared memory", (long long)dm.tiles_n, smem);
    BL_CUDA_CHECK(cudaFuncSetAttribute(bwd_dqrows_kernel<T, D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t grid = dm.batch * dm.heads_q * dm.tiles_m;
    bwd_dqrows_kernel<T, D><<<(unsigned)grid, DQR_THREADS, smem, stream>>>(rp);
    BL_CUDA_CHECK_LAUNCH("bwd_dqrows_kernel");
    return BL_OK;
}

// dq_accum (B, Sq, Hq, D) fp32 to TMA as (D, Hq, Sq, B) with (32, 1, 16, 1) boxes: one warp's 16
// rows x 32 columns, 128 bytes wide for the 128B swizzle.
bool make_dq_accum_map(CUtensorMap *map, const bl_bwd_dims &dm, float *dq_accum) {
    constexpr uint32_t BOX_COLS = 32, BOX_ROWS = 16;
    const int64_t f = sizeof(float);
    const int64_t dims[4] = {dm.head_dim, dm.heads_q, dm.seqlen_q, dm.batch};
    const int64_t strides[3] = {dm.head_dim * f, dm.heads_q * dm.head_dim * f,
                                dm.seqlen_q * dm.heads_q * dm.head_dim * f};
    const uint32_t box[4] = {BOX_COLS, 1, BOX_ROWS, 1};
    return bl_encode_tensor_map_4d(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, dq_accum, dims, strides, box);
}

// The kernels move rows in 16-byte vectors: data 16-byte aligned, strides multiples of 8.
bl_status check_vec_aligned(const char *name, bl_tensor t) {
    if (((uintptr_t)t.data & 15u) != 0 || t.stride_b % CHUNK || t.stride_s % CHUNK ||
        t.stride_h % CHUNK)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "%s: the CUDA backward needs 16-byte aligned rows (data %p, strides "
                            "%lld/%lld/%lld elements must be multiples of %d)",
                            name, t.data, (long long)t.stride_b, (long long)t.stride_s,
                            (long long)t.stride_h, CHUNK);
    return BL_OK;
}

}  // namespace bl_bwd

using namespace bl_bwd;

void bl_bwd_set_variant(int variant) { g_variant = variant; }

extern "C" bl_status bl_cuda_backward(const bl_attn_desc *d, bl_tensor q, bl_tensor k,
                                      bl_tensor v, bl_tensor out, bl_tensor dout,
                                      const float *lse, const float *tile_mass, float negl_prob,
                                      const uint8_t *mask, bl_tensor dq, bl_tensor dk,
                                      bl_tensor dv) {
    if (!bl_cuda_available())
        return bl_set_error(BL_ERR_NO_BACKEND,
                            "bl_backward: no CUDA device of compute capability 9.0 is usable "
                            "(the CUDA backward needs an H100/H200 and a working driver)");
    BL_TRY(bl_cuda_supports("CUDA backward", d->dtype, d->head_dim));
    BL_TRY(check_vec_aligned("q", q));
    BL_TRY(check_vec_aligned("k", k));
    BL_TRY(check_vec_aligned("v", v));
    BL_TRY(check_vec_aligned("out", out));
    BL_TRY(check_vec_aligned("dout", dout));
    BL_TRY(check_vec_aligned("dq", dq));
    BL_TRY(check_vec_aligned("dk", dk));
    BL_TRY(check_vec_aligned("dv", dv));
    if (mask == NULL && negl_prob > 0.0f && tile_mass == NULL)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "tile_mass is NULL but negl_prob = %g asks for selection", negl_prob);

    const bl_bwd_dims dm = bl_bwd_make_dims(d);
    const size_t need = bl_bwd_workspace_layout(dm, NULL, NULL);
    if (d->workspace == NULL || d->workspace_bytes < need)
        return bl_set_error(BL_ERR_WORKSPACE,
                            "desc->workspace: %zu bytes at %p, the CUDA backward needs %zu",
                            d->workspace_bytes, d->workspace, need);
    // The layout's slack lets the pieces start on 256-byte boundaries whatever the base.
    uintptr_t base = ((uintptr_t)d->workspace + 255u) & ~(uintptr_t)255u;
    bl_bwd_workspace ws;
    bl_bwd_workspace_layout(dm, (void *)base, &ws);
    cudaStream_t stream = (cudaStream_t)d->stream;

    const uint8_t *tiles = mask;  // NULL: dense
    // The selection's rows are latency-bound (sequential sums): the preprocess runs beside it
    // (see the launches below).
    const bool selecting = mask == NULL && negl_prob > 0.0f;
    if (selecting) {
        BL_TRY(bl_select_launch(dm, tile_mass, negl_prob, ws.mask, stream));
        tiles = ws.mask;
    }

    bwd_params p;
    p.q = q.data; p.k = k.data; p.v = v.data; p.dout = dout.data;
    p.dk = dk.data; p.dv = dv.data;
    p.q_sb = q.stride_b; p.q_ss = q.stride_s; p.q_sh = q.stride_h;
    p.k_sb = k.stride_b; p.k_ss = k.stride_s; p.k_sh = k.stride_h;
    p.v_sb = v.stride_b; p.v_ss = v.stride_s; p.v_sh = v.stride_h;
    p.do_sb = dout.stride_b; p.do_ss = dout.stride_s; p.do_sh = dout.stride_h;
    p.dk_sb = dk.stride_b; p.dk_ss = dk.stride_s; p.dk_sh = dk.stride_h;
    p.dv_sb = dv.stride_b; p.dv_ss = dv.stride_s; p.dv_sh = dv.stride_h;
    p.lse_log2 = ws.lse_log2;
    p.dlt = ws.dlt;
    p.unkept_rows = ws.unkept_rows;
    p.dq_accum = ws.dq_accum;
    p.counts = ws.counts;
    p.lists = ws.lists;
    p.lists80 = ws.lists80;
    p.totals = NULL;
    p.schedule = ws.schedule;
    p.sched_rec = ws.sched_rec;
    p.sched_rec_low = NULL;  // the schedule launch's (below)
    p.sched_next = ws.sched_next;
    p.prefetch_ahead = 0;
    p.dm = dm;
    p.scale = d->scale;
    p.scale_log2 = d->scale * LOG2E;
    p.causal = d->causal;
    p.diag = dm.seqlen_k - dm.seqlen_q;
    p.head_split = 1;
    p.dkv_part = NULL;
    p.dkv_done = NULL;
    const int64_t num_cols = dm.batch * dm.heads_k * dm.tiles_n;
    const bool bf16 = d->dtype == BL_DTYPE_BF16;
    const bool tma_rows =
        bl_make_tensor_map(&p.tm_q, q, dm.batch, dm.seqlen_q, dm.heads_q, d->head_dim, BM, bf16) &&
        bl_make_tensor_map(&p.tm_do, dout, dm.batch, dm.seqlen_q, dm.heads_q, d->head_dim, BM, bf16) &&
        make_dq_accum_map(&p.tm_dq, dm, ws.dq_accum);
    // Where TMA cannot describe K, V, dK or dV, head dim 128 runs version 6 (cp.async K / V loads,
    // dK / dV stored from registers) and head dim 64 the paired kernel (version 4).
    const bool tma_kv =
        tma_rows &&
        bl_make_tensor_map(&p.tm_k, k, dm.batch, dm.seqlen_k, dm.heads_k, d->head_dim, BN, bf16) &&
        bl_make_tensor_map(&p.tm_v, v, dm.batch, dm.seqlen_k, dm.heads_k, d->head_dim, BN, bf16) &&
        bl_make_tensor_map(&p.tm_dk, dk, dm.batch, dm.seqlen_k, dm.heads_k, d->head_dim, BN, bf16) &&
        bl_make_tensor_map(&p.tm_dv, dv, dm.batch, dm.seqlen_k, dm.heads_k, d->head_dim, BN, bf16);
    // The dq-rows path: the deterministic form (bl_attn_desc::deterministic), or the dev variant
    // DQ_ROWS (head dim 128). dq by the dq-rows kernel (64-key K / V boxes, dq as a 16-bit tensor
    // map), one CTA a row tile summing its key tiles in order; dK / dV by one CTA a column, or
    // a split call's parts summed in part order: no sum whose order depends on which CTA
    // finishes first. At head dim 128 no dq accumulator and no preprocess: the dq-rows kernel
    // first (it writes the Dlt / lse rows version 10 reads), then version 10 without its dQ, no
    // 80-row kernels. At head dim 64 the call runs as usual (version 6's dQ goes to the
    // accumulator, unread) and the dq-rows kernel in place of the postprocess.
    const bool dq_rows_wanted =
        tma_kv && dqrows_smem(d->head_dim, dm.tiles_n) <= DQR_MAX_SMEM &&
        (d->deterministic || (g_variant == BL_BWD_VARIANT_DQ_ROWS && d->head_dim == 128));
    // Head-dim-128 calls run version 11 on 80-row entries, with Q / dO maps of 80-row boxes and
    // its own dq accumulator layouts: dense calls always; masked and selected calls where their
    // 80-row entries cost less than their 64-row ones (bl_bwd_rows80_cheaper): aligned entries,
    // or packed ones where those cost less (bl_bwd_packed_chosen: the kept 64-row tiles end to
    // end, Q / dO by pieces), and the dense walk where a mask keeps every tile (every tile a
    // causal mask allows: bl_bwd_masked_full). Only the device knows the lists, so
    // version 10 and the 80-row kernels of a masked call are all launched and those not picked
    // return at once; the postprocess reads the same choice (BL_DQ_CHOSEN, BL_DQ_PACKED). Dev
    // variants force a kernel (the 80-row one on aligned entries).
    bool rows80 =
        d->head_dim == 128 && tma_kv && !dq_rows_wanted &&
        (g_variant == BL_BWD_VARIANT_WGMMA || g_variant == BL_BWD_VARIANT_WS128_FEW_CTAS ||
         g_variant == BL_BWD_VARIANT_WS128_ROWS80) &&
        bl_make_tensor_map(&p.tm_q80, q, dm.batch, dm.seqlen_q, dm.heads_q, d->head_dim, BM80, bf16) &&
        bl_make_tensor_map(&p.tm_do80, dout, dm.batch, dm.seqlen_q, dm.heads_q, d->head_dim, BM80, bf16);
    const bool masked = tiles != NULL;
    dqrows_params rp;
    bool dq_rows = false;
    if (dq_rows_wanted) {
        const int64_t D = d->head_dim;
        rp.tm_q = p.tm_q;
        rp.tm_do = p.tm_do;
        rp.mask = tiles;
        rp.out = (const uint16_t *)out.data;
        rp.out_sb = out.stride_b;
        rp.out_ss = out.stride_s;
        rp.out_sh = out.stride_h;
        rp.lse = lse;
        rp.lse_log2 = ws.lse_log2;
        rp.dlt = ws.dlt;
        rp.dm = dm;
        rp.scale = d->scale;
        rp.scale_log2 = p.scale_log2;
        rp.causal = d->causal;
        dq_rows = bl_make_tensor_map(&rp.tm_k, k, dm.batch, dm.seqlen_k, dm.heads_k, D, DQR_KEYS, bf16) &&
                  bl_make_tensor_map(&rp.tm_v, v, dm.batch, dm.seqlen_k, dm.heads_k, D, DQR_KEYS, bf16) &&
                  bl_make_tensor_map(&rp.tm_dq, dq, dm.batch, dm.seqlen_q, dm.heads_q, D, DQR_ROWS, bf16);
    }
    // Refused where nothing of the form can run: before any output is written (the selection,
    // if any, wrote only the workspace).
    if (d->deterministic && !dq_rows)
        return bl_set_error(BL_ERR_NOT_DETERMINISTIC,
                            "desc->deterministic = 1: the deterministic form needs q, k, v, dout "
                            "and dq that TMA can describe (dims below 2^32, 16-byte aligned rows) "
                            "and at most %zu bytes of shared memory for the key tiles' steps, got "
                            "seqlen_k = %lld", DQR_MAX_SMEM, (long long)dm.seqlen_k);
    const bool dq_rows_first = dq_rows && d->head_dim == 128;  // else after the main kernel

    for (int i = 0; rows80 && masked && i < 3; ++i) {
        const uint32_t box = (uint32_t)(R80_PACKED_BOX * (i + 1));
        rows80 = bl_make_tensor_map(&p.tm_qp[i], q, dm.batch, dm.seqlen_q, dm.heads_q,
                                    d->head_dim, box, bf16) &&
                 bl_make_tensor_map(&p.tm_dop[i], dout, dm.batch, dm.seqlen_q, dm.heads_q,
                                    d->head_dim, box, bf16);
    }
    // A masked call's aligned 80-row entries are list codes hl << 20 | m << 2 | bits
    // (bwd_lists_sm90.cu): calls too long or too grouped for that encoding keep version 10 alone.
    if (masked && !bl_bwd_r80_lists_fit(dm)) rows80 = false;
    const bool forced = g_variant == BL_BWD_VARIANT_WS128_ROWS80;  // no choice: 80 rows, aligned
    // A call whose columns are too few for the SMs splits each column's query heads
    // (bl_bwd_head_split): every kernel it launches in its SPLIT form (a part's entries are one
    // run of the column's lists: they hold each head's entries together), except version 10's
    // DIRECT form, which such a call does without.
    const bool v10_ships = d->head_dim == 128 && tma_kv && !dq_rows &&
                           (g_variant == BL_BWD_VARIANT_WGMMA ||
                            g_variant == BL_BWD_VARIANT_WS128_FEW_CTAS ||
                            g_variant == BL_BWD_VARIANT_WS128_ROWS64);
    // head dim 64: the TMA kernel (version 6), one CTA per (column, part)
    const bool ws64_ships = d->head_dim == 64 && tma_kv &&
                            (g_variant == BL_BWD_VARIANT_WGMMA ||
                             g_variant == BL_BWD_VARIANT_WS128_FEW_CTAS);
    if (ws64_ships ||
        (v10_ships && (masked || rows80 || g_variant == BL_BWD_VARIANT_WS128_ROWS64))) {
        p.head_split = bl_bwd_head_split(dm, d->causal != 0);
        if (p.head_split > 1 && (ws.dkv_part == NULL || ws.dkv_done == NULL))
            return bl_set_error(BL_ERR_INTERNAL, "head split %d without partials", p.head_split);
    }
    // A masked call may use fewer of those parts, picked on the device from its totals.
    BL_TRY(bl_bwd_split_rule_make(dm, d->causal != 0, p.head_split, &p.split_rule));
    bl_dq_layout layout = BL_DQ_ROWS;
    if (dq_rows_first)
        layout = BL_DQ_NONE;
    else if (rows80 && !masked)
        layout = BL_DQ_TILES80;
    else if (rows80 && d->causal)
        layout = forced ? BL_DQ_TILES80 : BL_DQ_CHOSEN;
    else if (rows80)
        layout = forced ? BL_DQ_TILES80G : BL_DQ_PACKED;
    // The small kernels in the order of their inputs, each the programmatic dependent of the one
    // before: [selection ->] lists (the mask) -> schedule (the counts; the lists kernel zeroes
    // the totals it sums) -> preprocess. Each lets its dependent start at once and waits for the
    // one before it where it needs it, so the preprocess (bandwidth-bound: Dlt, the
    // accumulator's zeros; it touches nothing the others read or write) runs beside all of
    // them, and waits for the schedule before it completes: the main kernel, launched behind it,
    // sees everything. With the preprocess in the middle (before the schedule), the schedule's
    // ~4-8 us and a launch were on the call's critical path (bench/results/
    // bwd-s49-fixed-chain.txt); before that, with the lists kernel after the preprocess, the
    // lists' ~3-20 us (bwd-s24-fixed-costs.txt).
    const bool lists80 = rows80 && masked;
    // The persistent head-dim-64 kernel (launch_main's choice for an unsplit call) on a masked
    // call: its light row tiles write dq in 16-bit (bwd_params::dq_direct, bwd_ws64p_sm90.cuh),
    // from the entries of each row tile the lists kernel counts.
#ifdef BL_BWD_WS64_PER_COLUMN
    const bool ws64p_direct = false;
#else
    const bool ws64p_direct = masked && d->head_dim == 64 && tma_rows && tma_kv && !dq_rows &&
                              p.head_split == 1 && g_variant != BL_BWD_VARIANT_CPASYNC_ROWS &&
                              g_variant != BL_BWD_VARIANT_WGMMA64_V1 &&
                              g_variant != BL_BWD_VARIANT_WGMMA64_V4 &&
                              bl_bwd_list_runs(dm) <= BL_BWD_WRITER_RUNS;
#endif
    // Masked calls whose kernel the device picks count each row tile's entries in the lists
    // kernel (bl_bwd_dq_writers_used), and those ws64p_direct takes; for the others it stays NULL.
    if (!bl_bwd_dq_writers_used(dm, layout) && !ws64p_direct) ws.dq_writers = NULL;
    BL_TRY(bl_bwd_lists_launch(dm, d->causal, tiles, lists80, selecting, &ws, stream));
    const int carveout = bl_bwd_chain_carveout(selecting);
    p.dkv_part = ws.dkv_part;
    p.dkv_done = ws.dkv_done;
    p.dq_writers = ws.dq_writers;
    p.dq_claims = ws.dq_claims;
    // Version 10's DIRECT form is a candidate (bwd_params::dq_direct: its light row tiles write dq
    // itself) where TMA can describe dq. The device picks it or not (bl_bwd_dq_direct_chosen),
    // and the zeros with it: the schedule publishes the pick, the preprocess's zero CTAs read it.
    // At head dim 64 (ws64p_direct) the same for the persistent kernel's DQ16 form, which the
    // device picks from the call's totals (bl_bwd_ws64p_dq16_chosen), a warp's 16 rows a copy
    // (WS64P_DQ16_ROWS).
    p.dq_direct = !dq_rows_first && p.head_split == 1 && ws.dq_writers != NULL &&
                  (d->head_dim == 128 || ws64p_direct) &&
                  bl_make_tensor_map(&p.tm_dq16, dq, dm.batch, dm.seqlen_q, dm.heads_q, d->head_dim,
                                     d->head_dim == 64 ? WS64P_DQ16_ROWS : BM, bf16);
    BL_TRY(bl_bwd_schedule_launch(dm, d->causal, lists80, p.head_split, carveout,
                                  p.dq_direct != 0, &ws, stream));
    p.sched_rec_low = ws.sched_rec_low;
    // (No preprocess on the dq-rows path: its kernel writes the Dlt / lse rows version 10 reads.)
    if (!dq_rows_first)
        BL_TRY(bl_bwd_preprocess_launch(dm, d->dtype, out, dout, lse, layout, carveout,
                                        p.dq_direct != 0, selecting, dq, &ws, stream));
    if (dq_rows_first) {
        const bl_status st = bf16 ? launch_dqrows<__nv_bfloat16, 128>(rp, stream)
                                  : launch_dqrows<__half, 128>(rp, stream);
        if (st != BL_OK) return st;
    }

    if (rows80 && masked && !forced) {
        // The 64-row kernel first: the 80-row ones follow as programmatic dependents.
        p.totals = ws.totals;
        bool perm = false;
        const bl_status st =
            bf16 ? launch_main<__nv_bfloat16, 128>(p, tma_rows, tma_kv, num_cols, stream, &perm)
                 : launch_main<__half, 128>(p, tma_rows, tma_kv, num_cols, stream, &perm);
        if (st != BL_OK) return st;
        if (!perm) return bl_set_error(BL_ERR_INTERNAL, "bl_cuda_backward: 64-row kernel without TMA");
    }
    if (rows80) {
        // A non-causal call's dense walk (every entry of a dense call; a masked call's where its
        // mask keeps every tile) runs on the causal dense walk with a diagonal no entry reaches,
        // where its keys fill whole key tiles (the causal walk has no key limit): its cuts then
        // drop nothing, and that loop measured 2-8 % cheaper a tile than the non-causal one
        // (bench/results/bwd-s63-causal-code-ab.txt run 4; bwd-s64-nc-on-causal-walk.txt). The
        // lists, schedule windows and dq layout stay the non-causal call's.
        const bool nc_causal_walk = bl_bwd_keys_full(dm, d->causal != 0) &&
                                    dm.seqlen_q < BL_BWD_DIAG_NONE / 2;
        auto launch = [&](r80_entries e) {
            p.diag = e == R80_DENSE && nc_causal_walk ? BL_BWD_DIAG_NONE : dm.seqlen_k - dm.seqlen_q;
            return bf16 ? launch_rows80<__nv_bfloat16>(p, e, num_cols, stream)
                        : launch_rows80<__half>(p, e, num_cols, stream);
        };
        BL_TRY(launch(!masked ? R80_DENSE : d->causal ? R80_LISTS : R80_MASKED));
        // The packed entries next, and last the dense kernel: it runs where the mask keeps
        // every tile (every tile a causal mask allows).
        if (masked && !forced) {
            BL_TRY(launch(R80_PACKED));
            BL_TRY(launch(R80_DENSE));
        }
    } else {
        bl_status st;
        bool perm = false;
        // the persistent head-dim-64 kernel's pick between its forms (bl_bwd_ws64p_dq16_chosen)
        if (d->head_dim == 64 && p.dq_direct) p.totals = ws.totals;
        if (d->head_dim == 64)
            st = bf16 ? launch_main<__nv_bfloat16, 64>(p, tma_rows, tma_kv, num_cols, stream, &perm)
                      : launch_main<__half, 64>(p, tma_rows, tma_kv, num_cols, stream, &perm);
        else
            st = bf16 ? launch_main<__nv_bfloat16, 128>(p, tma_rows, tma_kv, num_cols, stream,
                                                        &perm, dq_rows_first)
                      : launch_main<__half, 128>(p, tma_rows, tma_kv, num_cols, stream, &perm,
                                                 dq_rows_first);
        if (st != BL_OK) return st;
        if (dq_rows_first && !perm)
            return bl_set_error(BL_ERR_INTERNAL, "bl_cuda_backward: dq-rows path without version 10");
        layout = perm ? BL_DQ_ROWS_PERMUTED : BL_DQ_ROWS;
    }
    if (dq_rows_first) return BL_OK;  // dq written by the dq-rows kernel
    if (dq_rows)  // head dim 64: dq by the dq-rows kernel, the accumulator left unread
        return bf16 ? launch_dqrows<__nv_bfloat16, 64>(rp, stream)
                    : launch_dqrows<__half, 64>(rp, stream);

    return bl_bwd_postprocess_launch(dm, d->dtype, d->scale, layout, p.dq_direct != 0, dq, &ws,
                                     stream);
}

#ifdef BL_BWD_TIMELINE
#include <stdio.h>
// Dev only: the entry stamps (bl_bwd_tl), read back, with the mean entry period and each point's
// mean after consumer warpgroup 0's entry start over entries TL_FIRST..TL_LAST (the column's
// start left out); a point never stamped prints "-".
constexpr int TL_FIRST = 4, TL_LAST = bl_bwd::TL_ITERS - 2;
typedef unsigned bl_tl_row[bl_bwd::TL_ITERS][bl_bwd::TL_POINTS];  // one row of bl_bwd_tl
static const bl_tl_row *bl_bwd_timeline_means(const char *title, const char *row2) {
    using namespace bl_bwd;
    static unsigned tl[3][TL_ITERS][TL_POINTS];
    if (cudaMemcpyFromSymbol(tl, bl_bwd_tl, sizeof(tl)) != cudaSuccess) return nullptr;
    const int n = TL_LAST - TL_FIRST + 1;
    double period = 0;
    for (int it = TL_FIRST; it <= TL_LAST; ++it)
        period += (double)(tl[0][it + 1][0] - tl[0][it][0]);
    printf("%s: mean entry period %.0f clocks (consumer wg 0, entries %d..%d)\n", title,
           period / n, TL_FIRST, TL_LAST);
    const char *names[3] = {"consumer wg 0", "consumer wg 1", row2};
    for (int r = 0; r < 3; ++r) {
        printf("  %-16s:", names[r]);
        for (int i = 0; i < TL_POINTS; ++i) {
            if (tl[r][TL_FIRST][i] == 0 && tl[r][TL_LAST][i] == 0) {
                printf("      -");
                continue;
            }
            double m = 0;
            for (int it = TL_FIRST; it <= TL_LAST; ++it)
                m += (double)(int)(tl[r][it][i] - tl[0][it][0]);
            printf(" %6.0f", m / n);
        }
        printf("\n");
    }
    return tl;
}
// Dev only: prints the clock stamps bwd_ws128_kernel or bwd_ws64_kernel took in its CTA 0 during
// the last launch (dev/cuda/attn_bwd.cu `timeline`, `timeline64`): per point, the mean over
// entries (pairs at head dim 64) TL_FIRST..TL_LAST of the stamp minus consumer warp 0's loop-top
// stamp of the same entry.
extern "C" void bl_bwd_timeline_print(void) { bl_bwd_timeline_means("timeline", "reducer"); }

// Dev only: the 80-row kernel's entry stamps (`timeline80`, BL_TL80: CTA 0's first column), as
// bl_bwd_timeline_print; row 2: reducer points 0-1 (dQ^T staged seen, its read done), producer
// points 4-6 (entry decoded, EMPTY passed, loads issued).
extern "C" void bl_bwd_timeline80_print(void) {
    const bl_tl_row *tl = bl_bwd_timeline_means("timeline80", "reducer|producer");
    if (tl == nullptr) return;
    // per entry: its period, each warpgroup's S^T issue for the next entry (points 8 -> 9: the
    // FULL wait), the producer's load issue (5 -> 6) and when it ended against the consumers'
    // need of that entry (wg 0's point 8 of the entry before; negative: issued that much before)
    printf("  entry: period  wg0 8->9  wg1 8->9  issue  issued-vs-need\n");
    for (int it = TL_FIRST; it <= TL_LAST; ++it)
        printf("  %5d %7d %9d %9d %6d %15d\n", it, (int)(tl[0][it + 1][0] - tl[0][it][0]),
               (int)(tl[0][it][9] - tl[0][it][8]), (int)(tl[1][it][9] - tl[1][it][8]),
               (int)(tl[2][it][6] - tl[2][it][5]), (int)(tl[2][it][6] - tl[0][it - 1][8]));
}

// Dev only (-DBL_BWD_TL_GLOBAL, `timelinesparse`): version 10's entry stamps of CTA 0 by their
// place in its walk, raw: per ring position, consumer warpgroups 0 and 1's points 0-11 and the
// reducer's points 0-3 (staging ring positions: two more per column for its dK / dV), in clocks
// after consumer warpgroup 0's first stamp; 0 where never stamped.
extern "C" void bl_bwd_timeline_raw_print(void) {
    using namespace bl_bwd;
    static unsigned tl[3][TL_ITERS][TL_POINTS];
    if (cudaMemcpyFromSymbol(tl, bl_bwd_tl, sizeof(tl)) != cudaSuccess) return;
    const unsigned t0 = tl[0][0][0];
    printf("entry stamps of CTA 0 (clocks after its first; row 0 / 1: consumer wg 0 / 1 points "
           "0-11 at ring position i; row 2: reducer points 0-3 at staging position i)\n");
    for (int i = 0; i < TL_ITERS; ++i)
        for (int r = 0; r < 3; ++r) {
            printf("  %2d %d:", i, r);
            for (int q = 0; q < (r == 2 ? 4 : TL_POINTS); ++q)
                printf(" %8d", tl[r][i][q] ? (int)(tl[r][i][q] - t0) : 0);
            printf("\n");
        }
}

// Dev only: the column stamps of bwd_ws128_kernel's (`timelinecols`) or the 80-row kernel's
// (`timelinecols80`) CTA 0 in the last launch that got past its pick, in clocks after the
// consumers' loop top of the same column.
extern "C" void bl_bwd_timeline_cols_print(void) {
    using namespace bl_bwd;
    static unsigned tc[TL_COL_ROWS][TL_COLS][TL_COL_POINTS];
    static int cnt[TL_COLS];
    if (cudaMemcpyFromSymbol(tc, bl_bwd_tlcol, sizeof(tc)) != cudaSuccess ||
        cudaMemcpyFromSymbol(cnt, bl_bwd_tlcnt, sizeof(cnt)) != cudaSuccess)
        return;
    printf("columns of CTA 0 (clocks after the consumers' column start):\n"
           "  k count | consumers: taken  K/V-full  S^T(0)  loop-end  dK/dV-staged  next |"
           " producer: draw  decoded  EMPTY(0)  KVEMPTY |"
           " reducer (80-row kernel): taken  last-dQ-read  dK-seen  dK-read  dV-seen  dV-read\n");
    for (int k = 0; k + 1 < TL_COLS && cnt[k] >= 0 && cnt[k + 1] >= 0; ++k) {
        const unsigned t0 = tc[0][k][0];
        printf("  %2d %5d |", k, cnt[k]);
        for (int i = 1; i < 6; ++i) printf(" %8d", cnt[k] == 0 && i >= 2 && i <= 4 ? 0 : (int)(tc[0][k][i] - t0));
        printf(" %6d |", (int)(tc[0][k + 1][0] - t0));
        for (int i = 0; i < 4; ++i) printf(" %8d", (int)(tc[1][k][i] - t0));
        printf(" |");
        for (int i = 0; i < 6; ++i) printf(" %8d", tc[2][k][i] ? (int)(tc[2][k][i] - t0) : 0);
        printf("\n");
    }
}
#endif

#ifdef BL_BWD_COLS64
#include <stdio.h>
#include <algorithm>
#include <vector>
// Dev only: bwd_ws64_kernel's column stamps in the last launch (`cols64`). Each SM's span (its
// first CTA's start to its last CTA's end, in its own clock) split into the gaps between one
// CTA's end and the next one's start, column starts (start -> K / V landed), pair loops, the last
// pair's dQ and dK / dV staging, and the stores' and reduce-adds' completion; as means per SM and
// per column. SM clocks are not comparable across SMs, so the kernel's tail is not in it: the
// spread of the SMs' spans hints at it.
extern "C" void bl_bwd_cols64_print(void) {
    using namespace bl_bwd;
    int grid = 0;
    if (cudaMemcpyFromSymbol(&grid, bl_bwd_tl64_grid, sizeof(grid)) != cudaSuccess || grid <= 0)
        return;
    const int n = grid < TL64_CTAS ? grid : TL64_CTAS;
    std::vector<long long> t((size_t)TL64_CTAS * TL64_POINTS);
    std::vector<int> info((size_t)TL64_CTAS * 2);
    if (cudaMemcpyFromSymbol(t.data(), bl_bwd_tl64, t.size() * sizeof(long long)) != cudaSuccess ||
        cudaMemcpyFromSymbol(info.data(), bl_bwd_tl64_info, info.size() * sizeof(int)) != cudaSuccess)
        return;
    auto at = [&](int c, int i) { return t[(size_t)c * TL64_POINTS + i]; };
    auto end_of = [&](int c) { return at(c, 4) > at(c, 5) ? at(c, 4) : at(c, 5); };
    std::vector<std::vector<int>> by_sm;
    long long entries = 0, pairs = 0;
    for (int c = 0; c < n; ++c) {
        const int sm = info[2 * c];
        if (sm >= (int)by_sm.size()) by_sm.resize(sm + 1);
        by_sm[sm].push_back(c);
        entries += info[2 * c + 1];
        pairs += (info[2 * c + 1] + 1) / 2;
    }
    // parts: 0 gaps, 1 column starts, 2 pair loops, 3 last dQ + dK / dV staged, 4 the stores'
    // and reduce-adds' shared-memory reads done (the kernel's `.read` end waits), 5 columns
    // without entries
    double part[6] = {0, 0, 0, 0, 0, 0}, span = 0, span_min = 1e300, span_max = 0;
    int sms = 0, busy = 0, gaps = 0;
    for (auto &v : by_sm) {
        if (v.empty()) continue;
        std::sort(v.begin(), v.end(), [&](int a, int b) { return at(a, 0) < at(b, 0); });
        for (size_t i = 0; i < v.size(); ++i) {
            const int c = v[i];
            if (i > 0) {
                part[0] += (double)(at(c, 0) - end_of(v[i - 1]));
                ++gaps;
            }
            if (info[2 * c + 1] > 0) {
                part[1] += (double)(at(c, 1) - at(c, 0));
                part[2] += (double)(at(c, 2) - at(c, 1));
                part[3] += (double)(at(c, 3) - at(c, 2));
                part[4] += (double)(end_of(c) - at(c, 3));
                ++busy;
            } else {
                part[5] += (double)(end_of(c) - at(c, 0));
            }
        }
        const double s = (double)(end_of(v.back()) - at(v.front(), 0));
        span += s;
        span_min = s < span_min ? s : span_min;
        span_max = s > span_max ? s : span_max;
        ++sms;
    }
    if (sms == 0) return;
    const char *names[6] = {"gaps between CTAs / columns", "column starts (-> K / V landed)",
                            "pair loops",
                            "last dQ, dK / dV staged", "stores / reduce-adds read",
                            "columns without entries"};
    // slots: version 6's CTAs, or the persistent form's columns (its stamps go by position)
    printf("cols64: %d slots on %d SMs, %.1f entries per column; per SM span %.0f clocks (min %.0f, "
           "max %.0f)\n", n, sms, (double)entries / n, span / sms, span_min, span_max);
    // each part's mean per occurrence: per gap, per column with entries, per empty column
    const int per[6] = {gaps, busy, busy, busy, busy, n - busy};
    for (int i = 0; i < 6; ++i)
        printf("  %-34s %10.0f clocks per SM (%5.1f %%), %7.0f each\n", names[i], part[i] / sms,
               100.0 * part[i] / span, per[i] > 0 ? part[i] / per[i] : 0.0);
    printf("  pair loops per pair: %.0f clocks\n", pairs > 0 ? part[2] / pairs : 0.0);
    // the same by the column's place on its SM (0: each SM's first), to tell a loop that is
    // slower throughout from one that slows as the walk goes on
    std::vector<double> rank_clocks, rank_pairs;
    for (auto &v : by_sm)
        for (size_t i = 0; i < v.size(); ++i) {
            const int c = v[i];
            if (info[2 * c + 1] <= 0) continue;
            if (i >= rank_clocks.size()) {
                rank_clocks.resize(i + 1, 0.0);
                rank_pairs.resize(i + 1, 0.0);
            }
            rank_clocks[i] += (double)(at(c, 2) - at(c, 1));
            rank_pairs[i] += (double)((info[2 * c + 1] + 1) / 2);
        }
    printf("  per pair by the column's place on its SM:");
    for (size_t i = 0; i < rank_clocks.size(); ++i)
        printf(" %zu:%.0f", i, rank_pairs[i] > 0 ? rank_clocks[i] / rank_pairs[i] : 0.0);
    printf("\n");
    // which of the two ends is later: the dK / dV stores' wait or the reducer's
    double st = 0, rd = 0;
    for (int c = 0; c < n; ++c)
        if (info[2 * c + 1] > 0) {
            st += (double)(at(c, 4) - at(c, 3));
            rd += (double)(at(c, 5) - at(c, 3));
        }
    printf("  after staging: dK / dV stores done %.0f, reducer done %.0f clocks (per column)\n",
           busy > 0 ? st / busy : 0.0, busy > 0 ? rd / busy : 0.0);
}
#endif
