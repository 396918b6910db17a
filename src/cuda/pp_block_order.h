/* pp_block_order.h -- the order in which the dq accumulator's conversions (bwd_prepost_sm90.cu:
 * postprocess_tile, postprocess_rows_block, and the DIRECT conversion's part test
 * pp_part_has_heavy) take their (batch b, query head h, row tile m) blocks, CTA index blk ->
 * (b, h, m). Plain C, host and device under nvcc, so that tests/c/test_pp_block_order.c checks
 * that every block of a grid of B x Hq x tiles is taken exactly once, for head counts that are
 * and are not multiples of the group.
 *
 * Heads fastest within groups of BL_PP_HEAD_GROUP heads (2 or 1 where Hq is not a multiple of
 * 4), so that the CTAs in flight together write (and version 10's rows path reads) the same rows
 * of a few heads, contiguous in (B, Sq, Hq, D), rather than one head's rows, a piece out of every
 * Hq (bench/results/bwd-s39-prepost.txt: 4-8 us less at 32k x 24, up to 3 us at 16k x 16); then
 * the row tiles, the groups and the batches, each last first. That is the reverse of the main
 * kernels' order -- their window schedule walks the (b, kv head) columns in order
 * (bl_bwd_schedule_window_kernel), a causal column's last row tiles last -- so the blocks
 * converted first are the ones most likely still in L2: the conversions' tails 1-3 us shorter on
 * causal calls, level without a causal mask (bench/results/bwd-s132-conversion-order.txt).
 * 32-bit arithmetic: blk and the block count are grid sizes (in 64 bits the non-causal picked
 * conversion kernel spilled 60 bytes against 16). */
#ifndef BL_CUDA_PP_BLOCK_ORDER_H
#define BL_CUDA_PP_BLOCK_ORDER_H

#ifdef __CUDACC__
#define BL_PP_ORDER_FN __host__ __device__ static inline
#else
#define BL_PP_ORDER_FN static inline
#endif

enum { BL_PP_HEAD_GROUP = 4 };

/* (b, h, m) of block blk in [0, batch x heads x tiles). */
BL_PP_ORDER_FN void bl_pp_block_coords(int batch, int heads, int tiles, int blk, int *b, int *h,
                                       int *m) {
    const int group = heads % BL_PP_HEAD_GROUP == 0 ? BL_PP_HEAD_GROUP : heads % 2 == 0 ? 2 : 1;
    const int per_batch = heads * tiles, x = blk % per_batch;
    const int g = x / (group * tiles), r = x % (group * tiles);
    *h = heads - group * (g + 1) + r % group;
    *m = tiles - 1 - r / group;
    *b = batch - 1 - blk / per_batch;
}

#endif /* BL_CUDA_PP_BLOCK_ORDER_H */
