/* cpu_backward.c -- the CPU backward, dense or block-sparse (DESIGN §1).
 *
 * For every kept (row tile, key tile) block that holds an allowed key, P is recomputed from the
 * saved lse and the block adds its share to dq, dk and dv:
 *   P = exp(scale q k^T - lse), dP = dO v^T, dS = P * (dP - Dlt),
 *   dv += P^T dO, dk += scale dS^T q, dq += scale dS k, with Dlt_i = sum_d dO_id out_id
 * (computed once for all rows first, as the GPU's preprocess kernel does).
 *
 * Two schedules, the same arithmetic per block:
 *   per kv head  one work item per (batch, kv head). Its thread owns that head's dk and dv (fp32
 *                accumulators over all keys, summed over the group's query heads: GQA needs no
 *                atomics) and the dq rows of the group's heads. Every block is visited once.
 *                Used when there are at least as many (batch, kv head) pairs as threads.
 *   two pass     for few kv heads (MQA at batch 1 would leave all but one thread idle): pass 1
 *                gives each (batch, kv head, key tile) to a thread for dk and dv, pass 2 each
 *                (batch, query head, row tile) for dq. Blocks are visited twice (S and dP are
 *                recomputed), in exchange for parallelism.
 * The environment variable BACKLITE_CPU_BACKWARD=per-kv-head|two-pass forces one (for tests).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "cpu_kernels.h"
#include "cpu_tensor.h"
#include "cpu_tiles.h"

/* What every work item reads; built once per call. */
typedef struct bwd_problem {
    const bl_attn_desc *d;
    const bl_tensor *q, *k, *v, *dout, *dq, *dk, *dv;
    const float *lse;   /* (B, Hq, Sq) */
    const float *dlt;   /* (B, Hq, Sq) Dlt_i = sum_d dO_id out_id */
    const uint8_t *keep; /* (B, Hq, Tm, Tn) or NULL for all tiles */
    int64_t num_tiles_m, num_tiles_n, group;
} bwd_problem;

/* Per-thread scratch. */
typedef struct bwd_scratch {
    float *q;       /* (TM, D) query rows (unscaled) */
    float *dout;    /* (TM, D) output-gradient rows */
    float *dq;      /* (TM, D) dq accumulator of the current row tile (scale applied at store) */
    float *lse;     /* (TM) */
    float *dlt;     /* (TM) */
    int64_t *limit; /* (TM) number of keys each row may see (a prefix) */
    float *k;       /* (TN, D) key tile */
    float *v;       /* (TN, D) value tile */
    int64_t *cols;  /* (TM) allowed keys of each row in the current key tile */
    float *p;       /* (TM, TN) scores, then probabilities of the block */
    float *ds;      /* (TM, TN) dP, then dS of the block */
    float *dk;      /* (kv_rows, D) dk accumulator (scale applied at store) */
    float *dv;      /* (kv_rows, D) dv accumulator */
} bwd_scratch;

static void bwd_scratch_free(bwd_scratch *s) {
    free(s->q); free(s->dout); free(s->dq); free(s->lse); free(s->dlt); free(s->limit);
    free(s->k); free(s->v); free(s->cols); free(s->p); free(s->ds);
    free(s->dk); free(s->dv);
}

/* kv_rows: Sk for the per-kv-head schedule (whole-head accumulators), TN for two pass. */
static int bwd_scratch_alloc(bwd_scratch *s, int D, int64_t kv_rows) {
    const size_t tile_md = sizeof(float) * BL_TILE_M * D;
    const size_t tile_nd = sizeof(float) * BL_TILE_N * D;
    const size_t tile_mn = sizeof(float) * BL_TILE_M * BL_TILE_N;
    s->q = malloc(tile_md);
    s->dout = malloc(tile_md);
    s->dq = malloc(tile_md);
    s->lse = malloc(sizeof(float) * BL_TILE_M);
    s->dlt = malloc(sizeof(float) * BL_TILE_M);
    s->limit = malloc(sizeof(int64_t) * BL_TILE_M);
    s->k = malloc(tile_nd);
    s->v = malloc(tile_nd);
    s->cols = malloc(sizeof(int64_t) * BL_TILE_M);
    s->p = malloc(tile_mn);
    s->ds = malloc(tile_mn);
    s->dk = malloc(sizeof(float) * (size_t)kv_rows * D);
    s->dv = malloc(sizeof(float) * (size_t)kv_rows * D);
    return s->q && s->dout && s->dq && s->lse && s->dlt && s->limit && s->k && s->v &&
           s->cols && s->p && s->ds && s->dk && s->dv;
}

/* Dlt for every row, from the out the caller passes (the exact forward output, or a global one
 * for ring attention). Rows without keys get no gradient, so their Dlt is never read. */
static void compute_dlt(const bl_attn_desc *d, const bl_tensor *out, const bl_tensor *dout,
                        float *dlt) {
    const int D = (int)d->head_dim;
    const int64_t rows = d->batch * d->heads_q * d->seqlen_q;
#pragma omp parallel
    {
        float out_row[BL_MAX_HEAD_DIM], dout_row[BL_MAX_HEAD_DIM];
#pragma omp for schedule(static)
        for (int64_t row = 0; row < rows; ++row) { /* row = (b * Hq + h) * Sq + i, as lse */
            const int64_t i = row % d->seqlen_q, h = (row / d->seqlen_q) % d->heads_q;
            const int64_t b = row / (d->seqlen_q * d->heads_q);
            bl_load_row(out, d->dtype, b, i, h, D, out_row);
            bl_load_row(dout, d->dtype, b, i, h, D, dout_row);
            /* bl_dot, as for dP: where out equals v exactly (one allowed key) dP - Dlt is 0 */
            dlt[row] = bl_dot(dout_row, out_row, D);
        }
    }
}

/* Loads rows [i0, i0 + rows) of query head h: q, dO, lse, Dlt, key limits; zeroes dq. */
static void load_row_tile(const bwd_problem *pb, int64_t b, int64_t h, int64_t i0, int64_t rows,
                          bwd_scratch *s) {
    const bl_attn_desc *d = pb->d;
    const int D = (int)d->head_dim;
    const int64_t first = (b * d->heads_q + h) * d->seqlen_q + i0;
    for (int64_t r = 0; r < rows; ++r) {
        bl_load_row(pb->q, d->dtype, b, i0 + r, h, D, s->q + r * D);
        bl_load_row(pb->dout, d->dtype, b, i0 + r, h, D, s->dout + r * D);
        s->lse[r] = pb->lse[first + r];
        s->dlt[r] = pb->dlt[first + r];
        s->limit[r] = bl_key_limit(d->causal, i0 + r, d->seqlen_q, d->seqlen_k);
        memset(s->dq + r * D, 0, sizeof(float) * D);
    }
}

/* Converts keys/values [j0, j1) of kv head hk to float rows. */
static void load_kv_tile(const bwd_problem *pb, int64_t b, int64_t hk, int64_t j0, int64_t j1,
                         bwd_scratch *s) {
    const bl_attn_desc *d = pb->d;
    const int D = (int)d->head_dim;
    for (int64_t j = j0; j < j1; ++j) {
        bl_load_row(pb->k, d->dtype, b, j, hk, D, s->k + (j - j0) * D);
        bl_load_row(pb->v, d->dtype, b, j, hk, D, s->v + (j - j0) * D);
    }
}

/* 1 if block (b, h, m, n) is computed: it holds an allowed key and is kept. */
static int block_computed(const bwd_problem *pb, int64_t b, int64_t h, int64_t m, int64_t n) {
    const bl_attn_desc *d = pb->d;
    /* Tiles past the row tile's last visited one hold no allowed key, whatever the mask says. */
    if (n >= bl_key_tiles_visited(d->causal, m, d->seqlen_q, d->seqlen_k)) return 0;
    return !pb->keep ||
           pb->keep[((b * d->heads_q + h) * pb->num_tiles_m + m) * pb->num_tiles_n + n];
}

/* One (row tile, key tile) block, rows and keys already loaded into s. Adds its share to
 * dq_rows (TM, D) if not NULL, and to dk_rows, dv_rows ((width, D), the tile's keys) if not NULL.
 * Only a row's allowed keys (a prefix of the tile) are touched, so that a NaN or inf in one row
 * never reaches keys that row cannot see. */
static void backward_block(int D, float scale, int64_t rows, int64_t j0, int64_t width,
                           bwd_scratch *s, float *dq_rows, float *dk_rows, float *dv_rows) {
    /* S = q k^T and dP = dO v^T over the whole block (entries past a row's keys go unused) */
    bl_dot_block(s->q, D, rows, s->k, D, width, D, s->p, BL_TILE_N);
    bl_dot_block(s->dout, D, rows, s->v, D, width, D, s->ds, BL_TILE_N);

    for (int64_t r = 0; r < rows; ++r) {
        int64_t cols = s->limit[r] - j0;
        if (cols > width) cols = width;
        if (cols < 0) cols = 0;
        s->cols[r] = cols;
        float *p = s->p + r * BL_TILE_N, *ds = s->ds + r * BL_TILE_N;
        const float lse = s->lse[r], dlt = s->dlt[r];
        for (int64_t c = 0; c < cols; ++c) {
            p[c] = expf(scale * p[c] - lse);
            ds[c] = p[c] * (ds[c] - dlt);
        }
        if (dq_rows) bl_axpy_rows(dq_rows + r * D, ds, s->k, D, cols, D);
    }

    if (!dk_rows) return;
    for (int64_t c = 0; c < width; ++c) {
        bl_axpy_batch dk_batch = {{0}, {0}, 0}, dv_batch = {{0}, {0}, 0};
        float *dk = dk_rows + c * D, *dv = dv_rows + c * D;
        for (int64_t r = 0; r < rows; ++r) {
            if (c >= s->cols[r]) continue;
            bl_axpy_batch_add(&dk_batch, dk, s->ds[r * BL_TILE_N + c], s->q + r * D, D);
            bl_axpy_batch_add(&dv_batch, dv, s->p[r * BL_TILE_N + c], s->dout + r * D, D);
        }
        bl_axpy_batch_flush(&dk_batch, dk, D);
        bl_axpy_batch_flush(&dv_batch, dv, D);
    }
}

/* ---- schedule "per kv head" ---- */

static void backward_kv_head(const bwd_problem *pb, int64_t b, int64_t hk, bwd_scratch *s) {
    const bl_attn_desc *d = pb->d;
    const int D = (int)d->head_dim;
    const int64_t Sq = d->seqlen_q, Sk = d->seqlen_k;

    memset(s->dk, 0, sizeof(float) * (size_t)Sk * D);
    memset(s->dv, 0, sizeof(float) * (size_t)Sk * D);
    for (int64_t h = hk * pb->group; h < (hk + 1) * pb->group; ++h)
        for (int64_t m = 0; m < pb->num_tiles_m; ++m) {
            int64_t i0, i1;
            bl_row_tile_range(m, Sq, &i0, &i1);
            load_row_tile(pb, b, h, i0, i1 - i0, s);
            for (int64_t n = 0; n < pb->num_tiles_n; ++n) {
                if (!block_computed(pb, b, h, m, n)) continue;
                int64_t j0, j1;
                bl_key_tile_range(n, Sk, &j0, &j1);
                load_kv_tile(pb, b, hk, j0, j1, s);
                backward_block(D, d->scale, i1 - i0, j0, j1 - j0, s, s->dq, s->dk + j0 * D,
                               s->dv + j0 * D);
            }
            for (int64_t r = 0; r < i1 - i0; ++r)
                bl_store_row(pb->dq, d->dtype, b, i0 + r, h, D, s->dq + r * D, d->scale);
        }
    for (int64_t j = 0; j < Sk; ++j) {
        bl_store_row(pb->dk, d->dtype, b, j, hk, D, s->dk + j * D, d->scale);
        bl_store_row(pb->dv, d->dtype, b, j, hk, D, s->dv + j * D, 1.0f);
    }
}

/* ---- schedule "two pass" ---- */

/* Pass 1: dk, dv of key tile n of kv head hk, from every computed block in its column. */
static void backward_key_tile(const bwd_problem *pb, int64_t b, int64_t hk, int64_t n,
                              bwd_scratch *s) {
    const bl_attn_desc *d = pb->d;
    const int D = (int)d->head_dim;
    int64_t j0, j1;
    bl_key_tile_range(n, d->seqlen_k, &j0, &j1);
    memset(s->dk, 0, sizeof(float) * BL_TILE_N * D);
    memset(s->dv, 0, sizeof(float) * BL_TILE_N * D);
    load_kv_tile(pb, b, hk, j0, j1, s);
    for (int64_t h = hk * pb->group; h < (hk + 1) * pb->group; ++h)
        for (int64_t m = 0; m < pb->num_tiles_m; ++m) {
            if (!block_computed(pb, b, h, m, n)) continue;
            int64_t i0, i1;
            bl_row_tile_range(m, d->seqlen_q, &i0, &i1);
            load_row_tile(pb, b, h, i0, i1 - i0, s);
            backward_block(D, d->scale, i1 - i0, j0, j1 - j0, s, NULL, s->dk, s->dv);
        }
    for (int64_t j = j0; j < j1; ++j) {
        bl_store_row(pb->dk, d->dtype, b, j, hk, D, s->dk + (j - j0) * D, d->scale);
        bl_store_row(pb->dv, d->dtype, b, j, hk, D, s->dv + (j - j0) * D, 1.0f);
    }
}

/* Pass 2: dq of row tile m of query head h, from every computed block in its row. */
static void backward_row_tile(const bwd_problem *pb, int64_t b, int64_t h, int64_t m,
                              bwd_scratch *s) {
    const bl_attn_desc *d = pb->d;
    const int D = (int)d->head_dim;
    const int64_t hk = h / pb->group;
    int64_t i0, i1;
    bl_row_tile_range(m, d->seqlen_q, &i0, &i1);
    load_row_tile(pb, b, h, i0, i1 - i0, s);
    for (int64_t n = 0; n < pb->num_tiles_n; ++n) {
        if (!block_computed(pb, b, h, m, n)) continue;
        int64_t j0, j1;
        bl_key_tile_range(n, d->seqlen_k, &j0, &j1);
        load_kv_tile(pb, b, hk, j0, j1, s);
        backward_block(D, d->scale, i1 - i0, j0, j1 - j0, s, s->dq, NULL, NULL);
    }
    for (int64_t r = 0; r < i1 - i0; ++r)
        bl_store_row(pb->dq, d->dtype, b, i0 + r, h, D, s->dq + r * D, d->scale);
}

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int use_per_kv_head_schedule(const bl_attn_desc *d) {
    const char *forced = getenv("BACKLITE_CPU_BACKWARD");
    if (forced && strcmp(forced, "per-kv-head") == 0) return 1;
    if (forced && strcmp(forced, "two-pass") == 0) return 0;
    return d->batch * d->heads_k >= max_threads();
}

/* Runs the backward's work items in parallel; returns 0 if a thread's scratch allocation failed. */
static int run_schedule(const bwd_problem *pb, int per_kv_head) {
    const bl_attn_desc *d = pb->d;
    const int D = (int)d->head_dim;
    const int64_t heads_k_items = d->batch * d->heads_k;
    int out_of_memory = 0;
#pragma omp parallel
    {
        bwd_scratch s;
        const int ok = bwd_scratch_alloc(&s, D, per_kv_head ? d->seqlen_k : BL_TILE_N);
        if (!ok) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        if (per_kv_head) {
#pragma omp for schedule(dynamic)
            for (int64_t item = 0; item < heads_k_items; ++item)
                if (ok) backward_kv_head(pb, item / d->heads_k, item % d->heads_k, &s);
        } else {
            /* causal columns and rows differ in cost: hand them out dynamically */
            const int64_t key_items = heads_k_items * pb->num_tiles_n;
#pragma omp for schedule(dynamic)
            for (int64_t item = 0; item < key_items; ++item) {
                const int64_t n = item % pb->num_tiles_n, bh = item / pb->num_tiles_n;
                if (ok) backward_key_tile(pb, bh / d->heads_k, bh % d->heads_k, n, &s);
            }
            const int64_t row_items = d->batch * d->heads_q * pb->num_tiles_m;
#pragma omp for schedule(dynamic)
            for (int64_t item = 0; item < row_items; ++item) {
                const int64_t m = item % pb->num_tiles_m, bh = item / pb->num_tiles_m;
                if (ok) backward_row_tile(pb, bh / d->heads_q, bh % d->heads_q, m, &s);
            }
        }
        bwd_scratch_free(&s);
    }
    return !out_of_memory;
}

bl_status bl_cpu_backward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                          bl_tensor out, bl_tensor dout, const float *lse,
                          const float *tile_mass, float negl_prob, const uint8_t *mask,
                          bl_tensor dq, bl_tensor dk, bl_tensor dv) {
    bwd_problem pb = {d, &q, &k, &v, &dout, &dq, &dk, &dv, lse, NULL, mask,
                      bl_ceil_div(d->seqlen_q, BL_TILE_M), bl_ceil_div(d->seqlen_k, BL_TILE_N),
                      d->heads_q / d->heads_k};
    const size_t rows = (size_t)(d->batch * d->heads_q * d->seqlen_q);
    const size_t mask_bytes = (size_t)(d->batch * d->heads_q * pb.num_tiles_m * pb.num_tiles_n);
    uint8_t *selected = NULL;
    float *dlt = malloc(sizeof(float) * rows);
    if (!dlt)
        return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                            "bl_backward (CPU): cannot allocate %zu bytes for Dlt",
                            sizeof(float) * rows);

    if (!mask && negl_prob > 0.0f) { /* select from the tile mass first */
        selected = malloc(mask_bytes);
        if (!selected) {
            free(dlt);
            return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                                "bl_backward (CPU): cannot allocate a %zu-byte selection mask",
                                mask_bytes);
        }
        bl_status st = bl_cpu_select_tiles(d, tile_mass, negl_prob, selected);
        if (st != BL_OK) {
            free(selected), free(dlt);
            return st;
        }
        pb.keep = selected;
    }

    compute_dlt(d, &out, &dout, dlt);
    pb.dlt = dlt;
    const int per_kv_head = use_per_kv_head_schedule(d);
    const int ok = run_schedule(&pb, per_kv_head);
    free(selected), free(dlt);
    if (!ok)
        return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                            "bl_backward (CPU): cannot allocate the per-thread scratch "
                            "(seqlen_k=%lld, head_dim=%lld)",
                            (long long)d->seqlen_k, (long long)d->head_dim);
    return BL_OK;
}
