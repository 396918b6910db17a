/* cpu_forward.c -- the CPU forward: out, lse and (optionally) the tile mass W.
 *
 * This is the readable reference of the GPU algorithm. One work item is one (batch, query head,
 * row tile of BL_TILE_M rows); it walks the key tiles of BL_TILE_N keys with an online softmax
 * (running row max and row sum, rescaled accumulator). With statistics on, every row also keeps
 * the log of the unnormalized mass it put in each key tile (running max + log(tile sum)): its
 * probability in that tile, exp(log_mass - lse), is only known once the row's lse is final, so
 * after the last key tile the kept values are reduced to W[m, n] = sum over the tile's rows. This
 * small (TM, Tn) scratch is what the GPU keeps in its workspace instead of a (B, H, Sq, Tn) tensor.
 */
#include <math.h>
#include <stdlib.h>

#include "backend.h"
#include "cpu_kernels.h"
#include "cpu_tensor.h"
#include "cpu_tiles.h"

/* Per-thread scratch of one forward work item. */
typedef struct fwd_scratch {
    float *q;        /* (TM, D) scaled query rows */
    float *k;        /* (TN, D) the key tile */
    float *v;        /* (TN, D) the value tile */
    float *s;        /* (TM, TN) scores, then probabilities relative to the running max */
    float *acc;      /* (TM, D) unnormalized output rows */
    float *row_max;  /* (TM) running max of the scores */
    float *row_sum;  /* (TM) running sum of exp(score - row_max) */
    int64_t *limit;  /* (TM) number of keys each row may see (a prefix) */
    double *log_mass; /* (TM, Tn) per-row log of the unnormalized mass per key tile, stats only */
    double *row_lse;  /* (TM) final lse of each row, in double for the W reduction */
} fwd_scratch;

static void fwd_scratch_free(fwd_scratch *s) {
    free(s->q); free(s->k); free(s->v); free(s->s); free(s->acc);
    free(s->row_max); free(s->row_sum); free(s->limit); free(s->log_mass); free(s->row_lse);
}

static int fwd_scratch_alloc(fwd_scratch *s, int D, int64_t num_tiles_n, int with_stats) {
    s->q = malloc(sizeof(float) * BL_TILE_M * D);
    s->k = malloc(sizeof(float) * BL_TILE_N * D);
    s->v = malloc(sizeof(float) * BL_TILE_N * D);
    s->s = malloc(sizeof(float) * BL_TILE_M * BL_TILE_N);
    s->acc = malloc(sizeof(float) * BL_TILE_M * D);
    s->row_max = malloc(sizeof(float) * BL_TILE_M);
    s->row_sum = malloc(sizeof(float) * BL_TILE_M);
    s->limit = malloc(sizeof(int64_t) * BL_TILE_M);
    s->log_mass = with_stats ? malloc(sizeof(double) * BL_TILE_M * (size_t)num_tiles_n) : NULL;
    s->row_lse = malloc(sizeof(double) * BL_TILE_M);
    return s->q && s->k && s->v && s->s && s->acc && s->row_max && s->row_sum &&
           s->limit && s->row_lse && (!with_stats || s->log_mass);
}

/* Converts keys/values [j0, j1) of kv head hk to float rows. */
static void load_kv_tile(const bl_attn_desc *d, const bl_tensor *k, const bl_tensor *v,
                         int64_t b, int64_t hk, int64_t j0, int64_t j1, fwd_scratch *s) {
    const int D = (int)d->head_dim;
    for (int64_t j = j0; j < j1; ++j) {
        const int64_t c = j - j0;
        bl_load_row(k, d->dtype, b, j, hk, D, s->k + c * D);
        bl_load_row(v, d->dtype, b, j, hk, D, s->v + c * D);
    }
}

/* Online-softmax update of row r with its scores against the first `cols` keys of the tile
 * (already in s->s). Returns the natural log of the mass the row put in the tile, in the same
 * (unnormalized) scale as its lse. */
static double forward_row_on_tile(fwd_scratch *s, int D, int64_t r, int64_t cols) {
    float *srow = s->s + r * BL_TILE_N;
    float *acc = s->acc + r * D;

    /* NaN never wins the comparison, so a NaN score does not hide the finite max; it still
     * reaches the output through exp(NaN) as in dense attention. */
    float tile_max = -INFINITY;
    for (int64_t c = 0; c < cols; ++c)
        if (srow[c] > tile_max) tile_max = srow[c];
    const float new_max = tile_max > s->row_max[r] ? tile_max : s->row_max[r];
    /* All scores so far -inf: shift by 0 so that exp(-inf) = 0 rather than exp(-inf + inf). */
    const float shift = new_max == -INFINITY ? 0.0f : new_max;

    float tile_sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
        const float p = expf(srow[c] - shift);
        srow[c] = p;
        tile_sum += p;
    }
    const float alpha = expf(s->row_max[r] - shift); /* rescales what was summed so far */
    s->row_sum[r] = s->row_sum[r] * alpha + tile_sum;
    s->row_max[r] = new_max;
    for (int e = 0; e < D; ++e) acc[e] *= alpha;
    bl_axpy_rows(acc, srow, s->v, D, cols, D);
    return (double)shift + log((double)tile_sum);
}

static void forward_row_tile(const bl_attn_desc *d, const bl_tensor *q, const bl_tensor *k,
                             const bl_tensor *v, const bl_tensor *out, float *lse,
                             float *tile_mass, int64_t b, int64_t h, int64_t m,
                             fwd_scratch *s) {
    const int D = (int)d->head_dim;
    const int64_t Sq = d->seqlen_q, Sk = d->seqlen_k, Hq = d->heads_q;
    const int64_t hk = h / (Hq / d->heads_k);
    const int64_t num_tiles_n = bl_ceil_div(Sk, BL_TILE_N);
    const int64_t tiles_visited = bl_key_tiles_visited(d->causal, m, Sq, Sk);
    int64_t i0, i1;
    bl_row_tile_range(m, Sq, &i0, &i1);
    const int64_t rows = i1 - i0;

    for (int64_t r = 0; r < rows; ++r) {
        bl_load_row(q, d->dtype, b, i0 + r, h, D, s->q + r * D);
        for (int e = 0; e < D; ++e) s->q[r * D + e] *= d->scale;
        for (int e = 0; e < D; ++e) s->acc[r * D + e] = 0.0f;
        s->limit[r] = bl_key_limit(d->causal, i0 + r, Sq, Sk);
        s->row_max[r] = -INFINITY;
        s->row_sum[r] = 0.0f;
    }

    for (int64_t n = 0; n < tiles_visited; ++n) {
        int64_t j0, j1;
        bl_key_tile_range(n, Sk, &j0, &j1);
        load_kv_tile(d, k, v, b, hk, j0, j1, s);
        /* scores of every row against the whole tile; entries past a row's keys go unused */
        bl_dot_block(s->q, D, rows, s->k, D, j1 - j0, D, s->s, BL_TILE_N);
        for (int64_t r = 0; r < rows; ++r) {
            int64_t cols = s->limit[r] - j0; /* the row's allowed keys in this tile */
            if (cols > j1 - j0) cols = j1 - j0;
            double lm = -INFINITY;
            if (cols > 0) lm = forward_row_on_tile(s, D, r, cols);
            if (s->log_mass) s->log_mass[r * num_tiles_n + n] = lm;
        }
    }

    float *lse_rows = lse + (b * Hq + h) * Sq;
    for (int64_t r = 0; r < rows; ++r) {
        if (s->limit[r] == 0) { /* no allowed key: out = 0, lse = -inf, no mass */
            bl_zero_row(out, d->dtype, b, i0 + r, h, D);
            lse_rows[i0 + r] = -INFINITY;
            continue;
        }
        s->row_lse[r] = (double)s->row_max[r] + log((double)s->row_sum[r]);
        lse_rows[i0 + r] = (float)s->row_lse[r];
        bl_store_row(out, d->dtype, b, i0 + r, h, D, s->acc + r * D, 1.0f / s->row_sum[r]);
    }

    if (tile_mass) {
        float *w = tile_mass + ((b * Hq + h) * bl_ceil_div(Sq, BL_TILE_M) + m) * num_tiles_n;
        for (int64_t n = 0; n < num_tiles_n; ++n) {
            double mass = 0.0;
            if (n < tiles_visited)
                for (int64_t r = 0; r < rows; ++r) /* rows without keys carry no mass */
                    if (s->limit[r] > 0)
                        mass += exp(s->log_mass[r * num_tiles_n + n] - s->row_lse[r]);
            w[n] = (float)mass;
        }
    }
}

bl_status bl_cpu_forward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                         bl_tensor out, float *lse, float *tile_mass) {
    const int64_t num_tiles_m = bl_ceil_div(d->seqlen_q, BL_TILE_M);
    const int64_t num_tiles_n = bl_ceil_div(d->seqlen_k, BL_TILE_N);
    const int64_t items = d->batch * d->heads_q * num_tiles_m;
    int out_of_memory = 0;

#pragma omp parallel
    {
        fwd_scratch s;
        int ok = fwd_scratch_alloc(&s, (int)d->head_dim, num_tiles_n, tile_mass != NULL);
        if (!ok) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        /* Causal row tiles differ in cost: hand them out dynamically. */
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < items; ++item) {
            if (!ok) continue;
            const int64_t m = item % num_tiles_m;
            const int64_t h = (item / num_tiles_m) % d->heads_q;
            const int64_t b = item / (num_tiles_m * d->heads_q);
            forward_row_tile(d, &q, &k, &v, &out, lse, tile_mass, b, h, m, &s);
        }
        fwd_scratch_free(&s);
    }
    if (out_of_memory)
        return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                            "bl_forward (CPU): cannot allocate the per-thread scratch "
                            "(head_dim=%lld, %lld key tiles)",
                            (long long)d->head_dim, (long long)num_tiles_n);
    return BL_OK;
}
