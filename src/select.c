/* select.c -- the tile selection rule (DESIGN §1) and the CPU backend's bl_cpu_select_tiles.
 *
 * For one row tile with tile masses W[0..Tn): T = sum_n W[n] (double, in n order);
 * p_n = W[n] / T; order the tiles by (p_n ascending, n ascending); skip the longest prefix of that
 * order whose cumulative sum (double) is < negl_prob, strictly; keep the rest.
 * T == 0 (no valid row) keeps nothing; a non-finite T (NaN/inf in the inputs) keeps everything so
 * that NaN reaches the gradients as it would in dense attention.
 */
#include <math.h>
#include <stdlib.h>

#include "backend.h"
#include "cpu_select.h"
#include "cpu_tiles.h"

static int compare_by_share_then_index(const void *pa, const void *pb) {
    const bl_tile_share *a = pa, *b = pb;
    if (a->p < b->p) return -1;
    if (a->p > b->p) return 1;
    return (a->n > b->n) - (a->n < b->n);
}

void bl_select_row_tile(const float *w, int64_t num_tiles_n, double negl_prob, uint8_t *keep,
                        bl_tile_share *scratch) {
    double total = 0.0;
    for (int64_t n = 0; n < num_tiles_n; ++n) total += (double)w[n];

    if (!isfinite(total)) {
        for (int64_t n = 0; n < num_tiles_n; ++n) keep[n] = 1;
        return;
    }
    if (!(total > 0.0)) { /* no row of this tile saw any key: nothing to compute */
        for (int64_t n = 0; n < num_tiles_n; ++n) keep[n] = 0;
        return;
    }

    for (int64_t n = 0; n < num_tiles_n; ++n) {
        scratch[n].p = (double)w[n] / total;
        scratch[n].n = n;
        keep[n] = 1;
    }
    qsort(scratch, (size_t)num_tiles_n, sizeof *scratch, compare_by_share_then_index);

    /* Shares are >= 0, so the cumulative sum only grows: the longest prefix below negl_prob
     * ends at the first tile that would reach it. */
    double cumulative = 0.0;
    for (int64_t k = 0; k < num_tiles_n; ++k) {
        cumulative += scratch[k].p;
        if (!(cumulative < negl_prob)) break;
        keep[scratch[k].n] = 0;
    }
}

bl_status bl_cpu_select_tiles(const bl_attn_desc *d, const float *tile_mass, float negl_prob,
                              uint8_t *mask) {
    const int64_t num_tiles_m = bl_ceil_div(d->seqlen_q, BL_TILE_M);
    const int64_t num_tiles_n = bl_ceil_div(d->seqlen_k, BL_TILE_N);
    const int64_t row_tiles = d->batch * d->heads_q * num_tiles_m;
    int out_of_memory = 0;

#pragma omp parallel
    {
        bl_tile_share *scratch = malloc((size_t)num_tiles_n * sizeof *scratch);
        if (!scratch) {
#pragma omp atomic write
            out_of_memory = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < row_tiles; ++r) {
            if (scratch)
                bl_select_row_tile(tile_mass + r * num_tiles_n, num_tiles_n, (double)negl_prob,
                                   mask + r * num_tiles_n, scratch);
        }
        free(scratch);
    }
    if (out_of_memory)
        return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                            "bl_select_tiles: cannot allocate %lld bytes of selection scratch",
                            (long long)num_tiles_n * (long long)sizeof(bl_tile_share));
    return BL_OK;
}
