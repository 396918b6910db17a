// cuda_supports.cu -- what the CUDA backend's kernels are built for, answered without a device
// (bl_supports in backlite.h; the forward and backward entry points check it first). In a file
// of its own so that the backward's dev checker (dev/cuda/bwd_build_tree.sh) links without the
// forward's kernels.
#include <stdint.h>
#include "backend.h"

// bf16 / fp16 at head dims 64 and 128: the forward's and the backward's instantiations (the
// selection reads only W).
extern "C" bl_status bl_cuda_supports(const char *fn, bl_dtype dtype, int64_t head_dim) {
    if (dtype != BL_DTYPE_BF16 && dtype != BL_DTYPE_F16)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "%s: dtype=%d is not supported by the CUDA backend (bf16 = 2 and "
                            "fp16 = 1 only; fp32 = 0 runs on the CPU backend)", fn, (int)dtype);
    if (head_dim != 64 && head_dim != 128)
        return bl_set_error(BL_ERR_UNSUPPORTED,
                            "%s: head_dim=%lld is not supported by the CUDA backend (64 and 128 "
                            "only)", fn, (long long)head_dim);
    return BL_OK;
}
