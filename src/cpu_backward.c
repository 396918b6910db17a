/* cpu_backward.c -- the CPU backward, dense or block-sparse (DESIGN §1).
 *
 * One work item is one (batch, kv head): the thread that runs it owns that head's dk and dv
 * (fp32 accumulators over all keys, summed over the group's query heads, so GQA needs no atomics)
 * and the dq rows of the group's query heads. For every query head of the group and every row
 * tile it visits only the kept key tiles that hold an allowed key, recomputes P from the saved lse
 * and adds the tile's share to dq, dk and dv:
 *   P = exp(scale q k^T - lse), dP = dO v^T, dS = P * (dP - Dlt),
 *   dv += P^T dO, dk += scale dS^T q, dq += scale dS k, with Dlt_i = sum_d dO_id out_id.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_tensor.h"
#include "cpu_tiles.h"

/* Per-thread scratch of one backward work item. */
typedef struct bwd_scratch {
    float *q;        /* (TM, D) query rows (unscaled) */
    float *dout;     /* (TM, D) output-gradient rows */
    float *out_row;  /* (D) one output row, for Dlt */
    float *dq;       /* (TM, D) dq accumulator of the current row tile (scale applied at store) */
    float *lse;      /* (TM) */
    float *dlt;      /* (TM) Dlt_i = sum_d dO_id out_id */
    int64_t *limit;  /* (TM) number of keys each row may see (a prefix) */
    float *k;        /* (TN, D) key tile as rows, for dq += dS k */
    float *k_t;      /* (D, TN) key tile transposed, for S = q k^T */
    float *v_t;      /* (D, TN) value tile transposed, for dP = dO v^T */
    float *kv_row;   /* (D) one value row on its way into v_t */
    float *p;        /* (TM, TN) probabilities of the tile */
    float *ds;       /* (TM, TN) dS of the tile */
    float *dk;       /* (Sk, D) dk accumulator of the kv head (scale applied at store) */
    float *dv;       /* (Sk, D) dv accumulator of the kv head */
} bwd_scratch;

static void bwd_scratch_free(bwd_scratch *s) {
    free(s->q); free(s->dout); free(s->out_row); free(s->dq); free(s->lse); free(s->dlt);
    free(s->limit); free(s->k); free(s->k_t); free(s->v_t); free(s->kv_row); free(s->p);
    free(s->ds); free(s->dk); free(s->dv);
}

static int bwd_scratch_alloc(bwd_scratch *s, int D, int64_t Sk) {
    const size_t tile_md = sizeof(float) * BL_TILE_M * D;
    const size_t tile_nd = sizeof(float) * BL_TILE_N * D;
    const size_t tile_mn = sizeof(float) * BL_TILE_M * BL_TILE_N;
    s->q = malloc(tile_md);
    s->dout = malloc(tile_md);
    s->out_row = malloc(sizeof(float) * D);
    s->dq = malloc(tile_md);
    s->lse = malloc(sizeof(float) * BL_TILE_M);
    s->dlt = malloc(sizeof(float) * BL_TILE_M);
    s->limit = malloc(sizeof(int64_t) * BL_TILE_M);
    s->k = malloc(tile_nd);
    s->k_t = malloc(tile_nd);
    s->v_t = malloc(tile_nd);
    s->kv_row = malloc(sizeof(float) * D);
    s->p = malloc(tile_mn);
    s->ds = malloc(tile_mn);
    s->dk = malloc(sizeof(float) * (size_t)Sk * D);
    s->dv = malloc(sizeof(float) * (size_t)Sk * D);
    return s->q && s->dout && s->out_row && s->dq && s->lse && s->dlt && s->limit && s->k &&
           s->k_t && s->v_t && s->kv_row && s->p && s->ds && s->dk && s->dv;
}

/* Loads rows of row tile m of query head h: q, dO, lse, Dlt and each row's key limit. */
static void load_row_tile(const bl_attn_desc *d, const bl_tensor *q, const bl_tensor *out,
                          const bl_tensor *dout, const float *lse, int64_t b, int64_t h,
                          int64_t i0, int64_t rows, bwd_scratch *s) {
    const int D = (int)d->head_dim;
    const float *lse_rows = lse + (b * d->heads_q + h) * d->seqlen_q;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        bl_load_row(q, d->dtype, b, i, h, D, s->q + r * D);
        bl_load_row(dout, d->dtype, b, i, h, D, s->dout + r * D);
        bl_load_row(out, d->dtype, b, i, h, D, s->out_row);
        float dlt = 0.0f;
        for (int e = 0; e < D; ++e) dlt += s->dout[r * D + e] * s->out_row[e];
        s->dlt[r] = dlt;
        s->lse[r] = lse_rows[i];
        s->limit[r] = bl_key_limit(d->causal, i, d->seqlen_q, d->seqlen_k);
        memset(s->dq + r * D, 0, sizeof(float) * D);
    }
}

/* Converts keys/values [j0, j1) of kv head hk to float: k as rows and transposed, v transposed. */
static void load_kv_tile(const bl_attn_desc *d, const bl_tensor *k, const bl_tensor *v,
                         int64_t b, int64_t hk, int64_t j0, int64_t j1, bwd_scratch *s) {
    const int D = (int)d->head_dim;
    for (int64_t j = j0; j < j1; ++j) {
        const int64_t c = j - j0;
        float *k_row = s->k + c * D;
        bl_load_row(k, d->dtype, b, j, hk, D, k_row);
        bl_load_row(v, d->dtype, b, j, hk, D, s->kv_row);
        for (int e = 0; e < D; ++e) {
            s->k_t[(int64_t)e * BL_TILE_N + c] = k_row[e];
            s->v_t[(int64_t)e * BL_TILE_N + c] = s->kv_row[e];
        }
    }
}

/* One (row tile, key tile) block: adds its share to dq (tile rows), dk and dv (keys j0..). */
static void backward_block(int D, float scale, int64_t rows, int64_t j0, int64_t width,
                           bwd_scratch *s) {
    for (int64_t r = 0; r < rows; ++r) {
        int64_t cols = s->limit[r] - j0; /* the row's allowed keys in this tile */
        if (cols > width) cols = width;
        if (cols <= 0) continue;
        float *p = s->p + r * BL_TILE_N;
        float *ds = s->ds + r * BL_TILE_N;
        const float *q = s->q + r * D;
        const float *dout = s->dout + r * D;

        for (int64_t c = 0; c < cols; ++c) p[c] = 0.0f, ds[c] = 0.0f;
        for (int e = 0; e < D; ++e) {
            const float qe = q[e], de = dout[e];
            const float *kt = s->k_t + (int64_t)e * BL_TILE_N;
            const float *vt = s->v_t + (int64_t)e * BL_TILE_N;
            for (int64_t c = 0; c < cols; ++c) {
                p[c] += qe * kt[c];  /* S */
                ds[c] += de * vt[c]; /* dP */
            }
        }
        const float lse = s->lse[r], dlt = s->dlt[r];
        for (int64_t c = 0; c < cols; ++c) {
            p[c] = expf(scale * p[c] - lse);
            ds[c] = p[c] * (ds[c] - dlt);
        }

        float *dq = s->dq + r * D;
        for (int64_t c = 0; c < cols; ++c) {
            const float dsc = ds[c], pc = p[c];
            const float *krow = s->k + c * D;
            float *dk = s->dk + (j0 + c) * D;
            float *dv = s->dv + (j0 + c) * D;
            for (int e = 0; e < D; ++e) {
                dq[e] += dsc * krow[e];
                dk[e] += dsc * q[e];
                dv[e] += pc * dout[e];
            }
        }
    }
}

static void backward_kv_head(const bl_attn_desc *d, const bl_tensor *q, const bl_tensor *k,
                             const bl_tensor *v, const bl_tensor *out, const bl_tensor *dout,
                             const float *lse, const uint8_t *mask, const bl_tensor *dq,
                             const bl_tensor *dk, const bl_tensor *dv, int64_t b, int64_t hk,
                             bwd_scratch *s) {
    const int D = (int)d->head_dim;
    const int64_t Sq = d->seqlen_q, Sk = d->seqlen_k, Hq = d->heads_q;
    const int64_t group = Hq / d->heads_k;
    const int64_t num_tiles_m = bl_ceil_div(Sq, BL_TILE_M);
    const int64_t num_tiles_n = bl_ceil_div(Sk, BL_TILE_N);

    memset(s->dk, 0, sizeof(float) * (size_t)Sk * D);
    memset(s->dv, 0, sizeof(float) * (size_t)Sk * D);

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t m = 0; m < num_tiles_m; ++m) {
            int64_t i0, i1;
            bl_row_tile_range(m, Sq, &i0, &i1);
            load_row_tile(d, q, out, dout, lse, b, h, i0, i1 - i0, s);
            const uint8_t *keep = mask ? mask + ((b * Hq + h) * num_tiles_m + m) * num_tiles_n
                                       : NULL;
            /* Tiles past tiles_visited hold no allowed key: never computed, whatever the mask. */
            const int64_t tiles_visited = bl_key_tiles_visited(d->causal, m, Sq, Sk);
            for (int64_t n = 0; n < tiles_visited; ++n) {
                if (keep && !keep[n]) continue;
                int64_t j0, j1;
                bl_key_tile_range(n, Sk, &j0, &j1);
                load_kv_tile(d, k, v, b, hk, j0, j1, s);
                backward_block(D, d->scale, i1 - i0, j0, j1 - j0, s);
            }
            for (int64_t r = 0; r < i1 - i0; ++r)
                bl_store_row(dq, d->dtype, b, i0 + r, h, D, s->dq + r * D, d->scale);
        }
    }
    for (int64_t j = 0; j < Sk; ++j) {
        bl_store_row(dk, d->dtype, b, j, hk, D, s->dk + j * D, d->scale);
        bl_store_row(dv, d->dtype, b, j, hk, D, s->dv + j * D, 1.0f);
    }
}

bl_status bl_cpu_backward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                          bl_tensor out, bl_tensor dout, const float *lse,
                          const float *tile_mass, float negl_prob, const uint8_t *mask,
                          bl_tensor dq, bl_tensor dk, bl_tensor dv) {
    const int64_t num_tiles_m = bl_ceil_div(d->seqlen_q, BL_TILE_M);
    const int64_t num_tiles_n = bl_ceil_div(d->seqlen_k, BL_TILE_N);
    uint8_t *selected = NULL;

    if (!mask && negl_prob > 0.0f) { /* select from the tile mass first */
        const size_t mask_bytes = (size_t)(d->batch * d->heads_q * num_tiles_m * num_tiles_n);
        selected = malloc(mask_bytes);
        if (!selected)
            return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                                "bl_backward (CPU): cannot allocate a %zu-byte selection mask",
                                mask_bytes);
        bl_status st = bl_cpu_select_tiles(d, tile_mass, negl_prob, selected);
        if (st != BL_OK) {
            free(selected);
            return st;
        }
        mask = selected;
    }

    const int64_t items = d->batch * d->heads_k;
    int out_of_memory = 0;
#pragma omp parallel
    {
        bwd_scratch s;
        int ok = bwd_scratch_alloc(&s, (int)d->head_dim, d->seqlen_k);
        if (!ok) {
#pragma omp atomic write
            out_of_memory = 1;
        }
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < items; ++item) {
            if (!ok) continue;
            const int64_t hk = item % d->heads_k;
            const int64_t b = item / d->heads_k;
            backward_kv_head(d, &q, &k, &v, &out, &dout, lse, mask, &dq, &dk, &dv, b, hk, &s);
        }
        bwd_scratch_free(&s);
    }
    free(selected);
    if (out_of_memory)
        return bl_set_error(BL_ERR_OUT_OF_MEMORY,
                            "bl_backward (CPU): cannot allocate the per-thread scratch "
                            "(seqlen_k=%lld, head_dim=%lld)",
                            (long long)d->seqlen_k, (long long)d->head_dim);
    return BL_OK;
}
