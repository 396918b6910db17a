// cuda_check.cuh -- error checks for the CUDA backend: every CUDA call and launch goes through
// BL_CUDA_CHECK, which records the failing statement and CUDA's message as the library's last
// error and returns BL_ERR_CUDA from the enclosing function (library code never exits).
#pragma once
#include <cuda_runtime.h>
#include "backend.h"

#define BL_CUDA_CHECK(call)                                                                   \
    do {                                                                                      \
        cudaError_t bl_err_ = (call);                                                         \
        if (bl_err_ != cudaSuccess)                                                           \
            return bl_set_error(BL_ERR_CUDA, "%s failed at %s:%d: %s", #call, __FILE__,       \
                                __LINE__, cudaGetErrorString(bl_err_));                       \
    } while (0)

// After a <<<...>>> launch: catches bad launch configurations right away.
#define BL_CUDA_CHECK_LAUNCH(name) BL_CUDA_CHECK(cudaPeekAtLastError())

// The current device's SM count: the persistent backward kernel's grid and, from the same number,
// the backward schedule's window (bwd_lists_sm90.cu).
static inline bl_status bl_sm_count(int *sms) {
    int dev = 0;
    BL_CUDA_CHECK(cudaGetDevice(&dev));
    BL_CUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
    return BL_OK;
}

// Propagates a bl_status from a helper.
#define BL_TRY(expr)                                                                          \
    do {                                                                                      \
        bl_status bl_st_ = (expr);                                                            \
        if (bl_st_ != BL_OK) return bl_st_;                                                   \
    } while (0)

// Launches kernel(args...) on `stream`; where `dependent`, as a programmatic dependent launch
// (cudaLaunchAttributeProgrammaticStreamSerialization): it may be scheduled before the kernel
// ahead of it on the stream completes (as soon as that one's CTAs have all run
// griddep_launch_dependents or exited), so it must run griddep_wait (ptx_sm90.cuh) before it
// touches what that kernel writes, and before it exits if a later kernel relies on both.
// bl_launch_carveout: the same, with this launch's shared-memory carveout preference
// (cudaLaunchAttributePreferredSharedMemoryCarveout: percent of the most shared memory, 0 = the
// most L1), or BL_CARVEOUT_DEFAULT: none, the driver's choice. A launch attribute, not
// cudaFuncSetAttribute: no driver call of its own, and nothing left behind for the next launch.
enum { BL_CARVEOUT_DEFAULT = -1 };
template <typename... Params, typename... Args>
static inline cudaError_t bl_launch_carveout(void (*kernel)(Params...), dim3 grid, dim3 block,
                                             size_t smem, cudaStream_t stream, bool dependent,
                                             int carveout, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attrs[2];
    unsigned n = 0;
    if (dependent) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (carveout != BL_CARVEOUT_DEFAULT) {
        attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attrs[n++].val.sharedMemCarveout = (unsigned)carveout;
    }
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}
template <typename... Params, typename... Args>
static inline cudaError_t bl_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, bool dependent, Args &&...args) {
    return bl_launch_carveout(kernel, grid, block, smem, stream, dependent, BL_CARVEOUT_DEFAULT,
                              static_cast<Args &&>(args)...);
}
