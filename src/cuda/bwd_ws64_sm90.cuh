// bwd_ws64_sm90.cuh -- backward main kernel version 5, head dim 64: the paired kernel's math
// (bwd_wgmma64p_sm90.cuh, two list entries per iteration, dQ of pair it-1 under pair it's S^T)
// with a producer warpgroup, as versions 8 / 9 do at head dim 128 (bwd_ws128_sm90.cuh):
//   warpgroup 0, producer (24 registers): thread 0 loads each pair with TMA into a two-buffer ring
//     (FULL / EMPTY mbarriers; consumer warp 0 fills an empty slot's lse / Dlt); thread 32 issues the dQ
//     reduce-adds of each pair once the consumers have staged them (DQFULL / DQEMPTY; one staging
//     buffer: the shared memory has no room for two).
//   warpgroups 1 and 2, consumers (240 registers): the paired kernel's products; a named barrier
//     at the loop top publishes dS and frees the dS buffer the next pair writes. At the end dK /
//     dV go out by TMA stores from the freed Q buffers.
#pragma once
#include "bwd_wgmma64p_sm90.cuh"
#include "bwd_ws128_sm90.cuh"

namespace bl_bwd {

static_assert(wg64p_smem::DQS - wg64p_smem::BARS >= ws_bars::BYTES, "room for 8 mbarriers");

// lse_log2 = +inf, Dlt = 0 for the empty second slot of the pair in buffer `buf` (the last pair
// of an odd list), by the 32 lanes of consumer warp 0 (lane: which array, 16-byte vector). The
// consumers write it, not the producer: the loop-top named barrier then orders it against both
// the reads of the buffer's previous pair and this pair's (compute-sanitizer racecheck does not
// see the producer's mbarrier release as ordering generic stores).
__device__ __forceinline__ void ws64_fill_empty(float *s_rows, int buf, int lane) {
    constexpr int ROW_VEC = BM / 4;
    const int which = lane / ROW_VEC, c = lane % ROW_VEC;
    const float fill = which == 0 ? INFINITY : 0.0f;
    *reinterpret_cast<float4 *>(s_rows + (which * 2 + buf) * PAIR_ROWS + BM + 4 * c) =
        make_float4(fill, fill, fill, fill);
}

template <typename T>
__global__ void __launch_bounds__(WS_THREADS, 1) bwd_ws64_kernel(const __grid_constant__ bwd_params p) {
    constexpr int D = 64;
    using L = wg64p_smem;
    constexpr int NQ = PAIR_ROWS / 8;  // n8 tiles of queries (S^T, dP^T): 16
    constexpr int NQ_ENTRY = BM / 8;   // of them per entry: 8
    constexpr int ND = D / 8;          // n8 tiles of head dim (dK, dV, dQ): 8
    constexpr int KSTEPS_D = D / 16;
    constexpr int KSTEPS_Q = PAIR_ROWS / 16;  // dV / dK steps over the pair's queries: 8
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem_base = bl_smem_aligned<L::BASE_ALIGN>(smem_raw);
    const uint32_t s0 = bl_smem_addr(smem_base);
    const uint32_t bars = s0 + L::BARS;
    float *s_rows = reinterpret_cast<float *>(smem_base + L::ROWS);

    const bl_bwd_dims &dm = p.dm;
    const int64_t col = p.schedule[blockIdx.x];
    const int64_t n = col % dm.tiles_n;
    const int64_t g = (col / dm.tiles_n) % dm.heads_k;
    const int64_t b = col / (dm.tiles_n * dm.heads_k);
    const int count = p.counts[col];
    const int pairs = (count + 1) / 2;
    const int *list = p.lists + col * (dm.group * dm.tiles_m);

    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; ++i) {
            mbarrier_init(bars + ws_bars::FULL + 8 * i, 1);
            mbarrier_init(bars + ws_bars::EMPTY + 8 * i, THREADS);  // every consumer thread
        }
        mbarrier_init(bars + ws_bars::DQFULL, WARPS);
        mbarrier_init(bars + ws_bars::DQEMPTY, 1);
        fence_mbarrier_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        // ---- producer warpgroup ----
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            // Pair it into buffer it & 1 once pair it-2 has been read (the first wait on each
            // EMPTY passes at once).
            for (int it = 0; it < pairs; ++it) {
                const int buf = it & 1;
                mbarrier_wait(bars + ws_bars::EMPTY + 8 * buf, ((uint32_t)(it >> 1) & 1u) ^ 1u);
                const wg64p_entry e[2] = {
                    wg64p_decode(p, (int)g, list[2 * it]),
                    wg64p_decode(p, (int)g, 2 * it + 1 < count ? list[2 * it + 1] : -1)};
                wg64p_tma_pair(p, s0, buf, b, e);  // an empty slot's lse / Dlt: see ws64_fill_empty
            }
        } else if (threadIdx.x == 32) {
            // Pair k's dQ, staged by the 8 consumer warps (warps 4s.. hold entry s's rows).
            for (int k = 0; k < pairs; ++k) {
                mbarrier_wait(bars + ws_bars::DQFULL, (uint32_t)k & 1u);
                const wg64p_entry e[2] = {
                    wg64p_decode(p, (int)g, list[2 * k]),
                    wg64p_decode(p, (int)g, 2 * k + 1 < count ? list[2 * k + 1] : -1)};
#pragma unroll 1
                for (int w = 0; w < WARPS; ++w) {
                    const wg64p_entry mine = w < 4 ? e[0] : e[1];
                    if (mine.live())
                        dq_block_reduce(p, s0 + L::DQS + (uint32_t)w * DQ_WARP_BYTES, 0, mine.h,
                                        mine.row0 + 16 * (w & 3), (int)b);
                }
                bulk_wait_group_read<0>();  // the staging may be rewritten
                mbarrier_arrive(bars + ws_bars::DQEMPTY);
            }
            bulk_wait_group<0>();  // the reduce-adds complete before the CTA goes away
        }
        return;
    }

    // ---- consumer warpgroups ----
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;         // consumer thread 0..255
    const int lane = ct & 31, warp = ct >> 5;  // consumer warp 0..7
    const int wg = warp >> 2;                  // keys 64wg..64wg+63; dQ of entry wg
    const int lg = lane >> 2, lt = lane & 3;
    const int64_t key0 = n * BN;
    const int kw = warp * KEYS_PER_WARP;
    const uint32_t sdq = s0 + L::DQS + (uint32_t)warp * DQ_WARP_BYTES;

    float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
    for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;

    if (count > 0) {
        load_kv_tile<T, D>(p, s0 + L::K, s0 + L::V, b, g, key0, ct);
        bl_cp_async_commit();
        bl_cp_async_wait<0>();
        if (count == 1 && warp == 0) ws64_fill_empty(s_rows, 0, lane);  // pair 0 is odd
    }

    const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag
    const int64_t key_room = dm.seqlen_k - key0;
    const int key_limit = key_room < BN ? (int)key_room : BN;

    for (int it = 0; it < pairs; ++it) {
        const int buf = it & 1;
        bl_fence_proxy_async();  // cp.async (and iteration it-1's stmatrix) wrote what wgmma reads
        // Every consumer warp is done with iteration it-1: dS buffer buf^1 holds pair it-1's dS,
        // and dS buffer buf is free (pair it-2's dQ was waited for in iteration it-1).
        named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);
        mbarrier_wait(bars + ws_bars::FULL + 8 * buf, (uint32_t)(it >> 1) & 1u);
        // Pair it-2's reduce-adds have read the staging that pair it-1's dQ goes to below. The
        // wait is unconditional (at it == 0 and 1 its parity passes at once): a wait loop
        // under a branch here makes ptxas serialize dQ and S^T (C7517).
        mbarrier_wait(bars + ws_bars::DQEMPTY, ((uint32_t)it & 1u) | (uint32_t)(it == 0));
        // Pair it-1's dQ, unconditional (see the paired kernel: a conditional issue makes ptxas
        // serialize the products); at it == 0 its result is dropped.
        float dq[ND * 4];
        wg64p_issue_dq<T>(dq, s0 + L::DS + (buf ^ 1) * L::DS_BUF, s0 + L::K, wg);

        const uint32_t sQ = s0 + L::Q + buf * L::PANEL;
        const uint32_t sdO = s0 + L::DO + buf * L::PANEL;
        const float *lse2 = s_rows + buf * PAIR_ROWS;
        const float *dlt = s_rows + (2 + buf) * PAIR_ROWS;

        // ---- S^T = K Q^T and dP^T = V dO^T (this warpgroup's 64 keys x 128 queries) ----
        float s[NQ * 4], ds[NQ * 4];
#pragma unroll
        for (int x = 0; x < NQ * 4; ++x) s[x] = 0.0f;
        bl_reg_fence(s);
        bl_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk)
            bl_wgmma_ss_n128<T>(
                s,
                bl_wgmma_desc(s0 + L::K + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR,
                              16, BL_WGMMA_GROUP_BYTES),
                bl_wgmma_desc(sQ + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        bl_wgmma_wait<1>();  // pair it-1's dQ is done; S^T may still run
        bl_reg_fence(dq);
        if (it > 0) dq_block_stage<false>(sdq, dq);  // pair it-1's dQ into the staging
#pragma unroll
        for (int x = 0; x < NQ * 4; ++x) ds[x] = 0.0f;
        bl_reg_fence(ds);
        bl_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk)
            bl_wgmma_ss_n128<T>(
                ds,
                bl_wgmma_desc(s0 + L::V + wg * WG_KEYS * PANEL_ROW_BYTES + kk * K16_BYTES_KMAJOR,
                              16, BL_WGMMA_GROUP_BYTES),
                bl_wgmma_desc(sdO + kk * K16_BYTES_KMAJOR, 16, BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        if (it > 0) {
            // ... handed over once dP^T is issued: the proxy fence waits for the stores, which
            // right after them cost 2 % (bench/results/bwd-s8-variants.txt, late64)
            bl_fence_proxy_async();
            __syncwarp();
            if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL);
        }
        // The next pair is the last of an odd list: its empty slot's rows, into the other buffer
        // (read by nobody since the loop-top barrier; published by the next one).
        if (it + 1 < pairs && 2 * (it + 1) + 1 == count && warp == 0)
            ws64_fill_empty(s_rows, buf ^ 1, lane);
        // Row starts of this pair's entries, for the masks (an empty slot's are never used: its
        // P is 0 through lse = +inf). Read here, under the products: list reads ahead of the dQ
        // issue made ptxas serialize dQ and S^T (C7517).
        const int row0_e[2] = {(list[2 * it] % (int)dm.tiles_m) * BM,
                               2 * it + 1 < count ? (list[2 * it + 1] % (int)dm.tiles_m) * BM : 0};
        bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
        bl_reg_fence(s);

        // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
        bool need_mask[2];
        int causal_limit[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            need_mask[e] = key0 + BN > dm.seqlen_k ||
                           (p.causal && key0 + BN - 1 > row0_e[e] + diag);
            int64_t room = row0_e[e] + diag - key0;
            room = room > 2 * BN ? 2 * BN : room;
            room = room < -2 * BN ? -2 * BN : room;
            causal_limit[e] = p.causal ? (int)room : 2 * BN;
        }
#pragma unroll
        for (int t = 0; t < NQ; ++t) {
            const int e = t / NQ_ENTRY;  // which entry these 8 queries belong to
            const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
            s[4 * t + 0] = exp2f(fmaf(s[4 * t + 0], p.scale_log2, -l.x));
            s[4 * t + 1] = exp2f(fmaf(s[4 * t + 1], p.scale_log2, -l.y));
            s[4 * t + 2] = exp2f(fmaf(s[4 * t + 2], p.scale_log2, -l.x));
            s[4 * t + 3] = exp2f(fmaf(s[4 * t + 3], p.scale_log2, -l.y));
            if (need_mask[e]) {
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const int jr = kw + lg + ((x >> 1) << 3);              // key - key0
                    const int ir = 8 * (t % NQ_ENTRY) + 2 * lt + (x & 1);  // query - row0
                    if (jr >= key_limit || jr - ir > causal_limit[e]) s[4 * t + x] = 0.0f;
                }
            }
        }

        // ---- dS^T = P^T * (dP^T - Dlt), then both A operands packed ----
        // Dlt read before the wait: right after it the LDS waited behind the products (-1 %,
        // bench/results/bwd-s11-d64.txt).
        float2 dlt_r[NQ];
#pragma unroll
        for (int t = 0; t < NQ; ++t) dlt_r[t] = *reinterpret_cast<const float2 *>(dlt + 8 * t + 2 * lt);
        bl_wgmma_wait<0>();  // dP^T is done
        bl_reg_fence(ds);
        ds_from_dp<NQ>(ds, s, dlt_r);
        uint32_t pa[KSTEPS_Q][4], dsa[KSTEPS_Q][4];
#pragma unroll
        for (int ks = 0; ks < KSTEPS_Q; ++ks)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                pa[ks][x] = bl_pack2<T>(s[8 * ks + 2 * x], s[8 * ks + 2 * x + 1]);
                dsa[ks][x] = bl_pack2<T>(ds[8 * ks + 2 * x], ds[8 * ks + 2 * x + 1]);
            }

        // ---- dV += P^T dO and dK += dS^T Q (A from registers), dS to shared memory ----
        bl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS_Q; ++ks)
            bl_wgmma_rs<T, D>(dv_acc, pa[ks],
                              bl_wgmma_desc(sdO + ks * K16_BYTES_MNMAJOR, L::PANEL,
                                            BL_WGMMA_GROUP_BYTES));
#pragma unroll
        for (int ks = 0; ks < KSTEPS_Q; ++ks)
            bl_wgmma_rs<T, D>(dk_acc, dsa[ks],
                              bl_wgmma_desc(sQ + ks * K16_BYTES_MNMAJOR, L::PANEL,
                                            BL_WGMMA_GROUP_BYTES));
        bl_wgmma_commit();
        {
            // dS (query i, key j) at key panel j/64 (= wg), row i, chunk (j%64)/8 ^ (i%8); the
            // paired kernel has the fragment mapping.
            const int q = lane >> 3, r = lane & 7;
            const int chunk = 2 * (warp & 3) + (q & 1);
            const uint32_t base = s0 + L::DS + buf * L::DS_BUF + wg * L::PANEL +
                                  (uint32_t)(8 * (q >> 1) + r) * PANEL_ROW_BYTES +
                                  (uint32_t)((chunk ^ r) << 4);
#pragma unroll
            for (int ks = 0; ks < KSTEPS_Q; ++ks)
                bl_stmatrix_x4_trans(base + ks * K16_BYTES_MNMAJOR, dsa[ks]);
        }
        bl_wgmma_wait<0>();  // dV and dK are done: pa and dsa may die, Q / dO buffer buf is free
        bl_reg_fence(pa);
        bl_reg_fence(dsa);
        // Every consumer thread releases the buffer itself: its lse / Dlt reads then come before
        // the producer's next TMA writes there in the order compute-sanitizer racecheck checks
        // (one arrive per warp after a __syncwarp is reported as a WAR hazard).
        mbarrier_arrive(bars + ws_bars::EMPTY + 8 * buf);
    }
    if (pairs > 0) {  // the last pair's dQ
        bl_fence_proxy_async();
        named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);
        float dq[ND * 4];
        wg64p_issue_dq<T>(dq, s0 + L::DS + ((pairs - 1) & 1) * L::DS_BUF, s0 + L::K, wg);
        bl_wgmma_wait<0>();
        bl_reg_fence(dq);
        mbarrier_wait(bars + ws_bars::DQEMPTY, ((uint32_t)(pairs - 1) & 1u) ^ 1u);
        dq_block_stage(sdq, dq);
        if (lane == 0) mbarrier_arrive(bars + ws_bars::DQFULL);
    }
    bl_reg_fence(dk_acc);
    bl_reg_fence(dv_acc);
    // dK (times scale) and dV staged in the two Q buffers as the tensor maps' 128-row panels
    // (ws_stage_dkv) and stored by TMA from one thread, as the persistent head-dim-128 kernel does.
    // The buffers are free: every consumer warp has passed its last product's wait before the
    // barrier above (no pair: nothing was loaded).
    ws_stage_dkv<T>(s0 + L::Q, dk_acc, p.scale, warp, lane);
    ws_stage_dkv<T>(s0 + L::Q + L::PANEL, dv_acc, 1.0f, warp, lane);
    bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
    named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);
    if (ct == 0) {
        tma_store_4d(&p.tm_dk, s0 + L::Q, 0, (int)key0, (int)g, (int)b);
        tma_store_4d(&p.tm_dv, s0 + L::Q + L::PANEL, 0, (int)key0, (int)g, (int)b);
        bulk_commit_group();
        bulk_wait_group<0>();  // before the CTA and its shared memory go away
    }
}

}  // namespace bl_bwd
