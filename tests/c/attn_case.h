/* attn_case.h -- one attention problem set up for both the library and the float64 reference:
 * random inputs rounded to the dtype, library tensors in a chosen layout, the reference's inputs
 * as the exact rounded values. Header-only, shared by test_forward.c and test_backward.c. */
#ifndef BL_TEST_ATTN_CASE_H
#define BL_TEST_ATTN_CASE_H

#include "check.h"
#include "reference.h"

typedef struct case_shape {
    int64_t B, Sq, Sk, Hq, Hk, D;
} case_shape;

typedef struct attn_case {
    case_shape shape;
    int causal;
    bl_dtype dtype;
    layout lay;
    char name[160];
    bl_attn_desc desc;
    ref_problem ref;
    int64_t Tm, Tn;
    size_t nq, nk, nl, nw; /* elements of q-shaped, k-shaped, lse and W arrays */
    test_tensor q, k, v, out, dout, dq, dk, dv;
    double *q_d, *k_d, *v_d, *dout_d; /* rounded inputs as doubles, dense BSHD */
    float *lse, *W;
} attn_case;

static inline void case_init(attn_case *c, case_shape s, int causal, bl_dtype dt, layout lay,
                             uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->shape = s, c->causal = causal, c->dtype = dt, c->lay = lay;
    snprintf(c->name, sizeof c->name,
             "%s B=%lld Sq=%lld Sk=%lld Hq=%lld Hk=%lld D=%lld %s layout=%d",
             dtype_name(dt), (long long)s.B, (long long)s.Sq, (long long)s.Sk, (long long)s.Hq,
             (long long)s.Hk, (long long)s.D, causal ? "causal" : "full", (int)lay);
    bl_attn_desc *d = &c->desc;
    d->backend = BL_BACKEND_CPU, d->dtype = dt;
    d->batch = s.B, d->seqlen_q = s.Sq, d->seqlen_k = s.Sk, d->heads_q = s.Hq;
    d->heads_k = s.Hk, d->head_dim = s.D;
    d->scale = (float)(1.0 / sqrt((double)s.D));
    d->causal = causal;
    ref_problem *r = &c->ref;
    r->B = s.B, r->Sq = s.Sq, r->Sk = s.Sk, r->Hq = s.Hq, r->Hk = s.Hk, r->D = s.D;
    r->scale = d->scale; /* the float the library is given, exactly */
    r->causal = causal, r->tile_m = BL_TILE_M, r->tile_n = BL_TILE_N;
    c->Tm = ref_num_tiles_m(r), c->Tn = ref_num_tiles_n(r);
    c->nq = (size_t)(s.B * s.Sq * s.Hq * s.D);
    c->nk = (size_t)(s.B * s.Sk * s.Hk * s.D);
    c->nl = (size_t)(s.B * s.Hq * s.Sq);
    c->nw = (size_t)(s.B * s.Hq * c->Tm * c->Tn);

    c->q = tensor_make(s.B, s.Sq, s.Hq, s.D, dt, lay);
    c->k = tensor_make(s.B, s.Sk, s.Hk, s.D, dt, lay);
    c->v = tensor_make(s.B, s.Sk, s.Hk, s.D, dt, lay);
    c->out = tensor_make(s.B, s.Sq, s.Hq, s.D, dt, lay);
    c->dout = tensor_make(s.B, s.Sq, s.Hq, s.D, dt, lay);
    c->dq = tensor_make(s.B, s.Sq, s.Hq, s.D, dt, lay);
    c->dk = tensor_make(s.B, s.Sk, s.Hk, s.D, dt, lay);
    c->dv = tensor_make(s.B, s.Sk, s.Hk, s.D, dt, lay);
    c->q_d = xcalloc(c->nq, sizeof(double));
    c->k_d = xcalloc(c->nk, sizeof(double));
    c->v_d = xcalloc(c->nk, sizeof(double));
    c->dout_d = xcalloc(c->nq, sizeof(double));
    c->lse = xcalloc(c->nl, sizeof(float));
    c->W = xcalloc(c->nw, sizeof(float));

    uint64_t rng = seed;
    /* Scores of a few units: softmax neither uniform nor one-hot, so W and P are informative. */
    fill_normal(c->q_d, c->nq, 1.5, &rng);
    fill_normal(c->k_d, c->nk, 1.5, &rng);
    fill_normal(c->v_d, c->nk, 1.0, &rng);
    fill_normal(c->dout_d, c->nq, 1.0, &rng);
    tensor_set(&c->q, c->q_d);
    tensor_set(&c->k, c->k_d);
    tensor_set(&c->v, c->v_d);
    tensor_set(&c->dout, c->dout_d);
}

/* Replaces q and k with position codes whose scores peak at i - (Sq - Sk) == j (local
 * attention, as on a sequence with strong locality): most of each row's mass falls in the
 * key tiles near the diagonal, so the selection skips many tiles. `peak` is the top score. */
static inline void case_make_local(attn_case *c, double peak) {
    const case_shape *s = &c->shape;
    const int64_t pairs = s->D / 2;
    /* q_i . k_j = amp^2 * sum_f cos((i' - j) w_f), largest (pairs * amp^2) at i' == j */
    const double amp = sqrt(peak / (c->desc.scale * (double)pairs));
    for (int64_t b = 0; b < s->B; ++b)
        for (int64_t f = 0; f < pairs; ++f) {
            const double w = pow(1e-3, (double)f / (double)pairs); /* 1 .. 1e-3 rad per step */
            for (int64_t i = 0; i < s->Sq; ++i)
                for (int64_t h = 0; h < s->Hq; ++h) {
                    double *qv = c->q_d + ((b * s->Sq + i) * s->Hq + h) * s->D;
                    const double pos = (double)(i - (s->Sq - s->Sk));
                    qv[2 * f] = amp * cos(pos * w), qv[2 * f + 1] = amp * sin(pos * w);
                }
            for (int64_t j = 0; j < s->Sk; ++j)
                for (int64_t h = 0; h < s->Hk; ++h) {
                    double *kv = c->k_d + ((b * s->Sk + j) * s->Hk + h) * s->D;
                    kv[2 * f] = amp * cos((double)j * w), kv[2 * f + 1] = amp * sin((double)j * w);
                }
        }
    tensor_set(&c->q, c->q_d);
    tensor_set(&c->k, c->k_d);
    snprintf(c->name + strlen(c->name), sizeof c->name - strlen(c->name), " local");
}

static inline void case_free(attn_case *c) {
    tensor_free(&c->q), tensor_free(&c->k), tensor_free(&c->v), tensor_free(&c->out);
    tensor_free(&c->dout), tensor_free(&c->dq), tensor_free(&c->dk), tensor_free(&c->dv);
    free(c->q_d), free(c->k_d), free(c->v_d), free(c->dout_d), free(c->lse), free(c->W);
}

static inline bl_status case_forward(attn_case *c, int with_stats) {
    return bl_forward(&c->desc, c->q.t, c->k.t, c->v.t, c->out.t, c->lse,
                      with_stats ? c->W : NULL);
}

/* Relative L2 tolerance for an output stored in the dtype: one rounding to it dominates. */
static inline double output_tolerance(bl_dtype dt) {
    return dt == BL_DTYPE_F32 ? 1e-5 : dtype_eps(dt);
}
/* lse and W are fp32 whatever the dtype; the reference sees the same rounded inputs. */
#define STATS_TOLERANCE 1e-5

#endif /* BL_TEST_ATTN_CASE_H */
