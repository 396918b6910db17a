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

// Encodes a 4-D tensor map (dims innermost first, strides in bytes of dims 1..3) with the 128B
// swizzle. Returns false where TMA cannot take it (a stride that is not positive, no driver
// entry point).
static bool bl_encode_tensor_map_4d(CUtensorMap *map, CUtensorMapDataType type, void *data,
                                    const int64_t (&dims)[4], const int64_t (&strides)[3],
                                    const uint32_t (&box)[4]) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = bl_tensor_map_encoder();
    if (!encode) return false;
    cuuint64_t d[4], st[3];
    cuuint32_t bx[4], elem_strides[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; ++i) {
        d[i] = (cuuint64_t)dims[i];
        bx[i] = box[i];
    }
    for (int i = 0; i < 3; ++i) {
        if (strides[i] <= 0) return false;
        st[i] = (cuuint64_t)strides[i];
    }
    const CUresult r = encode(map, type, 4, data, d, st, bx, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

// Describes a (B, S, H, D) 16-bit tensor to TMA as (D, S, H, B) with a (64, box_rows, 1, 1) box
// -- one 128-byte-wide panel of box_rows rows -- and the 128B swizzle that the wgmma descriptors
// expect. Rows past S arrive as zeros.
static bool bl_make_tensor_map(CUtensorMap *map, bl_tensor t, int64_t batch, int64_t seqlen,
                               int64_t heads, int64_t head_dim, uint32_t box_rows, bool bf16) {
    constexpr uint32_t PANEL_COLS = 64;  // 128 bytes of 16-bit elements: the swizzle's row
    const int64_t elem = 2;
    // A stride of a dimension of size 1 is never used: give it a harmless valid value.
    const int64_t ss = seqlen == 1 ? head_dim : t.stride_s;
    const int64_t sh = heads == 1 ? head_dim : t.stride_h;
    const int64_t sb = batch == 1 ? head_dim : t.stride_b;
    const int64_t dims[4] = {head_dim, seqlen, heads, batch};
    const int64_t strides[3] = {ss * elem, sh * elem, sb * elem};
    const uint32_t box[4] = {PANEL_COLS, box_rows, 1, 1};
    return bl_encode_tensor_map_4d(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                   t.data, dims, strides, box);
}
