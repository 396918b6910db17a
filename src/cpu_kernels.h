/* cpu_kernels.h -- the small dense building blocks of the CPU forward and backward, written so
 * that the compiler vectorizes them without -ffast-math.
 *
 * The tiles are tiny (64 x 128 x D), so speed comes from doing more arithmetic per load and store:
 * dot products run over 4 rows x 2 keys at once (8 accumulators that stay in registers; the
 * reduction order is explicitly relaxed with `omp simd reduction`), and row updates
 * y += sum_i a_i x_i fold 4 source rows into one pass over y.
 */
#ifndef BL_CPU_KERNELS_H
#define BL_CPU_KERNELS_H

#include <stdint.h>

/* Rows and columns handled together by bl_dot_block and bl_axpy4. */
#define BL_DOT_ROWS 4
#define BL_DOT_COLS 2
#define BL_AXPY_WIDTH 4

static inline float bl_dot(const float *a, const float *b, int D) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int e = 0; e < D; ++e) sum += a[e] * b[e];
    return sum;
}

/* out[i * ldo + j] = dot(a row i, b row j) for i < BL_DOT_ROWS, j < BL_DOT_COLS. */
static inline void bl_dot_4x2(const float *a, int64_t lda, const float *b, int64_t ldb, int D,
                              float *out, int64_t ldo) {
    const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    const float *b0 = b, *b1 = b + ldb;
    float s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
#pragma omp simd reduction(+ : s00, s01, s10, s11, s20, s21, s30, s31)
    for (int e = 0; e < D; ++e) {
        const float y0 = b0[e], y1 = b1[e];
        s00 += a0[e] * y0, s01 += a0[e] * y1;
        s10 += a1[e] * y0, s11 += a1[e] * y1;
        s20 += a2[e] * y0, s21 += a2[e] * y1;
        s30 += a3[e] * y0, s31 += a3[e] * y1;
    }
    out[0] = s00, out[1] = s01;
    out[ldo] = s10, out[ldo + 1] = s11;
    out[2 * ldo] = s20, out[2 * ldo + 1] = s21;
    out[3 * ldo] = s30, out[3 * ldo + 1] = s31;
}

/* out (rows, ldo) [i, j] = dot(a row i, b row j) for i < rows, j < cols: a @ b^T. */
static inline void bl_dot_block(const float *a, int64_t lda, int64_t rows, const float *b,
                                int64_t ldb, int64_t cols, int D, float *out, int64_t ldo) {
    const int64_t rows_main = rows - rows % BL_DOT_ROWS, cols_main = cols - cols % BL_DOT_COLS;
    for (int64_t i = 0; i < rows_main; i += BL_DOT_ROWS) {
        for (int64_t j = 0; j < cols_main; j += BL_DOT_COLS)
            bl_dot_4x2(a + i * lda, lda, b + j * ldb, ldb, D, out + i * ldo + j, ldo);
        for (int64_t j = cols_main; j < cols; ++j)
            for (int64_t r = i; r < i + BL_DOT_ROWS; ++r)
                out[r * ldo + j] = bl_dot(a + r * lda, b + j * ldb, D);
    }
    for (int64_t r = rows_main; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) out[r * ldo + j] = bl_dot(a + r * lda, b + j * ldb, D);
}

/* y += a x */
static inline void bl_axpy(float *y, float a, const float *x, int D) {
    for (int e = 0; e < D; ++e) y[e] += a * x[e];
}

/* y += a[0] x[0] + ... + a[3] x[3] */
static inline void bl_axpy4(float *y, const float *a, const float *const *x, int D) {
    const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (int e = 0; e < D; ++e) y[e] += a0 * x0[e] + a1 * x1[e] + a2 * x2[e] + a3 * x3[e];
}

/* y += sum_c a[c] x row c, for c < count (x rows ldx apart), four rows a pass. */
static inline void bl_axpy_rows(float *y, const float *a, const float *x, int64_t ldx,
                                int64_t count, int D) {
    int64_t c = 0;
    for (; c + BL_AXPY_WIDTH <= count; c += BL_AXPY_WIDTH) {
        const float *rows[BL_AXPY_WIDTH] = {x + c * ldx, x + (c + 1) * ldx, x + (c + 2) * ldx,
                                            x + (c + 3) * ldx};
        bl_axpy4(y, a + c, rows, D);
    }
    for (; c < count; ++c) bl_axpy(y, a[c], x + c * ldx, D);
}

/* Collects (coefficient, source row) pairs and applies them to y four at a time, for updates
 * whose sources are chosen one by one (the rows allowed to see a key). */
typedef struct bl_axpy_batch {
    float a[BL_AXPY_WIDTH];
    const float *x[BL_AXPY_WIDTH];
    int count;
} bl_axpy_batch;

static inline void bl_axpy_batch_add(bl_axpy_batch *batch, float *y, float a, const float *x,
                                     int D) {
    batch->a[batch->count] = a;
    batch->x[batch->count] = x;
    if (++batch->count == BL_AXPY_WIDTH) {
        bl_axpy4(y, batch->a, batch->x, D);
        batch->count = 0;
    }
}

static inline void bl_axpy_batch_flush(bl_axpy_batch *batch, float *y, int D) {
    for (int i = 0; i < batch->count; ++i) bl_axpy(y, batch->a[i], batch->x[i], D);
    batch->count = 0;
}

#endif /* BL_CPU_KERNELS_H */
