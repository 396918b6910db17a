/* test_backward.c -- CPU backward (dense, selected from W, explicit masks) against the float64
 * reference, over dtypes, head dims, causal, GQA/MQA, odd lengths and Sq != Sk both ways, with
 * both CPU schedules (per kv head, two pass). */
#include "attn_case.h"

static const case_shape shapes[] = {
    /* B, Sq,  Sk,  Hq, Hk, D */
    {2, 130, 257, 4, 2, 64},  /* GQA, Sq < Sk */
    {1, 257, 130, 4, 1, 128}, /* MQA, Sq > Sk: causal has rows with no key */
    {1, 65, 63, 2, 2, 40},
    {1, 63, 65, 3, 3, 96},
    {1, 1, 1, 1, 1, 64},
    {1, 1, 300, 2, 1, 64},
    {2, 300, 1, 2, 2, 128},
    {1, 200, 200, 2, 1, 256},
    {1, 70, 129, 2, 2, 2},    /* the smallest head dim */
};

/* Tiles the negl_prob selection kept / looked at, over all cases: the sparse path must be tested
 * with tiles actually skipped. */
static int64_t g_tiles_kept = 0, g_tiles_total = 0;

typedef struct grads {
    double *dq, *dk, *dv;
} grads;

static grads grads_alloc(const attn_case *c) {
    grads g = {xcalloc(c->nq, sizeof(double)), xcalloc(c->nk, sizeof(double)),
               xcalloc(c->nk, sizeof(double))};
    return g;
}
static void grads_free(grads *g) { free(g->dq), free(g->dk), free(g->dv); }

/* Runs bl_backward; reads dq, dk, dv back. The outputs are poisoned first: every element must
 * be written. */
static bl_status run_backward(attn_case *c, float negl_prob, const uint8_t *mask, grads *got) {
    tensor_poison(&c->dq), tensor_poison(&c->dk), tensor_poison(&c->dv);
    bl_status st = bl_backward(&c->desc, c->q.t, c->k.t, c->v.t, c->out.t, c->dout.t, c->lse,
                               c->W, negl_prob, mask, c->dq.t, c->dk.t, c->dv.t);
    tensor_get(&c->dq, got->dq), tensor_get(&c->dk, got->dk), tensor_get(&c->dv, got->dv);
    EXPECT(tensor_gaps_untouched(&c->dq) && tensor_gaps_untouched(&c->dk) &&
               tensor_gaps_untouched(&c->dv),
           "[%s]: the backward wrote outside the (B,S,H,D) views", c->name);
    return st;
}

static void compare_grads(const attn_case *c, const char *mode, const grads *got,
                          const grads *want) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s, %s", c->name, mode);
    const double tol = output_tolerance(c->dtype);
    expect_close("dq", ctx, got->dq, want->dq, c->nq, tol);
    expect_close("dk", ctx, got->dk, want->dk, c->nk, tol);
    expect_close("dv", ctx, got->dv, want->dv, c->nk, tol);
}

static int grads_identical(const attn_case *c, const grads *a, const grads *b) {
    return memcmp(a->dq, b->dq, c->nq * sizeof(double)) == 0 &&
           memcmp(a->dk, b->dk, c->nk * sizeof(double)) == 0 &&
           memcmp(a->dv, b->dv, c->nk * sizeof(double)) == 0;
}

static void check_backward(attn_case *c, uint64_t seed) {
    const ref_problem *r = &c->ref;
    bl_status st = case_forward(c, 1);
    EXPECT(st == BL_OK, "bl_forward [%s] returned %d: %s", c->name, (int)st, bl_last_error());
    /* The reference's Dlt uses the out the library hands back, as the library's does. */
    double *out_d = xcalloc(c->nq, sizeof(double));
    tensor_get(&c->out, out_d);
    grads got = grads_alloc(c), want = grads_alloc(c), again = grads_alloc(c);

    /* 1. dense: mask NULL, negl_prob 0 */
    st = run_backward(c, 0.0f, NULL, &got);
    EXPECT(st == BL_OK, "bl_backward dense [%s] returned %d: %s", c->name, (int)st,
           bl_last_error());
    ref_backward(r, c->q_d, c->k_d, c->v_d, out_d, c->dout_d, NULL, want.dq, want.dk, want.dv);
    compare_grads(c, "dense", &got, &want);
    grads want_dense = grads_alloc(c);
    memcpy(want_dense.dq, want.dq, c->nq * sizeof(double));
    memcpy(want_dense.dk, want.dk, c->nk * sizeof(double));
    memcpy(want_dense.dv, want.dv, c->nk * sizeof(double));

    /* 2. selected from W: the library's mask must equal the reference selection of the same W,
     *    and the gradients the reference's over that mask. */
    const float negl_prob = 0.1f;
    uint8_t *mask = xcalloc(c->nw, 1), *mask_ref = xcalloc(c->nw, 1);
    st = bl_select_tiles(&c->desc, c->W, negl_prob, mask);
    EXPECT(st == BL_OK, "bl_select_tiles [%s] returned %d: %s", c->name, (int)st,
           bl_last_error());
    ref_select(r, c->W, negl_prob, mask_ref);
    EXPECT(memcmp(mask, mask_ref, c->nw) == 0, "mask [%s]: differs from the reference selection",
           c->name);
    for (size_t i = 0; i < c->nw; ++i) g_tiles_kept += mask[i] != 0;
    g_tiles_total += (int64_t)c->nw;
    st = run_backward(c, negl_prob, NULL, &got);
    EXPECT(st == BL_OK, "bl_backward selected [%s] returned %d: %s", c->name, (int)st,
           bl_last_error());
    ref_backward(r, c->q_d, c->k_d, c->v_d, out_d, c->dout_d, mask_ref, want.dq, want.dk,
                 want.dv);
    compare_grads(c, "negl_prob=0.1", &got, &want);
    /* the same mask given explicitly: the same computation, bit for bit */
    st = run_backward(c, 0.0f, mask, &again);
    EXPECT(st == BL_OK && grads_identical(c, &got, &again),
           "[%s]: explicit mask and negl_prob selection give different gradients", c->name);

    /* 3. a random explicit mask (any tile may be dropped, including the heaviest) */
    uint64_t rng = seed;
    for (size_t i = 0; i < c->nw; ++i) mask[i] = (uint8_t)(rng_next(&rng) & 3 ? 7 : 0);
    st = run_backward(c, 0.0f, mask, &got);
    EXPECT(st == BL_OK, "bl_backward random mask [%s] returned %d: %s", c->name, (int)st,
           bl_last_error());
    ref_backward(r, c->q_d, c->k_d, c->v_d, out_d, c->dout_d, mask, want.dq, want.dk, want.dv);
    compare_grads(c, "random mask", &got, &want);
    /* both CPU schedules visit the blocks in the same order per output: identical bits */
    const char *schedules[] = {"per-kv-head", "two-pass"};
    for (int i = 0; i < 2; ++i) {
        setenv("BACKLITE_CPU_BACKWARD", schedules[i], 1);
        st = run_backward(c, 0.0f, mask, &again);
        EXPECT(st == BL_OK && grads_identical(c, &got, &again),
               "[%s]: the %s schedule gives different gradients (random mask)", c->name,
               schedules[i]);
        st = run_backward(c, 0.0f, NULL, &again);
        compare_grads(c, schedules[i], &again, &want_dense);
        unsetenv("BACKLITE_CPU_BACKWARD");
    }

    /* 4. an all-zero mask computes nothing: every gradient exactly 0 */
    memset(mask, 0, c->nw);
    st = run_backward(c, 0.0f, mask, &got);
    int all_zero = st == BL_OK;
    for (size_t i = 0; i < c->nq; ++i) all_zero &= got.dq[i] == 0.0;
    for (size_t i = 0; i < c->nk; ++i) all_zero &= got.dk[i] == 0.0 && got.dv[i] == 0.0;
    EXPECT(all_zero, "[%s]: an all-zero mask must give zero gradients", c->name);

    /* 5. deterministic: a second dense run gives the same bits, and so does one that asks for
     * the deterministic form (desc.deterministic: the CPU backend has only one form) */
    run_backward(c, 0.0f, NULL, &got);
    run_backward(c, 0.0f, NULL, &again);
    EXPECT(grads_identical(c, &got, &again), "[%s]: two dense backward runs differ", c->name);
    c->desc.deterministic = 1;
    st = run_backward(c, 0.0f, NULL, &again);
    c->desc.deterministic = 0;
    EXPECT(st == BL_OK && grads_identical(c, &got, &again),
           "[%s]: the deterministic form gives other gradients (%d: %s)", c->name, (int)st,
           bl_last_error());

    free(mask), free(mask_ref), free(out_d);
    grads_free(&got), grads_free(&want), grads_free(&again), grads_free(&want_dense);
}

int main(void) {
    const bl_dtype dtypes[] = {BL_DTYPE_F32, BL_DTYPE_F16, BL_DTYPE_BF16};
    uint64_t seed = 100;
    int case_index = 0;
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; ++di)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; ++si)
            for (int causal = 0; causal <= 1; ++causal) {
                attn_case c;
                layout lay = (layout)(case_index++ % 3);
                case_init(&c, shapes[si], causal, dtypes[di], lay, seed);
                check_backward(&c, seed * 7919);
                case_free(&c);
                ++seed;
            }
    /* Longer sequences with local attention: many key tiles per row, most of them skipped. */
    const case_shape long_shape = {1, 1000, 900, 2, 1, 64};
    for (int i = 0; i < 2; ++i) {
        attn_case c;
        case_init(&c, long_shape, i, i ? BL_DTYPE_BF16 : BL_DTYPE_F32, LAYOUT_BSHD, seed++);
        case_make_local(&c, 12.0);
        int64_t kept_before = g_tiles_kept, total_before = g_tiles_total;
        check_backward(&c, seed * 7919);
        const int64_t kept = g_tiles_kept - kept_before, total = g_tiles_total - total_before;
        printf("[%s] negl_prob=0.1 kept %lld of %lld tiles\n", c.name, (long long)kept,
               (long long)total);
        EXPECT(2 * kept < total, "[%s]: local attention kept %lld of %lld tiles, want < half",
               c.name, (long long)kept, (long long)total);
        case_free(&c);
    }
    printf("negl_prob=0.1 kept %lld of %lld tiles\n", (long long)g_tiles_kept,
           (long long)g_tiles_total);
    EXPECT(g_tiles_kept < g_tiles_total,
           "the selection never skipped a tile: sparse path untested");
    return test_summary("test_backward");
}
