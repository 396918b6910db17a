/* test_nonfinite.c -- NaN and inf inputs propagate as in dense attention, and only inside their
 * own row / head / batch: every output they cannot reach is bit-identical to a clean run. */
#include "attn_case.h"

/* Writes value into element (b, s, h, d) of x and of its dense double copy. */
static void poke(test_tensor *x, double *vals, int64_t b, int64_t s, int64_t h, int64_t d,
                 double value) {
    int64_t o = tensor_offset(x, b, s, h) + d;
    if (x->dtype == BL_DTYPE_F32) ((float *)x->alloc)[o] = (float)value;
    else if (x->dtype == BL_DTYPE_BF16)
        ((uint16_t *)x->alloc)[o] = isnan(value)   ? 0x7fc0
                                    : isinf(value) ? (value > 0 ? 0x7f80 : 0xff80)
                                                   : test_encode_bf16(value);
    else
        ((uint16_t *)x->alloc)[o] = isinf(value) ? (value > 0 ? 0x7c00 : 0xfc00)
                                                 : test_encode_f16(value);
    vals[((b * x->S + s) * x->H + h) * x->D + d] = value;
}

typedef struct outputs {
    double *out, *lse, *w, *dq, *dk, *dv, *dq_sparse, *dk_sparse, *dv_sparse;
    uint8_t *mask;
} outputs;

static void run_all(attn_case *c, outputs *o) {
    o->out = xcalloc(c->nq, sizeof(double)), o->lse = xcalloc(c->nl, sizeof(double));
    o->w = xcalloc(c->nw, sizeof(double)), o->mask = xcalloc(c->nw, 1);
    o->dq = xcalloc(c->nq, sizeof(double)), o->dq_sparse = xcalloc(c->nq, sizeof(double));
    o->dk = xcalloc(c->nk, sizeof(double)), o->dk_sparse = xcalloc(c->nk, sizeof(double));
    o->dv = xcalloc(c->nk, sizeof(double)), o->dv_sparse = xcalloc(c->nk, sizeof(double));
    EXPECT(case_forward(c, 1) == BL_OK, "[%s] forward failed: %s", c->name, bl_last_error());
    tensor_get(&c->out, o->out);
    for (size_t i = 0; i < c->nl; ++i) o->lse[i] = c->lse[i];
    for (size_t i = 0; i < c->nw; ++i) o->w[i] = c->W[i];
    EXPECT(bl_select_tiles(&c->desc, c->W, 0.2f, o->mask) == BL_OK, "[%s] select failed: %s",
           c->name, bl_last_error());
    EXPECT(bl_backward(&c->desc, c->q.t, c->k.t, c->v.t, c->out.t, c->dout.t, c->lse, c->W, 0.0f,
                       NULL, c->dq.t, c->dk.t, c->dv.t) == BL_OK,
           "[%s] dense backward failed: %s", c->name, bl_last_error());
    tensor_get(&c->dq, o->dq), tensor_get(&c->dk, o->dk), tensor_get(&c->dv, o->dv);
    EXPECT(bl_backward(&c->desc, c->q.t, c->k.t, c->v.t, c->out.t, c->dout.t, c->lse, c->W, 0.2f,
                       NULL, c->dq.t, c->dk.t, c->dv.t) == BL_OK,
           "[%s] sparse backward failed: %s", c->name, bl_last_error());
    tensor_get(&c->dq, o->dq_sparse), tensor_get(&c->dk, o->dk_sparse);
    tensor_get(&c->dv, o->dv_sparse);
}

static void free_outputs(outputs *o) {
    free(o->out), free(o->lse), free(o->w), free(o->mask), free(o->dq), free(o->dk), free(o->dv);
    free(o->dq_sparse), free(o->dk_sparse), free(o->dv_sparse);
}

/* Compares a poisoned run against the clean one: entries where reach() is 0 must be identical
 * bits; entries where it is 1 must be NaN when want_nan. */
typedef int (*reach_fn)(int64_t index, const void *ctx);

static void expect_contained(const char *what, const char *ctx_name, const double *clean,
                             const double *dirty, size_t n, reach_fn reach, const void *ctx,
                             int want_nan) {
    size_t changed = 0, not_nan = 0, first = 0;
    for (size_t i = 0; i < n; ++i) {
        if (reach((int64_t)i, ctx)) {
            if (want_nan && !isnan(dirty[i])) ++not_nan;
            continue;
        }
        if (memcmp(&clean[i], &dirty[i], sizeof(double)) != 0 && changed++ == 0) first = i;
    }
    EXPECT(changed == 0, "%s [%s]: %zu entries out of reach changed (first at %zu: %g -> %g)",
           what, ctx_name, changed, first, changed ? clean[first] : 0.0,
           changed ? dirty[first] : 0.0);
    EXPECT(not_nan == 0, "%s [%s]: %zu reached entries are not NaN", what, ctx_name, not_nan);
}

/* Where one NaN at q[b0, i0, h0, :] may go. */
typedef struct q_nan_site {
    const attn_case *c;
    int64_t b0, i0, h0;
} q_nan_site;

static int reach_q_row(int64_t idx, const void *ctx) { /* (B, Sq, Hq, D) index */
    const q_nan_site *s = ctx;
    const case_shape *sh = &s->c->shape;
    int64_t h = idx / sh->D % sh->Hq, i = idx / (sh->D * sh->Hq) % sh->Sq,
            b = idx / (sh->D * sh->Hq * sh->Sq);
    return b == s->b0 && i == s->i0 && h == s->h0;
}
static int reach_lse(int64_t idx, const void *ctx) { /* (B, Hq, Sq) */
    const q_nan_site *s = ctx;
    const case_shape *sh = &s->c->shape;
    return idx == (s->b0 * sh->Hq + s->h0) * sh->Sq + s->i0;
}
static int reach_w(int64_t idx, const void *ctx) { /* (B, Hq, Tm, Tn): the row's own row tile */
    const q_nan_site *s = ctx;
    const attn_case *c = s->c;
    return idx / c->Tn == (s->b0 * c->shape.Hq + s->h0) * c->Tm + s->i0 / BL_TILE_M;
}
static int reach_kv(int64_t idx, const void *ctx) { /* (B, Sk, Hk, D): keys the row can see */
    const q_nan_site *s = ctx;
    const case_shape *sh = &s->c->shape;
    int64_t hk = idx / sh->D % sh->Hk, j = idx / (sh->D * sh->Hk) % sh->Sk,
            b = idx / (sh->D * sh->Hk * sh->Sk);
    return b == s->b0 && hk == s->h0 / (sh->Hq / sh->Hk) && ref_allowed(&s->c->ref, s->i0, j);
}

static void nan_in_one_query(bl_dtype dt, int causal) {
    const case_shape shape = {2, 130, 200, 4, 2, 64};
    attn_case c;
    case_init(&c, shape, causal, dt, LAYOUT_BSHD, 5);
    outputs clean, dirty;
    run_all(&c, &clean);
    const q_nan_site site = {&c, 1, 70, 3};
    poke(&c.q, c.q_d, site.b0, site.i0, site.h0, 5, NAN);
    run_all(&c, &dirty);
    expect_contained("out", c.name, clean.out, dirty.out, c.nq, reach_q_row, &site, 1);
    expect_contained("lse", c.name, clean.lse, dirty.lse, c.nl, reach_lse, &site, 1);
    expect_contained("W", c.name, clean.w, dirty.w, c.nw, reach_w, &site, 0);
    expect_contained("dq", c.name, clean.dq, dirty.dq, c.nq, reach_q_row, &site, 1);
    expect_contained("dk", c.name, clean.dk, dirty.dk, c.nk, reach_kv, &site, 1);
    expect_contained("dv", c.name, clean.dv, dirty.dv, c.nk, reach_kv, &site, 1);
    /* the NaN row tile keeps every tile, so the sparse backward still propagates it */
    const int64_t row_tile = (site.b0 * shape.Hq + site.h0) * c.Tm + site.i0 / BL_TILE_M;
    int all_kept = 1;
    for (int64_t n = 0; n < c.Tn; ++n) all_kept &= dirty.mask[row_tile * c.Tn + n] != 0;
    EXPECT(all_kept, "mask [%s]: the row tile with a NaN must keep every tile", c.name);
    expect_contained("dq (negl_prob 0.2)", c.name, clean.dq_sparse, dirty.dq_sparse, c.nq,
                     reach_q_row, &site, 1);
    expect_contained("dk (negl_prob 0.2)", c.name, clean.dk_sparse, dirty.dk_sparse, c.nk,
                     reach_kv, &site, 1);
    free_outputs(&clean), free_outputs(&dirty);
    case_free(&c);
}

/* Where an inf at k[b0, j0, hk0, :] may go: rows of the group's heads in batch b0 that see j0. */
typedef struct k_inf_site {
    const attn_case *c;
    int64_t b0, j0, hk0;
} k_inf_site;

static int reach_k_q(int64_t idx, const void *ctx) {
    const k_inf_site *s = ctx;
    const case_shape *sh = &s->c->shape;
    int64_t h = idx / sh->D % sh->Hq, i = idx / (sh->D * sh->Hq) % sh->Sq,
            b = idx / (sh->D * sh->Hq * sh->Sq);
    return b == s->b0 && h / (sh->Hq / sh->Hk) == s->hk0 && ref_allowed(&s->c->ref, i, s->j0);
}
static int reach_k_kv(int64_t idx, const void *ctx) { /* the whole kv head may change */
    const k_inf_site *s = ctx;
    const case_shape *sh = &s->c->shape;
    int64_t hk = idx / sh->D % sh->Hk, b = idx / (sh->D * sh->Hk * sh->Sk);
    return b == s->b0 && hk == s->hk0;
}

/* +inf in a key: scores become +-inf (or NaN against a zero); the result must match the float64
 * reference's dense computation in kind (NaN where it is NaN) and stay inside its kv head. */
static void inf_in_one_key(bl_dtype dt) {
    const case_shape shape = {2, 70, 150, 4, 2, 32};
    attn_case c;
    case_init(&c, shape, 1, dt, LAYOUT_BSHD, 9);
    outputs clean, dirty;
    run_all(&c, &clean);
    const k_inf_site site = {&c, 0, 100, 1};
    poke(&c.k, c.k_d, site.b0, site.j0, site.hk0, 0, INFINITY);
    run_all(&c, &dirty);
    expect_contained("out", c.name, clean.out, dirty.out, c.nq, reach_k_q, &site, 0);
    expect_contained("dq", c.name, clean.dq, dirty.dq, c.nq, reach_k_q, &site, 0);
    expect_contained("dk", c.name, clean.dk, dirty.dk, c.nk, reach_k_kv, &site, 0);
    expect_contained("dv", c.name, clean.dv, dirty.dv, c.nk, reach_k_kv, &site, 0);
    double *out_ref = xcalloc(c.nq, sizeof(double)), *lse_ref = xcalloc(c.nl, sizeof(double));
    ref_forward(&c.ref, c.q_d, c.k_d, c.v_d, out_ref, lse_ref, NULL);
    size_t kind_mismatch = 0, ref_nan = 0, ref_finite_reached = 0;
    for (size_t i = 0; i < c.nq; ++i) {
        kind_mismatch += isnan(out_ref[i]) != isnan(dirty.out[i]);
        ref_nan += isnan(out_ref[i]) != 0;
        ref_finite_reached += reach_k_q((int64_t)i, &site) && isfinite(out_ref[i]);
    }
    /* both kinds occur: rows whose score against the key is +inf (NaN) and -inf (finite) */
    EXPECT(ref_nan > 0 && ref_finite_reached > 0,
           "[%s, inf key]: the case no longer exercises both kinds (%zu NaN, %zu finite)", c.name,
           ref_nan, ref_finite_reached);
    EXPECT(kind_mismatch == 0, "out [%s, inf key]: %zu entries NaN in one of library/reference",
           c.name, kind_mismatch);
    free(out_ref), free(lse_ref);
    free_outputs(&clean), free_outputs(&dirty);
    case_free(&c);
}

int main(void) {
    const bl_dtype dtypes[] = {BL_DTYPE_F32, BL_DTYPE_F16, BL_DTYPE_BF16};
    for (int i = 0; i < 3; ++i) {
        nan_in_one_query(dtypes[i], 0);
        nan_in_one_query(dtypes[i], 1);
        inf_in_one_key(dtypes[i]);
    }
    return test_summary("test_nonfinite");
}
