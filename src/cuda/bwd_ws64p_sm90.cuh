// bwd_ws64p_sm90.cuh -- version 6 persistent (unsplit head-dim-64 calls): the head-dim-64
// kernel of bwd_ws64_sm90.cuh with one CTA per SM walking its share of the schedule's columns, so
// that a column's end overlaps the next column's start. Why: at low keeps version 6's time outside
// its pairs is ~4-5 us a column (the CTA's launch, K / V landing, the last dQ and dK / dV staged,
// the stores' and reduce-adds' reads: bench/notes-bwd.md, fifty-ninth and hundred-and-eighth
// sessions), paid one after another because the next CTA on the SM starts only when this one
// leaves (~196 KB of shared memory: one CTA an SM).
// What differs from version 6 (its pair math is the same: the helpers both call, ws64_* and
// wg64p_*, and the masked exponentials' lambda line for line):
// - the walk: a static snake over the schedule (ws64p_position), as the twenty-eighth session's
//   persistent form had it, so that the column and its count stay warp-uniform values (a column
//   drawn from the work counter and handed on through shared memory put the pair loop's ring
//   positions in vector registers there);
// - every ring (Q / dO pairs, dS, dQ staging) counts the CTA's pairs (gq), not the column's;
// - a column's dK / dV are staged in the dS buffer its last pair used (free once both
//   warpgroups' last dQ products are done) and stored by the producer warpgroup's warp 2
//   (DKVFULL), which then releases that buffer (DSEMPTY, all 256 counts at once); so the Q / dO
//   ring is never used for staging and the producer loads the next column's first pair while the
//   consumers finish;
// - K / V in a ring of two (the hundred-and-tenth session): a column's K / V load a whole column
//   ahead, behind the first pair of the column before (KVEMPTY per buffer: after that buffer's
//   last dQ product, which reads K);
// - the last dQ of a column of >= 2 pairs is staged in the other dS buffer as in version 6 and
//   released by the reducer once read (DSEMPTY); a one-pair column stages it in the dQ staging;
// - the reducer arrives on DQEMPTY once more at each column's end (after all the column's
//   reduce-adds have read their staging), so that every column adds as many phases as it has
//   pairs and the parities stay global;
// - a column without entries stores its zero dK / dV from the consumers' threads (no TMA).
// Measured (H100s, 16k x 16 x 64, main kernel against version 6). With one K / V buffer
// (bench/results/bwd-s109-ws64-persistent.txt): 3 % kept -9.5 %, 10 % -1..-4 %, causal 3 / 10 %
// -6.6 / -2.8 %, 0.8 % -4..-6 us; but dense +0.8..+1.8 % and a 24 %-kept video mask +2.2 %.
// With the K / V ring (bench/results/bwd-s110-ws64p-kv-ring.txt): dense level (+0.0..+0.8 %,
// causal level), 10 % -11..-20 us, 3 % -26, video negl 0.5 -31, causal 3 % / 0.8 % -16 / -8.5,
// 4 x 4k 10 % -21; but 0.8 % level / +2, 4 x 4k 3 % +4.5 and the 24 %-kept video mask +15 us
// (+1.2 %), where the static walk leaves the CTAs' loads uneven (dev/cuda/column_walk_model.py).
// With the rotated snake (ws64p_position; bench/results/bwd-s111-ws64p-rotate.txt, H200): 10 %
// -20 us, 3 % -34, 0.8 % -26, the video masks negl 0.2 / 0.5 -20 / -34, causal 3 % / 0.8 % -25 /
// -16, 4 x 4k 10 % / 3 % -28 / -27; dense +0.6..+1.0 % (the K / V ring's form without the
// rotation +0.9..+1.4 % on that H200). The default for non-causal calls since the
// hundred-and-eleventh session, for causal calls of at most 8192 query rows since the
// hundred-and-fourteenth, and for every causal call since the hundred-and-fifteenth
// (attn_bwd_sm90.cu has the measurements). Before: picked on
// the device for sparse calls (dev/cuda/wip/bwd-ws64p-pick.patch, with one K / V buffer) it took
// 8-21 us off the non-causal sparse rows, but the pick's returning grid and a slower version 6
// on the one video row measured there kept it out (bench/results/bwd-s109-ws64-pick.txt).
#pragma once
#include "bwd_ws64_sm90.cuh"

namespace bl_bwd {

// Dev only (-DBL_BWD_TIMELINE, `attn_bwd timeline64`): version 6's twelve pair stamps
// (BL_TLC in bwd_ws64_sm90.cuh) at the same places, in CTA 0's first column only (its pairs
// `it` would otherwise be overwritten by the next column's).
#ifdef BL_BWD_TIMELINE
#define BL_TLCP(i) bl_tl_store(lane == 0 && (warp & 3) == 0 && k == 0, wg, it, i)
#else
#define BL_TLCP(i) \
    do {           \
    } while (0)
#endif

// mbarriers at wg64p_smem::BARS: FULL / EMPTY (the pair ring; wg64p_tma_pair completes on FULL)
// and DQFULL / DQEMPTY (one per consumer warpgroup) where ws_bars has them, then the dS ring, K /
// V and the dK / dV staging.
struct ws64p_bars {
    static constexpr uint32_t DSFULL = ws_bars::DQEMPTY + 16;  // [2] a pair's dS, 256 threads
    static constexpr uint32_t DSEMPTY = DSFULL + 16;  // [2] dS read by both dQ products (256)
    static constexpr uint32_t KVFULL = DSEMPTY + 16;  // [2] a column's K / V landed (TMA)
    static constexpr uint32_t KVEMPTY = KVFULL + 16;  // [2] K / V read by all 256 consumer threads
    static constexpr uint32_t DKVFULL = KVEMPTY + 16;  // dK / dV staged by all 256 consumer threads
    // dK / dV stored (the stores have read their staging): a column stages its dK / dV only
    // once the column before's are stored, so that DKVFULL's phases never run two ahead of the
    // storing thread's waits (a one-pair column stages in the other dS buffer and could).
    static constexpr uint32_t DKVEMPTY = DKVFULL + 8;
    static constexpr uint32_t BYTES = DKVEMPTY + 8;
};
static_assert(ws_bars::FULL == 0 && ws_bars::EMPTY == 16 && ws_bars::DQFULL == 32 &&
                  ws_bars::DQEMPTY == 48, "the rings of ws_bars first");
// Light row tiles (bwd_params::dq_direct at head dim 64): per pair gq, in ring slot gq % 8 after
// the mbarriers, two bits per entry s at 2s -- bit 0: its row tile is light (bl_bwd_dq16_tile:
// its dQ goes to dq in 16-bit), bit 1: it is the tile's only entry (stored, not added). Written
// by the producer before the pair's FULL arrive; read by the consumers when they stage the pair's
// dQ and by the reducer after DQFULL (at most ~6 pairs apart: the rings of two between them).
constexpr uint32_t WS64P_FLAGS = ws64p_bars::BYTES;  // from wg64p_smem::BARS
constexpr int WS64P_FLAG_SLOTS = 8;
constexpr uint32_t WS64P_DQ16_ROWS = DQ_BOX_ROWS;  // p.tm_dq16's box at head dim 64: a warp's rows
static_assert(wg64p_smem::DQS - wg64p_smem::BARS >= WS64P_FLAGS + WS64P_FLAG_SLOTS * 4,
              "room for the mbarriers and the flags");
static_assert(wg64p_smem::DS_BUF == 2 * wg64p_smem::PANEL, "dK and dV fit one dS buffer");
// K / V in a ring of two (the CTA's kc-th column with entries in buffer kc & 1), so that the
// producer loads the next column's K / V a whole column ahead: buffer 0 is version 6's (L::K,
// L::V), buffer 1 after its layout's end. That takes the 227 KB a CTA can have, with no room for
// bl_smem_aligned's slack: the kernel traps where the dynamic shared memory does not start on a
// 1024-byte boundary (it does on sm_90 where a kernel has no static shared memory).
constexpr uint32_t WS64P_KV1 = wg64p_smem::USED;
constexpr size_t WS64P_SMEM_BYTES = WS64P_KV1 + 2 * wg64p_smem::PANEL;
static_assert(WS64P_KV1 % 1024 == 0 && wg64p_smem::V == wg64p_smem::K + wg64p_smem::PANEL,
              "each K / V buffer: K, then V, a panel each, 1024-aligned");
static_assert(WS64P_SMEM_BYTES <= 232448, "227 KB of shared memory per CTA on sm_90");
__device__ __forceinline__ uint32_t ws64p_kv(uint32_t s0, int kc) {
    return s0 + ((kc & 1) ? WS64P_KV1 : wg64p_smem::K);
}

// The CTA's k-th schedule position: round k takes positions k G .. k G + G - 1 (G CTAs),
// forward in even rounds and backward in odd ones, so that within each window of the schedule
// (two rounds without a causal mask, four with one; heaviest first) a CTA's heavier column is
// paired with a lighter one. The pairs' sums are not equal (columns 0 + 2G-1 against G-1 + G),
// and without more the same CTAs take the heavy sums in every window: so the CTAs turn by an odd
// stride of about 2 / 5 of G every two rounds, which spreads the excess over all of them.
// Without a causal mask: a model of the walk on the bench's masks (dev/cuda/column_walk_model.py,
// fitted to the measured snake) gives the largest CTA load at 16k x 16 x 64: video negl 0.2 1291
// -> 1259 us, random 0.8 % 149 -> 113, against a dynamic walk's 1257 / 105
// (bench/results/bwd-s110-ws64p-kv-ring.txt); measured on an H200 the main kernel fell by 37
// and 23 us on those calls (bench/results/bwd-s111-ws64p-rotate.txt). Causal calls walked the
// plain snake until the hundred-and-fifteenth session (on the one global sort they took when the
// rotation was first measured the model found the plain snake within 1 % of the dynamic walk);
// on their four-round windows the rotation took 7-21 % off the main kernel of random masks
// keeping 3-25 % at 4k and 8k rows (H100, bench/results/bwd-s115-causal-rotate.txt; the model
// predicted 9-13 %). The model finds no stride (--rotate) more than ~3 % better than 2 / 5.
constexpr int WS64P_ROTATE_NUM = 2, WS64P_ROTATE_DEN = 5;  // odd stride ~0.4 G
__device__ __forceinline__ int ws64p_position(int k) {
    const int g = (int)gridDim.x;
    const int stride = (WS64P_ROTATE_NUM * g / WS64P_ROTATE_DEN) | 1;
    const int c = ((int)blockIdx.x + (k >> 1) * stride) % g;
    const int x = (k & 1) ? g - 1 - c : c;
    return k * g + x;
}
// How many columns the CTA walks (known up front, so that the walk's counters stay uniform).
__device__ __forceinline__ int ws64p_cta_columns(int num_cols) {
    const int rounds = (num_cols + (int)gridDim.x - 1) / (int)gridDim.x;
    return ws64p_position(rounds - 1) < num_cols ? rounds : rounds - 1;
}
// The CTA's k-th column, decoded in 32 bits as version 6 does.
struct ws64p_column {
    int b, g, n, count;
    const int *list;
};
__device__ __forceinline__ ws64p_column ws64p_take(const bwd_params &p, int k) {
    const int4 rec = p.sched_rec[ws64p_position(k)];
    const int tn = (int)p.dm.tiles_n, hk = (int)p.dm.heads_k;
    const int bg = rec.x / tn, b = bg / hk;
    ws64p_column c;
    c.b = b;
    c.g = bg - b * hk;
    c.n = rec.x - bg * tn;
    c.count = rec.y;
    c.list = p.lists + (int64_t)rec.x * (p.dm.group * p.dm.tiles_m);
    return c;
}

// A column without entries: its dK / dV are zeros, stored by the 256 consumer threads (16-byte
// stores; keys past Sk left alone).
template <typename T>
__device__ __forceinline__ void ws64p_store_zero_dkv(const bwd_params &p, const ws64p_column &cl,
                                                     int ct) {
    constexpr int CHUNKS = 64 / CHUNK;  // 16-byte chunks of a key's row
    const int64_t key0 = (int64_t)cl.n * BN;
    for (int i = ct; i < 2 * BN * CHUNKS; i += THREADS) {
        const int x = i / (BN * CHUNKS), r = (i / CHUNKS) % BN, c = i % CHUNKS;
        if (key0 + r >= p.dm.seqlen_k) continue;
        T *dst = x == 0 ? static_cast<T *>(p.dk) + cl.b * p.dk_sb + (key0 + r) * p.dk_ss +
                              cl.g * p.dk_sh
                        : static_cast<T *>(p.dv) + cl.b * p.dv_sb + (key0 + r) * p.dv_ss +
                              cl.g * p.dv_sh;
        *reinterpret_cast<uint4 *>(dst + CHUNK * c) = make_uint4(0, 0, 0, 0);
    }
}

// Light row tiles' dQ in 16-bit (the DQ16 form, bwd_params::dq_direct at head dim 64: picked on
// the device for light masked calls, bl_bwd_ws64p_dq16_chosen). An entry whose row tile has at
// most BL_DQ16_MAX_WRITERS entries (bwd_params::dq_writers) goes to dq itself -- stored where it
// is the tile's only entry, else reduce-added in 16-bit onto the zeros the preprocess's zero CTAs
// wrote -- so that the tile skips the fp32 accumulator and the dq conversion
// (bl_bwd_postprocess_launch leaves it alone). As in version 10's DIRECT form, the consumers stage
// such an entry in 16-bit (half the bytes of the fp32 staging) and the reducer's copies only
// change type: a reducer warp that converted the fp32 staging itself made the main kernel ~2x
// slower (bench/results/bwd-s117-ws64p-dq16.txt). dq's error with 16 entries stays inside
// PyTorch's own bf16 backward's (BL_DQ16_MAX_WRITERS).
// The pair's flags (WS64P_FLAGS) from its entries' row tiles.
__device__ __forceinline__ unsigned ws64p_pair_flags(const bwd_params &p, int b,
                                                     const wg64p_entry (&e)[2]) {
    unsigned w[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {  // both loads first
        const int64_t tile = ((int64_t)b * p.dm.heads_q + e[s].h) * p.dm.tiles_m + e[s].row0 / BM;
        w[s] = e[s].live() ? bl_bwd_tile_writers(bl_bwd_tile_writer_runs(p.dq_writers, tile)) : 0u;
    }
    unsigned f = 0;
#pragma unroll
    for (int s = 0; s < 2; ++s)
        if (e[s].live() && bl_bwd_dq16_tile(w[s])) f |= (w[s] == 1 ? 3u : 1u) << (2 * s);
    return f;
}
// A warp's dQ block (fragment dq[32] as in dq_block_stage: rows lg / lg + 8, columns 8t + 2lt
// (+1)) in 16-bit is staged as dq * scale by ws_stage_dkv<T, 32> with warp 0 (the address given
// is already this warp's block: 16 rows of 128 bytes, 128B-swizzled, the box of p.tm_dq16 at
// head dim 64). The caller fences and syncs as after dq_block_stage<false>; the reducer puts
// each warp's block with one dq16_box_copy (as version 10's ws_put_dq16 does its panels).

// DQ16: the form with light row tiles in 16-bit (above). A masked call with p.dq_direct launches
// both forms, DQ16 first, with p.totals set, and the one bl_bwd_ws64p_dq16_chosen does not pick
// returns at once: a chain of programmatic dependents (below), which took 11-17 us off calls that
// pick the DQ16 form and put 3-10 us on those that pick the plain one (bench/results/
// bwd-s118-ws64p-pdl.txt), most of which a one-CTA link between the forms took back
// (bwd-s119-gate16-spacer.txt).
template <typename T, bool DQ16 = false>
__global__ void __launch_bounds__(WS_THREADS, 1) bwd_ws64p_kernel(const __grid_constant__ bwd_params p) {
    constexpr int D = 64;
    using L = wg64p_smem;
    constexpr int NQ = PAIR_ROWS / 8;  // n8 tiles of queries (S^T, dP^T): 16
    constexpr int NQ_ENTRY = BM / 8;   // of them per entry: 8
    constexpr int ND = D / 8;          // n8 tiles of head dim (dK, dV, dQ): 8
    constexpr int KSTEPS_Q = PAIR_ROWS / 16;  // dV / dK steps over the pair's queries: 8
    constexpr int WG_WARPS = WARPS / 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    if (p.totals != nullptr) {
        // As version 10's two forms (bwd_ws128_sm90.cuh): the DQ16 form is the preprocess's
        // programmatic dependent and the plain form that of a one-CTA link behind it
        // (launch_chain_link, which completes after the DQ16 form), so that the second's launch
        // overlaps the first's run. The DQ16 form lets its dependents launch once its wait has
        // made the totals final, the plain form at once; the one the totals do not pick returns,
        // the plain form's CTA 0 only once the link (so the DQ16 form) has completed (so the
        // plain grid, which the conversion waits for, completes after both); a picked plain form
        // waits for it before it starts. (A picked form's kernel launched straight behind the
        // other one ran 8-12 us longer than behind the preprocess, in either order; not
        // understood: bench/results/bwd-s118-ws64p-pdl.txt. The link took most of it back:
        // bwd-s119-gate16-spacer.txt.)
        if (DQ16) griddep_wait();
        griddep_launch_dependents();
        const bool picked = DQ16 == bl_bwd_ws64p_dq16_chosen(p.totals, p.dm);
        if (!picked && (DQ16 || blockIdx.x != 0)) return;
        if (!DQ16) griddep_wait();
        if (!picked) return;
    }
    if (bl_smem_addr(smem_raw) % L::BASE_ALIGN != 0) __trap();  // (WS64P_SMEM_BYTES: no slack)
    unsigned char *smem_base = smem_raw;
    const uint32_t s0 = bl_smem_addr(smem_base);
    const uint32_t bars = s0 + L::BARS;
    const float *s_rows = reinterpret_cast<const float *>(smem_base + L::ROWS);
    unsigned *s_flags = reinterpret_cast<unsigned *>(smem_base + L::BARS + WS64P_FLAGS);
    const bl_bwd_dims &dm = p.dm;
    const int cta_cols = ws64p_cta_columns((int)(dm.batch * dm.heads_k * dm.tiles_n));

    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; ++i) {
            mbarrier_init(bars + ws_bars::FULL + 8 * i, 1);
            mbarrier_init(bars + ws_bars::EMPTY + 8 * i, THREADS);  // every consumer thread
            mbarrier_init(bars + ws_bars::DQFULL + 8 * i, WG_WARPS);
            mbarrier_init(bars + ws_bars::DQEMPTY + 8 * i, 1);
            mbarrier_init(bars + ws64p_bars::DSFULL + 8 * i, THREADS);
            mbarrier_init(bars + ws64p_bars::DSEMPTY + 8 * i, THREADS);
            mbarrier_init(bars + ws64p_bars::KVFULL + 8 * i, 1);
            mbarrier_init(bars + ws64p_bars::KVEMPTY + 8 * i, THREADS);
        }
        mbarrier_init(bars + ws64p_bars::DKVFULL, THREADS);
        mbarrier_init(bars + ws64p_bars::DKVEMPTY, 1);
        fence_mbarrier_init();
    }
    __syncthreads();

    const int role_wg = bl_warpgroup_uniform();  // 0: producer, 1 and 2: consumers
    if (role_wg == 0) {
        // ---- producer warpgroup ----
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            // The CTA's pair gq into buffer gq & 1 once pair gq - 2 has been read (the first
            // wait on each EMPTY passes at once). K / V a column ahead: the first column's before
            // anything, then behind each column's first pair the next column's (the CTA's kc-th
            // with entries, into K / V buffer kc & 1 once the consumers are done with column
            // kc - 2's, KVEMPTY). Columns without entries load nothing.
            int gq = 0, kc = 0;
            int kv_col = 0;  // the next column whose K / V are to load (cta_cols: none)
            auto load_next_kv = [&]() {
                while (kv_col < cta_cols && p.sched_rec[ws64p_position(kv_col)].y <= 0)
                    ++kv_col;
                if (kv_col >= cta_cols) return;
                const ws64p_column c = ws64p_take(p, kv_col++);
                const int slot = kc & 1;
                mbarrier_wait(bars + ws64p_bars::KVEMPTY + 8 * slot, ((uint32_t)(kc >> 1) & 1u) ^ 1u);
                const uint32_t kv = ws64p_kv(s0, kc);
                ws_tma_kv_tile<D>(p, kv, kv + L::PANEL, bars + ws64p_bars::KVFULL + 8 * slot, c.b,
                                  c.g, (int64_t)c.n * BN);
                ++kc;
            };
            load_next_kv();
            for (int k = 0; k < cta_cols; ++k) {
                const ws64p_column cl = ws64p_take(p, k);
                const int pairs = (cl.count + 1) / 2;
                for (int it = 0; it < pairs; ++it, ++gq) {
                    const int buf = gq & 1;
                    mbarrier_wait(bars + ws_bars::EMPTY + 8 * buf, ((uint32_t)(gq >> 1) & 1u) ^ 1u);
                    const wg64p_entry e[2] = {
                        wg64p_decode(p, cl.g, cl.list[2 * it]),
                        wg64p_decode(p, cl.g, 2 * it + 1 < cl.count ? cl.list[2 * it + 1] : -1)};
                    if (DQ16)  // (before the FULL arrive in wg64p_tma_pair publishes them)
                        s_flags[gq % WS64P_FLAG_SLOTS] = ws64p_pair_flags(p, cl.b, e);
                    wg64p_tma_pair(p, s0, buf, cl.b, e);  // an empty slot's lse / Dlt: `empty1`
                    if (it == 0) load_next_kv();
                }
            }
        } else if (threadIdx.x == 32) {
            // Pair gq's dQ, staged by each consumer warpgroup on its own (warps 4w.. hold entry
            // w's rows), reduced in the warpgroups' order. DQEMPTY: one arrive a pair and
            // warpgroup -- the staging of pair gq read (gq + 2 < the column's end), the column's
            // second-to-last pair taken (its last dQ has a staging of its own), and at the
            // column's end once every staging of the column has been read.
            int gq = 0;
            for (int k = 0; k < cta_cols; ++k) {
                const ws64p_column cl = ws64p_take(p, k);
                const int pairs = (cl.count + 1) / 2;
                if (pairs == 0) continue;
                const int last = gq + pairs - 1;
                for (int it = 0; it < pairs; ++it, ++gq) {
                    const wg64p_entry e[2] = {
                        wg64p_decode(p, cl.g, cl.list[2 * it]),
                        wg64p_decode(p, cl.g, 2 * it + 1 < cl.count ? cl.list[2 * it + 1] : -1)};
                    const uint32_t stage = gq == last && pairs >= 2
                                               ? s0 + L::DS + (uint32_t)((last - 1) & 1) * L::DS_BUF
                                               : s0 + L::DQS;
                    const bool reused = it + 2 < pairs;
#pragma unroll 1
                    for (int w = 0; w < 2; ++w) {
                        const wg64p_entry mine = w == 0 ? e[0] : e[1];  // (no local-memory array)
                        mbarrier_wait(bars + ws_bars::DQFULL + 8 * w, (uint32_t)gq & 1u);
                        if (it == pairs - 2) mbarrier_arrive(bars + ws_bars::DQEMPTY + 8 * w);
                        // a light entry's blocks in 16-bit (WS64P_FLAGS; p.dq_direct)
                        const unsigned fl = DQ16 ? s_flags[gq % WS64P_FLAG_SLOTS] >> (2 * w) : 0u;
                        if (DQ16 && mine.live() && (fl & 1u)) {
#pragma unroll 1
                            for (int j = 0; j < WG_WARPS; ++j)
                                // (a warp's 16 rows a box; rows past Sq are skipped)
                                dq16_box_copy(p, stage + (uint32_t)(WG_WARPS * w + j) * DQ_WARP_BYTES,
                                              0, mine.row0 + 16 * j, mine.h, cl.b, !(fl & 2u));
                            bulk_commit_group();
                        } else if (mine.live()) {
#pragma unroll 1
                            for (int j = 0; j < WG_WARPS; ++j)
                                dq_block_reduce(p, stage + (uint32_t)(WG_WARPS * w + j) * DQ_WARP_BYTES,
                                                0, mine.h, mine.row0 + 16 * j, cl.b);
                        }
                        if (reused) {
                            bulk_wait_group_read<0>();  // the staging may be rewritten
                            mbarrier_arrive(bars + ws_bars::DQEMPTY + 8 * w);
                        }
                    }
                }
                bulk_wait_group_read<0>();  // every staging of the column has been read
                mbarrier_arrive(bars + ws_bars::DQEMPTY);
                mbarrier_arrive(bars + ws_bars::DQEMPTY + 8);
                // the last dQ's staging, the dS buffer of pair last - 1, may take dS again
                if (pairs >= 2)
                    mbarrier_arrive_count(bars + ws64p_bars::DSEMPTY + 8 * ((last - 1) & 1), THREADS);
            }
            bulk_wait_group<0>();  // the reduce-adds complete before the CTA goes away
        } else if (threadIdx.x == 64) {
            // A column's dK / dV, staged in the dS buffer of its last pair, stored by TMA; that
            // buffer then takes dS again (DSEMPTY for pair last, all its counts at once).
            int gq = 0, kd = 0;
            for (int k = 0; k < cta_cols; ++k) {
                const ws64p_column cl = ws64p_take(p, k);
                const int pairs = (cl.count + 1) / 2;
                if (pairs == 0) continue;
                gq += pairs;
                const int last = gq - 1;
                const uint32_t src = s0 + L::DS + (uint32_t)(last & 1) * L::DS_BUF;
                mbarrier_wait(bars + ws64p_bars::DKVFULL, (uint32_t)kd & 1u);
                ++kd;
                tma_store_4d(&p.tm_dk, src, 0, cl.n * BN, cl.g, cl.b);
                tma_store_4d(&p.tm_dv, src + L::PANEL, 0, cl.n * BN, cl.g, cl.b);
                bulk_commit_group();
                bulk_wait_group_read<0>();
                mbarrier_arrive_count(bars + ws64p_bars::DSEMPTY + 8 * (last & 1), THREADS);
                mbarrier_arrive(bars + ws64p_bars::DKVEMPTY);
            }
            bulk_wait_group<0>();  // the stores complete before the CTA goes away
        }
        return;
    }

    // ---- consumer warpgroups ----
    // Per column, per pair (the CTA's pair gq), each warpgroup: [turn] S^T, dP^T [pass the
    // turn]; P^T, dS^T; [turn] dV, dK [pass the turn]; dS into DS[gq & 1]; pair gq-1's dQ from
    // DS[(gq-1) & 1], staged. Every turn is taken and passed once per warpgroup and phase:
    // warpgroup 1 passes one in advance at the column's start and warpgroup 0 takes that one
    // back after the column's last pair.
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;         // consumer thread 0..255
    const int lane = ct & 31, warp = ct >> 5;  // consumer warp 0..7
    const int wg = role_wg - 1;                // keys 64wg..64wg+63; dQ of entry wg
    const int lg = lane >> 2, lt = lane & 3;
    const int kw = warp * KEYS_PER_WARP;
    const uint32_t sdq = s0 + L::DQS + (uint32_t)warp * DQ_WARP_BYTES;
    const uint32_t dqfull = bars + ws_bars::DQFULL + 8 * wg;
    const uint32_t dqempty = bars + ws_bars::DQEMPTY + 8 * wg;
    const int64_t diag = dm.seqlen_k - dm.seqlen_q;  // query i sees keys j <= i + diag

    int gq0 = 0;  // the CTA's pairs before this column: the rings' position
    int kc = 0;   // the CTA's K / V loads before this column (and dK / dV stagings)
    for (int k = 0; k < cta_cols; ++k) {
        const ws64p_column cl = ws64p_take(p, k);
        const int count = cl.count, pairs = (count + 1) / 2;
        // dev column stamps (-DBL_BWD_COLS64; no code otherwise): by schedule position
        BL_TL64P(ct == 0, ws64p_position(k), 0);
        BL_TL64P_INFO(ct == 0, ws64p_position(k), count,
                      (int)(dm.batch * dm.heads_k * dm.tiles_n));
        if (pairs == 0) {
            ws64p_store_zero_dkv<T>(p, cl, ct);
            BL_TL64P(ct == 0, ws64p_position(k), 4);
            BL_TL64P(ct == 0, ws64p_position(k), 5);
            continue;
        }
        const int64_t key0 = (int64_t)cl.n * BN;
        const int64_t key_room = dm.seqlen_k - key0;
        const int key_limit = key_room < BN ? (int)key_room : BN;

        float dk_acc[ND * 4], dv_acc[ND * 4];
#pragma unroll
        for (int x = 0; x < ND * 4; ++x) dk_acc[x] = dv_acc[x] = 0.0f;
        const uint32_t sK = ws64p_kv(s0, kc), sV = sK + L::PANEL;  // this column's K / V buffer
        mbarrier_wait(bars + ws64p_bars::KVFULL + 8 * (kc & 1), (uint32_t)(kc >> 1) & 1u);  // by TMA
        BL_TL64P(ct == 0, ws64p_position(k), 1);
        if (wg == 1) named_barrier_arrive(WS64_TURN0, THREADS);  // warpgroup 0 issues first

        // Pair gq-1's dQ, issued in the iteration of pair gq (zeroed once a column: see version 6).
        float dq[ND * 4];
#pragma unroll
        for (int x = 0; x < ND * 4; ++x) dq[x] = 0.0f;
        for (int it = 0; it < pairs; ++it) {
            const int gq = gq0 + it;
            const int buf = gq & 1;
            mbarrier_wait(bars + ws_bars::FULL + 8 * buf, (uint32_t)(gq >> 1) & 1u);
            BL_TLCP(0);
            const uint32_t sQ = s0 + L::Q + buf * L::PANEL;
            const uint32_t sdO = s0 + L::DO + buf * L::PANEL;
            const float *lse2 = s_rows + buf * PAIR_ROWS;
            const float *dlt = s_rows + (2 + buf) * PAIR_ROWS;
            const bool empty1 = 2 * it + 1 == count;  // see version 6

            // ---- S^T = K Q^T and dP^T = V dO^T (this warpgroup's 64 keys x 128 queries) ----
            float s[NQ * 4], ds[NQ * 4];
            bl_acc_overwritten(s);
            named_barrier_sync(WS64_TURN0 + wg, THREADS);
            ws64_issue_s_dp<T>(s, ds, sK, sV, sQ, sdO, wg);
            named_barrier_arrive(WS64_TURN0 + (wg ^ 1), THREADS);
            BL_TLCP(1);
            int row0_e[2] = {0, 0};
#pragma unroll
            for (int slot = 0; slot < 2; ++slot) {
                int hl, m;
                if (2 * it + slot < count) {
                    ws_split_code(cl.list[2 * it + slot], (int)dm.tiles_m, dm.group == 1, hl, m);
                    row0_e[slot] = m * BM;
                }
            }
            bl_wgmma_wait<1>();  // S^T is done; dP^T may still run
            bl_reg_fence(s);
            BL_TLCP(2);

            // ---- P^T: recompute the probabilities from lse; zero what the mask forbids ----
            bool need_mask[2];
            int causal_limit[2];
            ws64_mask_reach(p, key0, diag, row0_e, need_mask, causal_limit);
            auto exps = [&](bool masked) {
#pragma unroll
                for (int t = 0; t < NQ; ++t) {
                    const int e = t / NQ_ENTRY;  // which entry these 8 queries belong to
                    float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * t + 2 * lt);
                    if (e == 1 && empty1) l = make_float2(INFINITY, INFINITY);
#pragma unroll
                    for (int x = 0; x < 4; ++x) {
                        s[4 * t + x] =
                            exp2f(fmaf(s[4 * t + x], p.scale_log2, (x & 1) ? -l.y : -l.x));
                        if (masked) {
                            const int jr = kw + lg + ((x >> 1) << 3);              // key - key0
                            const int ir = 8 * (t % NQ_ENTRY) + 2 * lt + (x & 1);  // query - row0
                            if (need_mask[e] && (jr >= key_limit || jr - ir > causal_limit[e]))
                                s[4 * t + x] = 0.0f;
                        }
                    }
                }
            };
            if (need_mask[0] || need_mask[1])
                exps(true);
            else
                exps(false);

            // ---- dS^T = P^T * (dP^T - Dlt), then both A operands packed ----
            BL_TLCP(3);
            float2 dlt_r[NQ];
            ws64_load_dlt(dlt_r, dlt, empty1, lt);
            bl_wgmma_wait<0>();  // dP^T is done
            bl_reg_fence(ds);
            BL_TLCP(4);
            ds_from_dp<NQ>(ds, s, dlt_r);
            uint32_t pa[KSTEPS_Q][4], dsa[KSTEPS_Q][4];
            wg64p_pack_a<T>(s, ds, pa, dsa);

            // ---- dV += P^T dO and dK += dS^T Q (A from registers), dS to shared memory ----
            named_barrier_sync(WS64_TURN0 + wg, THREADS);
            bl_wgmma_fence();
            wg64p_issue_dv_dk<T, D>(dv_acc, dk_acc, pa, dsa, sdO, sQ);
            bl_wgmma_commit();
            named_barrier_arrive(WS64_TURN0 + (wg ^ 1), THREADS);
            // dS buffer buf held pair gq-2's dS (or, across a column's end, its dK / dV staging or
            // its last dQ's): released by both dQ products, the dK / dV stores or the reducer.
            BL_TLCP(5);
            mbarrier_wait(bars + ws64p_bars::DSEMPTY + 8 * buf, ((uint32_t)(gq >> 1) & 1u) ^ 1u);
            BL_TLCP(6);
            store_ds_tile(s0 + L::DS + buf * L::DS_BUF + wg * L::PANEL, dsa, warp, lane);
            bl_fence_proxy_async();  // the other warpgroup's wgmma reads what stmatrix wrote
            mbarrier_arrive(bars + ws64p_bars::DSFULL + 8 * buf);
            BL_TLCP(7);

            // ---- pair gq-1's dQ (entry wg's rows), behind dV / dK ----
            // Unconditional (see version 6): at it == 0 it reads the K panels, its result
            // dropped; its wait is then on a phase long complete (or parity 1 of a fresh barrier).
            mbarrier_wait(bars + ws64p_bars::DSFULL + 8 * (buf ^ 1),
                          (uint32_t)((gq - 1) >> 1) & 1u);
            BL_TLCP(8);
            wg64p_issue_dq<T>(dq, it > 0 ? s0 + L::DS + (buf ^ 1) * L::DS_BUF : sK, sK, wg);
            BL_TLCP(9);
            bl_wgmma_wait<0>();  // dV, dK and dQ are done: Q / dO buffer buf is free
            bl_reg_fence(pa);
            bl_reg_fence(dsa);
            bl_reg_fence(dq);
            BL_TLCP(10);
            if (it > 0) {
                // pair gq-1's dS buffer is free -- but for the column's second-to-last pair,
                // whose buffer takes the last dQ's staging: the reducer releases that one
                if (it < pairs - 1) mbarrier_arrive(bars + ws64p_bars::DSEMPTY + 8 * (buf ^ 1));
                // the reducer has read this warpgroup's staging of pair gq-3
                mbarrier_wait(dqempty, ((uint32_t)(gq - 1) & 1u) ^ 1u);
                if (DQ16 && (s_flags[(gq - 1) % WS64P_FLAG_SLOTS] >> (2 * wg) & 1u))
                    ws_stage_dkv<T>(sdq, dq, p.scale, 0, lane);  // a light tile's: 16-bit
                else
                    dq_block_stage<false>(sdq, dq);
                bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
                __syncwarp();
                if (lane == 0) mbarrier_arrive(dqfull);
            }
            BL_TLCP(11);
            mbarrier_arrive(bars + ws_bars::EMPTY + 8 * buf);
        }
        const int last = gq0 + pairs - 1;
        gq0 += pairs;
        BL_TL64P(ct == 0, ws64p_position(k), 2);
        bl_reg_fence(dk_acc);
        bl_reg_fence(dv_acc);
        // ---- the column's end ----
        // The last pair's dQ (reads DS[last & 1] and K); then K / V go back to the producer,
        // dK / dV are staged in DS[last & 1] once both warpgroups' last dQ products are done,
        // and the last dQ in DS[(last - 1) & 1] (free since both dQ products of pair last - 1
        // completed in the loop) or, for a one-pair column, in the dQ staging.
        if (wg == 0) named_barrier_sync(WS64_TURN0, THREADS);  // warpgroup 1's advance turn
        mbarrier_wait(bars + ws64p_bars::DSFULL + 8 * (last & 1), (uint32_t)(last >> 1) & 1u);
        wg64p_issue_dq<T>(dq, s0 + L::DS + (last & 1) * L::DS_BUF, sK, wg);
        bl_wgmma_wait<0>();
        bl_reg_fence(dq);
        mbarrier_arrive(bars + ws64p_bars::KVEMPTY + 8 * (kc & 1));
        named_barrier_sync(WS_BAR_LOOP_TOP, THREADS);  // both warpgroups' last dQ products done
        const uint32_t sdkv = s0 + L::DS + (uint32_t)(last & 1) * L::DS_BUF;
        mbarrier_wait(bars + ws64p_bars::DKVEMPTY, ((uint32_t)kc & 1u) ^ 1u);  // last column's stored
        ++kc;
        ws_stage_dkv<T>(sdkv, dk_acc, p.scale, warp, lane);
        ws_stage_dkv<T>(sdkv + L::PANEL, dv_acc, 1.0f, warp, lane);
        bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
        mbarrier_arrive(bars + ws64p_bars::DKVFULL);
        BL_TL64P(ct == 0, ws64p_position(k), 3);
        mbarrier_wait(dqempty, ((uint32_t)last & 1u) ^ 1u);
        const uint32_t last_stage =
            pairs >= 2 ? s0 + L::DS + (uint32_t)((last - 1) & 1) * L::DS_BUF : s0 + L::DQS;
        if (DQ16 && (s_flags[last % WS64P_FLAG_SLOTS] >> (2 * wg) & 1u)) {
            ws_stage_dkv<T>(last_stage + (uint32_t)warp * DQ_WARP_BYTES, dq, p.scale, 0, lane);
            bl_fence_proxy_async();  // the copy engine reads what stmatrix wrote
            __syncwarp();
        } else {
            dq_block_stage(last_stage + (uint32_t)warp * DQ_WARP_BYTES, dq);
        }
        if (lane == 0) mbarrier_arrive(dqfull);
        BL_TL64P(ct == 0, ws64p_position(k), 4);
        BL_TL64P(ct == 0, ws64p_position(k), 5);
    }
}

}  // namespace bl_bwd
