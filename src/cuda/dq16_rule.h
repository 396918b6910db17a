/* dq16_rule.h -- the DIRECT form's light dq row tiles (version 10 at head dim 128, the persistent
 * kernel's DQ16 form at 64): which tiles they are, which of them the preprocess's zero CTAs zero,
 * and how each entry of one writes its 16-bit dQ (stores, or adds onto what is there, after
 * waiting for a first claimant's store). Plain C, host and device under nvcc, so that
 * tests/c/test_dq16_rule.c checks the rule the kernels run: every light tile that has entries
 * ends as exactly one store plus adds, or as zeros plus adds, and no entry waits for a store that
 * no entry makes. Version 10 and the zero CTAs call these functions; the head-dim-64 form has no
 * claims and spells its half inline (a lone entry stores, bwd_ws64p_sm90.cuh's entry flags), the
 * case bl_bwd_dq16_adds(w, false, 0) gives -- kept so because that kernel's SASS was measured so.
 *
 * The light row tiles: at most BL_DQ16_MAX_WRITERS entries, whose dQ in 16-bit goes straight to
 * dq -- stored by a tile's only entry or by the first of its entries to claim it
 * (bl_bwd_workspace::dq_claims), added to by the others' 16-bit TMA reduce-adds once that store
 * has completed -- so that neither the fp32 adds nor the accumulator's conversion are paid there
 * (nor, mostly, its zeros: the preprocess's row CTAs that read the pick as DIRECT skip them, and
 * its zero CTAs zero the heavy tiles' rows; bwd_prepost_sm90.cu). Heavier tiles add
 * into the fp32 accumulator as every other kernel does. Rounding after each add costs precision
 * with the entries: relative RMS dq error, bf16 head dim 128, 2.35e-3 for one entry, 3.55e-3 at
 * 4, 5.54e-3 at 16, 1.37e-2 at 128, against 2.35e-3 summed in fp32 and 6.5-7.8e-3 for PyTorch's
 * own bf16 backward (dev/cuda/dq_accum_precision.py, bench/results/dq-accum-precision-s97.txt):
 * 16 keeps it inside PyTorch's. */
#ifndef BL_CUDA_DQ16_RULE_H
#define BL_CUDA_DQ16_RULE_H

#include <stdbool.h>

#ifdef __CUDACC__
#define BL_DQ16_FN __host__ __device__ static inline
#else
#define BL_DQ16_FN static inline
#endif

enum { BL_DQ16_MAX_WRITERS = 16 };

/* A row tile of `writers` entries is light. */
BL_DQ16_FN bool bl_bwd_dq16_tile(unsigned writers) { return writers <= BL_DQ16_MAX_WRITERS; }

/* Where the call has claims (head dim 128), a light tile's entries claim it: a tile of several
 * entries (one entry just stores). */
BL_DQ16_FN bool bl_bwd_dq16_claimed(unsigned writers) { return writers >= 2; }

/* The zero CTAs (BL_ZEROS_DQ16) zero the dq rows of a light tile: those without entries, and
 * those of several entries that do not claim. */
BL_DQ16_FN bool bl_bwd_dq16_zeroed(unsigned writers, bool with_claims) {
    return bl_bwd_dq16_tile(writers) && writers != 1 &&
           !(with_claims && bl_bwd_dq16_claimed(writers));
}

/* An entry of a light tile of `writers` entries adds its dQ (else stores it); `claimed` where it
 * claimed the tile, `before` the claims it found there (0: it is the first, and stores). */
BL_DQ16_FN bool bl_bwd_dq16_adds(unsigned writers, bool claimed, unsigned before) {
    return claimed ? before != 0 : writers != 1;
}

/* It waits for the first claimant's store (BL_DQ_CLAIM_STORED) before adding. */
BL_DQ16_FN bool bl_bwd_dq16_waits(bool claimed, unsigned before) {
    return claimed && before != 0;
}

/* Who zeroes the fp32 accumulator of a call that may run the DIRECT form (head dim 128), by the
 * device's pick as each CTA read it (bl_bwd_workspace::zeros_pick: written once a call, so a CTA
 * reads nothing yet or the call's own pick). A preprocess row CTA zeroes its part of the whole
 * accumulator unless it read DIRECT. */
BL_DQ16_FN bool bl_bwd_rows_zero_accum(bool read_direct) { return !read_direct; }

/* A zero CTA zeroes the fp32 rows of one of its tiles where it read no pick yet (`read_pick`
 * false: `writers` unknown), or read DIRECT and the tile is heavy: the rows the DIRECT form reads
 * (the conversion skips light tiles and reads none of a tile without entries). Together with
 * the row CTAs' rule every row that a call reads is zeroed, whatever each CTA read
 * (tests/c/test_dq16_rule.c). */
BL_DQ16_FN bool bl_bwd_zero_cta_zeroes_accum(bool read_pick, bool read_direct, unsigned writers) {
    return !read_pick || (read_direct && !bl_bwd_dq16_tile(writers));
}

#endif /* BL_CUDA_DQ16_RULE_H */
