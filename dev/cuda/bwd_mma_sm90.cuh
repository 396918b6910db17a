// bwd_mma_sm90.cuh -- backward main kernel, version 2: warp-level tensor cores (mma.sync
// m16n8k16 + ldmatrix) from XOR-swizzled shared memory. Each warp owns 16 keys of the CTA's 128
// and keeps their dK / dV in registers; dS^T goes through shared memory for dQ. Kept as the
// reference variant beside the wgmma kernel (bwd_wgmma_sm90.cuh). Included by attn_bwd_sm90.cu.
#pragma once
#include "bwd_kernel_common.cuh"
#include "bwd_ptx.cuh"

namespace bl_bwd {

// Element offset of (row, chunk) in a row-major tile of `row_chunks` 16-byte chunks per row,
// chunk index XORed with the row's low 3 bits: the 8 rows an ldmatrix phase reads hit 8 distinct
// bank groups.
template <int ROW_CHUNKS>
__device__ __forceinline__ int swz(int row, int chunk) {
    static_assert(ROW_CHUNKS >= 8, "swizzle needs at least 8 chunks per row");
    return row * ROW_CHUNKS * CHUNK + ((chunk ^ (row & 7)) * CHUNK);
}

template <int D>
struct smem_layout {
    static constexpr int K = 0;
    static constexpr int V = K + BN * D;
    static constexpr int Q = V + BN * D;        // two buffers of BM x D
    static constexpr int DO = Q + 2 * BM * D;   // two buffers of BM x D
    static constexpr int DS = DO + 2 * BM * D;  // two buffers of BN x BM: dS^T
    static constexpr int HALF_ELEMS = DS + 2 * BN * BM;
    // then fp32: lse_log2[2][BM], dlt[2][BM]
    static constexpr size_t USED = (size_t)HALF_ELEMS * 2 + 4 * BM * sizeof(float);
    // The kernel rounds its base up to BASE_ALIGN so that every tile starts on a 256-byte
    // boundary and the swizzled chunk bits of an address can be flipped with an XOR immediate.
    static constexpr size_t BASE_ALIGN = 1024;
    static constexpr size_t BYTES = USED + BASE_ALIGN;
};

// Issues the cp.async loads of list entry (h, m) into buffer `buf`: Q and dO rows (zero past Sq),
// and the padded per-row lse_log2 / Dlt.
template <typename T, int D>
__device__ __forceinline__ void load_row_tile(const bwd_params &p, T *smem, float *s_rows,
                                              int buf, int64_t b, int64_t h, int64_t m) {
    using L = smem_layout<D>;
    constexpr int ROW_CHUNKS = D / CHUNK;
    const T *q = static_cast<const T *>(p.q);
    const T *dout = static_cast<const T *>(p.dout);
    const int64_t row0 = m * BM;
    T *sq = smem + L::Q + buf * BM * D;
    T *sdo = smem + L::DO + buf * BM * D;
#pragma unroll
    for (int c = threadIdx.x; c < BM * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
        const int64_t i = row0 + r;
        const bool valid = i < p.dm.seqlen_q;
        const int64_t ii = valid ? i : 0;
        bl_cp_async16(bl_smem_addr(sq + swz<ROW_CHUNKS>(r, ch)),
                      q + b * p.q_sb + ii * p.q_ss + h * p.q_sh + ch * CHUNK, valid);
        bl_cp_async16(bl_smem_addr(sdo + swz<ROW_CHUNKS>(r, ch)),
                      dout + b * p.do_sb + ii * p.do_ss + h * p.do_sh + ch * CHUNK, valid);
    }
    constexpr int ROW_VEC = BM / 4;  // 16-byte vectors of fp32 per row tile
    if (threadIdx.x < 2 * ROW_VEC) {
        const int which = threadIdx.x / ROW_VEC, c = threadIdx.x % ROW_VEC;
        const float *src = (which == 0 ? p.lse_log2 : p.dlt) +
                           (b * p.dm.heads_q + h) * p.dm.seqlen_q_pad + row0 + 4 * c;
        float *dst = s_rows + (which * 2 + buf) * BM + 4 * c;
        bl_cp_async16(bl_smem_addr(dst), src, true);
    }
}

// Shared-memory addressing. A lane's ldmatrix row address is `base + row * row_bytes +
// (chunk ^ (row & 7)) * 16`. Every row offset the loops add is a multiple of 8 rows, so row & 7
// is the lane's own, and the loop's chunk bits never overlap the lane's: the address of step k is
// (lane base) ^ (k's chunk bits) + (k's row offset), all immediates but one register per operand.
constexpr uint32_t CHUNK_BYTES = 16;

template <typename T, int D>
__global__ void __launch_bounds__(THREADS, 1) bwd_mma_kernel(const bwd_params p) {
    using L = smem_layout<D>;
    constexpr int ROW_CHUNKS = D / CHUNK;   // chunks per K/V/Q/dO row
    constexpr int DS_CHUNKS = BM / CHUNK;   // chunks per dS^T row
    constexpr uint32_t RB = D * 2;          // bytes per K/V/Q/dO row
    constexpr uint32_t RB_DS = BM * 2;      // bytes per dS^T row
    constexpr int NQ = BM / 8;              // n8 tiles of queries per warp (S^T, dP^T)
    constexpr int ND = D / 8;               // n8 tiles of head dim (dK, dV)
    constexpr int NDQ = D / 2 / 8;          // n8 tiles of head dim per warp in dQ
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + L::BASE_ALIGN - 1) & ~(uintptr_t)(L::BASE_ALIGN - 1));
    T *smem = reinterpret_cast<T *>(smem_base);
    float *s_rows = reinterpret_cast<float *>(smem_base + (size_t)L::HALF_ELEMS * sizeof(T));
    // s_rows: [0..2*BM) lse_log2 for buffers 0/1, [2*BM..4*BM) dlt for buffers 0/1

    const bl_bwd_dims &dm = p.dm;
    const int64_t col = p.schedule[blockIdx.x];
    const int64_t n = col % dm.tiles_n;
    const int64_t g = (col / dm.tiles_n) % dm.heads_k;
    const int64_t b = col / (dm.tiles_n * dm.heads_k);
    const int count = p.counts[col];
    const int *list = p.lists + col * (dm.group * dm.tiles_m);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int lg = lane >> 2, lt = lane & 3;  // mma fragment row group / thread in group
    const int l7 = lane & 7;
    const int64_t key0 = n * BN;
    const int kw = warp * KEYS_PER_WARP;

    float dk_acc[ND][4], dv_acc[ND][4];
#pragma unroll
    for (int t = 0; t < ND; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[t][e] = dv_acc[t][e] = 0.0f;

    // List entries run one iteration ahead in registers, so no global load sits in front of a
    // prefetch.
    int e_cur = 0, e_next = 0;
    if (count > 0) {
        const T *kp = static_cast<const T *>(p.k);
        const T *vp = static_cast<const T *>(p.v);
        for (int c = threadIdx.x; c < BN * ROW_CHUNKS; c += THREADS) {
            const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
            const int64_t j = key0 + r;
            const bool valid = j < dm.seqlen_k;
            const int64_t jj = valid ? j : 0;
            bl_cp_async16(bl_smem_addr(smem + L::K + swz<ROW_CHUNKS>(r, ch)),
                          kp + b * p.k_sb + jj * p.k_ss + g * p.k_sh + ch * CHUNK, valid);
            bl_cp_async16(bl_smem_addr(smem + L::V + swz<ROW_CHUNKS>(r, ch)),
                          vp + b * p.v_sb + jj * p.v_ss + g * p.v_sh + ch * CHUNK, valid);
        }
        e_cur = list[0];
        e_next = count > 1 ? list[1] : 0;
        load_row_tile<T, D>(p, smem, s_rows, 0, b, g * dm.group + e_cur / dm.tiles_m,
                            e_cur % dm.tiles_m);
    }
    bl_cp_async_commit();

    const uint32_t s0 = bl_smem_addr(smem);
    // Per-lane operand bases (see "Shared-memory addressing").
    // A, non-transposed, from K / V rows kw + (lane & 15), chunk (lane >> 4):
    const uint32_t a_row = (uint32_t)(kw + (lane & 15)) * RB + (uint32_t)(((lane >> 4) ^ l7) * CHUNK_BYTES);
    const uint32_t aK = s0 + L::K * 2 + a_row, aV = s0 + L::V * 2 + a_row;
    // B, non-transposed, from Q / dO rows (lane & 7) + 8 * (lane >> 4), chunk (lane >> 3) & 1:
    const uint32_t b_row = (uint32_t)(l7 + ((lane >> 4) << 3)) * RB + (uint32_t)((((lane >> 3) & 1) ^ l7) * CHUNK_BYTES);
    // B, transposed, from Q / dO / K rows (lane & 7) + 8 * ((lane >> 3) & 1), chunk (lane >> 4):
    const uint32_t t_rowi = (uint32_t)(l7 + (((lane >> 3) & 1) << 3)) * RB;
    const uint32_t t_row = t_rowi + (uint32_t)(((lane >> 4) ^ l7) * CHUNK_BYTES);
    // dQ: this warp's 16 query rows and D/2 columns.
    const int qb = 16 * (warp & 3);
    const int dh = (warp >> 2) * (D / 2);
    const uint32_t tK = s0 + L::K * 2 + t_rowi + (uint32_t)((((dh / CHUNK) + (lane >> 4)) ^ l7) * CHUNK_BYTES);
    const uint32_t a_ds_row = (uint32_t)(l7 + ((lane >> 4) << 3)) * RB_DS +
                              (uint32_t)((((qb / CHUNK) + ((lane >> 3) & 1)) ^ l7) * CHUNK_BYTES);

    for (int it = 0; it < count; ++it) {
        const int buf = it & 1;
        const int64_t hl = e_cur / dm.tiles_m, m = e_cur % dm.tiles_m;
        const int64_t h = g * dm.group + hl;
        bl_cp_async_wait<0>();
        // This tile has landed for every thread, and every warp is done with iteration it-1:
        // buffer buf^1 and dS buffer buf (read two iterations ago) are free.
        __syncthreads();
        if (it + 1 < count) {
            load_row_tile<T, D>(p, smem, s_rows, buf ^ 1, b, g * dm.group + e_next / dm.tiles_m,
                                e_next % dm.tiles_m);
            bl_cp_async_commit();
        }
        e_cur = e_next;
        e_next = it + 2 < count ? list[it + 2] : 0;

        const uint32_t bQ = s0 + (L::Q + buf * BM * D) * 2 + b_row;
        const uint32_t bdO = s0 + (L::DO + buf * BM * D) * 2 + b_row;
        const uint32_t tQ = s0 + (L::Q + buf * BM * D) * 2 + t_row;
        const uint32_t tdO = s0 + (L::DO + buf * BM * D) * 2 + t_row;
        const float *lse2 = s_rows + buf * BM;
        const float *dlt = s_rows + (2 + buf) * BM;

        // ---- S^T = K Q^T (this warp's 16 keys x 64 queries) ----
        float s[NQ][4];
#pragma unroll
        for (int t = 0; t < NQ; ++t)
#pragma unroll
            for (int x = 0; x < 4; ++x) s[t][x] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            bl_ldmatrix_x4(a, aK ^ (kk * 2 * CHUNK_BYTES));
            const uint32_t bk = bQ ^ (kk * 2 * CHUNK_BYTES);
#pragma unroll
            for (int pq = 0; pq < NQ / 2; ++pq) {
                uint32_t bq[4];
                bl_ldmatrix_x4(bq, bk + pq * 16 * RB);
                bl_mma16816<T>(s[2 * pq], a, bq[0], bq[1]);
                bl_mma16816<T>(s[2 * pq + 1], a, bq[2], bq[3]);
            }
        }

        // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
        const int64_t row0 = m * BM;
        const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag
        const bool need_mask = key0 + BN > dm.seqlen_k ||
                               (p.causal && key0 + BN - 1 > row0 + diag);
        // In tile-relative 32-bit terms: key jr is valid iff jr < key_limit, and allowed iff
        // jr - ir <= causal_limit (clamped: the difference of relative indices is within +-BN).
        const int64_t key_room = dm.seqlen_k - key0;
        const int key_limit = key_room < BN ? (int)key_room : BN;
        int64_t causal_room = row0 + diag - key0;
        causal_room = causal_room > 2 * BN ? 2 * BN : causal_room;
        causal_room = causal_room < -2 * BN ? -2 * BN : causal_room;
        const int causal_limit = p.causal ? (int)causal_room : 2 * BN;
#pragma unroll
        for (int t = 0; t < NQ; ++t) {
            const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
            s[t][0] = exp2f(fmaf(s[t][0], p.scale_log2, -l.x));
            s[t][1] = exp2f(fmaf(s[t][1], p.scale_log2, -l.y));
            s[t][2] = exp2f(fmaf(s[t][2], p.scale_log2, -l.x));
            s[t][3] = exp2f(fmaf(s[t][3], p.scale_log2, -l.y));
            if (need_mask) {
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int jr = kw + lg + ((x >> 1) << 3);  // key, relative to key0
                    const int ir = 8 * t + 2 * lt + (x & 1);   // query, relative to row0
                    if (jr >= key_limit || jr - ir > causal_limit) s[t][x] = 0.0f;
                }
            }
        }

        // ---- dV += P^T dO ----
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks) {
            uint32_t a[4];
            a[0] = bl_pack2<T>(s[2 * ks][0], s[2 * ks][1]);
            a[1] = bl_pack2<T>(s[2 * ks][2], s[2 * ks][3]);
            a[2] = bl_pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]);
            a[3] = bl_pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
            for (int dp = 0; dp < ND / 2; ++dp) {
                uint32_t bb[4];
                bl_ldmatrix_x4_trans(bb, (tdO ^ (dp * 2 * CHUNK_BYTES)) + ks * 16 * RB);
                bl_mma16816<T>(dv_acc[2 * dp], a, bb[0], bb[1]);
                bl_mma16816<T>(dv_acc[2 * dp + 1], a, bb[2], bb[3]);
            }
        }

        // ---- dP^T = V dO^T, then dS^T = P^T * (dP^T - Dlt) in place of dP^T ----
        float ds[NQ][4];
#pragma unroll
        for (int t = 0; t < NQ; ++t)
#pragma unroll
            for (int x = 0; x < 4; ++x) ds[t][x] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            bl_ldmatrix_x4(a, aV ^ (kk * 2 * CHUNK_BYTES));
            const uint32_t bk = bdO ^ (kk * 2 * CHUNK_BYTES);
#pragma unroll
            for (int pq = 0; pq < NQ / 2; ++pq) {
                uint32_t bq[4];
                bl_ldmatrix_x4(bq, bk + pq * 16 * RB);
                bl_mma16816<T>(ds[2 * pq], a, bq[0], bq[1]);
                bl_mma16816<T>(ds[2 * pq + 1], a, bq[2], bq[3]);
            }
        }
#pragma unroll
        for (int t = 0; t < NQ; ++t) {
            const float2 dd = *reinterpret_cast<const float2 *>(dlt + 8 * t + 2 * lt);
            ds[t][0] = s[t][0] * (ds[t][0] - dd.x);
            ds[t][1] = s[t][1] * (ds[t][1] - dd.y);
            ds[t][2] = s[t][2] * (ds[t][2] - dd.x);
            ds[t][3] = s[t][3] * (ds[t][3] - dd.y);
        }

        // ---- dK += dS^T Q; dS^T to shared memory (buffer buf) for dQ ----
        T *sds_ptr = smem + L::DS + buf * BN * BM;
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks) {
            uint32_t a[4];
            a[0] = bl_pack2<T>(ds[2 * ks][0], ds[2 * ks][1]);
            a[1] = bl_pack2<T>(ds[2 * ks][2], ds[2 * ks][3]);
            a[2] = bl_pack2<T>(ds[2 * ks + 1][0], ds[2 * ks + 1][1]);
            a[3] = bl_pack2<T>(ds[2 * ks + 1][2], ds[2 * ks + 1][3]);
            const int r0 = kw + lg, r1 = r0 + 8;
            *reinterpret_cast<uint32_t *>(sds_ptr + swz<DS_CHUNKS>(r0, 2 * ks) + 2 * lt) = a[0];
            *reinterpret_cast<uint32_t *>(sds_ptr + swz<DS_CHUNKS>(r1, 2 * ks) + 2 * lt) = a[1];
            *reinterpret_cast<uint32_t *>(sds_ptr + swz<DS_CHUNKS>(r0, 2 * ks + 1) + 2 * lt) = a[2];
            *reinterpret_cast<uint32_t *>(sds_ptr + swz<DS_CHUNKS>(r1, 2 * ks + 1) + 2 * lt) = a[3];
#pragma unroll
            for (int dp = 0; dp < ND / 2; ++dp) {
                uint32_t bb[4];
                bl_ldmatrix_x4_trans(bb, (tQ ^ (dp * 2 * CHUNK_BYTES)) + ks * 16 * RB);
                bl_mma16816<T>(dk_acc[2 * dp], a, bb[0], bb[1]);
                bl_mma16816<T>(dk_acc[2 * dp + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads();  // every warp's dS^T is in shared memory

        // ---- dQ(64 x D) += dS K: warp -> 16 rows x D/2 columns; fp32 atomics ----
        {
            const uint32_t aS = s0 + (L::DS + buf * BN * BM) * 2 + a_ds_row;
            float dq[NDQ][4];
#pragma unroll
            for (int t = 0; t < NDQ; ++t)
#pragma unroll
                for (int x = 0; x < 4; ++x) dq[t][x] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks) {
                uint32_t a[4];
                bl_ldmatrix_x4_trans(a, aS + ks * 16 * RB_DS);
#pragma unroll
                for (int dp = 0; dp < NDQ / 2; ++dp) {
                    uint32_t bb[4];
                    bl_ldmatrix_x4_trans(bb, (tK ^ (dp * 2 * CHUNK_BYTES)) + ks * 16 * RB);
                    bl_mma16816<T>(dq[2 * dp], a, bb[0], bb[1]);
                    bl_mma16816<T>(dq[2 * dp + 1], a, bb[2], bb[3]);
                }
            }
            // Lane pairs (lt, lt^1) swap halves so each lane holds 4 consecutive columns of one
            // row: even lt -> row lg, columns 2lt..2lt+3; odd lt -> row lg+8, columns 2lt-2..2lt+1.
            // One 16-byte reduction instead of two 8-byte ones.
            const bool odd = lt & 1;
            const int64_t i = row0 + qb + lg + (odd ? 8 : 0);
            float *dst = p.dq_accum + ((b * dm.seqlen_q + i) * dm.heads_q + h) * D + dh +
                         2 * (lt & ~1);
#pragma unroll
            for (int t = 0; t < NDQ; ++t) {
                const float send0 = odd ? dq[t][0] : dq[t][2];
                const float send1 = odd ? dq[t][1] : dq[t][3];
                const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
                const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
                const float4 v = odd ? make_float4(got0, got1, dq[t][2], dq[t][3])
                                     : make_float4(dq[t][0], dq[t][1], got0, got1);
                if (i < dm.seqlen_q) atomicAdd(reinterpret_cast<float4 *>(dst + 8 * t), v);
            }
        }
    }

    // ---- epilogue: dK (times scale) and dV for this warp's 16 keys ----
    T *dk = static_cast<T *>(p.dk);
    T *dv = static_cast<T *>(p.dv);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int64_t j = key0 + kw + lg + 8 * half;
        if (j < dm.seqlen_k) {
            T *dk_row = dk + b * p.dk_sb + j * p.dk_ss + g * p.dk_sh + 2 * lt;
            T *dv_row = dv + b * p.dv_sb + j * p.dv_ss + g * p.dv_sh + 2 * lt;
#pragma unroll
            for (int t = 0; t < ND; ++t) {
                *reinterpret_cast<uint32_t *>(dk_row + 8 * t) = bl_pack2<T>(
                    dk_acc[t][2 * half] * p.scale, dk_acc[t][2 * half + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(dv_row + 8 * t) =
                    bl_pack2<T>(dv_acc[t][2 * half], dv_acc[t][2 * half + 1]);
            }
        }
    }
}

}  // namespace bl_bwd
