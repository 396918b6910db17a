/* bwd_workspace.h -- the backward's device-scratch size, defined with the backward kernels and
 * queried by bl_cuda_workspace_size (attn_fwd_sm90.cu) for BL_OP_BACKWARD. */
#ifndef BL_CUDA_BWD_WORKSPACE_H
#define BL_CUDA_BWD_WORKSPACE_H

#include <stddef.h>
#include "backlite.h"

#ifdef __cplusplus
extern "C"
#endif
bl_status bl_cuda_bwd_workspace_size(const bl_attn_desc *d, size_t *bytes);

#endif /* BL_CUDA_BWD_WORKSPACE_H */
