// bwd_wgmma_sm90.cuh -- backward main kernel, versions 3b, 4 and 6: warpgroup MMA (wgmma, sm_90a).
// Shipped: version 4 at head dim 128 where TMA cannot be used (with TMA the library runs version
// 8, bwd_ws128_sm90.cuh, built on version 6's math); versions 3b and 6 stay for the dev checker's
// comparisons (bench/notes-bwd.md has each version's measurements).
//
// Same work split as version 2 (bwd_mma_sm90.cuh) -- one CTA per (b, kv head, 128-key tile),
// 8 warps, dK / dV of the CTA's keys in registers for the whole list -- but each of the two
// warpgroups owns 64 keys and issues its products as wgmma, so the tensor cores read the
// shared-memory operands directly instead of every warp pulling them through ldmatrix (version
// 2 was bound by shared-memory bandwidth: ~730 KB of ldmatrix traffic per 64x128 tile).
// The wgmma accumulator of a warp is the m16n8k16 accumulator layout, n8 tile after n8 tile,
// and the register A operand is the m16n8k16 A fragment, so the math between the products is
// version 2's, on flat arrays.
//
// Products per list entry (warpgroup wg: keys 64wg..64wg+63; M = 64 always):
//   S^T  (64 keys x 64 queries) = K Q^T     SS, both K-major (reduction over d)
//   dP^T (64 x 64)              = V dO^T    SS, both K-major
//   dV  (64 keys x D)          += P^T dO    RS, dO MN-major (reduction over queries)
//   dK  (64 keys x D)          += dS^T Q    RS, Q MN-major
//   dQ  (64 queries x 64 d)     = dS K      SS, dS K-major over keys, K MN-major;
//        D = 128: warpgroup wg takes d columns 64wg..; D = 64: warpgroup wg takes keys 64wg..
//        (both then add into the same columns).
// Shared memory holds every tile as 128-byte swizzled panels (bwd_ptx.cuh).
#pragma once
#include "bwd_kernel_common.cuh"
#include <type_traits>
#include "bwd_ptx.cuh"
#include "ptx_sm90.cuh"

namespace bl_bwd {

constexpr uint32_t PANEL_ROW_BYTES = 128;   // one row of a 64-column panel
constexpr uint32_t K16_BYTES_KMAJOR = 32;   // a k16 step inside a K-major panel
constexpr uint32_t K16_BYTES_MNMAJOR = 16 * PANEL_ROW_BYTES;  // a k16 step of an MN-major operand
constexpr int PANEL_COLS = 64;
constexpr int WG_KEYS = 64;  // keys per warpgroup
// A list code hl * tiles_m + m -> (hl, m) (the head-dim-128 persistent kernels, ws_column,
// and the head-dim-64 one, wg64p_decode). Where the group is one query head (hl = 0) the code
// is m: no division. The integer division by tiles_m (a run-time value: ~25 instructions, and in
// the 24-register producer and reducer threads spills) ran four times an entry in the 80-row
// kernel's packed walks, twice in the producer and twice in the reducer, and cost those walks
// ~2 % a tile (~70-150 of ~4700 clocks an entry: `attn_bwd timeline80`,
// bench/results/bwd-s70-packed-producer.txt).
__device__ __forceinline__ void ws_split_code(int code, int tiles_m, bool one_head, int &hl,
                                              int &m) {
    if (one_head) {
        hl = 0, m = code;
        return;
    }
    // Groups of several heads: a float estimate of code / tiles_m and one correction step. The
    // estimate's relative error is below 2^-21 (the int -> float roundings and an approximate
    // reciprocal), so it is within 1 of the quotient while that is below 2^21 (hl < group, and
    // G*Tm < 2^19 wherever lists are made: the static_assert by LIST_BITS_MAX_BYTES).
    // Against the division: the packed walks' main kernel -1.0..-1.6 % at four query heads per
    // K / V head (bench/results/bwd-s71-gqa-split.txt); exact in a CPU emulation over 1.5e9 codes.
    const float est = __int2float_rn(code) * __fdividef(1.0f, __int2float_rn(tiles_m));
    hl = __float2int_rz(est);
    m = code - hl * tiles_m;
    if (m < 0) {
        --hl, m += tiles_m;
    } else if (m >= tiles_m) {
        ++hl, m -= tiles_m;
    }
}
// The row tile m of a list code.
__device__ __forceinline__ int ws_code_row_tile(int code, int tiles_m, bool one_head) {
    int hl, m;
    ws_split_code(code, tiles_m, one_head, hl, m);
    return m;
}

// dQ staging for the TMA reduce-adds: a warp's 16 x 64 fp32 block as two boxes of 16 rows x 32
// columns (128 bytes: the 128B swizzle's row), the box of the p.tm_dq tensor map.
constexpr uint32_t DQ_BOX_ROWS = 16, DQ_BOX_COLS = 32;
constexpr uint32_t DQ_BOX_BYTES = DQ_BOX_ROWS * DQ_BOX_COLS * sizeof(float);
constexpr uint32_t DQ_WARP_BYTES = 2 * DQ_BOX_BYTES;

// Byte offsets from the kernel's 1024-aligned shared-memory base.
template <int D>
struct wg_smem {
    static constexpr uint32_t K = 0;                          // BN x D: D/64 panels of BN rows
    static constexpr uint32_t V = K + BN * D * 2;             // BN x D
    static constexpr uint32_t Q = V + BN * D * 2;             // 2 buffers of BM x D
    static constexpr uint32_t DO = Q + 2 * BM * D * 2;        // 2 buffers of BM x D
    static constexpr uint32_t DS = DO + 2 * BM * D * 2;       // BM x BN: dS, 2 panels of BM rows
    static constexpr uint32_t ROWS = DS + BM * BN * 2;        // fp32 lse_log2[2][BM], dlt[2][BM]
    static constexpr uint32_t BARS = ROWS + 4 * BM * sizeof(float);  // 2 mbarriers (TMA rows)
    // Version 6: fp32 dQ staging for the TMA reduce-adds, 2 buffers x 8 warps.
    static constexpr uint32_t DQS = (BARS + 2 * 8 + 1023) / 1024 * 1024;
    static constexpr uint32_t USED = DQS + 2 * WARPS * DQ_WARP_BYTES;
    static constexpr uint32_t BASE_ALIGN = 1024;              // the 128B swizzle period
    static constexpr size_t BYTES = USED + BASE_ALIGN;
    static_assert(K % 1024 == 0 && V % 1024 == 0 && Q % 1024 == 0 && DO % 1024 == 0 &&
                      DS % 1024 == 0,
                  "panels must start on 1024-byte boundaries");
};

// Byte offset of 16-byte chunk `chunk` (of D/8) of row `row` in a ROWS-row panel tile.
template <int ROWS>
__device__ __forceinline__ uint32_t panel_offset(int row, int chunk) {
    return (uint32_t)(chunk >> 3) * (ROWS * PANEL_ROW_BYTES) + (uint32_t)row * PANEL_ROW_BYTES +
           (uint32_t)(((chunk & 7) ^ (row & 7)) << 4);
}

// cp.async of the CTA's K and V tiles (keys key0.., kv head g, batch b) as BN-row panels at sK /
// sV, zero past Sk; thread `tid` of THREADS issues every THREADS-th 16-byte chunk. One commit
// group, committed by the caller.
template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(const bwd_params &p, uint32_t sK, uint32_t sV,
                                             int64_t b, int64_t g, int64_t key0, int tid) {
    constexpr int ROW_CHUNKS = D / CHUNK;
    const T *kp = static_cast<const T *>(p.k);
    const T *vp = static_cast<const T *>(p.v);
    for (int c = tid; c < BN * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
        const int64_t j = key0 + r;
        const bool valid = j < p.dm.seqlen_k;
        const int64_t jj = valid ? j : 0;
        const uint32_t off = panel_offset<BN>(r, ch);
        bl_cp_async16(sK + off, kp + b * p.k_sb + jj * p.k_ss + g * p.k_sh + ch * CHUNK, valid);
        bl_cp_async16(sV + off, vp + b * p.v_sb + jj * p.v_ss + g * p.v_sh + ch * CHUNK, valid);
    }
}

// cp.async of list entry (h, m) into buffer `buf`: Q and dO rows as panels (zero past Sq) and
// the padded per-row lse_log2 / Dlt.
template <typename T, int D>
__device__ __forceinline__ void wg_load_row_tile(const bwd_params &p, uint32_t s0, float *s_rows,
                                                 int buf, int64_t b, int64_t h, int64_t m) {
    using L = wg_smem<D>;
    constexpr int ROW_CHUNKS = D / CHUNK;
    const T *q = static_cast<const T *>(p.q);
    const T *dout = static_cast<const T *>(p.dout);
    const int64_t row0 = m * BM;
    const uint32_t sq = s0 + L::Q + buf * (BM * D * 2);
    const uint32_t sdo = s0 + L::DO + buf * (BM * D * 2);
#pragma unroll
    for (int c = threadIdx.x; c < BM * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
        const int64_t i = row0 + r;
        const bool valid = i < p.dm.seqlen_q;
        const int64_t ii = valid ? i : 0;
        const uint32_t off = panel_offset<BM>(r, ch);
        bl_cp_async16(sq + off, q + b * p.q_sb + ii * p.q_ss + h * p.q_sh + ch * CHUNK, valid);
        bl_cp_async16(sdo + off, dout + b * p.do_sb + ii * p.do_ss + h * p.do_sh + ch * CHUNK,
                      valid);
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

// Version 6 (TMA_ROWS): one thread loads each row tile with TMA -- Q and dO as D/64 swizzled
// panels each, lse_log2 / Dlt as two bulk copies -- completing on the buffer's mbarrier, instead
// of every thread issuing ~20 cp.async and their address math per entry (those cost ~11 % of
// version 4: bench/results/bwd128-ablation-2026-11-29.txt). Its dQ goes out as TMA reduce-adds
// too (see the dQ step). ARRIVE = false: the bytes are announced without the arrive, which the
// caller makes once it has written what else the entry's consumers read (version 10's
// per-entry dQ flag).
template <int D, bool ARRIVE = true>
__device__ __forceinline__ void wg_tma_row_tile(const bwd_params &p, uint32_t s0, int buf,
                                                int64_t b, int64_t h, int64_t m) {
    using L = wg_smem<D>;
    constexpr uint32_t TILE_BYTES = BM * D * 2;              // one Q or dO buffer
    constexpr uint32_t PANEL_BYTES = BM * PANEL_ROW_BYTES;   // 64 columns of it
    constexpr uint32_t ROW_BYTES = BM * sizeof(float);       // lse_log2 or Dlt of the tile
    const uint32_t bar = s0 + L::BARS + 8 * buf;
    if (ARRIVE)
        mbarrier_arrive_expect_tx(bar, 2 * TILE_BYTES + 2 * ROW_BYTES);
    else
        mbarrier_expect_tx(bar, 2 * TILE_BYTES + 2 * ROW_BYTES);
    const int row0 = (int)(m * BM);
#pragma unroll
    for (int panel = 0; panel < D / PANEL_COLS; ++panel) {
        tma_load_4d(s0 + L::Q + buf * TILE_BYTES + panel * PANEL_BYTES, &p.tm_q, bar,
                    panel * PANEL_COLS, row0, (int)h, (int)b);
        tma_load_4d(s0 + L::DO + buf * TILE_BYTES + panel * PANEL_BYTES, &p.tm_do, bar,
                    panel * PANEL_COLS, row0, (int)h, (int)b);
    }
    const int64_t rows = (b * p.dm.heads_q + h) * p.dm.seqlen_q_pad + row0;
    bulk_load(s0 + L::ROWS + buf * ROW_BYTES, p.lse_log2 + rows, ROW_BYTES, bar);
    bulk_load(s0 + L::ROWS + (2 + buf) * ROW_BYTES, p.dlt + rows, ROW_BYTES, bar);
}

// A warp's dQ block -- rows 16(warp % 4) + lg (+8), columns 8t + 2lt (+1) of the accumulator
// fragment dq[32], t = 0..7 -- staged at sdq (DQ_WARP_BYTES, 1024-aligned) as two 128B-swizzled
// boxes of 16 rows x 32 columns, the boxes of the p.tm_dq tensor map, with the columns of every
// 8-column group stored even ones first (0 2 4 6 1 3 5 7: DQ_COLS_PERMUTED, undone by the dq
// postprocess). In that order each fp32 fragment register is one 32-bit word of an 8 x 4-word
// matrix, so the block goes out as 8 stmatrix.x4 per thread instead of 16 64-bit stores
// (the staging cost 12 % of version 8's time: bench/results/bwd128-v8-ablation.txt). The
// caller makes sure no reduce-add still reads sdq. FENCE = false leaves the proxy fence that
// must come before the copy engine reads the block (and the __syncwarp) to the caller.
template <bool FENCE = true>
__device__ __forceinline__ void dq_block_stage(uint32_t sdq, const float (&dq)[32]) {
    const int lane = threadIdx.x & 31;
    // Matrix i = lane / 8 of each stmatrix: rows 8(i / 2) + 0..7 of the block, odd columns if
    // i is odd, i.e. register dq[4t + i]; this lane addresses its row r = lane % 8.
    const int i = lane >> 3, r = lane & 7;
    const uint32_t row_base = sdq + (uint32_t)(8 * (i >> 1) + r) * PANEL_ROW_BYTES;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        // n8 tile t: box t / 4, 16-byte chunk 2(t % 4) (+1 for the odd columns), swizzled by row.
        const uint32_t chunk = (uint32_t)(2 * (t & 3) + (i & 1)) ^ (uint32_t)r;
        bl_stmatrix_x4(row_base + (t >> 2) * DQ_BOX_BYTES + (chunk << 4),
                       __float_as_uint(dq[4 * t + 0]), __float_as_uint(dq[4 * t + 1]),
                       __float_as_uint(dq[4 * t + 2]), __float_as_uint(dq[4 * t + 3]));
    }
    if (FENCE) {
        bl_fence_proxy_async();  // the copy engine reads what the stores wrote
        __syncwarp();
    }
}

// The m16n8k16 A fragments of KS k16 steps from an fp32 accumulator fragment whose n8 tiles
// 2ks, 2ks + 1 make step ks (P^T or dS^T of the backward as the register operand of dV / dK).
template <typename T, int KS>
__device__ __forceinline__ void pack_a_fragments(uint32_t (&a)[KS][4], const float (&x)[KS * 8]) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        a[ks][0] = bl_pack2<T>(x[8 * ks + 0], x[8 * ks + 1]);
        a[ks][1] = bl_pack2<T>(x[8 * ks + 2], x[8 * ks + 3]);
        a[ks][2] = bl_pack2<T>(x[8 * ks + 4], x[8 * ks + 5]);
        a[ks][3] = bl_pack2<T>(x[8 * ks + 6], x[8 * ks + 7]);
    }
}

// dS of this warp's 16 keys (the packed dS^T fragments dsa) into its warpgroup's panel of the dS
// tile (query rows, keys along the panels; panel wg holds keys 64wg..) at spanel, transposed by
// stmatrix: dS (query i, key j) at row i, chunk (j % 64) / 8 ^ (i % 8) of panel j / 64.
// Fragment dsa[ks][q] holds keys kw % 64 + 8(q & 1) + 0..7 x queries 16ks + 8(q >> 1) + 0..7;
// stored transposed, its row r is query 16ks + 8(q >> 1) + r. Lane l addresses row l % 8 of
// matrix l / 8.
template <int KS>
__device__ __forceinline__ void store_ds_tile(uint32_t spanel, const uint32_t (&dsa)[KS][4],
                                              int warp, int lane) {
    const int q = lane >> 3, r = lane & 7;
    const int chunk = 2 * (warp & 3) + (q & 1);
    const uint32_t base =
        spanel + (uint32_t)(8 * (q >> 1) + r) * PANEL_ROW_BYTES + (uint32_t)((chunk ^ r) << 4);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) bl_stmatrix_x4_trans(base + ks * K16_BYTES_MNMAJOR, dsa[ks]);
}

// dS^T = P^T * (dP^T - Dlt), in place of dP^T's accumulator fragment ds (NT n8 tiles of queries;
// this thread's queries 8t + 2lt and 8t + 2lt + 1 have Dlt dlt[t].x and .y).
template <int NT>
__device__ __forceinline__ void ds_from_dp(float (&ds)[4 * NT], const float (&p)[4 * NT],
                                           const float2 (&dlt)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        ds[4 * t + 0] = p[4 * t + 0] * (ds[4 * t + 0] - dlt[t].x);
        ds[4 * t + 1] = p[4 * t + 1] * (ds[4 * t + 1] - dlt[t].y);
        ds[4 * t + 2] = p[4 * t + 2] * (ds[4 * t + 2] - dlt[t].x);
        ds[4 * t + 3] = p[4 * t + 3] * (ds[4 * t + 3] - dlt[t].y);
    }
}

// The same with this thread's Dlt read from the tile's row array dlt (queries 8t + 2lt, +1).
template <int NT>
__device__ __forceinline__ void ds_from_dp_smem(float (&ds)[4 * NT], const float (&p)[4 * NT],
                                                const float *dlt, int lt) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float2 dd = *reinterpret_cast<const float2 *>(dlt + 8 * t + 2 * lt);
        ds[4 * t + 0] = p[4 * t + 0] * (ds[4 * t + 0] - dd.x);
        ds[4 * t + 1] = p[4 * t + 1] * (ds[4 * t + 1] - dd.y);
        ds[4 * t + 2] = p[4 * t + 2] * (ds[4 * t + 2] - dd.x);
        ds[4 * t + 3] = p[4 * t + 3] * (ds[4 * t + 3] - dd.y);
    }
}

// The block staged at sdq added into the fp32 accumulator at (columns col0.., q head h, rows
// row.., batch b) by two TMA reduce-adds from the calling thread, as one bulk group (rows past
// Sq are skipped by TMA); with STORE stored instead: the only writer of a row tile (version 10
// with p.dq_writers, bwd_ws128_sm90.cuh), whose store needs no read of the accumulator's zeros.
template <bool STORE = false>
__device__ __forceinline__ void dq_block_reduce(const bwd_params &p, uint32_t sdq, int col0, int h,
                                                int row, int b) {
#pragma unroll
    for (int box = 0; box < 2; ++box) {
        if (STORE)
            tma_store_4d(&p.tm_dq, sdq + box * DQ_BOX_BYTES, col0 + DQ_BOX_COLS * box, h, row, b);
        else
            tma_reduce_add_4d(&p.tm_dq, sdq + box * DQ_BOX_BYTES, col0 + DQ_BOX_COLS * box, h, row,
                              b);
    }
    bulk_commit_group();
}

// A warp's 16 x 64 dQ block (rows row.. + 16, columns col0.. + 64 of the fp32 accumulator;
// fragment dq[32] as in dq_block_stage) added with 8 float4 atomics per thread, columns in
// their natural order. Lane pairs (lt, lt^1) swap halves so that each lane holds 4 consecutive
// columns of one row: even lt -> row lg, columns 2lt..2lt+3; odd lt -> row lg+8.
template <int D>
__device__ __forceinline__ void dq_block_atomic_add(const bwd_params &p, const float (&dq)[32],
                                                    int b, int h, int64_t row, int col0) {
    const int lane = threadIdx.x & 31, lg = lane >> 2, lt = lane & 3;
    const bool odd = lt & 1;
    const int64_t i = row + lg + (odd ? 8 : 0);
    float *dst = p.dq_accum + (((int64_t)b * p.dm.seqlen_q + i) * p.dm.heads_q + h) * D + col0 +
                 2 * (lt & ~1);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        const float send0 = odd ? dq[4 * t + 0] : dq[4 * t + 2];
        const float send1 = odd ? dq[4 * t + 1] : dq[4 * t + 3];
        const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
        const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
        const float4 v = odd ? make_float4(got0, got1, dq[4 * t + 2], dq[4 * t + 3])
                             : make_float4(dq[4 * t + 0], dq[4 * t + 1], got0, got1);
        if (i < p.dm.seqlen_q) atomicAdd(reinterpret_cast<float4 *>(dst + 8 * t), v);
    }
}

// Element i of {a0, a1, a2, a3} for a run-time i in 0..3, by selects (an indexed register array
// would go to local memory).
__device__ __forceinline__ uint32_t bl_pick4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             int i) {
    const uint32_t lo = (i & 1) ? a1 : a0, hi = (i & 1) ? a3 : a2;
    return (i & 2) ? hi : lo;
}

// The epilogue of the backward main kernels without TMA stores (the shipped ones with a producer
// warpgroup stage dK / dV for TMA stores instead: ws_stage_dkv): a warp's 16 keys
// (key0w..key0w+15) of dK (times scale) and dV from its wgmma accumulator fragments (rows lg,
// lg + 8; columns 8t + 2lt (+1); lg = lane / 4, lt = lane % 4, passed in so that the kernels keep
// their own registers for them).
// Stored 16 bytes per thread: for each four n8 tiles 4u..4u+3 the quad's threads swap their
// packed pairs (three shuffles, a 4 x 4 transpose) so that thread lt holds all 8 columns of tile
// 4u + lt. Why: with one 4-byte store per pair the epilogue cost ~7 us per column, 28 % of a
// 1 %-kept 16k call (bench/results/bwd-s12-epilogue.txt).
template <typename T, int N>
__device__ __forceinline__ void store_dk_dv(const bwd_params &p, const float (&dk_acc)[N],
                                            const float (&dv_acc)[N], int64_t b, int64_t g,
                                            int64_t key0w, int lg, int lt) {
    constexpr int ND = N / 4;  // n8 tiles of head dim
    static_assert(ND % 4 == 0, "the quad transpose takes n8 tiles four at a time");
    T *dk = static_cast<T *>(p.dk);
    T *dv = static_cast<T *>(p.dv);
    // This thread's pairs of tiles 4u..4u+3 -> the 8 columns of tile 4u + lt: in round k thread lt
    // receives, from thread lt ^ k, that thread's pair of tile 4u + lt (column pair lt ^ k).
    auto transpose = [&](uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
        const uint32_t g0 = bl_pick4(a0, a1, a2, a3, lt);
        const uint32_t g1 = __shfl_xor_sync(0xffffffffu, bl_pick4(a0, a1, a2, a3, lt ^ 1), 1);
        const uint32_t g2 = __shfl_xor_sync(0xffffffffu, bl_pick4(a0, a1, a2, a3, lt ^ 2), 2);
        const uint32_t g3 = __shfl_xor_sync(0xffffffffu, bl_pick4(a0, a1, a2, a3, lt ^ 3), 3);
        return make_uint4(bl_pick4(g0, g1, g2, g3, lt), bl_pick4(g0, g1, g2, g3, 1 ^ lt),
                          bl_pick4(g0, g1, g2, g3, 2 ^ lt), bl_pick4(g0, g1, g2, g3, 3 ^ lt));
    };
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int64_t j = key0w + lg + 8 * half;
        T *dk_row = dk + b * p.dk_sb + j * p.dk_ss + g * p.dk_sh + 8 * lt;
        T *dv_row = dv + b * p.dv_sb + j * p.dv_ss + g * p.dv_sh + 8 * lt;
#pragma unroll
        for (int u = 0; u < ND / 4; ++u) {
            uint32_t kp[4], vp[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int t = 4 * u + x;
                kp[x] = bl_pack2<T>(dk_acc[4 * t + 2 * half] * p.scale,
                                    dk_acc[4 * t + 2 * half + 1] * p.scale);
                vp[x] = bl_pack2<T>(dv_acc[4 * t + 2 * half], dv_acc[4 * t + 2 * half + 1]);
            }
            // Every lane shuffles (the rows past Sk too): only the stores are guarded.
            const uint4 kq = transpose(kp[0], kp[1], kp[2], kp[3]);
            const uint4 vq = transpose(vp[0], vp[1], vp[2], vp[3]);
            if (j < p.dm.seqlen_k) {
                *reinterpret_cast<uint4 *>(dk_row + 32 * u) = kq;
                *reinterpret_cast<uint4 *>(dv_row + 32 * u) = vq;
            }
        }
    }
}

// Stage and reduce from the warp itself (lane 0 issues). Lane 0's bulk groups still reading
// staging other than sdq: at most PENDING.
template <int PENDING>
__device__ __forceinline__ void tma_reduce_dq_block(const bwd_params &p, uint32_t sdq,
                                                    const float (&dq)[32], int col0, int h,
                                                    int row, int b) {
    const bool lane0 = (threadIdx.x & 31) == 0;
    if (lane0) bulk_wait_group_read<PENDING>();  // sdq's previous boxes have been read
    __syncwarp();
    dq_block_stage(sdq, dq);
    if (lane0) dq_block_reduce(p, sdq, col0, h, row, b);
}

// S^T = K Q^T (or dP^T = V dO^T) of this warpgroup's 64 keys against a 64-row tile, issued as
// D / 16 k16 steps over the head dim's 64-column panels, both K-major: A's panels BN rows apart
// from sa (this warpgroup's first key), B's BM rows apart from sb. OVERWRITE: the first step does
// not accumulate, so the registers need no zeros. (Version 10 keeps its own copies of the loop:
// with this function ptxas scheduled two of its instantiations differently.)
template <typename T, int D, bool OVERWRITE>
__device__ __forceinline__ void wg_issue_keys_x_rows(float (&acc)[32], uint32_t sa, uint32_t sb) {
    constexpr uint32_t QPANEL = BM * PANEL_ROW_BYTES;  // bytes of one panel of a Q / dO tile
    constexpr uint32_t KPANEL = BN * PANEL_ROW_BYTES;  // bytes of one panel of a K / V tile
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = (kk / 4) * KPANEL + (kk % 4) * K16_BYTES_KMAJOR;
        const uint32_t qoff = (kk / 4) * QPANEL + (kk % 4) * K16_BYTES_KMAJOR;
        bl_wgmma_ss_n64<T, 0>(acc, bl_wgmma_desc(sa + koff, 16, BL_WGMMA_GROUP_BYTES),
                              bl_wgmma_desc(sb + qoff, 16, BL_WGMMA_GROUP_BYTES),
                              OVERWRITE ? kk > 0 : 1);
    }
}

// P^T in place of S^T in n8 tile t of a thread's accumulator fragment (elements 4t..4t+3: keys
// k, k, k + 8, k + 8 x queries a, b, a, b): exp2(S^T scale_log2 - lse2), l holding queries a and
// b's lse in log2 units.
template <int N>
__device__ __forceinline__ void p_from_s_n8(float (&s)[N], int t, float2 l, float scale_log2) {
    s[4 * t + 0] = exp2f(fmaf(s[4 * t + 0], scale_log2, -l.x));
    s[4 * t + 1] = exp2f(fmaf(s[4 * t + 1], scale_log2, -l.y));
    s[4 * t + 2] = exp2f(fmaf(s[4 * t + 2], scale_log2, -l.x));
    s[4 * t + 3] = exp2f(fmaf(s[4 * t + 3], scale_log2, -l.y));
}

// The same four elements zeroed where the mask forbids them: key jr (jr0 = k, relative to the
// column's first) at or past key_limit, or more than causal_limit past query ir (ir0 = a,
// relative to the entry's first row).
template <int N>
__device__ __forceinline__ void mask_n8(float (&s)[N], int t, int jr0, int ir0, int key_limit,
                                        int causal_limit) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        const int jr = jr0 + ((x >> 1) << 3);
        const int ir = ir0 + (x & 1);
        if (jr >= key_limit || jr - ir > causal_limit) s[4 * t + x] = 0.0f;
    }
}

// FUSED_DKV (version 4): the next entry's loads go out after this entry's S^T / dP^T issue; dK
// issues right after dS without waiting for dV (P^T's packed registers stay live until the
// tile's last wait); dS goes to shared memory with stmatrix.trans (4 per thread) instead of 32
// 16-bit stores. false: version 3b, as measured in bench/notes-bwd.md.
template <typename T, int D, bool FUSED_DKV, bool TMA_ROWS>
__global__ void __launch_bounds__(THREADS, 1) bwd_wgmma_kernel(const __grid_constant__ bwd_params p) {
    static_assert(FUSED_DKV || !TMA_ROWS, "version 6 builds on version 4");
    using L = wg_smem<D>;
    constexpr int NQ = BM / 8;   // n8 tiles of queries (S^T, dP^T): 8
    constexpr int ND = D / 8;    // n8 tiles of head dim (dK, dV)
    constexpr uint32_t QPANEL = BM * PANEL_ROW_BYTES;  // bytes of one panel of a Q / dO tile
    constexpr uint32_t KPANEL = BN * PANEL_ROW_BYTES;  // bytes of one panel of a K / V tile
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
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
        load_kv_tile<T, D>(p, s0 + L::K, s0 + L::V, b, g, key0, threadIdx.x);
        e_cur = list[0];
        e_next = count > 1 ? list[1] : 0;
        if (!TMA_ROWS) {
            wg_load_row_tile<T, D>(p, s0, s_rows, 0, b, g * dm.group + e_cur / dm.tiles_m,
                                   e_cur % dm.tiles_m);
        } else if (threadIdx.x == 0) {
            // The loop-top barrier publishes the initialisation to the other threads.
            mbarrier_init(s0 + L::BARS, 1);
            mbarrier_init(s0 + L::BARS + 8, 1);
            fence_mbarrier_init();
            wg_tma_row_tile<D>(p, s0, 0, b, g * dm.group + e_cur / dm.tiles_m, e_cur % dm.tiles_m);
        }
    }
    bl_cp_async_commit();

    if (TMA_ROWS) {  // the K / V tiles; the loop-top barrier publishes them
        bl_cp_async_wait<0>();
        bl_fence_proxy_async();
    }

    // dS as the K-major A operand of dQ: element (query i, key j) of the BM x BN tile.
    unsigned char *sds = smem_base + L::DS;

    // Version 4 decodes list entries (hl * Tm + m < 2^31) in 32 bits; version 3b as measured.
    using entry_t = typename std::conditional<FUSED_DKV, int, int64_t>::type;
    const entry_t tiles_m = (entry_t)dm.tiles_m;
    for (int it = 0; it < count; ++it) {
        const int buf = it & 1;
        const entry_t hl = e_cur / tiles_m, m = e_cur % tiles_m;
        const int64_t h = g * dm.group + hl;
        // cp.async wrote what wgmma reads next. Version 6 only has the K / V tiles in cp.async
        // groups: it waits once, before the loop. This thread's bulk groups (version 6's dQ
        // reduce-adds) share the scoreboard with cp.async groups, so a wait_group 0 here would
        // also wait for the previous entry's reduce-adds to complete in L2 (12.9 % of the stall
        // samples: bench/results/bwd128-ncu-src-s7.txt).
        if (!TMA_ROWS) {
            bl_cp_async_wait<0>();
            bl_fence_proxy_async();
        }
        // This tile has landed for every thread and every warp is done with iteration it-1:
        // Q / dO buffer buf^1 and the dS tile are free.
        __syncthreads();
        // Version 6: buffer buf's k-th tile (entry it = 2k + buf) completes phase k.
        if (TMA_ROWS) mbarrier_wait(s0 + L::BARS + 8 * buf, (uint32_t)(it >> 1) & 1u);
        // The next entry's loads into buffer buf^1 (~100 instructions of address math): version
        // 4 issues them after this tile's S^T / dP^T products, in their shadow.
        const int e_load = e_next;
        if (!FUSED_DKV && it + 1 < count) {
            wg_load_row_tile<T, D>(p, s0, s_rows, buf ^ 1, b, g * dm.group + e_load / tiles_m,
                                   e_load % tiles_m);
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
        wg_issue_keys_x_rows<T, D, false>(s, s0 + L::K + wg * WG_KEYS * PANEL_ROW_BYTES, sQ);
        bl_wgmma_commit();
        wg_issue_keys_x_rows<T, D, false>(ds, s0 + L::V + wg * WG_KEYS * PANEL_ROW_BYTES, sdO);
        bl_wgmma_commit();
        if (FUSED_DKV && it + 1 < count) {
            if (!TMA_ROWS) {
                wg_load_row_tile<T, D>(p, s0, s_rows, buf ^ 1, b, g * dm.group + e_load / tiles_m,
                                       e_load % tiles_m);
                bl_cp_async_commit();
            } else if (threadIdx.x == 0) {
                wg_tma_row_tile<D>(p, s0, buf ^ 1, b, g * dm.group + e_load / tiles_m,
                                   e_load % tiles_m);
            }
        }
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
            p_from_s_n8(s, t, l, p.scale_log2);
            if (need_mask) mask_n8(s, t, kw + lg, 8 * t + 2 * lt, key_limit, causal_limit);
        }

        // ---- dV += P^T dO (P^T from registers) ----
        uint32_t pa[BM / 16][4];
        pack_a_fragments<T>(pa, s);
        bl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks)
            bl_wgmma_rs<T, D>(dv_acc, pa[ks],
                              bl_wgmma_desc(sdO + ks * K16_BYTES_MNMAJOR, QPANEL, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        bl_wgmma_wait<1>();  // dP^T is done; dV may still run
        bl_reg_fence(ds);

        // ---- dS^T = P^T * (dP^T - Dlt) ----
        ds_from_dp_smem<NQ>(ds, s, dlt, lt);
        uint32_t dsa[BM / 16][4];
        pack_a_fragments<T>(dsa, ds);
        if (!FUSED_DKV) {
            bl_wgmma_wait<0>();  // dV is done: P's registers may be reused
            bl_reg_fence(pa);
        }

        // ---- dK += dS^T Q (registers), and dS to shared memory for dQ ----
        bl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BM / 16; ++ks)
            bl_wgmma_rs<T, D>(dk_acc, dsa[ks],
                              bl_wgmma_desc(sQ + ks * K16_BYTES_MNMAJOR, QPANEL, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        if (FUSED_DKV) {
            store_ds_tile(s0 + L::DS + wg * QPANEL, dsa, warp, lane);
        } else {
            // dS (query i, key j) at panel j/64 (= wg), row i, chunk (j%64)/8 ^ (i%8), lane j%8.
            // This thread's keys: kw + lg (+8); queries 8t + 2lt (+1).
            const int jj = (kw % WG_KEYS) + lg;
            unsigned char *panel = sds + wg * (BM * PANEL_ROW_BYTES);
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

        // ---- dQ(64 x 64) = dS K; fp32 atomics into the accumulator ----
        float dq[32];
#pragma unroll
        for (int x = 0; x < 32; ++x) dq[x] = 0.0f;
        bl_reg_fence(dq);
        bl_wgmma_fence();
        if (D == 128) {
            // warpgroup wg: d columns 64wg..64wg+63 (K panel wg), all 128 keys
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks)
                bl_wgmma_ss_n64<T, 1>(
                    dq,
                    bl_wgmma_desc(s0 + L::DS + (ks / 4) * QPANEL + (ks % 4) * K16_BYTES_KMAJOR, 16,
                                  BL_WGMMA_GROUP_BYTES),
                    bl_wgmma_desc(s0 + L::K + wg * KPANEL + ks * K16_BYTES_MNMAJOR, KPANEL,
                                  BL_WGMMA_GROUP_BYTES));
        } else {
            // warpgroup wg: keys 64wg..64wg+63 (dS panel wg), all 64 d columns
#pragma unroll
            for (int ks = 0; ks < WG_KEYS / 16; ++ks)
                bl_wgmma_ss_n64<T, 1>(
                    dq,
                    bl_wgmma_desc(s0 + L::DS + wg * QPANEL + ks * K16_BYTES_KMAJOR, 16,
                                  BL_WGMMA_GROUP_BYTES),
                    bl_wgmma_desc(s0 + L::K + (wg * WG_KEYS / 16 + ks) * K16_BYTES_MNMAJOR, KPANEL,
                                  BL_WGMMA_GROUP_BYTES));
        }
        bl_wgmma_commit();
        bl_wgmma_wait<0>();  // dK and dQ (and with FUSED_DKV dV) are done
        bl_reg_fence(dq);
        bl_reg_fence(dsa);
        if (FUSED_DKV) bl_reg_fence(pa);
        if (TMA_ROWS) {
            // Version 6: warp w's 16 x 64 block of dQ (rows 16(w%4).., columns 64wg..) goes out
            // as 2 TMA reduce-adds instead of 8 float4 atomics per thread. Its staging buffer
            // (buf) was last used two iterations ago: one newer bulk group may still read.
            tma_reduce_dq_block<1>(p, s0 + L::DQS + (uint32_t)(buf * WARPS + warp) * DQ_WARP_BYTES,
                                   dq, 64 * wg, (int)h, (int)(row0 + 16 * (warp & 3)), (int)b);
        } else {
            dq_block_atomic_add<D>(p, dq, (int)b, (int)h, row0 + 16 * (warp & 3), D == 128 ? 64 * wg : 0);
        }
    }
    // The staged dQ must be read, and added, before the CTA's shared memory goes away.
    if (TMA_ROWS && lane == 0) bulk_wait_group<0>();
    bl_reg_fence(dk_acc);
    bl_reg_fence(dv_acc);

    store_dk_dv<T>(p, dk_acc, dv_acc, b, g, key0 + kw, lg, lt);
}

}  // namespace bl_bwd
