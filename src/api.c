/* api.c -- the public functions of backlite.h: argument checks that do not depend on the backend,
 * then dispatch to the CPU backend (src/cpu_*.c) or the CUDA backend (src/cuda/, or the stub).
 *
 * Every failure names the function, the argument and its bad value in the last-error text.
 */
#include <math.h>
#include <stddef.h>

#include "backend.h"

/* Element counts beyond this are certainly a caller's mistake and would overflow int64 offsets. */
#define BL_MAX_ELEMENTS ((int64_t)1 << 56)

#define BL_CHECK(expr)                                                                        \
    do {                                                                                      \
        bl_status bl_st_ = (expr);                                                            \
        if (bl_st_ != BL_OK) return bl_st_;                                                   \
    } while (0)

static int backend_in_range(bl_backend backend) {
    return (int)backend == BL_BACKEND_CPU || (int)backend == BL_BACKEND_CUDA;
}

/* a * b, or -1 if it exceeds BL_MAX_ELEMENTS (both >= 0 here). */
static int64_t bounded_product(int64_t a, int64_t b) {
    if (a != 0 && b > BL_MAX_ELEMENTS / a) return -1;
    return a * b;
}

static bl_status check_dim(const char *fn, const char *name, int64_t value) {
    if (value < 1)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: desc->%s must be >= 1, got %lld", fn,
                            name, (long long)value);
    return BL_OK;
}

/* Backend, dtype and head dim: values no backend takes. `prefix` is "desc->" for a desc's
 * fields and "" for bl_supports's arguments, so that the message names what the caller wrote. */
static bl_status check_kind(const char *fn, const char *prefix, bl_backend backend, bl_dtype dtype,
                            int64_t head_dim) {
    if (!backend_in_range(backend))
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: %sbackend must be BL_BACKEND_CPU (0) or BL_BACKEND_CUDA (1), "
                            "got %d", fn, prefix, (int)backend);
    if ((int)dtype != BL_DTYPE_F32 && (int)dtype != BL_DTYPE_F16 && (int)dtype != BL_DTYPE_BF16)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: %sdtype must be BL_DTYPE_F32 (0), BL_DTYPE_F16 (1) or "
                            "BL_DTYPE_BF16 (2), got %d", fn, prefix, (int)dtype);
    if (head_dim < 2 || head_dim > BL_MAX_HEAD_DIM || head_dim % 2 != 0)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: %shead_dim must be even, >= 2 and <= %d, got %lld", fn, prefix,
                            BL_MAX_HEAD_DIM, (long long)head_dim);
    return BL_OK;
}

/* Everything about the problem description that holds for every backend. */
static bl_status check_desc(const char *fn, const bl_attn_desc *d) {
    if (!d) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    BL_CHECK(check_kind(fn, "desc->", d->backend, d->dtype, d->head_dim));
    BL_CHECK(check_dim(fn, "batch", d->batch));
    BL_CHECK(check_dim(fn, "seqlen_q", d->seqlen_q));
    BL_CHECK(check_dim(fn, "seqlen_k", d->seqlen_k));
    BL_CHECK(check_dim(fn, "heads_q", d->heads_q));
    BL_CHECK(check_dim(fn, "heads_k", d->heads_k));
    if (d->heads_q % d->heads_k != 0)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: desc->heads_q (%lld) must be a multiple of desc->heads_k (%lld)",
                            fn, (long long)d->heads_q, (long long)d->heads_k);
    if (!isfinite(d->scale))
        return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: desc->scale must be finite, got %g", fn,
                            (double)d->scale);
    if (d->causal != 0 && d->causal != 1)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: desc->causal must be 0 or 1, got %d",
                            fn, d->causal);
    if (d->deterministic != 0 && d->deterministic != 1)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: desc->deterministic must be 0 or 1, got %d", fn, d->deterministic);
    /* Every tensor, lse and W must be addressable with int64 element offsets. */
    const int64_t rows_q = bounded_product(bounded_product(d->batch, d->seqlen_q), d->heads_q);
    const int64_t rows_k = bounded_product(bounded_product(d->batch, d->seqlen_k), d->heads_k);
    const int64_t tiles = bounded_product(
        bounded_product(d->batch, d->heads_q),
        bounded_product((d->seqlen_q + BL_TILE_M - 1) / BL_TILE_M,
                        (d->seqlen_k + BL_TILE_N - 1) / BL_TILE_N));
    if (rows_q < 0 || rows_k < 0 || tiles < 0 || bounded_product(rows_q, d->head_dim) < 0 ||
        bounded_product(rows_k, d->head_dim) < 0)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: problem too large (batch=%lld, seqlen_q=%lld, seqlen_k=%lld, "
                            "heads_q=%lld, heads_k=%lld, head_dim=%lld)", fn,
                            (long long)d->batch, (long long)d->seqlen_q, (long long)d->seqlen_k,
                            (long long)d->heads_q, (long long)d->heads_k,
                            (long long)d->head_dim);
    return BL_OK;
}

static bl_status check_stride(const char *fn, const char *tensor, const char *stride_name,
                              int64_t stride, int64_t dim) {
    /* A dim of size 1 is never stepped over, so its stride only has to be non-negative. */
    if (stride < 0 || (dim > 1 && stride < 1))
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: %s.%s must be >= 1 (its dim has size %lld), got %lld", fn,
                            tensor, stride_name, (long long)dim, (long long)stride);
    return BL_OK;
}

/* A (B, S, H, D) tensor: data present, strides valid for its dims. */
static bl_status check_tensor(const char *fn, const char *name, const bl_tensor *t, int64_t B,
                              int64_t S, int64_t H) {
    if (!t->data) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: %s.data is NULL", fn, name);
    BL_CHECK(check_stride(fn, name, "stride_b", t->stride_b, B));
    BL_CHECK(check_stride(fn, name, "stride_s", t->stride_s, S));
    BL_CHECK(check_stride(fn, name, "stride_h", t->stride_h, H));
    return BL_OK;
}

static bl_status check_negl_prob(const char *fn, float negl_prob) {
    if (!(negl_prob >= 0.0f && negl_prob < 1.0f)) /* also rejects NaN */
        return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: negl_prob must be in [0, 1), got %g",
                            fn, (double)negl_prob);
    return BL_OK;
}

/* A compute call on the CUDA backend needs it compiled in and a usable device; saying so here
 * gives one clear message instead of whichever CUDA call would fail first. */
static bl_status require_backend(const char *fn, const bl_attn_desc *d) {
    if (d->backend == BL_BACKEND_CUDA && !bl_cuda_available())
        return bl_set_error(BL_ERR_NO_BACKEND,
                            "%s: desc->backend is BL_BACKEND_CUDA but the CUDA backend is not "
                            "available (not compiled into this build, or no compute capability "
                            "9.0 device is visible)", fn);
    return BL_OK;
}

/* CUDA calls run on caller-provided device scratch; the CPU backend needs none. */
static bl_status check_workspace(const char *fn, const bl_attn_desc *d, bl_op op,
                                 int with_stats) {
    if (d->backend != BL_BACKEND_CUDA) return BL_OK;
    size_t needed = 0;
    BL_CHECK(bl_cuda_workspace_size(d, op, with_stats, &needed));
    if (needed == 0) return BL_OK;
    if (!d->workspace)
        return bl_set_error(BL_ERR_WORKSPACE,
                            "%s: desc->workspace is NULL but this call needs %zu bytes "
                            "(see bl_workspace_size)", fn, needed);
    if (d->workspace_bytes < needed)
        return bl_set_error(BL_ERR_WORKSPACE,
                            "%s: desc->workspace_bytes is %zu but this call needs %zu bytes "
                            "(see bl_workspace_size)", fn, d->workspace_bytes, needed);
    return BL_OK;
}

/* ---- library information ---- */

int bl_backend_available(bl_backend backend) {
    if ((int)backend == BL_BACKEND_CPU) return 1;
    if ((int)backend == BL_BACKEND_CUDA) return bl_cuda_available();
    return 0;
}

bl_status bl_supports(bl_backend backend, bl_dtype dtype, int64_t head_dim) {
    static const char fn[] = "bl_supports";
    bl_clear_error();
    BL_CHECK(check_kind(fn, "", backend, dtype, head_dim));
    if (backend == BL_BACKEND_CPU) return BL_OK;
    return bl_cuda_supports(fn, dtype, head_dim);
}

void *bl_workspace_alloc(size_t bytes, int device, void *stream) {
    (void)stream;
    return bl_cuda_workspace_alloc(bytes, device);
}

void bl_workspace_free(void *ptr, size_t bytes, int device, void *stream) {
    (void)device; (void)stream;
    bl_cuda_workspace_free(ptr, bytes);
}

int bl_workspace_compressible(int device) { return bl_cuda_workspace_compressible(device); }

bl_status bl_tile_shape(bl_backend backend, int *tile_m, int *tile_n) {
    static const char fn[] = "bl_tile_shape";
    bl_clear_error();
    if (!backend_in_range(backend))
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: backend must be BL_BACKEND_CPU (0) or BL_BACKEND_CUDA (1), "
                            "got %d", fn, (int)backend);
    if (!tile_m) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: tile_m is NULL", fn);
    if (!tile_n) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: tile_n is NULL", fn);
    *tile_m = BL_TILE_M;
    *tile_n = BL_TILE_N;
    return BL_OK;
}

bl_status bl_num_tiles(const bl_attn_desc *desc, int64_t *num_tiles_m, int64_t *num_tiles_n) {
    static const char fn[] = "bl_num_tiles";
    bl_clear_error();
    BL_CHECK(check_desc(fn, desc));
    if (!num_tiles_m) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: num_tiles_m is NULL", fn);
    if (!num_tiles_n) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: num_tiles_n is NULL", fn);
    *num_tiles_m = (desc->seqlen_q + BL_TILE_M - 1) / BL_TILE_M;
    *num_tiles_n = (desc->seqlen_k + BL_TILE_N - 1) / BL_TILE_N;
    return BL_OK;
}

bl_status bl_workspace_size(const bl_attn_desc *desc, bl_op op, int with_stats, size_t *bytes) {
    static const char fn[] = "bl_workspace_size";
    bl_clear_error();
    BL_CHECK(check_desc(fn, desc));
    if ((int)op != BL_OP_FORWARD && (int)op != BL_OP_BACKWARD)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: op must be BL_OP_FORWARD (0) or BL_OP_BACKWARD (1), got %d", fn,
                            (int)op);
    if (with_stats != 0 && with_stats != 1)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: with_stats must be 0 or 1, got %d", fn,
                            with_stats);
    if (!bytes) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (desc->backend == BL_BACKEND_CPU) {
        *bytes = 0;
        return BL_OK;
    }
    return bl_cuda_workspace_size(desc, op, with_stats, bytes);
}

/* ---- forward ---- */

bl_status bl_forward(const bl_attn_desc *desc, bl_tensor q, bl_tensor k, bl_tensor v,
                     bl_tensor out, float *lse, float *tile_mass) {
    static const char fn[] = "bl_forward";
    bl_clear_error();
    BL_CHECK(check_desc(fn, desc));
    const int64_t B = desc->batch, Sq = desc->seqlen_q, Sk = desc->seqlen_k;
    BL_CHECK(check_tensor(fn, "q", &q, B, Sq, desc->heads_q));
    BL_CHECK(check_tensor(fn, "k", &k, B, Sk, desc->heads_k));
    BL_CHECK(check_tensor(fn, "v", &v, B, Sk, desc->heads_k));
    BL_CHECK(check_tensor(fn, "out", &out, B, Sq, desc->heads_q));
    if (!lse) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: lse is NULL", fn);
    BL_CHECK(require_backend(fn, desc));
    BL_CHECK(check_workspace(fn, desc, BL_OP_FORWARD, tile_mass != NULL));
    if (desc->backend == BL_BACKEND_CPU) return bl_cpu_forward(desc, q, k, v, out, lse, tile_mass);
    return bl_cuda_forward(desc, q, k, v, out, lse, tile_mass);
}

/* ---- tile selection ---- */

bl_status bl_select_tiles(const bl_attn_desc *desc, const float *tile_mass, float negl_prob,
                          uint8_t *mask) {
    static const char fn[] = "bl_select_tiles";
    bl_clear_error();
    BL_CHECK(check_desc(fn, desc));
    if (!tile_mass) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: tile_mass is NULL", fn);
    if (!mask) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: mask is NULL", fn);
    BL_CHECK(check_negl_prob(fn, negl_prob));
    BL_CHECK(require_backend(fn, desc));
    if (desc->backend == BL_BACKEND_CPU)
        return bl_cpu_select_tiles(desc, tile_mass, negl_prob, mask);
    return bl_cuda_select_tiles(desc, tile_mass, negl_prob, mask);
}

/* ---- backward ---- */

bl_status bl_backward(const bl_attn_desc *desc, bl_tensor q, bl_tensor k, bl_tensor v,
                      bl_tensor out, bl_tensor dout, const float *lse,
                      const float *tile_mass, float negl_prob, const uint8_t *mask,
                      bl_tensor dq, bl_tensor dk, bl_tensor dv) {
    static const char fn[] = "bl_backward";
    bl_clear_error();
    BL_CHECK(check_desc(fn, desc));
    const int64_t B = desc->batch, Sq = desc->seqlen_q, Sk = desc->seqlen_k;
    const int64_t Hq = desc->heads_q, Hk = desc->heads_k;
    BL_CHECK(check_tensor(fn, "q", &q, B, Sq, Hq));
    BL_CHECK(check_tensor(fn, "k", &k, B, Sk, Hk));
    BL_CHECK(check_tensor(fn, "v", &v, B, Sk, Hk));
    BL_CHECK(check_tensor(fn, "out", &out, B, Sq, Hq));
    BL_CHECK(check_tensor(fn, "dout", &dout, B, Sq, Hq));
    BL_CHECK(check_tensor(fn, "dq", &dq, B, Sq, Hq));
    BL_CHECK(check_tensor(fn, "dk", &dk, B, Sk, Hk));
    BL_CHECK(check_tensor(fn, "dv", &dv, B, Sk, Hk));
    if (!lse) return bl_set_error(BL_ERR_INVALID_ARGUMENT, "%s: lse is NULL", fn);
    BL_CHECK(check_negl_prob(fn, negl_prob));
    const int select_from_mass = mask == NULL && negl_prob > 0.0f;
    if (select_from_mass && !tile_mass)
        return bl_set_error(BL_ERR_INVALID_ARGUMENT,
                            "%s: tile_mass is NULL but mask is NULL and negl_prob=%g > 0 asks "
                            "for selection from the tile mass", fn, (double)negl_prob);
    BL_CHECK(require_backend(fn, desc));
    /* with_stats for the backward: whether the call selects tiles from the tile mass. */
    BL_CHECK(check_workspace(fn, desc, BL_OP_BACKWARD, select_from_mass));
    if (desc->backend == BL_BACKEND_CPU)
        return bl_cpu_backward(desc, q, k, v, out, dout, lse, tile_mass, negl_prob, mask, dq, dk,
                               dv);
    return bl_cuda_backward(desc, q, k, v, out, dout, lse, tile_mass, negl_prob, mask, dq, dk,
                            dv);
}
