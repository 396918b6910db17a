/*
 * backend.h -- the internal interface between the public API (src/api.c) and the backends.
 *
 * src/api.c validates every argument that does not depend on the backend (pointers, shapes,
 * strides, negl_prob range, workspace size) and then calls one of the functions below with the
 * same arguments. A backend checks only what is its own (supported dtype / head dim) and reports
 * failures through bl_set_error.
 */
#ifndef BL_BACKEND_H
#define BL_BACKEND_H

#include "backlite.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records `fmt` as this thread's last error and returns `status` (so: `return bl_set_error(...)`). */
bl_status bl_set_error(bl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void bl_clear_error(void);

/* ---- CPU backend (src/cpu_*.c) ---- */
bl_status bl_cpu_forward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                         bl_tensor out, float *lse, float *tile_mass);
bl_status bl_cpu_select_tiles(const bl_attn_desc *d, const float *tile_mass, float negl_prob,
                              uint8_t *mask);
bl_status bl_cpu_backward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                          bl_tensor out, bl_tensor dout, const float *lse,
                          const float *tile_mass, float negl_prob, const uint8_t *mask,
                          bl_tensor dq, bl_tensor dk, bl_tensor dv);

/* ---- CUDA backend (the .cu files in src/cuda; src/stub/cuda_stub.c when built without nvcc) ---- */
int bl_cuda_available(void);
/* bl_supports for the CUDA backend (dtype and head_dim already valid); `fn` starts the message. */
bl_status bl_cuda_supports(const char *fn, bl_dtype dtype, int64_t head_dim);
bl_status bl_cuda_workspace_size(const bl_attn_desc *d, bl_op op, int with_stats, size_t *bytes);
bl_status bl_cuda_forward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                          bl_tensor out, float *lse, float *tile_mass);
bl_status bl_cuda_select_tiles(const bl_attn_desc *d, const float *tile_mass, float negl_prob,
                               uint8_t *mask);
bl_status bl_cuda_backward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                           bl_tensor out, bl_tensor dout, const float *lse,
                           const float *tile_mass, float negl_prob, const uint8_t *mask,
                           bl_tensor dq, bl_tensor dk, bl_tensor dv);
void *bl_cuda_workspace_alloc(size_t bytes, int device);
void bl_cuda_workspace_free(void *ptr, size_t bytes);
int bl_cuda_workspace_compressible(int device);

#ifdef __cplusplus
}
#endif

#endif /* BL_BACKEND_H */
