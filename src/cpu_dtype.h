/* cpu_dtype.h -- bf16 / fp16 <-> float conversion for the CPU backend.
 *
 * Loads widen exactly; stores round to nearest, ties to even, as PyTorch and the GPU do, so the
 * CPU backend's outputs are the correctly rounded fp32 results. Written with bit operations so
 * that the library does not depend on compiler support for _Float16 or __bf16.
 */
#ifndef BL_CPU_DTYPE_H
#define BL_CPU_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t bl_float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bl_bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- bf16: the upper half of an fp32 ---- */

static inline float bl_bf16_to_float(uint16_t h) { return bl_bits_float((uint32_t)h << 16); }

static inline uint16_t bl_float_to_bf16(float f) {
    uint32_t u = bl_float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN, rounding could make inf */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds half-way cases to the even neighbour. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ---- */

#define BL_F16_EXP_MASK 0x7c00u
#define BL_F16_QUIET_BIT 0x0200u
/* fp32 bit patterns of the fp16 range limits */
#define BL_F32_BITS_F16_OVERFLOW 0x477ff000u /* 65520: half-way above 65504, rounds to inf */
#define BL_F32_BITS_F16_MIN_NORMAL 0x38800000u /* 2^-14 */
#define BL_F32_BIASED_EXP_HALF_SUBNORMAL 102   /* 2^-25: below it everything rounds to 0 */
/* fp16 subnormal step 2^-24, exactly representable */
#define BL_F16_SUBNORMAL_STEP 5.9604644775390625e-08f

static inline float bl_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 is exact in fp32 */
        float mag = (float)man * BL_F16_SUBNORMAL_STEP;
        return sign ? -mag : mag;
    }
    if (exp == 0x1fu) return bl_bits_float(sign | 0x7f800000u | (man << 13));
    return bl_bits_float(sign | ((exp + 112u) << 23) | (man << 13)); /* rebias 15 -> 127 */
}

static inline uint16_t bl_float_to_f16(float f) {
    uint32_t u = bl_float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf stays inf, NaN stays a quiet NaN */
        return (uint16_t)(sign | BL_F16_EXP_MASK | (a > 0x7f800000u ? BL_F16_QUIET_BIT : 0u));
    if (a >= BL_F32_BITS_F16_OVERFLOW) return (uint16_t)(sign | BL_F16_EXP_MASK);
    if (a < BL_F32_BITS_F16_MIN_NORMAL) {
        /* fp16 subnormal: round (mantissa with implicit bit) >> shift to nearest even. */
        int exp = (int)(a >> 23);
        if (exp < BL_F32_BIASED_EXP_HALF_SUBNORMAL) return sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - exp; /* 14..24 */
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++; /* may carry into the smallest normal */
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry bumps the exponent */
    return (uint16_t)(sign | h);
}

#endif /* BL_CPU_DTYPE_H */
