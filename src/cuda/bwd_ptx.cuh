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

// The dynamic shared memory `raw` rounded up to ALIGN bytes, computed by offsetting `raw` itself
// so that the compiler still knows the pointer is shared: reads through it compile to LDS (a
// pointer rebuilt from an integer compiles to generic LD, long-scoreboard latency right before
// the exp / dS math: bench/results/bwd128-ncu-src-s7.txt).
template <uint32_t ALIGN>
static __device__ __forceinline__ unsigned char *bl_smem_aligned(unsigned char *raw) {
    const uint32_t a = bl_smem_addr(raw);
    return raw + ((ALIGN - (a & (ALIGN - 1))) & (ALIGN - 1));
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

// Four 8x8 16-bit matrices stored as they are: register r[q] holds row l/4, 16-bit columns
// 2(l%4), +1 of matrix q (one 32-bit word: word l%4 of the row's 16 bytes); lane l gives the
// address of row l%8 of matrix l/8.
static __device__ __forceinline__ void bl_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1,
                                                      uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// Four 8x8 16-bit matrices, each stored transposed: register r[q] holds the m16n8k16 fragment of
// matrix q (lane l: row l/4, columns 2(l%4), +1); lane l gives the address of stored row l%8 of
// matrix l/8, which receives column l%8 of the fragment.
static __device__ __forceinline__ void bl_stmatrix_x4_trans(uint32_t addr,
                                                            const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
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

// The two 16-bit values of a packed word, low half first (bl_pack2's inverse).
template <typename T>
static __device__ __forceinline__ float2 bl_unpack2(uint32_t u);
template <>
__device__ __forceinline__ float2 bl_unpack2<__nv_bfloat16>(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 bl_unpack2<__half>(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&u));
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

// This thread's warpgroup (threadIdx.x / 128) as one value per warp, read from lane 0: ptxas
// then treats branches on it as warp-uniform and keeps what the warp-specialized kernels' roles
// derive from their loop counters -- ring positions, wgmma descriptors -- on the uniform
// datapath. Split on threadIdx.x itself, the head-dim-128 kernels' consumer loops formed part of
// them in vector registers (bench/notes-bwd.md, twenty-eighth session).
static __device__ __forceinline__ int bl_warpgroup_uniform(void) {
    return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
}

// ---- warpgroup MMA (wgmma, sm_90a) ----
// Operands in shared memory are "128-byte swizzled panels": a tile of R rows x C 16-bit columns is
// C/64 panels of R rows x 128 bytes, panel-contiguous; in each group of 8 rows (1024 bytes) the
// 16-byte chunk c of row r sits at chunk c ^ (r % 8). Panels start on 1024-byte boundaries.

// Matrix descriptor: start address, leading / stride byte offsets (16-byte units, 14 bits each),
// base offset 0, swizzle mode 1 (128B) in bits 62-63.
//   K-major operand: LBO unused, SBO = 1024 (next group of 8 rows); a k16 step inside a panel
//     moves the start by 32 bytes, the next panel by R*128.
//   MN-major operand (the "transposed" one): LBO = distance between 64-wide panels along M/N,
//     SBO = 1024 (next group of 8 reduction rows); a k16 step moves the start by 16 rows = 2048.
#define BL_WGMMA_GROUP_BYTES 1024u
static __device__ __forceinline__ uint64_t bl_wgmma_desc(uint32_t smem_addr, uint32_t lbo,
                                                         uint32_t sbo) {
    return (uint64_t)((smem_addr >> 4) & 0x3FFFu) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
static __device__ __forceinline__ void bl_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void bl_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void bl_wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by ordinary stores or cp.async and read next by wgmma: in every writing
// thread, before the barrier that publishes it.
static __device__ __forceinline__ void bl_fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins a register's use after the preceding wgmma wait (the hardware writes accumulators
// asynchronously; the compiler must not read them, or recycle A-fragment registers, earlier).
template <int N>
static __device__ __forceinline__ void bl_reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Gives an accumulator's registers a value without an instruction, for a product whose first
// wgmma does not read them (acc = 0 above). Zeroing them instead cost one move per register in
// the hot loops: ptxas folded some zeroed accumulators into their first product and copied the
// zeros of others from one zero register (e.g. 40 IMAD.MOV per entry for the 80-row kernel's dQ^T).
template <int N>
static __device__ __forceinline__ void bl_acc_overwritten(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "=f"(r[i]));
}
template <int N>
static __device__ __forceinline__ void bl_reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

#define BL_F8(d, i)                                                                          \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define BL_ACC32(d) BL_F8(d, 0), BL_F8(d, 8), BL_F8(d, 16), BL_F8(d, 24)
#define BL_ACC64(d) BL_ACC32(d), BL_F8(d, 32), BL_F8(d, 40), BL_F8(d, 48), BL_F8(d, 56)
#define BL_REGS32                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define BL_REGS64                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "   \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define BL_ACC40(d) BL_ACC32(d), BL_F8(d, 32)
#define BL_REGS40                                                                             \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
    "%36, %37, %38, %39}"

// Both operands from shared memory, fp32 accumulators d: one wgmma of SHAPE whose descriptors
// and predicate are operands IA, IB, IP (after the accumulator registers); TA / TB = 1: A / B
// MN-major ("transposed"), 0: K-major.
#define BL_WGMMA_SS_ASM(SHAPE, REGS, ACC, IA, IB, IP, TY, TA, TB)                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                            \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS           \
                 ", %" #IA ", %" #IB ", p, 1, 1, " #TA ", " #TB ";\n}\n"                     \
                 : ACC(d)                                                                     \
                 : "l"(da), "l"(db), "r"(acc))
// d[32] = A(smem, K-major) * B(smem; K-major when TRANS_B == 0, MN-major when 1) + (acc ? d : 0);
// m64n64k16. acc = 0 (wgmma's scale-d false) starts a product without zeroing d first.
template <typename T, int TRANS_B>
static __device__ __forceinline__ void bl_wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db,
                                                       int acc = 1);
// d[40] = A(smem; K-major when TRANS_A == 0, MN-major when 1) * B(smem, K-major) + (acc ? d : 0);
// m64n80k16: the 80-row kernel's products over its query rows (bwd_ws128r80_sm90.cuh).
template <typename T, int TRANS_A>
static __device__ __forceinline__ void bl_wgmma_ss_n80(float (&d)[40], uint64_t da, uint64_t db,
                                                       int acc = 1);
#define BL_WGMMA_SS_SPECIALIZE(T, TY, X)                                                      \
    template <>                                                                               \
    __device__ __forceinline__ void bl_wgmma_ss_n64<T, X>(float (&d)[32], uint64_t da,        \
                                                          uint64_t db, int acc) {             \
        BL_WGMMA_SS_ASM("m64n64k16", BL_REGS32, BL_ACC32, 32, 33, 34, TY, 0, X);              \
    }                                                                                         \
    template <>                                                                               \
    __device__ __forceinline__ void bl_wgmma_ss_n80<T, X>(float (&d)[40], uint64_t da,        \
                                                          uint64_t db, int acc) {             \
        BL_WGMMA_SS_ASM("m64n80k16", BL_REGS40, BL_ACC40, 40, 41, 42, TY, X, 0);              \
    }
BL_WGMMA_SS_SPECIALIZE(__nv_bfloat16, "bf16", 0)
BL_WGMMA_SS_SPECIALIZE(__nv_bfloat16, "bf16", 1)
BL_WGMMA_SS_SPECIALIZE(__half, "f16", 0)
BL_WGMMA_SS_SPECIALIZE(__half, "f16", 1)

// d[N/2] += A(registers: the m16n8k16 A fragment of this warp's 16 rows) * B(smem; MN-major
// when TRANS_B == 1, the default, K-major when 0); m64nNk16 for N = 64 or 128.
#define BL_WGMMA_RS_N64(TY, TB)                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " BL_REGS32        \
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, " #TB ";\n}\n"                        \
                 : BL_ACC32(d)                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
#define BL_WGMMA_RS_N128(TY, TB)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " BL_REGS64       \
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, " #TB ";\n}\n"                        \
                 : BL_ACC64(d)                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
template <typename T, int N, int TRANS_B = 1>
static __device__ __forceinline__ void bl_wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                                   uint64_t db);
#define BL_WGMMA_RS_SPECIALIZE(T, TY, TB)                                                     \
    template <>                                                                               \
    __device__ __forceinline__ void bl_wgmma_rs<T, 64, TB>(float (&d)[32],                    \
                                                           const uint32_t (&a)[4], uint64_t db) { \
        BL_WGMMA_RS_N64(TY, TB);                                                              \
    }                                                                                         \
    template <>                                                                               \
    __device__ __forceinline__ void bl_wgmma_rs<T, 128, TB>(float (&d)[64],                   \
                                                            const uint32_t (&a)[4], uint64_t db) { \
        BL_WGMMA_RS_N128(TY, TB);                                                             \
    }
BL_WGMMA_RS_SPECIALIZE(__nv_bfloat16, "bf16", 0)
BL_WGMMA_RS_SPECIALIZE(__nv_bfloat16, "bf16", 1)
BL_WGMMA_RS_SPECIALIZE(__half, "f16", 0)
BL_WGMMA_RS_SPECIALIZE(__half, "f16", 1)
