// attn_bwd.cu -- standalone checker and timer of the sm_90a selection and block-sparse backward
// (src/cuda/attn_bwd_sm90.cu, select_sm90.cu, bwd_lists_sm90.cu, bwd_prepost_sm90.cu), llm.c style.
//
// check: builds its own inputs, runs a float64 CPU forward (out, lse, tile mass W), then compares
//   the GPU dq/dk/dv against a float64 CPU backward over exactly the kept tiles, for dense,
//   random-mask and selection modes over many shapes; and the GPU selection against the
//   library's CPU selection rule (src/select.c), bit for bit.
// bench: times dense and sparse backward on large shapes with CUDA events.
//
// Build (from the repo root):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math \
//        --expt-relaxed-constexpr -DBL_BWD_WITH_MMA_VARIANT -I include -I src -I src/cuda -o attn_bwd dev/cuda/attn_bwd.cu \
//        src/cuda/attn_bwd_sm90.cu src/cuda/select_sm90.cu src/cuda/bwd_lists_sm90.cu \
//        src/cuda/bwd_prepost_sm90.cu \
//        src/select.c src/error.c
// Run: ./attn_bwd check | ./attn_bwd small | ./attn_bwd bench
// `small`, `small64`, `smallp`, `smallpc`, `smallnc`: a few tiny cases for compute-sanitizer
// (everything quick; head dim 64; the non-causal packed / aligned walks; the causal packed walk;
// non-causal calls on the causal dense walk).
// Every case runs the shipped kernel of its head dim, the same kernel with cp.async row tiles
// (the library's fallback where TMA cannot describe Q / dO), the mma.sync kernel when built in,
// and the previous version (D = 64: version 1 of bwd_wgmma_sm90.cuh; D = 128: version 3b).
// `bench64` / `bench128` time the shipped kernel against its cp.async form.
// `sparse1 [KEEP]` / `sparsec [KEEP]` / `sparsen [KEEP]` / `sparse64 [KEEP]`: dense, then one
// random tile mask keeping KEEP (default 0.01): 16k x 16 x 128 full and causal / causal at 16k x
// 16 and 32k x 24 / the same two shapes without a causal mask / head dim 64; `sparsecg` /
// `sparseng [KEEP]` as sparsec / sparsen with four query heads per K / V head. `select1`: 16k x 16
// x 128 full and causal, dense then the selections from a banded W. `dense128`: the bench's
// head-dim-128 shapes (16k x 16, 32k x 24), dense only. `densenc`: dense non-causal head dim
// 128 at 8k, 16k, 32k (the 80-row kernel); `r80ab`: the same shapes, the 80-row kernel against
// the 64-row one (BL_BWD_VARIANT_WS128_ROWS64), three alternating rounds in one process; `r80ab
// causal`: the same at 16k x 16 and 32k x 24, causal.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "backlite.h"
#include "backend.h"
#include "bwd_workspace.h"
#include "bwd_common.cuh"  // bl_bwd_set_variant
extern "C" {
#include "cpu_select.h"  // the CPU selection rule, C linkage
}

// The backward's entry points ask bl_cuda_available() (defined with the forward, in
// attn_fwd_sm90.cu, which this checker does not link). A weak stand-in: any linked strong
// definition wins.
#ifdef BL_BWD_TIMELINE
extern "C" void bl_bwd_timeline_print(void);  // attn_bwd_sm90.cu, dev builds only
extern "C" void bl_bwd_timeline_cols_print(void);
extern "C" void bl_bwd_timeline_raw_print(void);
extern "C" void bl_bwd_timeline80_print(void);
#endif
#ifdef BL_BWD_COLS64
extern "C" void bl_bwd_cols64_print(void);  // attn_bwd_sm90.cu, dev builds only
#endif
extern "C" __attribute__((weak)) int bl_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 0;
    cudaDeviceProp prop;
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                    \
                    cudaGetErrorString(e_));                                                \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define BL(call)                                                                            \
    do {                                                                                    \
        bl_status s_ = (call);                                                              \
        if (s_ != BL_OK) {                                                                  \
            fprintf(stderr, "%s:%d %s: status %d: %s\n", __FILE__, __LINE__, #call, (int)s_, \
                    bl_last_error());                                                       \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

// ---- host helpers ----

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {  // xorshift64*, [0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand(void) {
    double u1 = urand() + 1e-300, u2 = urand();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint16_t to_bits(float x, bl_dtype dt) {
    if (dt == BL_DTYPE_BF16) {
        __nv_bfloat16 h = __float2bfloat16_rn(x);
        return *reinterpret_cast<uint16_t *>(&h);
    }
    __half h = __float2half_rn(x);
    return *reinterpret_cast<uint16_t *>(&h);
}
static float from_bits(uint16_t u, bl_dtype dt) {
    if (dt == BL_DTYPE_BF16) return __bfloat162float(*reinterpret_cast<__nv_bfloat16 *>(&u));
    return __half2float(*reinterpret_cast<__half *>(&u));
}

struct Case {
    int B, Sq, Sk, Hq, Hk, D, causal;
    bl_dtype dt;
    int mode;        // 0 dense, 1 random mask, 2 selection from the forward's W
    double keep;     // mode 1: probability a tile is kept
    float negl;      // mode 2
    int padded;      // 1: tensors live inside wider rows (strides != packed)
    int nan_row;     // 1: one q row of head 0 is NaN (checks NaN stays in its head)
    int synthetic;   // 1: long sequences: random out, made-up lse and W (no O(S^2) CPU forward),
                     //    and a CPU reference that visits the kept tiles only
    int pick;        // head dim 128, mask: the entries the device must pick (kPick*), or
                     //    kPickAny (the case fails when another kernel runs it)
};
enum { kPickAny = 0, kPickPacked = 1, kPickAligned = 2, kPickRows64 = 3 };

// A (B, S, H, D) tensor on the host: float values already rounded to the dtype, and its layout.
struct HostT {
    int B, S, H, D;
    int64_t sb, ss, sh;  // element strides
    std::vector<float> v;  // dense (B,S,H,D) copy of the values
    size_t alloc;          // elements of the strided buffer
    float &at(int b, int s, int h, int d) { return v[(((size_t)b * S + s) * H + h) * D + d]; }
};

static HostT make_t(int B, int S, int H, int D, int padded) {
    HostT t;
    t.B = B; t.S = S; t.H = H; t.D = D;
    const int hstride = padded ? D + 8 : D;      // gap between heads
    const int64_t sstride = (int64_t)H * hstride + (padded ? 16 : 0);
    t.sh = hstride; t.ss = sstride; t.sb = sstride * S + (padded ? 32 : 0);
    t.alloc = (size_t)t.sb * B;
    t.v.assign((size_t)B * S * H * D, 0.0f);
    return t;
}
static std::vector<uint16_t> pack(HostT &t, bl_dtype dt) {
    std::vector<uint16_t> buf(t.alloc, to_bits(0.0f, dt));
    for (int b = 0; b < t.B; ++b)
        for (int s = 0; s < t.S; ++s)
            for (int h = 0; h < t.H; ++h)
                for (int d = 0; d < t.D; ++d)
                    buf[b * t.sb + s * t.ss + h * t.sh + d] = to_bits(t.at(b, s, h, d), dt);
    return buf;
}
static void unpack(HostT &t, const std::vector<uint16_t> &buf, bl_dtype dt) {
    for (int b = 0; b < t.B; ++b)
        for (int s = 0; s < t.S; ++s)
            for (int h = 0; h < t.H; ++h)
                for (int d = 0; d < t.D; ++d)
                    t.at(b, s, h, d) = from_bits(buf[b * t.sb + s * t.ss + h * t.sh + d], dt);
}
static void fill_random(HostT &t, bl_dtype dt, double sigma) {
    for (auto &x : t.v) x = from_bits(to_bits((float)(sigma * nrand()), dt), dt);
}

static int64_t key_limit(int causal, int64_t i, int64_t Sq, int64_t Sk) {
    if (!causal) return Sk;
    int64_t l = i + Sk - Sq + 1;
    return l < 0 ? 0 : (l < Sk ? l : Sk);
}

// float64 forward: out (rounded to dtype), lse (fp32), W (fp32, (B,Hq,Tm,Tn)).
static void cpu_forward(const Case &c, HostT &q, HostT &k, HostT &v, HostT &out,
                        std::vector<float> &lse, std::vector<float> &W, float scale) {
    const int G = c.Hq / c.Hk, Tm = (c.Sq + 63) / 64, Tn = (c.Sk + 127) / 128;
    lse.assign((size_t)c.B * c.Hq * c.Sq, 0.0f);
    W.assign((size_t)c.B * c.Hq * Tm * Tn, 0.0f);
    std::vector<double> s(c.Sk), o(c.D), wacc((size_t)Tn);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.Hq; ++h) {
            const int g = h / G;
            std::vector<double> wrow((size_t)Tm * Tn, 0.0);
            for (int i = 0; i < c.Sq; ++i) {
                const int64_t lim = key_limit(c.causal, i, c.Sq, c.Sk);
                double mx = -INFINITY;
                for (int j = 0; j < lim; ++j) {
                    double acc = 0;
                    for (int d = 0; d < c.D; ++d) acc += (double)q.at(b, i, h, d) * k.at(b, j, g, d);
                    s[j] = acc * scale;
                    mx = std::max(mx, s[j]);
                }
                double sum = 0;
                for (int j = 0; j < lim; ++j) sum += exp(s[j] - mx);
                const double l = lim > 0 ? mx + log(sum) : -INFINITY;
                lse[((size_t)b * c.Hq + h) * c.Sq + i] = (float)l;
                std::fill(o.begin(), o.end(), 0.0);
                for (int j = 0; j < lim; ++j) {
                    const double pj = exp(s[j] - l);
                    wrow[(size_t)(i / 64) * Tn + j / 128] += pj;
                    for (int d = 0; d < c.D; ++d) o[d] += pj * v.at(b, j, g, d);
                }
                for (int d = 0; d < c.D; ++d)
                    out.at(b, i, h, d) = from_bits(to_bits((float)o[d], c.dt), c.dt);
            }
            for (size_t x = 0; x < wrow.size(); ++x)
                W[((size_t)b * c.Hq + h) * Tm * Tn + x] = (float)wrow[x];
        }
}

// One (query i, key j) pair of the float64 backward, both references' inner step: recompute
// p from lse l, dS = p (dP - Dlt), and add its share to dq, dk (both times scale) and dv.
static void add_pair(const Case &c, HostT &q, HostT &k, HostT &v, HostT &dout, float scale,
                     int b, int i, int h, int j, int g, double l, double dlt,
                     std::vector<double> &dq, std::vector<double> &dk, std::vector<double> &dv) {
    double sc = 0, dp = 0;
    for (int d = 0; d < c.D; ++d) {
        sc += (double)q.at(b, i, h, d) * k.at(b, j, g, d);
        dp += (double)dout.at(b, i, h, d) * v.at(b, j, g, d);
    }
    const double p = exp(sc * scale - l);
    const double ds = p * (dp - dlt);
    for (int d = 0; d < c.D; ++d) {
        dq[(((size_t)b * c.Sq + i) * c.Hq + h) * c.D + d] += scale * ds * k.at(b, j, g, d);
        dk[(((size_t)b * c.Sk + j) * c.Hk + g) * c.D + d] += scale * ds * q.at(b, i, h, d);
        dv[(((size_t)b * c.Sk + j) * c.Hk + g) * c.D + d] += p * dout.at(b, i, h, d);
    }
}

// float64 backward over the kept tiles of `mask` (B,Hq,Tm,Tn).
static void cpu_backward(const Case &c, HostT &q, HostT &k, HostT &v, HostT &out, HostT &dout,
                         const std::vector<float> &lse, const std::vector<uint8_t> &mask,
                         float scale, std::vector<double> &dq, std::vector<double> &dk,
                         std::vector<double> &dv) {
    const int G = c.Hq / c.Hk, Tm = (c.Sq + 63) / 64, Tn = (c.Sk + 127) / 128;
    dq.assign((size_t)c.B * c.Sq * c.Hq * c.D, 0.0);
    dk.assign((size_t)c.B * c.Sk * c.Hk * c.D, 0.0);
    dv.assign((size_t)c.B * c.Sk * c.Hk * c.D, 0.0);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.Hq; ++h) {
            const int g = h / G;
            for (int i = 0; i < c.Sq; ++i) {
                const double l = lse[((size_t)b * c.Hq + h) * c.Sq + i];
                if (l == -INFINITY) continue;
                double dlt = 0;
                for (int d = 0; d < c.D; ++d) dlt += (double)dout.at(b, i, h, d) * out.at(b, i, h, d);
                const int64_t lim = key_limit(c.causal, i, c.Sq, c.Sk);
                const int m = i / 64;
                for (int j = 0; j < lim; ++j) {
                    if (!mask[(((size_t)b * c.Hq + h) * Tm + m) * Tn + j / 128]) continue;
                    add_pair(c, q, k, v, dout, scale, b, i, h, j, g, l, dlt, dq, dk, dv);
                }
            }
        }
}

// Stand-in forward for long sequences: out random, lse = log(#allowed keys) + noise (-inf for
// rows with none), W banded around each row tile's last allowed key tile. The backward's formula
// holds for any (out, lse), so the GPU and CPU still compute the same thing.
static void synth_forward(const Case &c, HostT &out, std::vector<float> &lse,
                          std::vector<float> &W) {
    const int Tm = (c.Sq + 63) / 64, Tn = (c.Sk + 127) / 128;
    fill_random(out, c.dt, 1.0);
    lse.assign((size_t)c.B * c.Hq * c.Sq, 0.0f);
    W.assign((size_t)c.B * c.Hq * Tm * Tn, 0.0f);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.Hq; ++h) {
            for (int i = 0; i < c.Sq; ++i) {
                const int64_t lim = key_limit(c.causal, i, c.Sq, c.Sk);
                lse[((size_t)b * c.Hq + h) * c.Sq + i] =
                    lim > 0 ? (float)(log((double)lim) + 0.5 * urand()) : -INFINITY;
            }
            for (int m = 0; m < Tm; ++m) {
                const int last_row = std::min(64 * m + 63, c.Sq - 1);
                const int64_t lim = key_limit(c.causal, last_row, c.Sq, c.Sk);
                const double center = lim > 0 ? (double)((lim - 1) / 128) : -1;
                for (int n = 0; n < Tn; ++n)
                    W[(((size_t)b * c.Hq + h) * Tm + m) * Tn + n] =
                        (lim > (int64_t)n * 128) ? (float)(exp(-fabs(n - center) / 2.0) * (0.5 + urand())) : 0.0f;
            }
        }
}

// float64 backward visiting only the kept, causally live tiles of `mask` (B,Hq,Tm,Tn).
static void cpu_backward_tiles(const Case &c, HostT &q, HostT &k, HostT &v, HostT &out,
                               HostT &dout, const std::vector<float> &lse,
                               const std::vector<uint8_t> &mask, float scale,
                               std::vector<double> &dq, std::vector<double> &dk,
                               std::vector<double> &dv) {
    const int G = c.Hq / c.Hk, Tm = (c.Sq + 63) / 64, Tn = (c.Sk + 127) / 128;
    dq.assign((size_t)c.B * c.Sq * c.Hq * c.D, 0.0);
    dk.assign((size_t)c.B * c.Sk * c.Hk * c.D, 0.0);
    dv.assign((size_t)c.B * c.Sk * c.Hk * c.D, 0.0);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.Hq; ++h) {
            const int g = h / G;
            for (int m = 0; m < Tm; ++m)
                for (int n = 0; n < Tn; ++n) {
                    if (!mask[(((size_t)b * c.Hq + h) * Tm + m) * Tn + n]) continue;
                    for (int i = 64 * m; i < std::min(64 * m + 64, c.Sq); ++i) {
                        const double l = lse[((size_t)b * c.Hq + h) * c.Sq + i];
                        if (l == -INFINITY) continue;
                        double dlt = 0;
                        for (int d = 0; d < c.D; ++d) dlt += (double)dout.at(b, i, h, d) * out.at(b, i, h, d);
                        const int64_t lim = std::min<int64_t>(key_limit(c.causal, i, c.Sq, c.Sk), 128 * n + 128);
                        for (int j = 128 * n; j < lim; ++j) {
                            add_pair(c, q, k, v, dout, scale, b, i, h, j, g, l, dlt, dq, dk, dv);
                        }
                    }
                }
        }
}

// Max |gpu - ref| over max |ref|, on the finite reference entries; counts NaN mismatches.
struct Err {
    double rel;
    long bad_nan;
};
static Err compare(HostT &gpu, const std::vector<double> &ref) {
    double maxref = 0, maxerr = 0;
    long bad = 0;
    for (size_t x = 0; x < ref.size(); ++x) {
        const double r = ref[x], g = gpu.v[x];
        if (!std::isfinite(r)) {
            if (std::isfinite(g)) ++bad;
            continue;
        }
        if (!std::isfinite(g)) { ++bad; continue; }
        maxref = std::max(maxref, fabs(r));
        maxerr = std::max(maxerr, fabs(g - r));
    }
    return {maxerr / (maxref > 0 ? maxref : 1.0), bad};
}

static void *dev_upload(const void *h, size_t bytes) {
    void *d = nullptr;
    CK(cudaMalloc(&d, bytes > 0 ? bytes : 1));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static bl_attn_desc make_desc(const Case &c, float scale) {
    bl_attn_desc d;
    memset(&d, 0, sizeof d);
    d.backend = BL_BACKEND_CUDA;
    d.dtype = c.dt;
    d.batch = c.B; d.seqlen_q = c.Sq; d.seqlen_k = c.Sk;
    d.heads_q = c.Hq; d.heads_k = c.Hk; d.head_dim = c.D;
    d.scale = scale; d.causal = c.causal;
    return d;
}

static bl_tensor dev_tensor(HostT &t, void *data) {
    bl_tensor x;
    x.data = data; x.stride_b = t.sb; x.stride_s = t.ss; x.stride_h = t.sh;
    return x;
}

static const char *variant_name(int variant) {
    if (variant == BL_BWD_VARIANT_WGMMA64_V1) return "wg64v1";
    if (variant == BL_BWD_VARIANT_WGMMA128_V3B) return "wg128v3b";
    if (variant == BL_BWD_VARIANT_CPASYNC_ROWS) return "cpasync";
    if (variant == BL_BWD_VARIANT_WGMMA128_V6) return "wg128v6";
    if (variant == BL_BWD_VARIANT_WGMMA64_V4) return "wg64v4";
    if (variant == BL_BWD_VARIANT_WS128_FEW_CTAS) return "ws3cta";
    if (variant == BL_BWD_VARIANT_WS128_ROWS64) return "r64";
    if (variant == BL_BWD_VARIANT_WS128_ROWS80) return "r80m3";
    if (variant == BL_BWD_VARIANT_DQ_ROWS) return "dqrows";
    return variant == BL_BWD_VARIANT_MMA ? "mma" : "wgmma";  // wgmma: the shipped kernels
}

// Runs one case; returns 1 on pass.
static int run_case(const Case &c) {
    const float scale = 1.0f / sqrtf((float)c.D);
    const int Tm = (c.Sq + 63) / 64, Tn = (c.Sk + 127) / 128;
    HostT q = make_t(c.B, c.Sq, c.Hq, c.D, c.padded), k = make_t(c.B, c.Sk, c.Hk, c.D, c.padded),
          v = make_t(c.B, c.Sk, c.Hk, c.D, c.padded), out = make_t(c.B, c.Sq, c.Hq, c.D, c.padded),
          dout = make_t(c.B, c.Sq, c.Hq, c.D, c.padded), dq = make_t(c.B, c.Sq, c.Hq, c.D, c.padded),
          dk = make_t(c.B, c.Sk, c.Hk, c.D, c.padded), dv = make_t(c.B, c.Sk, c.Hk, c.D, c.padded);
    // Larger q/k spread gives peaky attention, so selection has something to skip.
    fill_random(q, c.dt, c.mode == 2 ? 2.0 : 1.0);
    fill_random(k, c.dt, c.mode == 2 ? 2.0 : 1.0);
    fill_random(v, c.dt, 1.0);
    fill_random(dout, c.dt, 1.0);
    if (c.nan_row) for (int d = 0; d < c.D; ++d) q.at(0, c.Sq / 2, 0, d) = NAN;
    std::vector<float> lse, W;
    if (c.synthetic) synth_forward(c, out, lse, W);
    else cpu_forward(c, q, k, v, out, lse, W, scale);

    std::vector<uint8_t> mask((size_t)c.B * c.Hq * Tm * Tn, 1);
    if (c.mode == 1)
        for (auto &x : mask) x = urand() < c.keep ? (uint8_t)(1 + (urand() < 0.5) * 6) : 0;
    std::vector<bl_tile_share> scratch(Tn);
    if (c.mode == 2)
        for (size_t r = 0; r < (size_t)c.B * c.Hq * Tm; ++r)
            bl_select_row_tile(&W[r * Tn], Tn, (double)c.negl, &mask[r * Tn], scratch.data());
    std::vector<double> rdq, rdk, rdv;
    if (c.synthetic) cpu_backward_tiles(c, q, k, v, out, dout, lse, mask, scale, rdq, rdk, rdv);
    else cpu_backward(c, q, k, v, out, dout, lse, mask, scale, rdq, rdk, rdv);

    int all_ok = 1;
    // The main kernels this build carries: the shipped wgmma ones always; version 1 at D = 64;
    // the mma.sync one when compiled in.
    std::vector<int> variants = {BL_BWD_VARIANT_WGMMA};
#ifdef BL_BWD_WITH_MMA_VARIANT
    variants.push_back(BL_BWD_VARIANT_MMA);
#endif
    variants.push_back(c.D == 64 ? BL_BWD_VARIANT_WGMMA64_V1 : BL_BWD_VARIANT_WGMMA128_V3B);
    // The shipped kernel without TMA: what the library runs where Q / dO cannot be described.
    variants.push_back(BL_BWD_VARIANT_CPASYNC_ROWS);
    // The previous TMA kernels (shipped: version 10 at D = 128, version 6 at D = 64).
    variants.push_back(c.D == 128 ? BL_BWD_VARIANT_WGMMA128_V6 : BL_BWD_VARIANT_WGMMA64_V4);
    // The persistent head-dim-128 kernel on 3 CTAs: each walks several columns. At head dim 64
    // the same variant runs the shipped kernel (version 6) unsplit: see the split cap below.
    variants.push_back(BL_BWD_VARIANT_WS128_FEW_CTAS);
    // Head-dim-128 calls that keep every tile: the 64-row kernel too (the shipped one takes 80
    // rows where nothing is masked).
    if (c.D == 128 && (c.mode == 0 || (c.mode == 1 && c.keep >= 1.0)))
        variants.push_back(BL_BWD_VARIANT_WS128_ROWS64);
    // Masked and selected head-dim-128 calls: the 80-row kernel on their lists whatever the
    // device would pick (the shipped choice takes it for full masks only here), on 3 CTAs.
    if (c.D == 128 && c.mode != 0) variants.push_back(BL_BWD_VARIANT_WS128_ROWS80);
    // Head dim 128: dQ by row tiles beside version 10 without dQ (no dq accumulator).
    if (c.D == 128) variants.push_back(BL_BWD_VARIANT_DQ_ROWS);
    // ATTN_BWD_CHECK_SHIPPED=1: the shipped pick and the 80-row kernel on 3 CTAs only (a quick
    // compute-sanitizer pass over the kernels the library runs, e.g. after an 80-row change).
    if (getenv("ATTN_BWD_CHECK_SHIPPED"))
        variants.erase(std::remove_if(variants.begin(), variants.end(),
                                      [](int v) {
                                          return v != BL_BWD_VARIANT_WGMMA &&
                                                 v != BL_BWD_VARIANT_WS128_FEW_CTAS &&
                                                 v != BL_BWD_VARIANT_WS128_ROWS80;
                                      }),
                       variants.end());
    for (int variant : variants) {
    bl_bwd_set_variant(variant);
    // The shipped choice splits the query heads of a call of few columns (bl_bwd_head_split:
    // every GQA / MQA case here); on 3 CTAs the unsplit kernels run the same cases.
    bl_bwd_set_head_split_cap(variant == BL_BWD_VARIANT_WS128_FEW_CTAS ? 1 : 1 << 30);
    bl_attn_desc desc = make_desc(c, scale);
    size_t wsb = 0;
    BL(bl_cuda_bwd_workspace_size(&desc, &wsb));
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemset(ws, 0xff, wsb));  // garbage: the kernels must not rely on zeroed scratch
    desc.workspace = (char *)ws;
    desc.workspace_bytes = wsb;
    auto hq = pack(q, c.dt), hk = pack(k, c.dt), hv = pack(v, c.dt), ho = pack(out, c.dt),
         hdo = pack(dout, c.dt);
    void *d_q = dev_upload(hq.data(), hq.size() * 2), *d_k = dev_upload(hk.data(), hk.size() * 2),
         *d_v = dev_upload(hv.data(), hv.size() * 2), *d_o = dev_upload(ho.data(), ho.size() * 2),
         *d_do = dev_upload(hdo.data(), hdo.size() * 2);
    std::vector<uint16_t> junk(dq.alloc, 0x7fc0);  // NaN-filled outputs: all must be overwritten
    void *d_dq = dev_upload(junk.data(), dq.alloc * 2);
    junk.assign(dk.alloc, 0x7fc0);
    void *d_dk = dev_upload(junk.data(), dk.alloc * 2), *d_dv = dev_upload(junk.data(), dv.alloc * 2);
    float *d_lse = (float *)dev_upload(lse.data(), lse.size() * 4);
    float *d_W = (float *)dev_upload(W.data(), W.size() * 4);
    uint8_t *d_mask = (uint8_t *)dev_upload(mask.data(), mask.size());

    const uint8_t *mask_arg = c.mode == 1 ? d_mask : nullptr;
    const float negl = c.mode == 2 ? c.negl : 0.0f;
    BL(bl_cuda_backward(&desc, dev_tensor(q, d_q), dev_tensor(k, d_k), dev_tensor(v, d_v),
                        dev_tensor(out, d_o), dev_tensor(dout, d_do), d_lse, d_W, negl, mask_arg,
                        dev_tensor(dq, d_dq), dev_tensor(dk, d_dk), dev_tensor(dv, d_dv)));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> buf(dq.alloc);
    CK(cudaMemcpy(buf.data(), d_dq, dq.alloc * 2, cudaMemcpyDeviceToHost));
    unpack(dq, buf, c.dt);
    buf.resize(dk.alloc);
    CK(cudaMemcpy(buf.data(), d_dk, dk.alloc * 2, cudaMemcpyDeviceToHost));
    unpack(dk, buf, c.dt);
    CK(cudaMemcpy(buf.data(), d_dv, dv.alloc * 2, cudaMemcpyDeviceToHost));
    unpack(dv, buf, c.dt);

    // Selection check: the GPU mask bit for bit against the CPU rule.
    long sel_diff = 0;
    if (c.mode == 2) {
        std::vector<uint8_t> gmask(mask.size());
        BL(bl_cuda_select_tiles(&desc, d_W, c.negl, d_mask));
        CK(cudaMemcpy(gmask.data(), d_mask, mask.size(), cudaMemcpyDeviceToHost));
        for (size_t x = 0; x < mask.size(); ++x) sel_diff += (gmask[x] != 0) != (mask[x] != 0);
    }
    size_t kept = 0;
    for (auto x : mask) kept += x != 0;

    Err eq = compare(dq, rdq), ek = compare(dk, rdk), ev = compare(dv, rdv);
    const double tol = c.dt == BL_DTYPE_BF16 ? 2e-2 : 4e-3;
    int ok = eq.rel < tol && ek.rel < tol && ev.rel < tol && !eq.bad_nan && !ek.bad_nan &&
             !ev.bad_nan && sel_diff == 0;
    // The head split the library took (bl_bwd_head_split on the shipped kernels: version 10 and
    // the 80-row ones at head dim 128, version 6 at head dim 64).
    const bl_bwd_dims dm = bl_bwd_make_dims(&desc);
    const bool split_kernel =
        c.D == 128 ? variant == BL_BWD_VARIANT_WGMMA || variant == BL_BWD_VARIANT_WS128_ROWS64
                   : variant == BL_BWD_VARIANT_WGMMA || variant == BL_BWD_VARIANT_WS128_FEW_CTAS;
    const int split = split_kernel ? bl_bwd_head_split(dm, c.causal != 0) : 1;
    // The kernel the device picked for a masked head-dim-128 call under the shipped choice
    // (the entry totals the lists kernel left in the workspace).
    const char *pick = "";
    int split_used = split;  // of a masked head-dim-128 call: the device's (bl_bwd_split_parts)
    if (c.D == 128 && c.mode != 0 &&
        (variant == BL_BWD_VARIANT_WGMMA || variant == BL_BWD_VARIANT_WS128_FEW_CTAS)) {
        bl_bwd_workspace w;
        bl_bwd_workspace_layout(dm, ws, &w);
        unsigned long long tot[BL_BWD_TOTALS];
        CK(cudaMemcpy(tot, w.totals, sizeof tot, cudaMemcpyDeviceToHost));
        bl_bwd_split_rule rule;
        if (split > 1 && bl_bwd_split_rule_make(dm, c.causal != 0, split, &rule) == BL_OK)
            split_used = bl_bwd_split_parts(split, rule, tot);
        const bool keys_full = bl_bwd_keys_full(dm, c.causal != 0);
        pick = bl_bwd_masked_full(tot)     ? " [80 rows, dense]"
               : !bl_bwd_rows80_chosen(tot, c.causal, keys_full)
                   ? (bl_bwd_dq_direct_chosen(tot, dm) ? " [64 rows, direct dQ]" : " [64 rows]")
               : !bl_bwd_packed_chosen(tot, c.causal) ? " [80 rows]"
                                             : " [80 rows, packed]";
        // A mask that keeps every tile (every tile a causal mask allows: the row tiles from
        // Tm - bl_bwd_allowed_row_tiles(n) on) must take the dense kernel, and no other mask may.
        bool full = true;
        for (size_t t = 0; t < mask.size(); ++t) {
            const int64_t n = (int64_t)t % dm.tiles_n, m = (int64_t)t / dm.tiles_n % dm.tiles_m;
            if (!mask[t] && m >= dm.tiles_m - bl_bwd_allowed_row_tiles(dm, c.causal, n))
                full = false;
        }
        if (bl_bwd_masked_full(tot) != full) ok = 0;
        // Cases written for packed (or aligned) entries must still reach them: a change of the
        // cost constants would otherwise leave that path unchecked without a word.
        const bool packed = bl_bwd_rows80_chosen(tot, c.causal, keys_full) && !bl_bwd_masked_full(tot) &&
                            bl_bwd_packed_chosen(tot, c.causal);
        const bool aligned = bl_bwd_rows80_chosen(tot, c.causal, keys_full) && !bl_bwd_masked_full(tot) &&
                             !packed;
        const bool rows64 = !bl_bwd_rows80_chosen(tot, c.causal, keys_full);
        if (variant == BL_BWD_VARIANT_WGMMA && ((c.pick == kPickPacked && !packed) ||
                                                (c.pick == kPickAligned && !aligned) ||
                                                (c.pick == kPickRows64 && !rows64)))
            ok = 0;
    }
    // (at head dim 64 the 3-CTA variant is the shipped kernel unsplit)
    const char *vname =
        c.D == 64 && variant == BL_BWD_VARIANT_WS128_FEW_CTAS ? "ws64u" : variant_name(variant);
    printf("%-5s %-4s B%d Sq%-5d Sk%-5d Hq%-2d Hk%-2d D%-3d %s %-6s%s%s keep %5.3f | dq %.1e dk %.1e "
           "dv %.1e nan-mismatch %ld/%ld/%ld sel-diff %ld  %s%s\n",
           vname, c.dt == BL_DTYPE_BF16 ? "bf16" : "fp16", c.B, c.Sq, c.Sk, c.Hq, c.Hk, c.D,
           c.causal ? "causal" : "full  ", c.mode == 0 ? "dense" : c.mode == 1 ? "mask" : "select",
           c.padded ? " strided" : "", c.nan_row ? " nan" : c.synthetic ? " long" : "", (double)kept / mask.size(),
           eq.rel, ek.rel, ev.rel, eq.bad_nan, ek.bad_nan, ev.bad_nan, sel_diff,
           ok ? "PASS" : "FAIL", pick);
    if (split > 1)
        printf("      (the call above: %d-way head split, %d parts used)\n", split, split_used);
    cudaFree(ws); cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_o); cudaFree(d_do);
    cudaFree(d_dq); cudaFree(d_dk); cudaFree(d_dv); cudaFree(d_lse); cudaFree(d_W);
    cudaFree(d_mask);
    all_ok &= ok;
    }
    bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
    bl_bwd_set_head_split_cap(1 << 30);
    return all_ok;
}

// Selection alone on synthetic W rows of Tn tiles: ties, zeros, an all-zero row, a NaN row.
static int check_selection_synthetic(int Tn) {
    Case c = {1, 64 * 7, 128 * Tn, 3, 3, 64, 0, BL_DTYPE_BF16, 2, 0, 0.05f, 0, 0};
    const int Tm = 7;
    std::vector<float> W((size_t)c.Hq * Tm * Tn);
    for (size_t r = 0; r < (size_t)c.Hq * Tm; ++r) {
        for (int n = 0; n < Tn; ++n) {
            float x;
            switch (r % 5) {
            case 0: x = (float)floor(urand() * 4) / 64.0f; break;          // many ties
            case 1: x = (float)exp(8.0 * urand()) * (urand() < 0.3); break; // peaky, zeros
            case 2: x = (float)(1.0 / (1 + abs(n - Tn / 2))); break;       // banded
            case 3: x = 1.0f; break;  // running sums that meet negl_prob 0.25 / 0.5 exactly
            default: x = (float)urand(); break;
            }
            W[r * Tn + n] = x;
        }
    }
    for (int n = 0; n < Tn; ++n) W[5 * Tn + n] = 0.0f;  // no mass: keeps nothing
    W[6 * Tn + Tn / 3] = NAN;                          // non-finite: keeps all
    W[11 * Tn + Tn / 2] = INFINITY;                    // the same
    W[10 * Tn] = -1.0f;  // not a probability mass (a user's W): the sequential rule still holds
    int fails = 0;
    // (0.25 and 0.5 against the constant rows: the selection's parallel decision must hand
    // such rows to the sequential one, select_sm90.cu sel_fast_skip)
    const float negls[] = {0.0f, 0.01f, 0.05f, 0.25f, 0.3f, 0.5f, 0.9f};
    float *d_W = (float *)dev_upload(W.data(), W.size() * 4);
    uint8_t *d_mask;
    CK(cudaMalloc(&d_mask, W.size()));
    std::vector<bl_tile_share> scratch(Tn);
    for (float negl : negls) {
        std::vector<uint8_t> cm(W.size()), gm(W.size());
        for (size_t r = 0; r < (size_t)c.Hq * Tm; ++r)
            bl_select_row_tile(&W[r * Tn], Tn, (double)negl, &cm[r * Tn], scratch.data());
        bl_attn_desc desc = make_desc(c, 0.125f);
        BL(bl_cuda_select_tiles(&desc, d_W, negl, d_mask));
        CK(cudaMemcpy(gm.data(), d_mask, gm.size(), cudaMemcpyDeviceToHost));
        long diff = 0, kept = 0;
        for (size_t x = 0; x < gm.size(); ++x) {
            diff += (gm[x] != 0) != (cm[x] != 0);
            kept += cm[x] != 0;
        }
        printf("selection Tn=%d negl=%.2f: kept %.3f, GPU/CPU mask differences %ld  %s\n", Tn,
               negl, (double)kept / gm.size(), diff, diff ? "FAIL" : "PASS");
        fails += diff != 0;
    }
    cudaFree(d_W);
    cudaFree(d_mask);
    return fails == 0;
}

// ---- bench: large shapes, device-generated inputs ----

__global__ void fill_kernel(uint16_t *x, size_t n, uint32_t seed, int bf16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        float u = (h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;  // uniform(-1, 1)
        if (bf16) { __nv_bfloat16 b = __float2bfloat16_rn(u); x[i] = *reinterpret_cast<uint16_t *>(&b); }
        else { __half b = __float2half_rn(u); x[i] = *reinterpret_cast<uint16_t *>(&b); }
    }
}
__global__ void fill_f32(float *x, size_t n, float val) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) x[i] = val;
}
__global__ void mask_kernel(uint8_t *m, size_t n, double keep, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        m[i] = (h & 0xffffff) < keep * 16777216.0 ? 1 : 0;
    }
}
// Banded tile mass: mass decays with |n - diagonal tile|, so selection keeps a band.
__global__ void banded_w_kernel(float *W, int64_t rows, int tm, int tn, float width) {
    const int64_t n_all = rows * tn;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_all;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int n = (int)(i % tn);
        const int m = (int)((i / tn) % tm);
        const float center = (m + 0.5f) * (float)tn / (float)tm;  // the diagonal, any Sq/Sk
        W[i] = expf(-fabsf(n - center) / width);
    }
}

static double time_bwd(const bl_attn_desc &desc, bl_tensor q, bl_tensor k, bl_tensor v,
                       bl_tensor o, bl_tensor dO, const float *lse, const float *W, float negl,
                       const uint8_t *mask, bl_tensor dq, bl_tensor dk, bl_tensor dv, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 2; ++w)
        BL(bl_cuda_backward(&desc, q, k, v, o, dO, lse, W, negl, mask, dq, dk, dv));
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(e0));
        BL(bl_cuda_backward(&desc, q, k, v, o, dO, lse, W, negl, mask, dq, dk, dv));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms[ms.size() / 2];
}

static const char *g_vname = "wgmma";
static int g_full_sweep = 1;  // 0: dense only
static double g_sparse_only = -1;  // >= 0: of the sparse cases, only the random mask of this keep
static int g_select_only = 0;      // 1: of the sparse cases, only the selections (banded W)
static double g_dense_tflops = 0;  // the last bench_shape's dense rate, for bench64's table
static int g_group = 1;  // query heads per K / V head in bench_shape (sparsecg / sparseng: 4)
static void bench_shape(int B, int S, int H, int D, int causal) {
    const bl_dtype dt = BL_DTYPE_BF16;
    const float scale = 1.0f / sqrtf((float)D);
    const int Hk = H / g_group;  // K, V, dK, dV: buffers 1, 2, 6, 7 below
    Case c = {B, S, S, H, Hk, D, causal, dt, 0, 0, 0, 0, 0};
    bl_attn_desc desc = make_desc(c, scale);
    const int64_t Tm = (S + 63) / 64, Tn = (S + 127) / 128;
    const size_t elems = (size_t)B * S * H * D;
    uint16_t *buf[8];
    for (int i = 0; i < 8; ++i) {
        CK(cudaMalloc(&buf[i], elems * 2));
        fill_kernel<<<1024, 256>>>(buf[i], elems, 1234u + 77u * i, 1);
    }
    float *lse, *W;
    uint8_t *mask;
    CK(cudaMalloc(&lse, (size_t)B * H * S * 4));
    // Uniform(-1,1) inputs give scores of a few units; lse near log(S) keeps P in range.
    fill_f32<<<1024, 256>>>(lse, (size_t)B * H * S, logf((float)S) + 0.5f);
    const size_t ntile = (size_t)B * H * Tm * Tn;
    CK(cudaMalloc(&W, ntile * 4));
    CK(cudaMalloc(&mask, ntile));
    size_t wsb;
    BL(bl_cuda_bwd_workspace_size(&desc, &wsb));
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    desc.workspace = ws;
    desc.workspace_bytes = wsb;
    bl_tensor t[8];
    for (int i = 0; i < 8; ++i) {
        const int64_t heads = i == 1 || i == 2 || i == 6 || i == 7 ? Hk : H;
        t[i].data = buf[i];
        t[i].stride_h = D; t[i].stride_s = heads * D; t[i].stride_b = (int64_t)S * heads * D;
    }
    const double flops = 2.5 * 4.0 * B * H * (double)S * S * D * (causal ? 0.5 : 1.0);
    const int reps = S >= 32768 ? 3 : 7;
    CK(cudaDeviceSynchronize());
    // ATTN_BWD_SKIP_DENSE=1: no dense reference call (ncu of the sparse calls alone) -- where
    // sparse calls follow; in the dense-only modes (one, one64, dense128, densenc) the dense call
    // is the measurement and runs anyway (the sixty-third session's one64 under NCU timed nothing).
    const bool skip_dense = g_full_sweep && getenv("ATTN_BWD_SKIP_DENSE") != nullptr;
    double dense = skip_dense ? NAN
                              : time_bwd(desc, t[0], t[1], t[2], t[3], t[4], lse, nullptr, 0.0f,
                                         nullptr, t[5], t[6], t[7], reps);
    printf("bench %-5s B%d S%d H%d D%d %s dense        : %8.3f ms  %6.1f TFLOP/s\n", g_vname, B, S,
           H, D, causal ? "causal" : "full  ", dense, flops / dense * 1e-9);
    g_dense_tflops = flops / dense * 1e-9;
    if (!g_full_sweep) {
        for (int i = 0; i < 8; ++i) cudaFree(buf[i]);
        cudaFree(lse); cudaFree(W); cudaFree(mask); cudaFree(ws);
        return;
    }
    std::vector<double> keeps = {0.0, 0.01, 0.1, 0.5};
    if (g_sparse_only >= 0) keeps = {g_sparse_only};
    if (g_select_only) keeps.clear();
    for (double keep : keeps) {
        mask_kernel<<<1024, 256>>>(mask, ntile, keep, 99u);
        double t_s = time_bwd(desc, t[0], t[1], t[2], t[3], t[4], lse, nullptr, 0.0f, mask, t[5],
                              t[6], t[7], reps);
        printf("bench %-5s B%d S%d H%d D%d %s mask keep %.2f: %8.3f ms  = %.4f x dense (bar %.4f)\n",
               g_vname, B, S, H, D, causal ? "causal" : "full  ", keep, t_s, t_s / dense,
               keep + 0.10);
    }
    if (g_sparse_only >= 0) {
        for (int i = 0; i < 8; ++i) cudaFree(buf[i]);
        cudaFree(lse); cudaFree(W); cudaFree(mask); cudaFree(ws);
        return;
    }
    // Selection path on banded W: the kept share comes out of the rule.
    banded_w_kernel<<<1024, 256>>>(W, (int64_t)B * H * Tm, (int)Tm, (int)Tn, 1.5f);
    const float negls[] = {0.05f, 0.2f};
    for (float negl : negls) {
        double t_s = time_bwd(desc, t[0], t[1], t[2], t[3], t[4], lse, W, negl, nullptr, t[5],
                              t[6], t[7], reps);
        BL(bl_cuda_select_tiles(&desc, W, negl, mask));
        std::vector<uint8_t> hm(ntile);
        CK(cudaMemcpy(hm.data(), mask, ntile, cudaMemcpyDeviceToHost));
        size_t kept = 0;
        for (auto x : hm) kept += x != 0;
        const double kf = (double)kept / ntile;
        printf("bench %-5s B%d S%d H%d D%d %s select negl %.2f (kept %.4f): %8.3f ms = %.4f x dense "
               "(bar %.4f)\n", g_vname, B, S, H, D, causal ? "causal" : "full  ", negl, kf, t_s,
               t_s / dense, kf + 0.10);
    }
    for (int i = 0; i < 8; ++i) cudaFree(buf[i]);
    cudaFree(lse); cudaFree(W); cudaFree(mask); cudaFree(ws);
}

// The tile-visiting CPU reference against the plain one, on a small masked causal case.
static int check_tile_reference(void) {
    Case c = {1, 200, 333, 2, 1, 64, 1, BL_DTYPE_BF16, 1, 0.5, 0, 0, 0, 0};
    const float scale = 0.125f;
    const int Tm = (c.Sq + 63) / 64, Tn = (c.Sk + 127) / 128;
    HostT q = make_t(1, c.Sq, 2, 64, 0), k = make_t(1, c.Sk, 1, 64, 0), v = make_t(1, c.Sk, 1, 64, 0),
          out = make_t(1, c.Sq, 2, 64, 0), dout = make_t(1, c.Sq, 2, 64, 0);
    fill_random(q, c.dt, 1.0); fill_random(k, c.dt, 1.0); fill_random(v, c.dt, 1.0);
    fill_random(dout, c.dt, 1.0);
    std::vector<float> lse, W;
    cpu_forward(c, q, k, v, out, lse, W, scale);
    std::vector<uint8_t> mask((size_t)2 * Tm * Tn);
    for (auto &x : mask) x = urand() < 0.5;
    std::vector<double> a[3], t[3];
    cpu_backward(c, q, k, v, out, dout, lse, mask, scale, a[0], a[1], a[2]);
    cpu_backward_tiles(c, q, k, v, out, dout, lse, mask, scale, t[0], t[1], t[2]);
    double worst = 0;
    for (int x = 0; x < 3; ++x)
        for (size_t e = 0; e < a[x].size(); ++e) worst = std::max(worst, fabs(a[x][e] - t[x][e]));
    printf("tile-visiting CPU reference vs plain one: max |diff| %.2e  %s\n", worst,
           worst < 1e-9 ? "PASS" : "FAIL");
    return worst < 1e-9;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "check";
    // ATTN_BWD_VARIANT=N: the timing modes that keep the default variant run variant N instead
    // (e.g. 10, DQ_ROWS, against 0 in the same build).
    if (const char *v = getenv("ATTN_BWD_VARIANT")) {
        bl_bwd_set_variant(atoi(v));
        g_vname = variant_name(atoi(v));
    }
#ifdef BL_BWD_TIMELINE
    if (!strcmp(what, "timeline")) {  // one CTA's clock stamps in the 64-row head-dim-128 kernel
        bl_bwd_set_variant(BL_BWD_VARIANT_WS128_ROWS64);  // (dense calls take the 80-row one)
        g_full_sweep = 0;
        bench_shape(1, 8192, 16, 128, 0);
        bl_bwd_timeline_print();
        return 0;
    }
    // Version 10's entry stamps in CTA 0's walk (build with -DBL_BWD_TL_GLOBAL as well) and its
    // column stamps: 16k x 16 x 128, mask keeping argv[2] (default 0.03).
    if (!strcmp(what, "timelinesparse")) {
#ifndef BL_BWD_TL_GLOBAL
        fprintf(stderr, "timelinesparse: build with -DBL_BWD_TIMELINE -DBL_BWD_TL_GLOBAL\n");
        return 1;
#endif
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.03;
        bench_shape(1, 16384, 16, 128, 0);
        bl_bwd_timeline_raw_print();
        bl_bwd_timeline_cols_print();
        return 0;
    }
    if (!strcmp(what, "timelinecols")) {  // column stamps: 16k x 16 x 128, mask keeping argv[2]
        // ("causal" as argv[3] for a causal mask)
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.01;
        bench_shape(1, 16384, 16, 128, argc > 3 && !strcmp(argv[3], "causal"));
        bl_bwd_timeline_cols_print();
        return 0;
    }
    // The 80-row kernel on a 16k x 16 x 128 call, mask keeping argv[2] (default 0.5; the masked
    // walks run from ~10 % kept, and a keep of 1 or more times the dense call), "causal" as
    // argv[3] for a causal mask: `timelinecols80` its column stamps (the places of timelinecols),
    // `timeline80` its entry stamps (BL_TL80).
    if (!strcmp(what, "timelinecols80") || !strcmp(what, "timeline80")) {
        const double keep = argc > 2 ? atof(argv[2]) : 0.5;
        if (keep >= 1.0) g_full_sweep = 0;
        else g_sparse_only = keep;
        bench_shape(1, 16384, 16, 128, argc > 3 && !strcmp(argv[3], "causal"));
        if (!strcmp(what, "timeline80"))
            bl_bwd_timeline80_print();
        else
            bl_bwd_timeline_cols_print();
        return 0;
    }
    if (!strcmp(what, "timeline64")) {  // the same in the head-dim-64 kernel (8k x 16 x 64)
        bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
        g_full_sweep = 0;
        bench_shape(1, 8192, 16, 64, 0);
        bl_bwd_timeline_print();
        return 0;
    }
#endif
#ifdef BL_BWD_COLS64
    if (!strcmp(what, "cols64")) {  // head-dim-64 column stamps: 16k x 16 x 64, mask keeping
        // argv[2] (>= 1: the dense call), "causal" (or "nc") as argv[3] for a causal mask, and
        // another shape B,S,H as argv[4] (e.g. 4,4096,16). The persistent form stamps by
        // schedule position, version 6 by CTA (bwd_ws64_sm90.cuh): the printer reads both.
        const double keep = argc > 2 ? atof(argv[2]) : 0.25;
        const int causal = argc > 3 && !strcmp(argv[3], "causal");
        int B = 1, S = 16384, H = 16;
        if (argc > 4 && sscanf(argv[4], "%d,%d,%d", &B, &S, &H) != 3) {
            fprintf(stderr, "cols64: shape B,S,H expected, got %s\n", argv[4]);
            return 1;
        }
        if (keep >= 1.0) g_full_sweep = 0;
        else g_sparse_only = keep;
        bench_shape(B, S, H, 64, causal);
        bl_bwd_cols64_print();
        return 0;
    }
#endif
    if (!strcmp(what, "sparse1")) {  // one sparse call per shape (random mask, keep 0.01 or argv[2])
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.01;
        bench_shape(1, 16384, 16, 128, 0);
        bench_shape(1, 16384, 16, 128, 1);
        return 0;
    }
    if (!strcmp(what, "sparsec")) {  // causal only, at 16k and at the bench's 32k x 24 shape
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.01;
        bench_shape(1, 16384, 16, 128, 1);
        bench_shape(1, 32768, 24, 128, 1);
        return 0;
    }
    if (!strcmp(what, "sparsen")) {  // non-causal only, at 16k and at the bench's 32k x 24 shape
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.01;
        bench_shape(1, 16384, 16, 128, 0);
        bench_shape(1, 32768, 24, 128, 0);
        return 0;
    }
    if (!strcmp(what, "sparsecg") || !strcmp(what, "sparseng")) {  // the same two shapes with
        // four query heads per K / V head (GQA: 16 / 4 and 24 / 6), causal (c) or not (n)
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.01;
        g_group = 4;
        const int causal = what[6] == 'c';
        bench_shape(1, 16384, 16, 128, causal);
        bench_shape(1, 32768, 24, 128, causal);
        return 0;
    }
    if (!strcmp(what, "splitcaps")) {  // 1 x 16k x 32 q x 128 causal, Hk = 32 / argv[3] (32:
        // MQA), a random mask keeping argv[2], under each head-split cap (bl_bwd_head_split
        // picks at most that many parts): what the split costs a masked call, two rounds; with
        // argv[4] = 1, 2, 4 or 8 that cap alone, once (e.g. under ncu)
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.25;
        g_group = argc > 3 ? atoi(argv[3]) : 32;
        static const char *names[] = {"cap1", "cap2", "cap4", "cap8"};
        const int only = argc > 4 ? atoi(argv[4]) : 0;
        for (int round = 0; round < (only ? 1 : 2); ++round)
            for (int x = 0; x < 4; ++x) {
                if (only && (1 << x) != only) continue;
                bl_bwd_set_head_split_cap(1 << x);
                g_vname = names[x];
                bench_shape(1, 16384, 32, 128, 1);
            }
        bl_bwd_set_head_split_cap(1 << 30);
        return 0;
    }
    if (!strcmp(what, "sparse64")) {  // the same at head dim 64, and the bench's 4 x 4096 shape
        g_sparse_only = argc > 2 ? atof(argv[2]) : 0.01;
        bench_shape(1, 16384, 16, 64, 0);
        bench_shape(1, 16384, 16, 64, 1);
        bench_shape(4, 4096, 16, 64, 0);
        return 0;
    }
    if (!strcmp(what, "dense128")) {  // the bench's head-dim-128 shapes, dense only
        bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
        g_full_sweep = 0;
        for (int causal = 0; causal < 2; ++causal) {
            bench_shape(1, 16384, 16, 128, causal);
            bench_shape(1, 32768, 24, 128, causal);
        }
        return 0;
    }
    if (!strcmp(what, "densenc")) {  // dense non-causal head dim 128 (the 80-row kernel)
        bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
        g_full_sweep = 0;
        bench_shape(1, 8192, 16, 128, 0);
        bench_shape(1, 16384, 16, 128, 0);
        bench_shape(1, 32768, 24, 128, 0);
        return 0;
    }
    if (!strcmp(what, "r80ab")) {  // dense head dim 128: 80-row kernel vs 64-row one
        const int causal = argc > 2 && !strcmp(argv[2], "causal");
        g_full_sweep = 0;
        const int vids[2] = {BL_BWD_VARIANT_WGMMA, BL_BWD_VARIANT_WS128_ROWS64};
        for (int round = 0; round < 3; ++round)
            for (int x = 0; x < 2; ++x) {
                const int v = vids[(x + round) % 2];  // alternate which goes first
                bl_bwd_set_variant(v);
                g_vname = variant_name(v);
                if (!causal) bench_shape(1, 8192, 16, 128, 0);
                bench_shape(1, 16384, 16, 128, causal);
                bench_shape(1, 32768, 24, 128, causal);
            }
        return 0;
    }
    if (!strcmp(what, "select1")) {  // 16k x 16 x 128, full and causal: dense, then selections
        g_select_only = 1;
        bench_shape(1, 16384, 16, 128, 0);
        bench_shape(1, 16384, 16, 128, 1);
        return 0;
    }
    if (!strcmp(what, "onemask")) {  // 8k x 16 x 128: dense, then a random mask keeping argv[2]
        g_sparse_only = argc > 2 ? atof(argv[2]) : 1.0;   // (for ncu's per-kernel times)
        bench_shape(1, 8192, 16, 128, argc > 3 && !strcmp(argv[3], "causal"));
        return 0;
    }
    if (!strcmp(what, "one") || !strcmp(what, "one64")) {  // short dense runs, for ncu
        bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
        g_full_sweep = 0;
        bench_shape(1, 8192, 16, !strcmp(what, "one") ? 128 : 64, 0);
        return 0;
    }
    if (!strcmp(what, "bench")) {  // both kernels, dense; then the wgmma one, sparse too
        g_vname = "mma";
        g_full_sweep = 0;
        bl_bwd_set_variant(BL_BWD_VARIANT_MMA);
        bench_shape(1, 16384, 16, 128, 0);
        bench_shape(4, 4096, 16, 64, 0);
        g_vname = "wgmma";
        g_full_sweep = 1;
        bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
        bench_shape(1, 16384, 16, 128, 0);
        bench_shape(1, 16384, 16, 128, 1);
        bench_shape(1, 32768, 24, 128, 0);
        bench_shape(4, 4096, 16, 64, 0);
        return 0;
    }
    if (!strcmp(what, "bench128") || !strcmp(what, "bench64")) {
        // The previous TMA kernel against the shipped one (head dim 128: version 6 against 9; 64:
        // version 4 against 5), dense, in alternating rounds; then the shipped one's sparse
        // ratios on one shape.
        const bool d128 = !strcmp(what, "bench128");
        const int D = d128 ? 128 : 64;
        struct Shape { int B, S, H, causal; };
        const Shape s128[4] = {{1, 16384, 16, 0}, {1, 16384, 16, 1}, {1, 32768, 24, 0}, {1, 32768, 24, 1}};
        const Shape s64[4] = {{4, 4096, 16, 0}, {1, 16384, 16, 0}, {1, 16384, 16, 1}, {1, 32768, 16, 0}};
        const Shape *shapes = d128 ? s128 : s64;
        const int vids[2] = {d128 ? BL_BWD_VARIANT_WGMMA128_V6 : BL_BWD_VARIANT_WGMMA64_V4,
                             BL_BWD_VARIANT_WGMMA};
        double rate[4][2];
        g_full_sweep = 0;
        for (int r = 0; r < 2; ++r)  // two rounds, alternating kernels: drift shows up as spread
            for (int x = 0; x < 4; ++x)
                for (int v = 0; v < 2; ++v) {
                    g_vname = variant_name(vids[v]);
                    bl_bwd_set_variant(vids[v]);
                    bench_shape(shapes[x].B, shapes[x].S, shapes[x].H, D, shapes[x].causal);
                    rate[x][v] = r ? std::max(rate[x][v], g_dense_tflops) : g_dense_tflops;
                }
        g_full_sweep = 1;
        g_vname = variant_name(BL_BWD_VARIANT_WGMMA);
        bl_bwd_set_variant(BL_BWD_VARIANT_WGMMA);
        if (d128) bench_shape(1, 16384, 16, 128, 1);
        else bench_shape(4, 4096, 16, 64, 0);
        const char *older = d128 ? "v6" : "v4";
        const char *shipped = d128 ? "v10" : "v5, paired";
        printf("\nD=%d dense TFLOP/s (best of 2 rounds, each a median of 7 or 3)\n", D);
        printf("| shape | %s | wgmma (shipped: %s) | shipped / %s |\n| --- | --- | --- | --- |\n",
               older, shipped, older);
        for (int x = 0; x < 4; ++x)
            printf("| B%d S%d H%d D%d %s | %.1f | %.1f | %.3f |\n", shapes[x].B, shapes[x].S,
                   shapes[x].H, D, shapes[x].causal ? "causal" : "full", rate[x][0], rate[x][1],
                   rate[x][1] / rate[x][0]);
        return 0;
    }
    const bl_dtype BF = BL_DTYPE_BF16, FP = BL_DTYPE_F16;
    std::vector<Case> cases;
    if (!strcmp(what, "check64")) {  // head dim 64 only: every kernel this build carries
        //            B  Sq   Sk   Hq Hk D  causal dt mode keep negl padded nan synthetic
        cases.push_back({1, 128, 128, 1, 1, 64, 0, BF, 0, 0, 0, 0, 0});
        cases.push_back({2, 256, 384, 4, 2, 64, 0, BF, 0, 0, 0, 0, 0});    // GQA, Sq < Sk
        cases.push_back({1, 300, 300, 2, 2, 64, 1, BF, 0, 0, 0, 0, 0});    // causal, odd
        cases.push_back({1, 200, 517, 4, 1, 64, 1, FP, 0, 0, 0, 0, 0});    // MQA
        cases.push_back({1, 517, 200, 3, 1, 64, 1, BF, 0, 0, 0, 0, 0});    // Sq > Sk: -inf rows
        cases.push_back({1, 1000, 1000, 2, 1, 64, 1, FP, 0, 0, 0, 0, 0});  // many row tiles
        cases.push_back({2, 190, 333, 4, 4, 64, 0, FP, 1, 0.5, 0, 1, 0});  // mask, strided
        cases.push_back({1, 384, 640, 4, 2, 64, 1, BF, 1, 0.3, 0, 0, 0});
        cases.push_back({1, 333, 777, 4, 2, 64, 0, BF, 2, 0, 0.05f, 0, 0}); // selection
        cases.push_back({1, 64, 64, 1, 1, 64, 0, FP, 1, 0.0, 0, 0, 0});    // nothing kept
        cases.push_back({1, 1, 1, 1, 1, 64, 0, BF, 0, 0, 0, 0, 0});        // one token
        cases.push_back({1, 256, 300, 4, 2, 64, 0, BF, 0, 0, 0, 0, 1});    // NaN row in head 0
        cases.push_back({1, 4096, 131072, 2, 1, 64, 1, BF, 2, 0, 0.05f, 0, 0, 1});  // long keys
        cases.push_back({1, 131072, 4096, 1, 1, 64, 0, FP, 1, 0.002, 0, 0, 0, 1});  // long rows
    } else if (!strcmp(what, "small64")) {  // for compute-sanitizer: head dim 64, several pairs
        cases.push_back({1, 130, 200, 2, 1, 64, 1, BF, 1, 0.6, 0, 0, 0});
        cases.push_back({1, 600, 300, 2, 1, 64, 0, BF, 0, 0, 0, 0, 0});   // 5 pairs per column
        cases.push_back({1, 520, 700, 2, 2, 64, 1, FP, 0, 0, 0, 0, 0});   // odd lists, causal
        cases.push_back({1, 900, 400, 2, 1, 64, 0, BF, 1, 0.5, 0, 0, 0}); // masked, odd and even
    } else if (!strcmp(what, "smallpc")) {  // for compute-sanitizer: the causal packed walk
        cases.push_back({1, 512, 1024, 24, 1, 128, 1, BF, 1, 0.85, 0, 0, 0, 0, kPickPacked});
    } else if (!strcmp(what, "smallp")) {  // ... the non-causal packed and aligned walks
        cases.push_back({1, 1600, 300, 4, 1, 128, 0, BF, 1, 0.85, 0, 0, 0, 0, kPickPacked});
        cases.push_back({1, 1600, 300, 4, 1, 128, 0, BF, 1, 0.85, 0, 0, 1, 0, kPickPacked});
        cases.push_back({1, 160, 700, 4, 1, 128, 0, FP, 1, 0.95, 0, 0, 0, 0, kPickAligned});
        // ... with Sk a multiple of 128: their KEYS_FULL forms
        cases.push_back({1, 1600, 256, 4, 1, 128, 0, BF, 1, 0.85, 0, 0, 1, 0, kPickPacked});
        cases.push_back({1, 160, 768, 4, 1, 128, 0, FP, 1, 0.95, 0, 0, 0, 0, kPickAligned});
    } else if (!strcmp(what, "smallnc")) {  // ... non-causal calls on the causal dense walk
        cases.push_back({1, 170, 256, 2, 1, 128, 0, BF, 0, 0, 0, 0, 0});
        cases.push_back({1, 170, 256, 2, 1, 128, 0, BF, 1, 1.0, 0, 0, 0});
    } else if (!strcmp(what, "small")) {  // for compute-sanitizer: tiny and quick
        cases.push_back({1, 130, 200, 2, 1, 64, 1, BF, 1, 0.6, 0, 0, 0});
        cases.push_back({1, 70, 129, 2, 2, 128, 0, FP, 2, 0, 0.1f, 1, 0});
        cases.push_back({1, 170, 300, 2, 1, 128, 0, BF, 0, 0, 0, 0, 0});  // 80-row kernel
        cases.push_back({1, 170, 300, 2, 1, 128, 1, BF, 0, 0, 0, 0, 0});  // the same, causal
        cases.push_back({1, 170, 300, 2, 1, 128, 0, BF, 1, 1.0, 0, 0, 0});  // masked: 80 rows chosen
        cases.push_back({1, 170, 300, 2, 1, 128, 1, BF, 1, 0.6, 0, 0, 0});  // 64 chosen; r80m3 forced
        cases.push_back({1, 170, 300, 2, 1, 128, 1, BF, 1, 1.0, 0, 0, 0});  // causal, every tile: dense
        // version 10 storing row tiles of one entry, row tiles nobody keeps
        cases.push_back({1, 500, 700, 2, 2, 128, 0, BF, 1, 0.2, 0, 0, 0, 0, kPickRows64});
        // ... its KEYS_FULL form (no causal mask, Sk % 128 == 0)
        cases.push_back({1, 500, 768, 2, 2, 128, 0, BF, 1, 0.2, 0, 0, 0, 0, kPickRows64});
        // ... with ~10 entries per row tile: version 10 without its direct dQ (its DIRECT form
        // only up to 4.5 entries a row tile, bl_bwd_dq_direct_chosen), tiles of one entry adding
        // into the zeros
        cases.push_back({1, 512, 8192, 2, 1, 128, 0, BF, 1, 0.15, 0, 0, 0, 0, kPickRows64});
        // packed 80-row entries: ~85 kept 64-row tiles a column (4 heads of 25), so that
        // ceil(4 c / 5) x 76 < 64 c whatever the rounding
        cases.push_back({1, 1600, 300, 4, 1, 128, 0, BF, 1, 0.85, 0, 0, 0, 0, kPickPacked});
        // ... with a NaN row (it stays in the key tiles that keep its tile)
        cases.push_back({1, 1600, 300, 4, 1, 128, 0, BF, 1, 0.85, 0, 0, 1, 0, kPickPacked});
        // ... with a causal mask (columns of up to 24 x 8 tiles, half of them on the diagonal)
        cases.push_back({1, 512, 1024, 24, 1, 128, 1, BF, 1, 0.85, 0, 0, 0, 0, kPickPacked});
        // aligned 80-row entries, without and with a causal mask (the check's asserted picks)
        cases.push_back({1, 160, 700, 4, 1, 128, 0, FP, 1, 0.95, 0, 0, 0, 0, kPickAligned});
        cases.push_back({1, 2000, 3000, 2, 2, 128, 1, BF, 1, 0.99, 0, 0, 0, 0, kPickAligned});
        // a causal split call using 1 of its 8 parts (bl_bwd_split_parts)
        cases.push_back({2, 8448, 8448, 8, 1, 128, 1, BF, 1, 0.004, 0, 0, 0, 1});
        // 280 key tiles: more than one schedule window (264 positions on 132 SMs)
        cases.push_back({1, 64, 256, 140, 140, 128, 0, BF, 1, 0.5, 0, 0, 0});
        // selection: 2 keys per lane of the warp kernel; the shared-memory sort (Tn > 1024)
        cases.push_back({1, 70, 5000, 2, 1, 64, 0, BF, 2, 0, 0.1f, 0, 0});
        cases.push_back({1, 40, 128 * 1100, 1, 1, 64, 0, BF, 2, 0, 0.1f, 0, 0});
    } else {
        //            B  Sq   Sk   Hq Hk D   causal dt mode keep negl padded nan
        cases.push_back({1, 128, 128, 1, 1, 64, 0, BF, 0, 0, 0, 0, 0});
        cases.push_back({2, 256, 384, 4, 2, 128, 0, BF, 0, 0, 0, 0, 0});
        cases.push_back({1, 300, 300, 2, 2, 128, 1, BF, 0, 0, 0, 0, 0});
        cases.push_back({1, 200, 517, 4, 1, 64, 1, FP, 0, 0, 0, 0, 0});
        cases.push_back({1, 517, 200, 3, 1, 128, 1, BF, 0, 0, 0, 0, 0});   // Sq > Sk: -inf rows
        cases.push_back({2, 190, 333, 4, 4, 64, 0, FP, 1, 0.5, 0, 1, 0});
        cases.push_back({1, 384, 640, 4, 2, 128, 1, BF, 1, 0.3, 0, 0, 0});
        cases.push_back({1, 257, 1000, 2, 1, 128, 0, FP, 1, 0.1, 0, 1, 0});
        cases.push_back({1, 333, 777, 4, 2, 64, 0, BF, 2, 0, 0.05f, 0, 0});
        cases.push_back({1, 512, 512, 2, 2, 128, 1, BF, 2, 0, 0.1f, 0, 0});
        cases.push_back({2, 100, 1300, 2, 1, 128, 0, FP, 2, 0, 0.2f, 1, 0});
        cases.push_back({1, 64, 64, 1, 1, 64, 0, FP, 1, 0.0, 0, 0, 0});    // nothing kept
        cases.push_back({1, 1, 1, 1, 1, 128, 0, BF, 0, 0, 0, 0, 0});       // one token
        cases.push_back({1, 256, 300, 4, 2, 128, 0, BF, 0, 0, 0, 0, 1});   // NaN row in head 0
        // Dense non-causal head dim 128 (the 80-row kernel): Sq not a multiple of 80, MQA, strided,
        // Sq < 80, Sq > Sk, many row tiles per column.
        cases.push_back({1, 1000, 700, 3, 1, 128, 0, FP, 0, 0, 0, 0, 0});
        cases.push_back({2, 90, 257, 2, 2, 128, 0, BF, 0, 0, 0, 1, 0});
        cases.push_back({1, 33, 1030, 2, 1, 128, 0, BF, 0, 0, 0, 0, 0});
        cases.push_back({1, 2000, 200, 2, 2, 128, 0, BF, 0, 0, 0, 0, 0});
        // ... with Sk a multiple of 128 (the causal dense walk with an unreachable diagonal):
        // Sq > Sk, Sq < 80, strided MQA, a NaN row, Sq not a multiple of 80
        cases.push_back({1, 2000, 256, 2, 2, 128, 0, BF, 0, 0, 0, 0, 0});
        cases.push_back({1, 33, 1024, 2, 1, 128, 0, FP, 0, 0, 0, 0, 0});
        cases.push_back({2, 90, 384, 4, 1, 128, 0, BF, 0, 0, 0, 1, 0});
        cases.push_back({1, 256, 384, 4, 2, 128, 0, BF, 0, 0, 0, 0, 1});
        cases.push_back({1, 1000, 768, 3, 1, 128, 0, FP, 0, 0, 0, 0, 0});
        // Dense causal head dim 128 (the 80-row kernel with the diagonal): Sq < Sk with MQA, many
        // row tiles, strided, Sq > Sk with rows that see no key, Sq < 80. (No NaN row: every
        // kernel, as a dense MMA would, spreads a NaN q row into the dK rows of the keys it
        // cannot see in the tiles it shares with them, 0 x NaN in dS^T Q, which this reference,
        // skipping masked pairs, does not.)
        cases.push_back({1, 333, 1000, 4, 1, 128, 1, FP, 0, 0, 0, 0, 0});
        cases.push_back({1, 1000, 1000, 2, 1, 128, 1, BF, 0, 0, 0, 0, 0});
        cases.push_back({2, 250, 250, 2, 2, 128, 1, BF, 0, 0, 0, 1, 0});
        cases.push_back({1, 1500, 300, 2, 1, 128, 1, FP, 0, 0, 0, 0, 0});
        cases.push_back({1, 50, 700, 2, 2, 128, 1, BF, 0, 0, 0, 0, 0});
        // Masks that keep every tile (every tile a causal mask allows): the device picks the dense
        // 80-row kernel (r64 forces version 10); causal with a mask that keeps most tiles (80
        // rows picked); masked causal Sq > Sk.
        cases.push_back({1, 300, 500, 2, 1, 128, 0, BF, 1, 1.0, 0, 0, 0});
        cases.push_back({2, 170, 257, 2, 2, 128, 0, FP, 1, 1.0, 0, 1, 0});
        // ... non-causal with Sk a multiple of 128 (the causal dense walk, no diagonal), a NaN row
        cases.push_back({1, 300, 512, 2, 1, 128, 0, BF, 1, 1.0, 0, 0, 0});
        cases.push_back({2, 170, 384, 2, 2, 128, 0, FP, 1, 1.0, 0, 1, 1});
        cases.push_back({1, 700, 700, 2, 1, 128, 1, BF, 1, 0.97, 0, 0, 0});
        cases.push_back({1, 700, 900, 2, 1, 128, 1, FP, 1, 1.0, 0, 0, 0});  // causal, every tile
        cases.push_back({1, 900, 300, 2, 2, 128, 1, FP, 1, 0.5, 0, 0, 0});
        // Masked non-causal calls on packed 80-row entries (picked where they cost less than the
        // 64-row and the aligned 80-row ones: columns of more than ~80 kept 64-row tiles make
        // that certain): MQA with Sq not a multiple of 64, strided, and a mask keeping 90 %
        // (pieces mostly contiguous) -- with 3 CTAs each walks many columns.
        cases.push_back({1, 2000, 700, 4, 1, 128, 0, BF, 1, 0.7, 0, 0, 0, 0, kPickPacked});
        cases.push_back({2, 1400, 400, 8, 1, 128, 0, FP, 1, 0.5, 0, 1, 0, 0, kPickPacked});
        cases.push_back({1, 3000, 500, 2, 1, 128, 0, BF, 1, 0.9, 0, 0, 0, 0, kPickPacked});
        // ... with Sk a multiple of 128 (the walks without key-limit selects, KEYS_FULL): MQA,
        // strided fp16, a NaN row
        cases.push_back({1, 2000, 768, 4, 1, 128, 0, BF, 1, 0.7, 0, 0, 0, 0, kPickPacked});
        cases.push_back({2, 1400, 384, 8, 1, 128, 0, FP, 1, 0.5, 0, 1, 0, 0, kPickPacked});
        cases.push_back({1, 3000, 512, 2, 1, 128, 0, BF, 1, 0.9, 0, 0, 1, 0, kPickPacked});
        // ... at 99 %, where aligned and packed entries are about as many (either may run), and
        // three-tile columns at 95 %, where the aligned entries are the fewer (2 80-row tiles a
        // head against ceil(4 c / 5) of c <= 12 kept 64-row tiles: >= 12 % fewer in simulation)
        cases.push_back({1, 1500, 400, 2, 1, 128, 0, FP, 1, 0.99, 0, 0, 0, 0, kPickAny});
        cases.push_back({1, 160, 700, 4, 1, 128, 0, FP, 1, 0.95, 0, 0, 0, 0, kPickAligned});
        // ... KEYS_FULL: Sk a multiple of 128; GQA, strided, a NaN row
        cases.push_back({1, 160, 768, 4, 1, 128, 0, FP, 1, 0.95, 0, 0, 0, 0, kPickAligned});
        cases.push_back({2, 160, 384, 4, 2, 128, 0, BF, 1, 0.95, 0, 1, 1, 0, kPickAligned});
        // Masked causal calls on packed entries (each piece with its own diagonal), MQA with
        // columns of many kept 64-row tiles (packed costs 76 x ceil(4 c / 5) against 64 c: ~5 %
        // less in these totals, where the per-column rounding is 0.1 %): Sq = Sk not a multiple
        // of 64, Sq > Sk with rows that see no key, Sq < Sk strided; and Sq < Sk at 99 % kept,
        // where the aligned entries cost less (~828 x 75 against ~855 packed x 77; with every
        // tile kept the dense kernel runs: the 700 x 900 case above, and Sq > Sk below).
        cases.push_back({1, 2000, 2000, 8, 1, 128, 1, BF, 1, 0.6, 0, 0, 0, 0, kPickPacked});
        cases.push_back({1, 2500, 1000, 16, 1, 128, 1, FP, 1, 0.7, 0, 0, 0, 0, kPickPacked});
        cases.push_back({1, 1000, 2000, 16, 1, 128, 1, BF, 1, 0.8, 0, 1, 0, 0, kPickPacked});
        cases.push_back({1, 2000, 3000, 2, 2, 128, 1, BF, 1, 0.99, 0, 0, 0, 0, kPickAligned});
        cases.push_back({1, 900, 300, 2, 2, 128, 1, BF, 1, 1.0, 0, 0, 0});
        // A masked causal split call that uses fewer of its parts (bl_bwd_split_parts; 132
        // columns of 1056 entries split 8 ways dense): 1 part at 0.4 % of all tiles kept (~0.8 %
        // of the causal ones, the share the rule weighs); the line under the case says. tests/gpu
        // covers 2 of 4 parts (test_gpu_masked_backward_fewer_split_parts, and its many_columns
        // form past two columns per SM).
        cases.push_back({2, 8448, 8448, 8, 1, 128, 1, BF, 1, 0.004, 0, 0, 0, 1});
        // Version 10 on sparse masks, where a row tile's only entry stores its dQ and tiles no
        // key tile keeps are converted without a read (they must come out 0):
        // GQA with Sq not a multiple of 64, causal, a NaN row, strided, and more key tiles than
        // a lists CTA takes (Tn = 20 > 16: two CTAs write a byte each of a row tile's count).
        cases.push_back({1, 1000, 600, 4, 2, 128, 0, BF, 1, 0.05, 0, 0, 0, 0, kPickRows64});
        cases.push_back({1, 900, 900, 4, 1, 128, 1, FP, 1, 0.1, 0, 0, 0, 0, kPickRows64});
        cases.push_back({1, 500, 700, 2, 2, 128, 0, BF, 1, 0.2, 0, 0, 1, 0, kPickRows64});
        cases.push_back({2, 300, 900, 3, 3, 128, 0, FP, 1, 0.08, 0, 1, 0, 0, kPickRows64});
        cases.push_back({1, 640, 128 * 20, 2, 1, 128, 0, BF, 1, 0.02, 0, 0, 0, 0, kPickRows64});
        // ... and Tn = 130: nine lists CTAs, nine bytes of each row tile's count
        cases.push_back({1, 320, 128 * 130, 2, 1, 128, 0, BF, 1, 0.02, 0, 0, 0, 0, kPickRows64});
        // ~10 entries per row tile: version 10 without its direct dQ (bl_bwd_dq_direct_chosen)
        cases.push_back({1, 512, 8192, 2, 1, 128, 0, FP, 1, 0.15, 0, 1, 0, 0, kPickRows64});
        // Version 10's KEYS_FULL form (no causal mask, Sk % 128 == 0), direct dQ: GQA with Sq
        // not a multiple of 64 and a NaN row; MQA, strided, two batches
        cases.push_back({1, 700, 1024, 4, 2, 128, 0, FP, 1, 0.05, 0, 0, 1, 0, kPickRows64});
        cases.push_back({2, 330, 768, 3, 1, 128, 0, BF, 1, 0.06, 0, 1, 0, 0, kPickRows64});
        // ... and causal with one query head per kv head at low keeps: the direct dQ; ~6
        // entries a row tile (reduce-adds) with the diagonal in the last key tiles, strided; Sk
        // inside its last key tile with a NaN row; more key tiles than a schedule window (a NaN
        // row too)
        cases.push_back({1, 2048, 2048, 2, 2, 128, 1, BF, 1, 0.03, 0, 0, 0, 0, kPickRows64});
        cases.push_back({1, 256, 8192, 2, 2, 128, 1, FP, 1, 0.1, 0, 1, 0, 0, kPickRows64});
        cases.push_back({1, 2048, 2000, 2, 2, 128, 1, FP, 1, 0.05, 0, 1, 1, 0, kPickRows64});
        cases.push_back({2, 512, 2048, 40, 40, 128, 1, BF, 1, 0.03, 0, 0, 1, 0, kPickRows64});
        // More key tiles than a schedule window (264 / 528 positions on 132 SMs), in many
        // (batch, kv head) groups: masked (64 rows), dense causal with G = 2, dense non-causal
        // (80 rows), selected. (They checked dev/cuda/wip/bwd-lazy-dq-zero.patch, whose zeroing
        // goes by windows and kv heads.)
        cases.push_back({2, 64, 512, 80, 80, 128, 0, BF, 1, 0.3, 0, 0, 0});
        cases.push_back({1, 100, 1000, 160, 80, 128, 1, FP, 0, 0, 0, 0, 0});
        cases.push_back({1, 150, 600, 100, 100, 128, 0, BF, 0, 0, 0, 1, 0});
        cases.push_back({1, 130, 640, 60, 60, 128, 0, BF, 2, 0, 0.1f, 0, 0});
        // Long sequences (Tn = 1024 selection rows; Tm = 2048 row tiles), synthetic forward.
        cases.push_back({1, 4096, 131072, 2, 1, 64, 1, BF, 2, 0, 0.05f, 0, 0, 1});
        cases.push_back({1, 131072, 4096, 1, 1, 128, 0, FP, 1, 0.002, 0, 0, 0, 1});
    }
    int fails = 0;
    const bool quick = !strcmp(what, "small") || !strcmp(what, "small64") ||
                       !strcmp(what, "smallpc") || !strcmp(what, "smallp") ||
                       !strcmp(what, "smallnc");
    if (!quick) fails += !check_tile_reference();
    for (auto &c : cases) fails += !run_case(c);
    // Tn over every register-sort width of the warp selection kernel (1..32 keys per lane) and
    // beyond it (the shared-memory sort).
    if (!quick)
        for (int tn : {1, 7, 33, 100, 256, 300, 1000, 1024, 1500})
            fails += !check_selection_synthetic(tn);
    printf("%s: %d case(s) failed\n", what, fails);
    return fails ? 1 : 0;
}
