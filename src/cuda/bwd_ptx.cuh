// bwd_ptx.cuh -- thin inline-PTX helpers of the sm_90a backward: cp.async copies into shared
// memory, ldmatrix fragment loads and the mma.sync m16n8k16 tensor-core product (fp32
// accumulate), for bf16 and fp16. Kept apart from ptx_sm90.cuh (the forward's wgmma/TMA helpers)
// so that the backward builds whatever state that header is in.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Shared-memory address of a generic pointer, as the 32-bit value PTX's .shared instructions take.
static __device__ __forceinline__ uint32_t bl_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16-byte global -> shared copy that bypasses L1; when `valid` is false nothing is read and the
// 16 destination bytes are zero-filled (rows past the end of a sequence).
static __device__ __forceinline__ void bl_cp_async16(uint32_t dst, const void *src, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
static __device__ __forceinline__ void bl_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most `N` committed groups are still in flight.
template <int N>
static __device__ __forceinline__ void bl_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 16-bit matrices; lane l supplies the row address for matrix l/8.
static __device__ __forceinline__ void bl_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// The same with each 8x8 matrix transposed on the way into registers.
static __device__ __forceinline__ void bl_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a * b for one m16n8k16 tile; a: 4 regs (16x16, row), b: 2 regs (16x8, col), c: 4 fp32.
template <typename T>
static __device__ __forceinline__ void bl_mma16816(float (&c)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void bl_mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                           uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void bl_mma16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                    uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values, `lo` in the low half (the lower column).
template <typename T>
static __device__ __forceinline__ uint32_t bl_pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t bl_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <>
__device__ __forceinline__ uint32_t bl_pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// 16-bit element -> float, and back.
static __device__ __forceinline__ float bl_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ float bl_to_float(__half x) { return __half2float(x); }
template <typename T>
static __device__ __forceinline__ T bl_from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 bl_from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half bl_from_float<__half>(float x) { return __float2half_rn(x); }
