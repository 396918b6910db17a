/* test_args.c -- every public function rejects bad arguments with BL_ERR_INVALID_ARGUMENT (or the
 * documented status) and a last-error message that names the argument; library information;
 * the last-error text is per thread. */
#include "check.h"

#ifndef __STDC_NO_THREADS__
#include <threads.h>
#endif

/* A small valid problem with real buffers, so that each test can break exactly one thing. */
enum { B = 1, SQ = 5, SK = 7, HQ = 4, HK = 2, D = 8 };

static float q_buf[B * SQ * HQ * D], out_buf[B * SQ * HQ * D], dout_buf[B * SQ * HQ * D],
    dq_buf[B * SQ * HQ * D];
static float k_buf[B * SK * HK * D], v_buf[B * SK * HK * D], dk_buf[B * SK * HK * D],
    dv_buf[B * SK * HK * D];
static float lse_buf[B * HQ * SQ], w_buf[B * HQ * 1 * 1];
static uint8_t mask_buf[B * HQ * 1 * 1];

static bl_attn_desc good_desc(void) {
    bl_attn_desc d;
    memset(&d, 0, sizeof d);
    d.backend = BL_BACKEND_CPU, d.dtype = BL_DTYPE_F32;
    d.batch = B, d.seqlen_q = SQ, d.seqlen_k = SK, d.heads_q = HQ, d.heads_k = HK, d.head_dim = D;
    d.scale = 0.35f, d.causal = 1;
    return d;
}

static bl_tensor tq(float *data) { /* (B, SQ, HQ, D) contiguous */
    bl_tensor t = {data, SQ * HQ * D, HQ * D, D};
    return t;
}
static bl_tensor tk(float *data) { /* (B, SK, HK, D) contiguous */
    bl_tensor t = {data, SK * HK * D, HK * D, D};
    return t;
}

/* The status must be `want` and the message must contain `needle`. */
static void expect_error(const char *what, bl_status got, bl_status want, const char *needle) {
    const char *msg = bl_last_error();
    EXPECT(got == want, "%s: status %d (%s), want %d (%s); message: \"%s\"", what, (int)got,
           bl_status_string(got), (int)want, bl_status_string(want), msg);
    EXPECT(strstr(msg, needle) != NULL, "%s: message \"%s\" does not name \"%s\"", what, msg,
           needle);
}

static bl_status forward_with(const bl_attn_desc *d) {
    return bl_forward(d, tq(q_buf), tk(k_buf), tk(v_buf), tq(out_buf), lse_buf, w_buf);
}

typedef struct desc_case {
    const char *what, *needle;
    bl_attn_desc d;
} desc_case;

/* Every desc field out of range, through every function that takes a desc. */
static void bad_desc_everywhere(void) {
    desc_case cases[32];
    int n = 0;
#define ADD(needle_, field_, value_)                                                          \
    do {                                                                                      \
        cases[n].what = #field_ " = " #value_;                                                \
        cases[n].needle = needle_;                                                            \
        cases[n].d = good_desc();                                                             \
        cases[n].d.field_ = value_;                                                           \
        ++n;                                                                                  \
    } while (0)
    ADD("backend", backend, (bl_backend)7);
    ADD("backend", backend, (bl_backend)-1);
    ADD("dtype", dtype, (bl_dtype)3);
    ADD("batch", batch, 0);
    ADD("seqlen_q", seqlen_q, 0);
    ADD("seqlen_k", seqlen_k, -3);
    ADD("heads_q", heads_q, 0);
    ADD("heads_k", heads_k, 0);
    ADD("heads_k", heads_k, 3); /* 4 % 3 != 0 */
    ADD("head_dim", head_dim, 0);
    ADD("head_dim", head_dim, 7);   /* odd */
    ADD("head_dim", head_dim, 258); /* > BL_MAX_HEAD_DIM */
    ADD("scale", scale, NAN);
    ADD("scale", scale, INFINITY);
    ADD("causal", causal, 2);
    ADD("causal", causal, -1);
    ADD("deterministic", deterministic, 2);
    ADD("deterministic", deterministic, -1);
#undef ADD
    for (int i = 0; i < n; ++i) {
        char what[128];
        bl_attn_desc *d = &cases[i].d;
        int64_t tm, tn;
        size_t bytes;
        snprintf(what, sizeof what, "bl_forward, %s", cases[i].what);
        expect_error(what, forward_with(d), BL_ERR_INVALID_ARGUMENT, cases[i].needle);
        snprintf(what, sizeof what, "bl_backward, %s", cases[i].what);
        expect_error(what,
                     bl_backward(d, tq(q_buf), tk(k_buf), tk(v_buf), tq(out_buf), tq(dout_buf),
                                 lse_buf, NULL, 0.0f, NULL, tq(dq_buf), tk(dk_buf), tk(dv_buf)),
                     BL_ERR_INVALID_ARGUMENT, cases[i].needle);
        snprintf(what, sizeof what, "bl_select_tiles, %s", cases[i].what);
        expect_error(what, bl_select_tiles(d, w_buf, 0.1f, mask_buf), BL_ERR_INVALID_ARGUMENT,
                     cases[i].needle);
        snprintf(what, sizeof what, "bl_num_tiles, %s", cases[i].what);
        expect_error(what, bl_num_tiles(d, &tm, &tn), BL_ERR_INVALID_ARGUMENT, cases[i].needle);
        snprintf(what, sizeof what, "bl_workspace_size, %s", cases[i].what);
        expect_error(what, bl_workspace_size(d, BL_OP_FORWARD, 1, &bytes),
                     BL_ERR_INVALID_ARGUMENT, cases[i].needle);
    }
    expect_error("bl_forward, desc NULL", forward_with(NULL), BL_ERR_INVALID_ARGUMENT, "desc");
    int64_t tm, tn;
    expect_error("bl_num_tiles, desc NULL", bl_num_tiles(NULL, &tm, &tn), BL_ERR_INVALID_ARGUMENT,
                 "desc");
    expect_error("bl_select_tiles, desc NULL", bl_select_tiles(NULL, w_buf, 0.1f, mask_buf),
                 BL_ERR_INVALID_ARGUMENT, "desc");
}

/* Null data and bad strides in every tensor argument. */
static void bad_tensors(void) {
    bl_attn_desc d = good_desc();
    bl_tensor q = tq(q_buf), k = tk(k_buf), v = tk(v_buf), out = tq(out_buf);
    bl_tensor dout = tq(dout_buf), dq = tq(dq_buf), dk = tk(dk_buf), dv = tk(dv_buf);
    bl_tensor *fwd[] = {&q, &k, &v, &out};
    const char *fwd_names[] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; ++i) {
        bl_tensor saved = *fwd[i];
        char what[96], needle[48];
        fwd[i]->data = NULL;
        snprintf(what, sizeof what, "bl_forward, %s.data NULL", fwd_names[i]);
        snprintf(needle, sizeof needle, "%s.data", fwd_names[i]);
        expect_error(what, bl_forward(&d, q, k, v, out, lse_buf, w_buf), BL_ERR_INVALID_ARGUMENT,
                     needle);
        *fwd[i] = saved;
        fwd[i]->stride_s = 0;
        snprintf(what, sizeof what, "bl_forward, %s.stride_s 0", fwd_names[i]);
        snprintf(needle, sizeof needle, "%s.stride_s", fwd_names[i]);
        expect_error(what, bl_forward(&d, q, k, v, out, lse_buf, w_buf), BL_ERR_INVALID_ARGUMENT,
                     needle);
        *fwd[i] = saved;
        fwd[i]->stride_h = -D;
        snprintf(what, sizeof what, "bl_forward, %s.stride_h negative", fwd_names[i]);
        snprintf(needle, sizeof needle, "%s.stride_h", fwd_names[i]);
        expect_error(what, bl_forward(&d, q, k, v, out, lse_buf, w_buf), BL_ERR_INVALID_ARGUMENT,
                     needle);
        *fwd[i] = saved;
        fwd[i]->stride_b = -1; /* B == 1: any stride is never stepped over, but not negative */
        snprintf(what, sizeof what, "bl_forward, %s.stride_b negative", fwd_names[i]);
        snprintf(needle, sizeof needle, "%s.stride_b", fwd_names[i]);
        expect_error(what, bl_forward(&d, q, k, v, out, lse_buf, w_buf), BL_ERR_INVALID_ARGUMENT,
                     needle);
        *fwd[i] = saved;
    }
    expect_error("bl_forward, lse NULL", bl_forward(&d, q, k, v, out, NULL, w_buf),
                 BL_ERR_INVALID_ARGUMENT, "lse");

    bl_tensor *bwd[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
    const char *bwd_names[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < 8; ++i) {
        bl_tensor saved = *bwd[i];
        char what[96], needle[48];
        bwd[i]->data = NULL;
        snprintf(what, sizeof what, "bl_backward, %s.data NULL", bwd_names[i]);
        snprintf(needle, sizeof needle, "%s.data", bwd_names[i]);
        expect_error(what,
                     bl_backward(&d, q, k, v, out, dout, lse_buf, w_buf, 0.1f, NULL, dq, dk, dv),
                     BL_ERR_INVALID_ARGUMENT, needle);
        *bwd[i] = saved;
        bwd[i]->stride_s = -5;
        snprintf(what, sizeof what, "bl_backward, %s.stride_s negative", bwd_names[i]);
        snprintf(needle, sizeof needle, "%s.stride_s", bwd_names[i]);
        expect_error(what,
                     bl_backward(&d, q, k, v, out, dout, lse_buf, w_buf, 0.1f, NULL, dq, dk, dv),
                     BL_ERR_INVALID_ARGUMENT, needle);
        *bwd[i] = saved;
    }
    expect_error("bl_backward, lse NULL",
                 bl_backward(&d, q, k, v, out, dout, NULL, w_buf, 0.1f, NULL, dq, dk, dv),
                 BL_ERR_INVALID_ARGUMENT, "lse");
    expect_error("bl_backward, selection asked without tile_mass",
                 bl_backward(&d, q, k, v, out, dout, lse_buf, NULL, 0.1f, NULL, dq, dk, dv),
                 BL_ERR_INVALID_ARGUMENT, "tile_mass");
    const float bad_negl[] = {-0.01f, 1.0f, 1.5f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_negl / sizeof *bad_negl; ++i) {
        char what[96];
        snprintf(what, sizeof what, "bl_backward, negl_prob %g", (double)bad_negl[i]);
        expect_error(what,
                     bl_backward(&d, q, k, v, out, dout, lse_buf, w_buf, bad_negl[i], NULL, dq,
                                 dk, dv),
                     BL_ERR_INVALID_ARGUMENT, "negl_prob");
        snprintf(what, sizeof what, "bl_select_tiles, negl_prob %g", (double)bad_negl[i]);
        expect_error(what, bl_select_tiles(&d, w_buf, bad_negl[i], mask_buf),
                     BL_ERR_INVALID_ARGUMENT, "negl_prob");
    }
    expect_error("bl_select_tiles, tile_mass NULL", bl_select_tiles(&d, NULL, 0.1f, mask_buf),
                 BL_ERR_INVALID_ARGUMENT, "tile_mass");
    expect_error("bl_select_tiles, mask NULL", bl_select_tiles(&d, w_buf, 0.1f, NULL),
                 BL_ERR_INVALID_ARGUMENT, "mask");

    /* Valid corner cases that must be accepted: stride 0 on a dim of size 1, a transposed
     * layout, tile_mass NULL with negl_prob 0 (dense) or with an explicit mask. */
    bl_attn_desc one_head = good_desc();
    one_head.heads_q = 1, one_head.heads_k = 1;
    bl_tensor q1 = {q_buf, 0, D, 0}, k1 = {k_buf, 0, D, 0}, v1 = {v_buf, 0, D, 0};
    bl_tensor o1 = {out_buf, 0, D, 0};
    bl_status st = bl_forward(&one_head, q1, k1, v1, o1, lse_buf, NULL);
    EXPECT(st == BL_OK, "stride 0 on size-1 dims rejected: %s", bl_last_error());
    EXPECT(bl_last_error()[0] == '\0', "a successful call leaves last error \"%s\"",
           bl_last_error());
    bl_tensor q_t = {q_buf, SQ * HQ * D, D, SQ * D}; /* (B, H, S, D) memory */
    st = bl_forward(&d, q_t, k, v, out, lse_buf, w_buf);
    EXPECT(st == BL_OK, "a (B, H, S, D) memory layout rejected: %s", bl_last_error());
    st = bl_backward(&d, q, k, v, out, dout, lse_buf, NULL, 0.0f, NULL, dq, dk, dv);
    EXPECT(st == BL_OK, "dense backward without tile_mass rejected: %s", bl_last_error());
    memset(mask_buf, 1, sizeof mask_buf);
    st = bl_backward(&d, q, k, v, out, dout, lse_buf, NULL, 0.5f, mask_buf, dq, dk, dv);
    EXPECT(st == BL_OK, "explicit mask without tile_mass rejected: %s", bl_last_error());
}

static void other_functions(void) {
    bl_attn_desc d = good_desc();
    int tm_i = 0, tn_i = 0;
    int64_t tm = 0, tn = 0;
    size_t bytes = 123;

    EXPECT(bl_tile_shape(BL_BACKEND_CPU, &tm_i, &tn_i) == BL_OK && tm_i == BL_TILE_M &&
               tn_i == BL_TILE_N,
           "bl_tile_shape(CPU) = (%d, %d), want (%d, %d)", tm_i, tn_i, BL_TILE_M, BL_TILE_N);
    EXPECT(bl_tile_shape(BL_BACKEND_CUDA, &tm_i, &tn_i) == BL_OK && tm_i == BL_TILE_M &&
               tn_i == BL_TILE_N,
           "bl_tile_shape(CUDA) = (%d, %d), want (%d, %d)", tm_i, tn_i, BL_TILE_M, BL_TILE_N);
    expect_error("bl_tile_shape, backend 9", bl_tile_shape((bl_backend)9, &tm_i, &tn_i),
                 BL_ERR_INVALID_ARGUMENT, "backend");
    expect_error("bl_tile_shape, tile_m NULL", bl_tile_shape(BL_BACKEND_CPU, NULL, &tn_i),
                 BL_ERR_INVALID_ARGUMENT, "tile_m");
    expect_error("bl_tile_shape, tile_n NULL", bl_tile_shape(BL_BACKEND_CPU, &tm_i, NULL),
                 BL_ERR_INVALID_ARGUMENT, "tile_n");

    const int64_t lens[][4] = {{1, 1, 1, 1}, {64, 128, 1, 1}, {65, 129, 2, 2}, {4096, 1000, 64, 8}};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; ++i) {
        d.seqlen_q = lens[i][0], d.seqlen_k = lens[i][1];
        bl_status st = bl_num_tiles(&d, &tm, &tn);
        EXPECT(st == BL_OK && tm == lens[i][2] && tn == lens[i][3],
               "bl_num_tiles(Sq=%lld, Sk=%lld) = (%lld, %lld), want (%lld, %lld)",
               (long long)lens[i][0], (long long)lens[i][1], (long long)tm, (long long)tn,
               (long long)lens[i][2], (long long)lens[i][3]);
    }
    d = good_desc();
    expect_error("bl_num_tiles, num_tiles_m NULL", bl_num_tiles(&d, NULL, &tn),
                 BL_ERR_INVALID_ARGUMENT, "num_tiles_m");
    expect_error("bl_num_tiles, num_tiles_n NULL", bl_num_tiles(&d, &tm, NULL),
                 BL_ERR_INVALID_ARGUMENT, "num_tiles_n");

    EXPECT(bl_workspace_size(&d, BL_OP_BACKWARD, 0, &bytes) == BL_OK && bytes == 0,
           "bl_workspace_size(CPU) = %zu, want 0", bytes);
    expect_error("bl_workspace_size, op 5", bl_workspace_size(&d, (bl_op)5, 0, &bytes),
                 BL_ERR_INVALID_ARGUMENT, "op");
    expect_error("bl_workspace_size, with_stats 2", bl_workspace_size(&d, BL_OP_FORWARD, 2, &bytes),
                 BL_ERR_INVALID_ARGUMENT, "with_stats");
    expect_error("bl_workspace_size, bytes NULL", bl_workspace_size(&d, BL_OP_FORWARD, 0, NULL),
                 BL_ERR_INVALID_ARGUMENT, "bytes");

    /* Sizes whose element counts overflow int64 offsets are refused, not computed. */
    bl_attn_desc huge = good_desc();
    huge.batch = (int64_t)1 << 40, huge.seqlen_q = (int64_t)1 << 40;
    expect_error("bl_num_tiles, overflowing sizes", bl_num_tiles(&huge, &tm, &tn),
                 BL_ERR_INVALID_ARGUMENT, "too large");

    /* The CUDA backend: a valid call either runs (device present) or says it is not there. */
    EXPECT(bl_backend_available(BL_BACKEND_CPU) == 1, "the CPU backend must be available");
    EXPECT(bl_backend_available((bl_backend)5) == 0, "backend 5 reported available");
    if (!bl_backend_available(BL_BACKEND_CUDA)) {
        bl_attn_desc cuda = good_desc();
        cuda.backend = BL_BACKEND_CUDA, cuda.dtype = BL_DTYPE_BF16;
        bl_status st = forward_with(&cuda);
        EXPECT(st == BL_ERR_NO_BACKEND, "bl_forward on an absent CUDA backend returned %d (%s)",
               (int)st, bl_last_error());
        EXPECT(strstr(bl_last_error(), "CUDA") != NULL, "absent CUDA backend message: \"%s\"",
               bl_last_error());
        st = bl_select_tiles(&cuda, w_buf, 0.1f, mask_buf);
        EXPECT(st == BL_ERR_NO_BACKEND, "bl_select_tiles on an absent CUDA backend returned %d "
               "(%s)", (int)st, bl_last_error());
        st = bl_backward(&cuda, tq(q_buf), tk(k_buf), tk(v_buf), tq(out_buf), tq(dout_buf),
                         lse_buf, NULL, 0.0f, NULL, tq(dq_buf), tk(dk_buf), tk(dv_buf));
        EXPECT(st == BL_ERR_NO_BACKEND, "bl_backward on an absent CUDA backend returned %d (%s)",
               (int)st, bl_last_error());
    }

    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", BL_VERSION_MAJOR, BL_VERSION_MINOR,
             BL_VERSION_PATCH);
    EXPECT(strcmp(bl_version_string(), version) == 0, "bl_version_string() = \"%s\", want \"%s\"",
           bl_version_string(), version);
    EXPECT(bl_abi_version() == BL_ABI_VERSION, "bl_abi_version() = %d, want %d", bl_abi_version(),
           BL_ABI_VERSION);
    for (int s = BL_OK; s <= BL_ERR_NOT_DETERMINISTIC; ++s)
        EXPECT(bl_status_string((bl_status)s) && bl_status_string((bl_status)s)[0],
               "bl_status_string(%d) is empty", s);
    EXPECT(strcmp(bl_status_string(BL_OK), bl_status_string(BL_ERR_INVALID_ARGUMENT)) != 0,
           "bl_status_string does not tell statuses apart");
    EXPECT(bl_status_string((bl_status)99) != NULL, "bl_status_string(99) is NULL");
}

/* bl_supports: the CPU backend takes every valid kind; the CUDA backend bf16 / fp16 at head dims
 * 64 and 128 where it is compiled in (no device needed), else it is reported absent for all. */
static void supports_query(void) {
    const bl_dtype dtypes[] = {BL_DTYPE_F32, BL_DTYPE_F16, BL_DTYPE_BF16};
    const int64_t head_dims[] = {2, 40, 64, 80, 96, 128, 160, 256};
    for (int t = 0; t < 3; ++t)
        for (int h = 0; h < 8; ++h)
            EXPECT(bl_supports(BL_BACKEND_CPU, dtypes[t], head_dims[h]) == BL_OK,
                   "bl_supports(CPU, dtype %d, head_dim %lld): %s", (int)dtypes[t],
                   (long long)head_dims[h], bl_last_error());

    expect_error("bl_supports, backend 5", bl_supports((bl_backend)5, BL_DTYPE_F32, 64),
                 BL_ERR_INVALID_ARGUMENT, "backend");
    expect_error("bl_supports, dtype 7", bl_supports(BL_BACKEND_CPU, (bl_dtype)7, 64),
                 BL_ERR_INVALID_ARGUMENT, "dtype");
    const int64_t bad_head_dims[] = {0, -64, 63, BL_MAX_HEAD_DIM + 2};
    for (int h = 0; h < 4; ++h) {
        expect_error("bl_supports, bad head_dim", bl_supports(BL_BACKEND_CPU, BL_DTYPE_F32,
                                                              bad_head_dims[h]),
                     BL_ERR_INVALID_ARGUMENT, "head_dim");
        expect_error("bl_supports, bad head_dim on CUDA",
                     bl_supports(BL_BACKEND_CUDA, BL_DTYPE_BF16, bad_head_dims[h]),
                     BL_ERR_INVALID_ARGUMENT, "head_dim");
    }

    const bl_status cuda128 = bl_supports(BL_BACKEND_CUDA, BL_DTYPE_BF16, 128);
    if (bl_backend_available(BL_BACKEND_CUDA))
        EXPECT(cuda128 == BL_OK, "CUDA is available but bl_supports(CUDA, bf16, 128) = %d: %s",
               (int)cuda128, bl_last_error());
    if (cuda128 == BL_OK) { /* compiled in */
        EXPECT(bl_supports(BL_BACKEND_CUDA, BL_DTYPE_F16, 128) == BL_OK, "CUDA fp16 128: %s",
               bl_last_error());
        EXPECT(bl_supports(BL_BACKEND_CUDA, BL_DTYPE_BF16, 64) == BL_OK, "CUDA bf16 64: %s",
               bl_last_error());
        EXPECT(bl_supports(BL_BACKEND_CUDA, BL_DTYPE_F16, 64) == BL_OK, "CUDA fp16 64: %s",
               bl_last_error());
        expect_error("bl_supports(CUDA, fp32)", bl_supports(BL_BACKEND_CUDA, BL_DTYPE_F32, 128),
                     BL_ERR_UNSUPPORTED, "dtype=0");
        const int64_t other[] = {2, 40, 80, 96, 160, 256};
        for (int h = 0; h < 6; ++h)
            expect_error("bl_supports(CUDA, another head dim)",
                         bl_supports(BL_BACKEND_CUDA, BL_DTYPE_BF16, other[h]),
                         BL_ERR_UNSUPPORTED, "64 and 128");
    } else {
        expect_error("bl_supports(CUDA) without the CUDA backend", cuda128, BL_ERR_NO_BACKEND,
                     "not compiled");
        expect_error("bl_supports(CUDA, 80) without the CUDA backend",
                     bl_supports(BL_BACKEND_CUDA, BL_DTYPE_BF16, 80), BL_ERR_NO_BACKEND,
                     "not compiled");
    }
}

#ifndef __STDC_NO_THREADS__
/* Another thread's failure must not show in this thread's last error, nor this one's there. */
static int failing_thread(void *arg) {
    (void)arg;
    int64_t tm, tn;
    bl_attn_desc d = good_desc();
    d.batch = -9;
    bl_status st = bl_num_tiles(&d, &tm, &tn);
    return st == BL_ERR_INVALID_ARGUMENT && strstr(bl_last_error(), "batch") != NULL;
}

static void last_error_per_thread(void) {
    int64_t tm, tn;
    bl_attn_desc d = good_desc();
    d.heads_k = 3;
    bl_num_tiles(&d, &tm, &tn);
    thrd_t thread;
    int thread_ok = 0;
    EXPECT(thrd_create(&thread, failing_thread, NULL) == thrd_success, "thrd_create failed");
    thrd_join(thread, &thread_ok);
    EXPECT(thread_ok, "the other thread did not see its own error");
    EXPECT(strstr(bl_last_error(), "heads_k") != NULL && strstr(bl_last_error(), "batch") == NULL,
           "this thread's last error changed to \"%s\"", bl_last_error());
}
#endif

int main(void) {
    /* the valid base problem runs, so every failure below is due to the one broken argument */
    bl_attn_desc d = good_desc();
    EXPECT(forward_with(&d) == BL_OK, "the valid base forward failed: %s", bl_last_error());
    EXPECT(bl_backward(&d, tq(q_buf), tk(k_buf), tk(v_buf), tq(out_buf), tq(dout_buf), lse_buf,
                       w_buf, 0.1f, NULL, tq(dq_buf), tk(dk_buf), tk(dv_buf)) == BL_OK,
           "the valid base backward failed: %s", bl_last_error());
    bad_desc_everywhere();
    bad_tensors();
    other_functions();
    supports_query();
#ifndef __STDC_NO_THREADS__
    last_error_per_thread();
#endif
    return test_summary("test_args");
}
