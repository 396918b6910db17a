/* cpu_tensor.h -- reading and writing rows of (B, S, H, D) tensors of any supported dtype as
 * float, for the CPU backend. All arithmetic happens in fp32 on these converted rows. */
#ifndef BL_CPU_TENSOR_H
#define BL_CPU_TENSOR_H

#include <stdint.h>

#include "backlite.h"
#include "cpu_dtype.h"

/* Element offset of (b, s, h, 0). */
static inline int64_t bl_row_offset(const bl_tensor *t, int64_t b, int64_t s, int64_t h) {
    return b * t->stride_b + s * t->stride_s + h * t->stride_h;
}

/* dst[0..D) = t[b, s, h, 0..D) widened to float. */
static inline void bl_load_row(const bl_tensor *t, bl_dtype dtype, int64_t b, int64_t s,
                               int64_t h, int D, float *dst) {
    int64_t off = bl_row_offset(t, b, s, h);
    switch (dtype) {
    case BL_DTYPE_F32: {
        const float *src = (const float *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = src[d];
        break;
    }
    case BL_DTYPE_F16: {
        const uint16_t *src = (const uint16_t *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = bl_f16_to_float(src[d]);
        break;
    }
    case BL_DTYPE_BF16: {
        const uint16_t *src = (const uint16_t *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = bl_bf16_to_float(src[d]);
        break;
    }
    }
}

/* t[b, s, h, 0..D) = src[0..D) * mul, rounded to the tensor's dtype (nearest even). */
static inline void bl_store_row(const bl_tensor *t, bl_dtype dtype, int64_t b, int64_t s,
                                int64_t h, int D, const float *src, float mul) {
    int64_t off = bl_row_offset(t, b, s, h);
    switch (dtype) {
    case BL_DTYPE_F32: {
        float *dst = (float *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = src[d] * mul;
        break;
    }
    case BL_DTYPE_F16: {
        uint16_t *dst = (uint16_t *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = bl_float_to_f16(src[d] * mul);
        break;
    }
    case BL_DTYPE_BF16: {
        uint16_t *dst = (uint16_t *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = bl_float_to_bf16(src[d] * mul);
        break;
    }
    }
}

/* t[b, s, h, 0..D) = 0 (rows that get no gradient, or no allowed key). */
static inline void bl_zero_row(const bl_tensor *t, bl_dtype dtype, int64_t b, int64_t s,
                               int64_t h, int D) {
    int64_t off = bl_row_offset(t, b, s, h);
    if (dtype == BL_DTYPE_F32) {
        float *dst = (float *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = 0.0f;
    } else { /* +0.0 is all-zero bits in fp16 and bf16 */
        uint16_t *dst = (uint16_t *)t->data + off;
        for (int d = 0; d < D; ++d) dst[d] = 0;
    }
}

#endif /* BL_CPU_TENSOR_H */
