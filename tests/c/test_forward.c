/* test_forward.c -- CPU forward (out, lse, tile mass W) against the float64 reference, over
 * dtypes, head dims, causal, GQA/MQA, odd lengths, Sq != Sk both ways and memory layouts. */
#include "attn_case.h"

static const case_shape shapes[] = {
    /* B, Sq,  Sk,  Hq, Hk, D */
    {2, 130, 257, 4, 2, 64},  /* GQA, Sq < Sk, partial last tiles */
    {1, 257, 130, 4, 1, 128}, /* MQA, Sq > Sk: causal has rows with no key */
    {1, 65, 63, 2, 2, 40},    /* odd head dim, one key tile */
    {1, 63, 65, 3, 3, 96},
    {1, 1, 1, 1, 1, 64},      /* single query, single key */
    {1, 1, 300, 2, 1, 64},    /* one query row against many keys (decode-like) */
    {2, 300, 1, 2, 2, 128},   /* many rows, one key: causal leaves almost every row empty */
    {1, 200, 200, 2, 1, 256}, /* the largest head dim */
    {1, 70, 129, 2, 2, 2},    /* the smallest head dim */
};

static void check_forward(attn_case *c) {
    const ref_problem *r = &c->ref;
    double *out_ref = xcalloc(c->nq, sizeof(double)), *out_got = xcalloc(c->nq, sizeof(double));
    double *lse_ref = xcalloc(c->nl, sizeof(double)), *lse_got = xcalloc(c->nl, sizeof(double));
    double *w_ref = xcalloc(c->nw, sizeof(double)), *w_got = xcalloc(c->nw, sizeof(double));

    tensor_poison(&c->out);
    bl_status st = case_forward(c, 1);
    EXPECT(st == BL_OK, "bl_forward [%s] returned %d: %s", c->name, (int)st, bl_last_error());
    ref_forward(r, c->q_d, c->k_d, c->v_d, out_ref, lse_ref, w_ref);
    tensor_get(&c->out, out_got);
    for (size_t i = 0; i < c->nl; ++i) lse_got[i] = c->lse[i];
    for (size_t i = 0; i < c->nw; ++i) w_got[i] = c->W[i];

    expect_close("out", c->name, out_got, out_ref, c->nq, output_tolerance(c->dtype));
    expect_close("lse", c->name, lse_got, lse_ref, c->nl, STATS_TOLERANCE);
    expect_close("W", c->name, w_got, w_ref, c->nw, STATS_TOLERANCE);
    EXPECT(tensor_gaps_untouched(&c->out), "out [%s]: wrote outside the (B,S,H,D) view", c->name);

    /* Rows without any allowed key: out exactly 0 and lse exactly -inf. */
    int64_t empty_rows = 0;
    for (int64_t b = 0; b < r->B; ++b)
        for (int64_t h = 0; h < r->Hq; ++h)
            for (int64_t i = 0; i < r->Sq; ++i) {
                if (isfinite(lse_ref[(b * r->Hq + h) * r->Sq + i])) continue;
                ++empty_rows;
                EXPECT(c->lse[(b * r->Hq + h) * r->Sq + i] == -INFINITY,
                       "lse [%s]: empty row b=%lld h=%lld i=%lld has lse %g, want -inf", c->name,
                       (long long)b, (long long)h, (long long)i,
                       (double)c->lse[(b * r->Hq + h) * r->Sq + i]);
                for (int64_t e = 0; e < r->D; ++e)
                    if (out_got[((b * r->Sq + i) * r->Hq + h) * r->D + e] != 0.0) {
                        EXPECT(0, "out [%s]: empty row b=%lld h=%lld i=%lld is not zero",
                               c->name, (long long)b, (long long)h, (long long)i);
                        break;
                    }
            }
    if (r->causal && r->Sq > r->Sk)
        EXPECT(empty_rows == r->B * r->Hq * (r->Sq - r->Sk),
               "[%s]: %lld empty rows, want B*Hq*(Sq-Sk)", c->name, (long long)empty_rows);

    /* Each valid row carries mass 1: W summed over a row tile counts its valid rows. */
    for (int64_t bh = 0; bh < r->B * r->Hq; ++bh)
        for (int64_t m = 0; m < c->Tm; ++m) {
            double total = 0.0, rows = 0.0;
            for (int64_t n = 0; n < c->Tn; ++n) total += c->W[(bh * c->Tm + m) * c->Tn + n];
            for (int64_t i = m * BL_TILE_M; i < (m + 1) * BL_TILE_M && i < r->Sq; ++i)
                rows += isfinite(lse_ref[bh * r->Sq + i]);
            EXPECT(fabs(total - rows) <= 1e-5 * (rows > 1 ? rows : 1),
                   "W [%s]: row tile (bh=%lld, m=%lld) holds mass %.9g, want %g", c->name,
                   (long long)bh, (long long)m, total, rows);
        }

    /* Without statistics: the same out and lse, bit for bit. */
    float *lse_first = xcalloc(c->nl, sizeof(float));
    memcpy(lse_first, c->lse, c->nl * sizeof(float));
    size_t out_bytes = c->out.elements * dtype_bytes(c->dtype);
    void *out_first = xcalloc(out_bytes, 1);
    memcpy(out_first, c->out.alloc, out_bytes);
    st = case_forward(c, 0);
    EXPECT(st == BL_OK, "bl_forward without stats [%s] returned %d: %s", c->name, (int)st,
           bl_last_error());
    EXPECT(memcmp(out_first, c->out.alloc, out_bytes) == 0,
           "out [%s]: differs between runs with and without tile statistics", c->name);
    EXPECT(memcmp(lse_first, c->lse, c->nl * sizeof(float)) == 0,
           "lse [%s]: differs between runs with and without tile statistics", c->name);

    free(lse_first), free(out_first);
    free(out_ref), free(out_got), free(lse_ref), free(lse_got), free(w_ref), free(w_got);
}

int main(void) {
    const bl_dtype dtypes[] = {BL_DTYPE_F32, BL_DTYPE_F16, BL_DTYPE_BF16};
    uint64_t seed = 1;
    int case_index = 0;
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; ++di)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; ++si)
            for (int causal = 0; causal <= 1; ++causal) {
                attn_case c;
                layout lay = (layout)(case_index++ % 3); /* every layout meets every dtype */
                case_init(&c, shapes[si], causal, dtypes[di], lay, seed++);
                check_forward(&c);
                case_free(&c);
            }
    /* Local attention over many tiles: W concentrated near the diagonal, still exact. */
    const case_shape long_shape = {1, 1000, 900, 2, 1, 64};
    for (int causal = 0; causal <= 1; ++causal) {
        attn_case c;
        case_init(&c, long_shape, causal, BL_DTYPE_BF16, LAYOUT_PADDED, seed++);
        case_make_local(&c, 12.0);
        check_forward(&c);
        case_free(&c);
    }
    return test_summary("test_forward");
}
