/* test_select.c -- the tile selection rule through bl_select_tiles (CPU backend): hand-worked
 * cases with exact binary fractions, ties, empty and non-finite row tiles, the negl_prob limits,
 * and random tile masses against the reference selection and the rule's invariants. */
#include "check.h"
#include "reference.h"

/* A desc whose W has exactly `rows` row tiles (B = 1, Hq = rows, Sq = TM) of `tiles_n` key
 * tiles. */
static bl_attn_desc desc_for(int64_t rows, int64_t tiles_n) {
    bl_attn_desc d;
    memset(&d, 0, sizeof d);
    d.backend = BL_BACKEND_CPU, d.dtype = BL_DTYPE_F32;
    d.batch = 1, d.seqlen_q = BL_TILE_M, d.seqlen_k = tiles_n * BL_TILE_N;
    d.heads_q = rows, d.heads_k = 1, d.head_dim = 64, d.scale = 0.125f;
    return d;
}

/* Selects one row tile and compares with the expected keep flags. */
static void expect_selection(const char *what, const float *w, int64_t tiles_n, float negl_prob,
                             const uint8_t *want) {
    bl_attn_desc d = desc_for(1, tiles_n);
    uint8_t got[64];
    memset(got, 0xAA, sizeof got);
    bl_status st = bl_select_tiles(&d, w, negl_prob, got);
    EXPECT(st == BL_OK, "%s: bl_select_tiles returned %d: %s", what, (int)st, bl_last_error());
    int same = 1;
    for (int64_t n = 0; n < tiles_n; ++n) same &= (got[n] != 0) == (want[n] != 0);
    char got_s[80] = "", want_s[80] = "";
    for (int64_t n = 0; n < tiles_n && n < 64; ++n) {
        got_s[n] = got[n] ? '1' : '0';
        want_s[n] = want[n] ? '1' : '0';
    }
    EXPECT(same, "%s (negl_prob=%g): kept %s, want %s", what, (double)negl_prob, got_s, want_s);
}

static void hand_worked_cases(void) {
    /* total 8: shares 1/8, 2/8, 3/8, 2/8; ascending (p, n) order: n0, n1, n3, n2 */
    const float w[4] = {1, 2, 3, 2};
    expect_selection("cumsum 1/8 == negl: nothing skipped", w, 4, 0.125f,
                     (const uint8_t[]){1, 1, 1, 1});
    expect_selection("skip n0 only", w, 4, 0.13f, (const uint8_t[]){0, 1, 1, 1});
    expect_selection("cumsum 3/8 == negl is not < negl: n1 kept", w, 4, 0.375f,
                     (const uint8_t[]){0, 1, 1, 1});
    expect_selection("equal shares: the lower n (n1) is skipped before n3", w, 4, 0.4f,
                     (const uint8_t[]){0, 0, 1, 1});
    expect_selection("n0, n1, n3 skipped (5/8 < 0.7)", w, 4, 0.7f, (const uint8_t[]){0, 0, 1, 0});

    const float ties[4] = {1, 1, 1, 1};
    expect_selection("ties, negl 0.5: only n0 skipped (cumsum 0.5 not < 0.5)", ties, 4, 0.5f,
                     (const uint8_t[]){0, 1, 1, 1});
    expect_selection("ties, negl 0.6: n0, n1 skipped", ties, 4, 0.6f,
                     (const uint8_t[]){0, 0, 1, 1});
    expect_selection("ties, negl 0.999999: the highest n survives", ties, 4, 0.999999f,
                     (const uint8_t[]){0, 0, 0, 1});

    const float causal_tail[4] = {3, 1, 0, 0}; /* tiles with no allowed key carry no mass */
    expect_selection("empty tiles kept when negl_prob = 0", causal_tail, 4, 0.0f,
                     (const uint8_t[]){1, 1, 1, 1});
    expect_selection("empty tiles skipped first", causal_tail, 4, 0.01f,
                     (const uint8_t[]){1, 1, 0, 0});

    const float zeros[3] = {0, 0, 0};
    expect_selection("all-zero row tile keeps nothing", zeros, 3, 0.0f, (const uint8_t[]){0, 0, 0});
    expect_selection("all-zero row tile keeps nothing", zeros, 3, 0.5f, (const uint8_t[]){0, 0, 0});

    const float with_nan[3] = {0.5f, NAN, 0.25f};
    expect_selection("NaN in W keeps every tile", with_nan, 3, 0.9f, (const uint8_t[]){1, 1, 1});
    const float with_inf[3] = {0.5f, INFINITY, 0.25f};
    expect_selection("inf in W keeps every tile", with_inf, 3, 0.9f, (const uint8_t[]){1, 1, 1});
    const float one[1] = {0.25f};
    expect_selection("a single tile is always kept", one, 1, 0.999999f, (const uint8_t[]){1});
    /* 2 + 2^-22 in fp32 makes n1 strictly heavier than n0 */
    const float near_tie[2] = {2.0f, 2.0000002384185791f};
    expect_selection("strictly smaller share skipped first", near_tie, 2, 0.5f,
                     (const uint8_t[]){0, 1});
}

/* Random row tiles with ties and zeros: equal to the reference, and the rule's invariants. */
static void random_cases(void) {
    const int64_t rows = 3 * 5, tiles_n = 9;
    bl_attn_desc d = desc_for(rows, tiles_n);
    ref_problem r = {1, BL_TILE_M, tiles_n * BL_TILE_N, rows, 1, 64, 0.125, 0, BL_TILE_M,
                     BL_TILE_N};
    float *w = xcalloc((size_t)(rows * tiles_n), sizeof(float));
    uint8_t *got = xcalloc((size_t)(rows * tiles_n), 1);
    uint8_t *want = xcalloc((size_t)(rows * tiles_n), 1);
    uint8_t *prev = xcalloc((size_t)(rows * tiles_n), 1);
    const float negl_probs[] = {0.0f, 1e-4f, 0.01f, 0.05f, 0.1f, 0.3f, 0.5f, 0.9f, 0.999999f};
    uint64_t rng = 42;
    for (int trial = 0; trial < 200; ++trial) {
        for (int64_t i = 0; i < rows * tiles_n; ++i) {
            double u = rng_uniform(&rng);
            /* a few levels only, so that ties are common; some zeros; a heavy tail */
            w[i] = trial % 2 ? (float)floor(u * 4.0) : (float)(exp(8.0 * u) - 1.0);
        }
        for (size_t pi = 0; pi < sizeof negl_probs / sizeof *negl_probs; ++pi) {
            const float negl = negl_probs[pi];
            bl_status st = bl_select_tiles(&d, w, negl, got);
            EXPECT(st == BL_OK, "random: bl_select_tiles returned %d: %s", (int)st,
                   bl_last_error());
            ref_select(&r, w, negl, want);
            for (int64_t row = 0; row < rows; ++row) {
                const float *wr = w + row * tiles_n;
                const uint8_t *g = got + row * tiles_n;
                int same = 1, kept = 0;
                double total = 0, skipped = 0, max_w = -1;
                int64_t argmax_last = 0;
                for (int64_t n = 0; n < tiles_n; ++n) {
                    same &= (g[n] != 0) == (want[row * tiles_n + n] != 0);
                    total += wr[n];
                    if (!g[n]) skipped += wr[n];
                    kept += g[n] != 0;
                    if (wr[n] >= max_w) max_w = wr[n], argmax_last = n;
                }
                EXPECT(same, "random trial %d row %lld negl %g: differs from the reference",
                       trial, (long long)row, (double)negl);
                if (total > 0) {
                    /* the rule sums shares in sorted order (1/6+1/6+1/6 < 0.5 there), so
                     * allow rounding-level slack against this plain ratio */
                    EXPECT(skipped / total < negl + 1e-12 || (negl == 0.0f && skipped == 0),
                           "random trial %d row %lld: skipped share %.9g not < negl %g", trial,
                           (long long)row, skipped / total, (double)negl);
                    EXPECT(g[argmax_last], "random trial %d row %lld negl %g: the heaviest "
                           "tile (last of the ties) was skipped", trial, (long long)row,
                           (double)negl);
                    if (negl == 0.0f)
                        EXPECT(kept == tiles_n, "random: negl_prob 0 must keep all tiles");
                } else {
                    EXPECT(kept == 0, "random: a zero row tile must keep nothing");
                }
                /* a larger negl_prob keeps a subset of what a smaller one keeps */
                if (pi > 0)
                    for (int64_t n = 0; n < tiles_n; ++n)
                        EXPECT(!g[n] || prev[row * tiles_n + n],
                               "random trial %d row %lld: negl %g keeps tile %lld that a "
                               "smaller negl_prob skipped", trial, (long long)row,
                               (double)negl, (long long)n);
            }
            memcpy(prev, got, (size_t)(rows * tiles_n));
        }
    }
    free(w), free(got), free(want), free(prev);
}

/* Each row tile is selected on its own: a NaN or a zero row tile does not affect its neighbours. */
static void row_tiles_independent(void) {
    bl_attn_desc d = desc_for(3, 2);
    const float w[6] = {1, 3, NAN, 1, 0, 0};
    uint8_t got[6];
    bl_status st = bl_select_tiles(&d, w, 0.3f, got);
    EXPECT(st == BL_OK, "independent: bl_select_tiles returned %d: %s", (int)st, bl_last_error());
    const uint8_t want[6] = {0, 1, 1, 1, 0, 0};
    EXPECT(memcmp(got, want, 6) == 0, "independent: got %d%d %d%d %d%d, want 01 11 00",
           got[0], got[1], got[2], got[3], got[4], got[5]);
}

int main(void) {
    hand_worked_cases();
    random_cases();
    row_tiles_independent();
    return test_summary("test_select");
}
