/*
 * backlite.h -- the public C API of BackLite.
 *
 * BackLite is attention for training whose forward pass is exact and whose backward pass is
 * block-sparse. The forward measures, per (query tile, key tile) block, how much softmax
 * probability mass falls in it (the tile mass W); the backward skips the blocks that together
 * carry less than `negl_prob` of each row tile's mass. See DESIGN.md for the exact semantics.
 *
 * Conventions
 *   - Tensors use the FlashAttention layout (B, S, H, D) with the last dim contiguous; the other
 *     strides are passed explicitly, in elements (not bytes), through bl_tensor.
 *   - lse is fp32, contiguous, shape (B, Hq, Sq), natural log.
 *   - Tile mass W is fp32, contiguous, shape (B, Hq, Tm, Tn), Tm = ceil(Sq/TM), Tn = ceil(Sk/TN).
 *   - Block masks are uint8 (0 = skip, nonzero = keep), contiguous, shape (B, Hq, Tm, Tn).
 *   - Every function returns a bl_status; on failure bl_last_error() says what and why
 *     (the argument's name and its bad value). Nothing here exits or aborts.
 *   - CUDA entry points take the stream in bl_attn_desc.stream (a cudaStream_t as void*), never
 *     allocate (query the workspace with bl_workspace_size) and run asynchronously on that stream.
 *     The CPU backend may allocate scratch memory internally.
 */
#ifndef BACKLITE_H
#define BACKLITE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BL_VERSION_MAJOR 0
#define BL_VERSION_MINOR 1
#define BL_VERSION_PATCH 0
/* ABI version: bumped whenever a struct layout or a signature below changes; the Python loader
 * refuses a library whose bl_abi_version() differs from the one it was written for. */
#define BL_ABI_VERSION 2

/* Tile granularity of the statistics and of the sparse backward (DESIGN §1). */
#define BL_TILE_M 64  /* query rows per row tile */
#define BL_TILE_N 128 /* keys per key tile */

/* Largest head dim any backend accepts; backends may support fewer (see bl_supports). */
#define BL_MAX_HEAD_DIM 256

typedef enum bl_status {
    BL_OK = 0,
    BL_ERR_INVALID_ARGUMENT = 1, /* a bad argument: null pointer, shape, stride, value range */
    BL_ERR_UNSUPPORTED = 2,      /* valid, but this backend does not implement it (dtype, D) */
    BL_ERR_NO_BACKEND = 3,       /* the backend was not compiled in, or no usable device */
    BL_ERR_WORKSPACE = 4,        /* workspace missing or smaller than bl_workspace_size */
    BL_ERR_OUT_OF_MEMORY = 5,    /* host allocation failed (CPU backend scratch) */
    BL_ERR_CUDA = 6,             /* a CUDA call or kernel launch failed */
    BL_ERR_INTERNAL = 7,
    BL_ERR_NOT_DETERMINISTIC = 8 /* desc->deterministic = 1, but this call has no such form */
} bl_status;

typedef enum bl_dtype {
    BL_DTYPE_F32 = 0, /* CPU backend only */
    BL_DTYPE_F16 = 1,
    BL_DTYPE_BF16 = 2
} bl_dtype;

typedef enum bl_backend {
    BL_BACKEND_CPU = 0,
    BL_BACKEND_CUDA = 1 /* sm_90a (H100/H200) */
} bl_backend;

typedef enum bl_op {
    BL_OP_FORWARD = 0,
    BL_OP_BACKWARD = 1
} bl_op;

/* One attention call's problem description, shared by forward, backward and workspace queries. */
typedef struct bl_attn_desc {
    bl_backend backend;
    bl_dtype dtype;     /* dtype of q, k, v, out, dout, dq, dk, dv */
    int64_t batch;      /* B  >= 1 */
    int64_t seqlen_q;   /* Sq >= 1 */
    int64_t seqlen_k;   /* Sk >= 1 */
    int64_t heads_q;    /* Hq >= 1 */
    int64_t heads_k;    /* Hk >= 1, Hq % Hk == 0 (GQA/MQA) */
    int64_t head_dim;   /* D */
    float scale;        /* softmax scale, usually 1/sqrt(D); must be finite */
    int causal;         /* 0 or 1; bottom-right aligned: query i sees keys j <= i + Sk - Sq */
    void *stream;       /* CUDA: cudaStream_t (NULL = legacy default stream); CPU: ignored */
    void *workspace;    /* CUDA: device scratch of >= bl_workspace_size bytes; CPU: ignored */
    size_t workspace_bytes;
    /* Backward, 0 or 1. 1: dq, dk and dv come out the same bits in every call with the same
     * inputs -- on CUDA by the deterministic form (dq by row tiles, each summed in key order by
     * one CTA; a call it cannot run, past ~2.6M keys at head dim 128 or ~3.2M at 64, returns
     * BL_ERR_NOT_DETERMINISTIC and writes no output); the CPU backend always is. 0: the fastest
     * form, where CUDA sums dq by fp32 reduce-adds in the order the key tiles' CTAs finish, so
     * its bits may differ between calls. The forward and selection always are deterministic. */
    int deterministic;
} bl_attn_desc;

/* A (B, S, H, D) tensor: element (b, s, h, d) is at data[b*stride_b + s*stride_s + h*stride_h + d]. */
typedef struct bl_tensor {
    void *data;
    int64_t stride_b, stride_s, stride_h; /* in elements */
} bl_tensor;

/* ---- library information ---- */
const char *bl_version_string(void);  /* "0.1.0" */
int bl_abi_version(void);             /* BL_ABI_VERSION of the compiled library */
const char *bl_status_string(bl_status s);
/* Text of the last error on this thread ("" if none). Valid until the next call on the thread. */
const char *bl_last_error(void);
/* 1 if the backend was compiled in (CUDA: and a device of compute capability 9.0 is visible). */
int bl_backend_available(bl_backend backend);
/* BL_OK if `backend` computes attention in `dtype` at head dim `head_dim`: the CPU backend every
 * dtype and valid head dim, the CUDA backend bf16 / fp16 at head dims 64 and 128. Else
 * BL_ERR_UNSUPPORTED (what bl_forward and bl_backward return for such a call on a usable device),
 * BL_ERR_NO_BACKEND where the backend is not compiled in, or BL_ERR_INVALID_ARGUMENT for a value
 * no backend takes; bl_last_error says which. Needs no device, so that a caller can pick another
 * implementation before it prepares a call; size limits and the device itself are checked by the
 * calls. */
bl_status bl_supports(bl_backend backend, bl_dtype dtype, int64_t head_dim);
/* The (TM, TN) tile shape the backend uses for W, masks and the sparse backward. */
bl_status bl_tile_shape(bl_backend backend, int *tile_m, int *tile_n);
/* Tm, Tn for a problem: ceil(Sq/TM), ceil(Sk/TN). */
bl_status bl_num_tiles(const bl_attn_desc *desc, int64_t *num_tiles_m, int64_t *num_tiles_n);
/* Device scratch bytes `op` needs for this problem (0 for the CPU backend). For the forward,
 * `with_stats` says whether the tile mass is recorded. */
bl_status bl_workspace_size(const bl_attn_desc *desc, bl_op op, int with_stats, size_t *bytes);

/* ---- workspace memory (CUDA) ----
 * Optional: device memory for the workspaces, mapped compressible where the GPU has compute
 * data compression (H100 / H200; bl_workspace_compressible says whether `device` grants it).
 * The backward's fp32 dq accumulator is zeros written ahead of the main kernel and read back
 * after it; compressed, those bytes cost less DRAM traffic (bench/results/
 * bwd-s80-compressible-probe.txt). The signatures are PyTorch's pluggable-allocator ones
 * (torch.cuda.memory.CUDAPluggableAllocator), which the Python package uses through a
 * torch.cuda.MemPool; `stream` (a cudaStream_t) is not used. bl_workspace_alloc returns NULL
 * where it cannot allocate; bl_workspace_free waits for the device (as cudaFree does) and
 * releases a pointer bl_workspace_alloc returned. A build without CUDA returns NULL / 0. */
void *bl_workspace_alloc(size_t bytes, int device, void *stream);
void bl_workspace_free(void *ptr, size_t bytes, int device, void *stream);
int bl_workspace_compressible(int device);

/* ---- forward ----
 * q: (B, Sq, Hq, D), k: (B, Sk, Hk, D), v: (B, Sk, Hk, D), out: (B, Sq, Hq, D)
 * lse: (B, Hq, Sq) fp32 contiguous.
 * tile_mass: (B, Hq, Tm, Tn) fp32 contiguous, or NULL to record no statistics (zero overhead). */
bl_status bl_forward(const bl_attn_desc *desc, bl_tensor q, bl_tensor k, bl_tensor v,
                     bl_tensor out, float *lse, float *tile_mass);

/* ---- tile selection ----
 * tile_mass: (B, Hq, Tm, Tn) fp32 -> mask: (B, Hq, Tm, Tn) uint8.
 * For each (b, h, m) with total T = sum_n W > 0: p_n = W/T; order tiles by (p_n asc, n asc);
 * skip the longest prefix whose cumulative sum is < negl_prob (strictly); keep the rest.
 * Rows tiles with T == 0 keep nothing; a non-finite T (NaN/inf inputs) keeps every tile so that
 * NaN propagates into the gradients as in dense attention. negl_prob must be in [0, 1).
 * Sums are in double precision. On CUDA both pointers are device memory. */
bl_status bl_select_tiles(const bl_attn_desc *desc, const float *tile_mass, float negl_prob,
                          uint8_t *mask);

/* ---- backward ----
 * dout, out: (B, Sq, Hq, D); lse: (B, Hq, Sq) from the forward (or a global one, for ring
 * attention); dq: (B, Sq, Hq, D), dk, dv: (B, Sk, Hk, D), overwritten (GQA: summed over the
 * query heads of each group).
 * Tiles to compute, exactly one of:
 *   mask != NULL                  explicit block mask (B, Hq, Tm, Tn) uint8;
 *   mask == NULL, negl_prob > 0   selection from tile_mass (B, Hq, Tm, Tn) as bl_select_tiles;
 *   mask == NULL, negl_prob == 0  dense backward (tile_mass ignored, may be NULL).
 * Tiles without any allowed key (causal) are never computed, whatever the mask says. */
bl_status bl_backward(const bl_attn_desc *desc, bl_tensor q, bl_tensor k, bl_tensor v,
                      bl_tensor out, bl_tensor dout, const float *lse,
                      const float *tile_mass, float negl_prob, const uint8_t *mask,
                      bl_tensor dq, bl_tensor dk, bl_tensor dv);

#ifdef __cplusplus
}
#endif

#endif /* BACKLITE_H */
