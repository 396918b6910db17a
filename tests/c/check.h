/* check.h -- helpers shared by the C tests (header-only: CMake links each test_*.c with
 * reference.c alone): a seeded RNG, the tests' own bf16/fp16 codecs (written independently of
 * src/cpu_dtype.h), tensors in several memory layouts, and tolerance checks that print what failed.
 */
#ifndef BL_TEST_CHECK_H
#define BL_TEST_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backlite.h"

/* ---- failure accounting: every failed check prints a line; main returns the count != 0 ---- */

static int g_failures = 0;
static int g_checks = 0;

#define EXPECT(cond, ...)                                                                     \
    do {                                                                                      \
        ++g_checks;                                                                           \
        if (!(cond)) {                                                                        \
            ++g_failures;                                                                     \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
        }                                                                                     \
    } while (0)

static inline int test_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, g_checks, g_failures);
    return g_failures != 0;
}

/* ---- deterministic random numbers (splitmix64) ---- */

static inline uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double rng_uniform(uint64_t *state) { /* in (0, 1) */
    return ((double)(rng_next(state) >> 11) + 0.5) / 9007199254740992.0;
}
static inline double rng_normal(uint64_t *state) {
    const double two_pi = 6.283185307179586;
    return sqrt(-2.0 * log(rng_uniform(state))) * cos(two_pi * rng_uniform(state));
}

/* ---- the tests' own reduced-precision codecs (round to nearest even via nearbyint) ---- */

/* x rounded to `bits` significant bits, for |x| in the normal range of the target format. */
static inline double round_significand(double x, int bits) {
    int e;
    double m = frexp(x, &e); /* x = m 2^e, 0.5 <= |m| < 1 */
    return ldexp(nearbyint(ldexp(m, bits)), e - bits);
}

static inline uint16_t test_encode_bf16(double x) { /* x finite, bf16 normal range or 0 */
    float f = (float)round_significand(x, 8);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static inline double test_decode_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double test_decode_f16(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double mag;
    if (exp == 0) mag = ldexp(man, -24);
    else if (exp == 31) mag = man ? NAN : INFINITY;
    else mag = ldexp(1024 + man, exp - 25);
    return sign ? -mag : mag;
}
/* Correct rounding of any finite double to fp16 (subnormals and overflow included). */
static inline uint16_t test_encode_f16(double x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return 0x7e00;
    if (a < ldexp(1.0, -14)) /* subnormal: multiples of 2^-24 */
        return sign | (uint16_t)nearbyint(ldexp(a, 24)); /* 1024 here is the smallest normal */
    double r = round_significand(a, 11);
    if (r > 65504.0) return sign | 0x7c00;
    int e;
    double m = frexp(r, &e); /* r = m 2^e, m in [0.5, 1) */
    int man = (int)ldexp(m, 11) - 1024;
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)man;
}

/* Value x as stored in dtype (rounded), back as a double. */
static inline double round_to_dtype(double x, bl_dtype dt) {
    if (dt == BL_DTYPE_F32) return (float)x;
    if (dt == BL_DTYPE_BF16) return test_decode_bf16(test_encode_bf16(x));
    return test_decode_f16(test_encode_f16(x));
}

static inline size_t dtype_bytes(bl_dtype dt) { return dt == BL_DTYPE_F32 ? 4 : 2; }

static inline const char *dtype_name(bl_dtype dt) {
    return dt == BL_DTYPE_F32 ? "f32" : dt == BL_DTYPE_F16 ? "f16" : "bf16";
}

/* Unit roundoff of the stored dtype: what an output rounded once to it can be off by. */
static inline double dtype_eps(bl_dtype dt) {
    return dt == BL_DTYPE_F32 ? ldexp(1.0, -23) : dt == BL_DTYPE_F16 ? ldexp(1.0, -10)
                                                                      : ldexp(1.0, -7);
}

/* ---- (B, S, H, D) tensors in a chosen memory layout ---- */

typedef enum layout {
    LAYOUT_BSHD = 0,   /* contiguous, the FlashAttention layout */
    LAYOUT_BHSD = 1,   /* a transposed view: heads outermost after batch */
    LAYOUT_PADDED = 2, /* BSHD with gaps after every row and head (a slice of a bigger tensor) */
} layout;

typedef struct test_tensor {
    bl_tensor t;
    void *alloc;
    size_t elements;
    int64_t B, S, H, D;
    bl_dtype dtype;
} test_tensor;

static inline test_tensor tensor_make(int64_t B, int64_t S, int64_t H, int64_t D, bl_dtype dt,
                                      layout lay) {
    test_tensor x;
    memset(&x, 0, sizeof x);
    x.B = B, x.S = S, x.H = H, x.D = D, x.dtype = dt;
    const int64_t pad_h = lay == LAYOUT_PADDED ? 3 : 0, pad_s = lay == LAYOUT_PADDED ? 5 : 0;
    if (lay == LAYOUT_BHSD) {
        x.t.stride_s = D, x.t.stride_h = S * D, x.t.stride_b = H * S * D;
        x.elements = (size_t)(B * H * S * D);
    } else {
        x.t.stride_h = D + pad_h;
        x.t.stride_s = H * (D + pad_h) + pad_s;
        x.t.stride_b = S * x.t.stride_s;
        x.elements = (size_t)(B * x.t.stride_b);
    }
    x.alloc = calloc(x.elements, dtype_bytes(dt));
    x.t.data = x.alloc;
    return x;
}

static inline void tensor_free(test_tensor *x) { free(x->alloc); x->alloc = NULL; }

static inline int64_t tensor_offset(const test_tensor *x, int64_t b, int64_t s, int64_t h) {
    return b * x->t.stride_b + s * x->t.stride_s + h * x->t.stride_h;
}

/* Stores vals (dense B,S,H,D doubles) rounded to the dtype; vals get the rounded values back. */
static inline void tensor_set(test_tensor *x, double *vals) {
    for (int64_t b = 0; b < x->B; ++b)
        for (int64_t s = 0; s < x->S; ++s)
            for (int64_t h = 0; h < x->H; ++h)
                for (int64_t d = 0; d < x->D; ++d) {
                    double *val = vals + ((b * x->S + s) * x->H + h) * x->D + d;
                    int64_t o = tensor_offset(x, b, s, h) + d;
                    if (x->dtype == BL_DTYPE_F32) {
                        ((float *)x->alloc)[o] = (float)*val;
                        *val = (float)*val;
                    } else if (x->dtype == BL_DTYPE_BF16) {
                        ((uint16_t *)x->alloc)[o] = test_encode_bf16(*val);
                        *val = test_decode_bf16(((uint16_t *)x->alloc)[o]);
                    } else {
                        ((uint16_t *)x->alloc)[o] = test_encode_f16(*val);
                        *val = test_decode_f16(((uint16_t *)x->alloc)[o]);
                    }
                }
}

/* Reads the tensor into dense (B, S, H, D) doubles. */
static inline void tensor_get(const test_tensor *x, double *vals) {
    for (int64_t b = 0; b < x->B; ++b)
        for (int64_t s = 0; s < x->S; ++s)
            for (int64_t h = 0; h < x->H; ++h)
                for (int64_t d = 0; d < x->D; ++d) {
                    double *val = vals + ((b * x->S + s) * x->H + h) * x->D + d;
                    int64_t o = tensor_offset(x, b, s, h) + d;
                    if (x->dtype == BL_DTYPE_F32) *val = ((float *)x->alloc)[o];
                    else if (x->dtype == BL_DTYPE_BF16)
                        *val = test_decode_bf16(((uint16_t *)x->alloc)[o]);
                    else *val = test_decode_f16(((uint16_t *)x->alloc)[o]);
                }
}

/* Fills every byte of the tensor's allocation (gaps included) with a sentinel pattern, to see
 * that outputs are fully written and that gaps are left alone. */
static inline void tensor_poison(test_tensor *x) {
    memset(x->alloc, 0x7f, x->elements * dtype_bytes(x->dtype));
}

/* 1 if every gap element (not part of the (B,S,H,D) view) still holds the sentinel. */
static inline int tensor_gaps_untouched(const test_tensor *x) {
    const size_t eb = dtype_bytes(x->dtype);
    unsigned char *seen = calloc(x->elements, 1);
    for (int64_t b = 0; b < x->B; ++b)
        for (int64_t s = 0; s < x->S; ++s)
            for (int64_t h = 0; h < x->H; ++h)
                for (int64_t d = 0; d < x->D; ++d) seen[tensor_offset(x, b, s, h) + d] = 1;
    int ok = 1;
    for (size_t i = 0; i < x->elements && ok; ++i) {
        if (seen[i]) continue;
        const unsigned char *bytes = (const unsigned char *)x->alloc + i * eb;
        for (size_t j = 0; j < eb; ++j) ok &= bytes[j] == 0x7f;
    }
    free(seen);
    return ok;
}

static inline void fill_normal(double *vals, size_t n, double stddev, uint64_t *rng) {
    for (size_t i = 0; i < n; ++i) vals[i] = stddev * rng_normal(rng);
}

/* ---- tolerance checks ---- */

/* Relative L2 error of got against ref over the entries where ref is finite, and that the
 * non-finite entries agree in kind. Prints the failing quantity with its context. */
static inline void expect_close(const char *what, const char *ctx, const double *got,
                                const double *ref, size_t n, double rel_tol) {
    double err2 = 0.0, ref2 = 0.0, max_err = 0.0;
    size_t max_at = 0, mismatched_nonfinite = 0, first_bad = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(ref[i]) || !isfinite(got[i])) {
            int same = (isnan(ref[i]) && isnan(got[i])) || (got[i] == ref[i]);
            if (!same && mismatched_nonfinite++ == 0) first_bad = i;
            continue;
        }
        double e = got[i] - ref[i];
        err2 += e * e;
        ref2 += ref[i] * ref[i];
        if (fabs(e) > max_err) max_err = fabs(e), max_at = i;
    }
    double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    EXPECT(rel <= rel_tol && mismatched_nonfinite == 0,
           "%s [%s]: relative L2 error %.3g (tolerance %.3g), max abs error %.3g at %zu "
           "(got %.9g, want %.9g), %zu non-finite mismatches%s",
           what, ctx, rel, rel_tol, max_err, max_at, n ? got[max_at] : 0.0,
           n ? ref[max_at] : 0.0, mismatched_nonfinite,
           mismatched_nonfinite ? " (see first below)" : "");
    if (mismatched_nonfinite)
        fprintf(stderr, "  first non-finite mismatch at %zu: got %g, want %g\n", first_bad,
                got[first_bad], ref[first_bad]);
}

static inline void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu x %zu bytes)\n", n, size);
        exit(2);
    }
    return p;
}

#endif /* BL_TEST_CHECK_H */
