/* cuda_stub.c -- the CUDA backend entry points of a build made without nvcc: each one reports
 * that the backend is not compiled in. */
#include "backend.h"

static bl_status no_cuda(void) {
    return bl_set_error(BL_ERR_NO_BACKEND,
                        "the CUDA backend is not compiled into this build of BackLite "
                        "(nvcc was not found when it was built)");
}

int bl_cuda_available(void) { return 0; }

bl_status bl_cuda_supports(const char *fn, bl_dtype dtype, int64_t head_dim) {
    (void)fn; (void)dtype; (void)head_dim;
    return no_cuda();
}

bl_status bl_cuda_workspace_size(const bl_attn_desc *d, bl_op op, int with_stats, size_t *bytes) {
    (void)d; (void)op; (void)with_stats; (void)bytes;
    return no_cuda();
}

bl_status bl_cuda_forward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                          bl_tensor out, float *lse, float *tile_mass) {
    (void)d; (void)q; (void)k; (void)v; (void)out; (void)lse; (void)tile_mass;
    return no_cuda();
}

bl_status bl_cuda_select_tiles(const bl_attn_desc *d, const float *tile_mass, float negl_prob,
                               uint8_t *mask) {
    (void)d; (void)tile_mass; (void)negl_prob; (void)mask;
    return no_cuda();
}

bl_status bl_cuda_backward(const bl_attn_desc *d, bl_tensor q, bl_tensor k, bl_tensor v,
                           bl_tensor out, bl_tensor dout, const float *lse,
                           const float *tile_mass, float negl_prob, const uint8_t *mask,
                           bl_tensor dq, bl_tensor dk, bl_tensor dv) {
    (void)d; (void)q; (void)k; (void)v; (void)out; (void)dout; (void)lse; (void)tile_mass;
    (void)negl_prob; (void)mask; (void)dq; (void)dk; (void)dv;
    return no_cuda();
}

void *bl_cuda_workspace_alloc(size_t bytes, int device) {
    (void)bytes; (void)device;
    return NULL;
}

void bl_cuda_workspace_free(void *ptr, size_t bytes) {
    (void)ptr; (void)bytes;
}

int bl_cuda_workspace_compressible(int device) {
    (void)device;
    return 0;
}
