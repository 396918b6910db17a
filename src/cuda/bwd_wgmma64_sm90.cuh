// bwd_wgmma64_sm90.cuh -- backward main kernel for head dim 64, variant 2 (compile-time switch
// -DBL_BWD_D64_V2; the shipped default stays bwd_wgmma_kernel<T, 64>).
//
// Why a separate D = 64 kernel: version 3's dQ = dS K at D = 64 splits the 128 keys between the
// two warpgroups, so both warpgroups add a full 64 x 64 fp32 partial into the same dq rows: 8192
// floats of global reductions per 64 x 128 tile. At D = 128 the same kernel adds 8192 floats per
// tile for twice the FLOPs, and both head dims run at about the same time per tile (~4 us/SM),
// which points at the L2 reduction stream, not the tensor cores, as what bounds a tile.
//
// Change against version 3 (everything else -- CTA per (b, kv head, 128 keys), list walk, S^T /
// dP^T / dV / dK products, masking, dS, epilogue -- is the same work in the same order):
//   dQ^T (64 d x 32 queries) = K^T dS^T   per warpgroup, over all 128 keys,
//     warpgroup wg takes queries 32wg..32wg+31 (N split), so each dq element is added once:
//     4096 floats of reductions per tile, half of version 3's, the same share per FLOP as D=128.
//   A = K^T: the K tile (keys x d, one 64-column panel) read as an MN-major A (transposed; the
//     same descriptor version 3 uses for K as the MN-major B of its D = 128 dQ).
//   B = dS^T: the dS tile (queries x keys, K-major over keys) read as a K-major B; the N split
//     moves the start by 32 rows = 4096 bytes, a whole number of 1024-byte swizzle periods.
// The dq reductions become float2 (a lane-pair shuffle makes two consecutive d of one query).
// Two instances (DEFER_DQ): the reductions right after each tile's dQ^T, or deferred into the
// next iteration behind its first products.
#pragma once
#include "bwd_wgmma_sm90.cuh"

namespace bl_bwd {

constexpr int D64 = 64;
constexpr int DQ_WG_QUERIES = BM / 2;  // queries of the dQ^T product per warpgroup: 32

// d[16] += A(smem, MN-major: transposed) * B(smem, K-major); m64n32k16.
#define BL_WGMMA_TN_N32(TY)                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                  \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                       \
                 " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"     \
                 ", %16, %17, p, 1, 1, 1, 0;\n}\n"                                             \
                 : BL_F8(d, 0), BL_F8(d, 8)                                                    \
                 : "l"(da), "l"(db), "r"(1))
template <typename T>
static __device__ __forceinline__ void bl_wgmma_tn_n32(float (&d)[16], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void bl_wgmma_tn_n32<__nv_bfloat16>(float (&d)[16], uint64_t da,
                                                                uint64_t db) {
    BL_WGMMA_TN_N32("bf16");
}
template <>
__device__ __forceinline__ void bl_wgmma_tn_n32<__half>(float (&d)[16], uint64_t da,
                                                         uint64_t db) {
    BL_WGMMA_TN_N32("f16");
}

// One warpgroup's dQ^T accumulator (64 d x 32 queries of one list entry) as the float2 values
// its thread adds into the fp32 dq accumulator. Accumulator (d row, query column): d =
// 16*(warp%4) + lg + 8*(x>>1), query = 32wg + 8t + 2lt + (x&1). Lanes lg and lg^1 (lane ^ 4)
// hold d and d+1: the even one keeps query 8t+2lt and takes its partner's value of that query,
// the odd one keeps query 8t+2lt+1 -- each then holds two consecutive d of one query.
// v[2t + dh]: query 32wg + 8t + 2lt + (lg&1), d = 16*(warp%4) + (lg&~1) + 8dh (+1).
// Every lane of the warp must call it (shuffles).
constexpr int DQ_VALS = DQ_WG_QUERIES / 8 * 2;  // float2 values per thread: 8
__device__ __forceinline__ void wg64_pair_dq(const float (&dq)[16], float2 (&v)[DQ_VALS],
                                             int lg) {
    const bool odd = lg & 1;
#pragma unroll
    for (int t = 0; t < DQ_WG_QUERIES / 8; ++t)
#pragma unroll
        for (int dh = 0; dh < 2; ++dh) {
            const float mine_q0 = dq[4 * t + 2 * dh + 0];  // query 8t+2lt
            const float mine_q1 = dq[4 * t + 2 * dh + 1];  // query 8t+2lt+1
            const float got = __shfl_xor_sync(0xffffffffu, odd ? mine_q0 : mine_q1, 4);
            v[2 * t + dh] = odd ? make_float2(got, mine_q1) : make_float2(mine_q0, got);
        }
}
// The reductions of wg64_pair_dq's values for list entry (b, h, row tile at row0).
__device__ __forceinline__ void wg64_add_dq(const bwd_params &p, const float2 (&v)[DQ_VALS],
                                            int64_t b, int64_t h, int64_t row0, int wg, int warp,
                                            int lg, int lt) {
    constexpr int D = D64;
    const bl_bwd_dims &dm = p.dm;
    const int d0 = 16 * (warp & 3) + (lg & ~1);
    const int64_t i0 = row0 + wg * DQ_WG_QUERIES + 2 * lt + (lg & 1);  // this thread's t = 0 query
    const int64_t row_stride = dm.heads_q * D;                           // floats between queries
    float *dst = p.dq_accum + ((b * dm.seqlen_q + i0) * dm.heads_q + h) * D + d0;
#pragma unroll
    for (int t = 0; t < DQ_WG_QUERIES / 8; ++t)
        if (i0 + 8 * t < dm.seqlen_q)
#pragma unroll
            for (int dh = 0; dh < 2; ++dh)
                atomicAdd(reinterpret_cast<float2 *>(dst + 8 * t * row_stride + 8 * dh),
                          v[2 * t + dh]);
}

// DEFER_DQ: the dq reductions of list entry it are issued in iteration it+1, right after its
// S^T / dP^T products, so they leave the SM while the tensor cores work instead of between the
// last product of a tile and the barrier in front of the next one.
template <typename T, bool DEFER_DQ>
__global__ void __launch_bounds__(THREADS, 1) bwd_wgmma64_kernel(const bwd_params p) {
    constexpr int D = D64;
    using L = wg_smem<D>;
    constexpr int ROW_CHUNKS = D / CHUNK;
    constexpr int NQ = BM / 8;   // n8 tiles of queries (S^T, dP^T): 8
    constexpr int ND = D / 8;    // n8 tiles of head dim (dK, dV): 8
    constexpr int KSTEPS_D = D / 16;
    constexpr int NQ_DQ = DQ_WG_QUERIES / 8;           // n8 tiles of the dQ^T accumulator: 4
    constexpr uint32_t QPANEL = BM * PANEL_ROW_BYTES;  // bytes of one panel of a Q / dO / dS tile
    constexpr uint32_t KPANEL = BN * PANEL_ROW_BYTES;  // bytes of one panel of a K / V tile
    static_assert(D == PANEL_COLS, "K is one panel wide: dQ^T's M is all of d");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + L::BASE_ALIGN - 1) &
        ~(uintptr_t)(L::BASE_ALIGN - 1));
    const uint32_t s0 = bl_smem_addr(smem_base);
    float *s_rows = reinterpret_cast<float *>(smem_base + L::ROWS);

    const bl_bwd_dims &dm = p.dm;
    const int64_t col = p.schedule[blockIdx.x];
    const int64_t n = col % dm.tiles_n;
    const int64_t g = (col / dm.tiles_n) % dm.heads_k;
    const int64_t b = col / (dm.tiles_n * dm.heads_k);
    const int count = p.counts[col];
    const int *list = p.lists + col * (dm.group * dm.tiles_m);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wg = warp >> 2;                 // warpgroup: keys 64wg..64wg+63
    const int lg = lane >> 2, lt = lane & 3;  // accumulator row group / thread in group
    const int64_t key0 = n * BN;
    const int kw = warp * KEYS_PER_WARP;      // this warp's first key (its 16 accumulator rows)

    float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
    for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;

    int e_cur = 0, e_next = 0;
    if (count > 0) {
        const T *kp = static_cast<const T *>(p.k);
        const T *vp = static_cast<const T *>(p.v);
        for (int c = threadIdx.x; c < BN * ROW_CHUNKS; c += THREADS) {
            const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
            const int64_t j = key0 + r;
            const bool valid = j < dm.seqlen_k;
            const int64_t jj = valid ? j : 0;
            const uint32_t off = panel_offset<BN>(r, ch);
            bl_cp_async16(s0 + L::K + off, kp + b * p.k_sb + jj * p.k_ss + g * p.k_sh + ch * CHUNK,
                          valid);
            bl_cp_async16(s0 + L::V + off, vp + b * p.v_sb + jj * p.v_ss + g * p.v_sh + ch * CHUNK,
                          valid);
        }
        e_cur = list[0];
        e_next = count > 1 ? list[1] : 0;
        wg_load_row_tile<T, D>(p, s0, s_rows, 0, b, g * dm.group + e_cur / dm.tiles_m,
                               e_cur % dm.tiles_m);
    }
    bl_cp_async_commit();

    // dS as the K-major B operand of dQ^T: element (query i, key j) of the BM x BN tile.
    unsigned char *sds = smem_base + L::DS;
    // DEFER_DQ: the previous entry's dq values (paired, so no longer wgmma registers: reading
    // them while the next products run needs no wait) and where they go.
    float2 dq_prev[DQ_VALS];
#pragma unroll
    for (int x = 0; x < DQ_VALS; ++x) dq_prev[x] = make_float2(0.0f, 0.0f);
    int64_t h_prev = 0, row0_prev = 0;

    for (int it = 0; it < count; ++it) {
        const int buf = it & 1;
        const int64_t hl = e_cur / dm.tiles_m, m = e_cur % dm.tiles_m;
        const int64_t h = g * dm.group + hl;
        bl_cp_async_wait<0>();
        bl_fence_proxy_async();  // cp.async wrote what wgmma reads next
        // This tile has landed for every thread and every warp is done with iteration it-1:
        // Q / dO buffer buf^1 and the dS tile are free.
        __syncthreads();
        if (it + 1 < count) {
            wg_load_row_tile<T, D>(p, s0, s_rows, buf ^ 1, b, g * dm.group + e_next / dm.tiles_m,
                                   e_next % dm.tiles_m);
            bl_cp_async_commit();
        }
        e_cur = e_next;
        e_next = it + 2 < count ? list[it + 2] : 0;

        const uint32_t sQ = s0 + L::Q + buf * (BM * D * 2);
        const uint32_t sdO = s0 + L::DO + buf * (BM * D * 2);
        const float *lse2 = s_rows + buf * BM;
        const float *dlt = s_rows + (2 + buf) * BM;

        // ---- S^T = K Q^T and dP^T = V dO^T (this warpgroup's 64 keys x 64 queries) ----
        float s[NQ * 4], ds[NQ * 4];
#pragma unroll
        for (int x = 0; x < NQ * 4; ++x) s[x] = ds[x] = 0.0f;
        // The zeros must be in the registers before the fence (else ptxas serializes).
        bl_reg_fence(s);
        bl_reg_fence(ds);
        bl_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk)
            bl_wgmma_ss_n64<T, 0>(
                s,
                bl_wgmma_desc(s0 + L::K + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR,
                              16, BL_WGMMA_GROUP_BYTES),
                bl_wgmma_desc(sQ + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk)
            bl_wgmma_ss_n64<T, 0>(
                ds,
                bl_wgmma_desc(s0 + L::V + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR,
                              16, BL_WGMMA_GROUP_BYTES),
                bl_wgmma_desc(sdO + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        if (DEFER_DQ && it > 0) wg64_add_dq(p, dq_prev, b, h_prev, row0_prev, wg, warp, lg, lt);
        bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
        bl_reg_fence(s);

        // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
        const int64_t row0 = m * BM;
        const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag
        const bool need_mask = key0 + BN > dm.seqlen_k ||
                               (p.causal && key0 + BN - 1 > row0 + diag);
        const int64_t key_room = dm.seqlen_k - key0;
        const int key_limit = key_room < BN ? (int)key_room : BN;
        int64_t causal_room = row0 + diag - key0;
        causal_room = causal_room > 2 * BN ? 2 * BN : causal_room;
        causal_room = causal_room < -2 * BN ? -2 * BN : causal_room;
        const int causal_limit = p.causal ? (int)causal_room : 2 * BN;
#pragma unroll
        for (int t = 0; t < NQ; ++t) {
            const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
            s[4 * t + 0] = exp2f(fmaf(s[4 * t + 0], p.scale_log2, -l.x));
            s[4 * t + 1] = exp2f(fmaf(s[4 * t + 1], p.scale_log2, -l.y));
            s[4 * t + 2] = exp2f(fmaf(s[4 * t + 2], p.scale_log2, -l.x));
            s[4 * t + 3] = exp2f(fmaf(s[4 * t + 3], p.scale_log2, -l.y));
            if (need_mask) {
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int jr = kw + lg + ((x >> 1) << 3);  // key, relative to key0
                    const int ir = 8 * t + 2 * lt + (x & 1);   // query, relative to row0
                    if (jr >= key_limit || jr - ir > causal_limit) s[4 * t + x] = 0.0f;
                }
            }
        }

        // ---- dV += P^T dO (P^T from registers) ----
        uint32_t pa[BM / 16][4];
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks) {
            pa[ks][0] = bl_pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
            pa[ks][1] = bl_pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
            pa[ks][2] = bl_pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
            pa[ks][3] = bl_pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
        }
        bl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks)
            bl_wgmma_rs<T, D>(dv_acc, pa[ks],
                              bl_wgmma_desc(sdO + ks * K16_BYTES_MNMAJOR, QPANEL,
                                            BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        bl_wgmma_wait<1>();  // dP^T is done; dV may still run
        bl_reg_fence(ds);

        // ---- dS^T = P^T * (dP^T - Dlt) ----
#pragma unroll
        for (int t = 0; t < NQ; ++t) {
            const float2 dd = *reinterpret_cast<const float2 *>(dlt + 8 * t + 2 * lt);
            ds[4 * t + 0] = s[4 * t + 0] * (ds[4 * t + 0] - dd.x);
            ds[4 * t + 1] = s[4 * t + 1] * (ds[4 * t + 1] - dd.y);
            ds[4 * t + 2] = s[4 * t + 2] * (ds[4 * t + 2] - dd.x);
            ds[4 * t + 3] = s[4 * t + 3] * (ds[4 * t + 3] - dd.y);
        }
        uint32_t dsa[BM / 16][4];
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks) {
            dsa[ks][0] = bl_pack2<T>(ds[8 * ks + 0], ds[8 * ks + 1]);
            dsa[ks][1] = bl_pack2<T>(ds[8 * ks + 2], ds[8 * ks + 3]);
            dsa[ks][2] = bl_pack2<T>(ds[8 * ks + 4], ds[8 * ks + 5]);
            dsa[ks][3] = bl_pack2<T>(ds[8 * ks + 6], ds[8 * ks + 7]);
        }
        bl_wgmma_wait<0>();  // dV is done: P's registers may be reused
        bl_reg_fence(pa);

        // ---- dK += dS^T Q (registers), and dS to shared memory for dQ^T ----
        bl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks)
            bl_wgmma_rs<T, D>(dk_acc, dsa[ks],
                              bl_wgmma_desc(sQ + ks * K16_BYTES_MNMAJOR, QPANEL,
                                            BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        {
            // dS (query i, key j) at panel j/64 (= wg), row i, chunk (j%64)/8 ^ (i%8), lane j%8.
            // This thread's keys: kw + lg (+8); queries 8t + 2lt (+1). The packed registers hold
            // the same rounded values the dK product uses.
            const int jj = (kw % WG_KEYS) + lg;
            unsigned char *panel = sds + wg * QPANEL;
#pragma unroll
            for (int t = 0; t < NQ; ++t)
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int j = jj + ((x >> 1) << 3);
                    const int i = 8 * t + 2 * lt + (x & 1);
                    const uint32_t off = (uint32_t)i * PANEL_ROW_BYTES +
                                         (uint32_t)((((j >> 3) ^ (i & 7)) << 4) + (j & 7) * 2);
                    *reinterpret_cast<T *>(panel + off) = bl_from_float<T>(ds[4 * t + x]);
                }
        }
        bl_fence_proxy_async();  // the dS stores are read by wgmma next
        __syncthreads();         // every warp's dS is in shared memory

        // ---- dQ^T (64 d x 32 queries) = K^T dS^T over all 128 keys; fp32 reductions ----
        float dq[NQ_DQ * 4];
#pragma unroll
        for (int x = 0; x < NQ_DQ * 4; ++x) dq[x] = 0.0f;
        bl_reg_fence(dq);
        bl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks)
            bl_wgmma_tn_n32<T>(
                dq,
                // A = K^T: 16 keys per step, MN-major (d contiguous), one panel of BN rows.
                bl_wgmma_desc(s0 + L::K + ks * K16_BYTES_MNMAJOR, KPANEL, BL_WGMMA_GROUP_BYTES),
                // B = dS^T: this warpgroup's 32 query rows of the dS tile, K-major over keys.
                bl_wgmma_desc(s0 + L::DS + (ks / 4) * QPANEL + (ks % 4) * K16_BYTES_KMAJOR +
                                  wg * DQ_WG_QUERIES * PANEL_ROW_BYTES,
                              16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        bl_wgmma_wait<0>();  // dK and dQ^T are done
        bl_reg_fence(dq);
        bl_reg_fence(dsa);
        wg64_pair_dq(dq, dq_prev, lg);
        h_prev = h;
        row0_prev = row0;
        if (!DEFER_DQ) wg64_add_dq(p, dq_prev, b, h_prev, row0_prev, wg, warp, lg, lt);
    }
    if (DEFER_DQ && count > 0)  // the last entry's
        wg64_add_dq(p, dq_prev, b, h_prev, row0_prev, wg, warp, lg, lt);
    bl_reg_fence(dk_acc);
    bl_reg_fence(dv_acc);

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
                *reinterpret_cast<uint32_t *>(dk_row + 8 * t) =
                    bl_pack2<T>(dk_acc[4 * t + 2 * half] * p.scale,
                                dk_acc[4 * t + 2 * half + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(dv_row + 8 * t) =
                    bl_pack2<T>(dv_acc[4 * t + 2 * half], dv_acc[4 * t + 2 * half + 1]);
            }
        }
    }
}

}  // namespace bl_bwd
