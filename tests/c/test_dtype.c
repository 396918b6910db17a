/* test_dtype.c -- the CPU backend's bf16/fp16 conversions (src/cpu_dtype.h): exhaustive decode
 * and round trip over all 65536 patterns, round-to-nearest-even on random values and on exact
 * half-way points, against the tests' own codecs (and the compiler's _Float16 where it has one). */
#include "../../src/cpu_dtype.h"
#include "check.h"

static int same_value(double a, double b) {
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

static void exhaustive(void) {
    int decode_bad = 0, trip_bad = 0;
    for (uint32_t h = 0; h <= 0xffff; ++h) {
        double f16 = bl_f16_to_float((uint16_t)h), bf16 = bl_bf16_to_float((uint16_t)h);
        if (!same_value(f16, test_decode_f16((uint16_t)h)) && decode_bad++ < 5)
            EXPECT(0, "fp16 0x%04x decodes to %.9g, want %.9g", h, f16,
                   test_decode_f16((uint16_t)h));
        if (!same_value(bf16, test_decode_bf16((uint16_t)h)) && decode_bad++ < 5)
            EXPECT(0, "bf16 0x%04x decodes to %.9g, want %.9g", h, bf16,
                   test_decode_bf16((uint16_t)h));
        if (isnan(f16)) {
            EXPECT(isnan(bl_f16_to_float(bl_float_to_f16((float)f16))), "fp16 NaN 0x%04x lost", h);
        } else if (bl_float_to_f16((float)f16) != h && trip_bad++ < 5) {
            EXPECT(0, "fp16 0x%04x -> %.9g -> 0x%04x", h, f16, bl_float_to_f16((float)f16));
        }
        if (isnan(bf16)) {
            EXPECT(isnan(bl_bf16_to_float(bl_float_to_bf16((float)bf16))), "bf16 NaN 0x%04x lost",
                   h);
        } else if (bl_float_to_bf16((float)bf16) != h && trip_bad++ < 5) {
            EXPECT(0, "bf16 0x%04x -> %.9g -> 0x%04x", h, bf16, bl_float_to_bf16((float)bf16));
        }
    }
    EXPECT(decode_bad == 0 && trip_bad == 0, "exhaustive: %d decode and %d round-trip errors",
           decode_bad, trip_bad);
}

/* Every value exactly half-way between two neighbouring finite fp16 / bf16 values (and just
 * above and below it) rounds like the reference: ties to the even neighbour. */
static void halfway_points(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7bff; ++h) { /* positive finite fp16 with a finite successor */
        double lo = test_decode_f16((uint16_t)h), hi = test_decode_f16((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: fp16 neighbours average within fp32 */
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; ++i) {
            uint16_t got = bl_float_to_f16(probes[i]), want = test_encode_f16(probes[i]);
            uint16_t got_neg = bl_float_to_f16(-probes[i]);
            if ((got != want || got_neg != (want | 0x8000)) && bad++ < 5)
                EXPECT(0, "fp16 rounding of %.10g: 0x%04x, want 0x%04x", (double)probes[i], got,
                       want);
        }
    }
    for (uint32_t h = 0x0080; h < 0x7f7f; ++h) { /* positive normal bf16 */
        double lo = test_decode_bf16((uint16_t)h), hi = test_decode_bf16((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; ++i) {
            uint16_t got = bl_float_to_bf16(probes[i]), want = test_encode_bf16(probes[i]);
            if (got != want && bad++ < 5)
                EXPECT(0, "bf16 rounding of %.10g: 0x%04x, want 0x%04x", (double)probes[i], got,
                       want);
        }
    }
    EXPECT(bad == 0, "half-way points: %d rounding errors", bad);
    /* the edges: the largest fp16 and the first value that overflows it */
    EXPECT(bl_float_to_f16(65504.0f) == 0x7bff, "65504 -> 0x%04x", bl_float_to_f16(65504.0f));
    EXPECT(bl_float_to_f16(65519.99f) == 0x7bff, "65519.99 -> 0x%04x", bl_float_to_f16(65519.99f));
    EXPECT(bl_float_to_f16(65520.0f) == 0x7c00, "65520 -> 0x%04x, want inf",
           bl_float_to_f16(65520.0f));
    EXPECT(bl_float_to_f16(1e-8f) == 0x0000, "1e-8 -> 0x%04x, want 0", bl_float_to_f16(1e-8f));
    EXPECT(bl_float_to_f16(-INFINITY) == 0xfc00, "-inf -> 0x%04x", bl_float_to_f16(-INFINITY));
    EXPECT(bl_float_to_bf16(INFINITY) == 0x7f80, "inf -> bf16 0x%04x", bl_float_to_bf16(INFINITY));
    EXPECT(isnan(bl_bf16_to_float(bl_float_to_bf16(NAN))), "bf16 NaN lost");
    EXPECT(isnan(bl_f16_to_float(bl_float_to_f16(-NAN))), "fp16 NaN lost");
}

/* Random fp32 values over the whole fp16 range and beyond, and the bf16 normal range. */
static void random_values(void) {
    uint64_t rng = 7;
    int bad = 0;
    for (int i = 0; i < 2000000; ++i) {
        double mag = ldexp(rng_uniform(&rng), (int)(rng_next(&rng) % 48) - 30); /* 2^-30..2^17 */
        float f = (float)(rng_next(&rng) & 1 ? -mag : mag);
        uint16_t got = bl_float_to_f16(f), want = test_encode_f16(f);
        if (got != want && bad++ < 5)
            EXPECT(0, "fp16 rounding of %.10g: 0x%04x, want 0x%04x", (double)f, got, want);
#ifdef __FLT16_MAX__
        _Float16 native = (_Float16)f;
        uint16_t native_bits;
        memcpy(&native_bits, &native, 2);
        if (got != native_bits && bad++ < 5)
            EXPECT(0, "fp16 rounding of %.10g: 0x%04x, the compiler's _Float16 gives 0x%04x",
                   (double)f, got, native_bits);
#endif
        /* fp32 normals only: the tests' bf16 codec rounds significands, not fp32 subnormals */
        double bmag = ldexp(1.0 + rng_uniform(&rng), (int)(rng_next(&rng) % 252) - 126);
        float g = (float)(rng_next(&rng) & 1 ? -bmag : bmag);
        uint16_t gb = bl_float_to_bf16(g), wb = test_encode_bf16(g);
        if (gb != wb && bad++ < 5)
            EXPECT(0, "bf16 rounding of %.10g: 0x%04x, want 0x%04x", (double)g, gb, wb);
    }
    EXPECT(bad == 0, "random values: %d rounding errors", bad);
}

int main(void) {
    exhaustive();
    halfway_points();
    random_values();
    return test_summary("test_dtype");
}
