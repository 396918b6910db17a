// tensor_map.cuh -- host side of TMA: describing a (B, S, H, D) 16-bit tensor to the copy engine.
// Shared by the forward (Q, K, V tiles) and the backward (Q, dO row tiles).
#pragma once
#include <stdint.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include "backend.h"

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no -lcuda needed).
static PFN_cuTensorMapEncodeTiled_v12000 bl_tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static bool looked = false;
    if (!looked) {
        void *ptr = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                             &found) == cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)ptr;
        else
            (void)cudaGetLastError();
        looked = true;
    }
    return fn;
}

// Describes a (B, S, H, D) tensor to TMA as (D, S, H, B) with a (64, box_rows, 1, 1) box -- one
// 128-byte-wide panel of box_rows rows -- and the 128B swizzle that the wgmma descriptors expect.
// Rows past S arrive as zeros. Returns false where TMA cannot take the tensor (a stride that is
// not positive, no driver entry point); callers then use their cp.async kernels.
static bool bl_make_tensor_map(CUtensorMap *map, bl_tensor t, int64_t batch, int64_t seqlen,
                               int64_t heads, int64_t head_dim, uint32_t box_rows, bool bf16) {
    constexpr uint32_t PANEL_COLS = 64;  // 128 bytes of 16-bit elements: the swizzle's row
    PFN_cuTensorMapEncodeTiled_v12000 encode = bl_tensor_map_encoder();
    if (!encode) return false;
    const int64_t elem = 2;
    // A stride of a dimension of size 1 is never used: give it a harmless valid value.
    const int64_t ss = seqlen == 1 ? head_dim : t.stride_s;
    const int64_t sh = heads == 1 ? head_dim : t.stride_h;
    const int64_t sb = batch == 1 ? head_dim : t.stride_b;
    if (ss <= 0 || sh <= 0 || sb <= 0) return false;
    cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)seqlen, (cuuint64_t)heads, (cuuint64_t)batch};
    cuuint64_t strides[3] = {(cuuint64_t)(ss * elem), (cuuint64_t)(sh * elem), (cuuint64_t)(sb * elem)};
    cuuint32_t box[4] = {PANEL_COLS, box_rows, 1, 1};
    cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                              4, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}
