"""back_lite.integrations.flash_attn: flash_attn 2.x's functions computed by BackLite, on the CPU
backend in fp32 against the float64 reference (the GPU form: tests/gpu/test_gpu_attention.py).
flash_attn itself is not needed: the reference is tests/reference.py."""
import math

import pytest
import torch

import back_lite
import reference as ref
from back_lite import functional, ops
from back_lite.integrations import flash_attn as bl_fa

ATOL = 2e-5  # fp32 rounding against float64 at these sizes


def qkv(batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen)
    return [t.requires_grad_() for t in (q, k, v)]


def reference(q, k, v, dout, scale, causal):
    """float64 out, lse and (dq, dk, dv) of the dense attention, bottom-right causal."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse, _ = ref.attention(q64, k64, v64, scale, causal)
    return out, lse, torch.autograd.grad(out, (q64, k64, v64), dout.double())


@pytest.mark.parametrize("shape,causal,window_size", [
    ((2, 150, 150, 2, 2), False, (-1, -1)),
    ((2, 150, 150, 4, 2), True, (-1, -1)),     # GQA
    ((1, 70, 200, 2, 1), True, (-1, -1)),      # MQA, Sq < Sk: bottom-right, as flash_attn
    ((1, 200, 90, 2, 2), True, (-1, -1)),      # Sq > Sk: the first rows see no key
    ((1, 100, 130, 2, 2), False, (-1, 0)),     # the causal band as a window
    ((1, 100, 130, 2, 2), True, (500, -1)),    # a left window no row reaches
    ((1, 100, 130, 2, 2), False, (129, 99)),   # windows no row reaches on either side
])
def test_flash_attn_func_matches_the_reference(shape, causal, window_size):
    batch, seqlen_q, seqlen_k, heads_q, heads_k = shape
    q, k, v = qkv(batch, seqlen_q, seqlen_k, heads_q, heads_k)
    out, lse, probs = bl_fa.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                            return_attn_probs=True, negl_prob=0.0)
    band = causal or window_size[1] == 0
    dout = torch.randn_like(out)
    out64, lse64, grads64 = reference(q, k, v, dout, 1.0 / math.sqrt(64), band)
    assert probs is None and out.shape == q.shape and lse.shape == (batch, heads_q, seqlen_q)
    torch.testing.assert_close(out.double(), out64, atol=ATOL, rtol=0)
    torch.testing.assert_close(lse.double(), lse64, atol=ATOL, rtol=0)  # -inf rows included
    for g, g64 in zip(torch.autograd.grad(out, (q, k, v), dout), grads64):
        torch.testing.assert_close(g.double(), g64, atol=1e-4, rtol=0)


def test_flash_attn_func_is_back_lite_with_its_arguments():
    """Same bits as back_lite.attention with the same scale, causal flag and negl_prob (so the
    sparse backward is really on), gradients included."""
    q, k, v = qkv(1, 300, 300, 2, 2)
    got = bl_fa.flash_attn_func(q, k, v, softmax_scale=0.2, causal=True, negl_prob=0.3)
    want, _, _ = functional.attention(q, k, v, negl_prob=0.3, scale=0.2, causal=True)
    assert torch.equal(got, want)
    dout = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, (q, k, v), dout)
    for a, b in zip(got_grads, torch.autograd.grad(want, (q, k, v), dout)):
        assert torch.equal(a, b)
    dense = bl_fa.flash_attn_func(q, k, v, softmax_scale=0.2, causal=True, negl_prob=0.0)
    # negl_prob=0.3 skipped some tiles: its dq is not the dense one
    assert not torch.equal(torch.autograd.grad(dense, q, dout)[0], got_grads[0])


def test_packed_forms_are_views_of_the_same_call():
    gen = torch.Generator().manual_seed(3)
    qkv_packed = torch.randn(2, 130, 3, 4, 64, generator=gen).requires_grad_()
    out = bl_fa.flash_attn_qkvpacked_func(qkv_packed, causal=True, negl_prob=0.0)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv_packed.unbind(2))
    want = bl_fa.flash_attn_func(q, k, v, causal=True, negl_prob=0.0)
    assert torch.equal(out, want)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv_packed, dout)
    assert torch.equal(dqkv, torch.stack(torch.autograd.grad(want, (q, k, v), dout), dim=2))

    q = torch.randn(2, 100, 4, 64, generator=gen).requires_grad_()
    kv = torch.randn(2, 130, 2, 2, 64, generator=gen).requires_grad_()  # GQA: 2 K / V heads
    out = bl_fa.flash_attn_kvpacked_func(q, kv, softmax_scale=0.1, negl_prob=0.0)
    assert torch.equal(out, bl_fa.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1],
                                                  softmax_scale=0.1, negl_prob=0.0))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(dropout_p=0.1), "dropout_p=0.1 is not supported"),
    (dict(softcap=30.0), "softcap=30.0 is not supported"),
    (dict(alibi_slopes=torch.ones(2)), "alibi_slopes=.*shape \\(2,\\)"),
    (dict(window_size=(16, 0)), "sliding window of 16 keys to the left"),
    (dict(window_size=(16, -1), causal=True), "sliding window of 16 keys"),
    (dict(window_size=(-1, 8)), "limits each query to 8 keys to its right"),
])
def test_what_back_lite_does_not_compute_is_refused(kwargs, needle):
    q, k, v = qkv(1, 100, 130, 2, 2)
    with pytest.raises(NotImplementedError, match=needle):
        bl_fa.flash_attn_func(q, k, v, **kwargs)


def test_argument_errors():
    q, k, v = qkv(1, 100, 130, 2, 2)
    with pytest.raises(ValueError, match="window_size must be a pair of ints, got 5"):
        bl_fa.flash_attn_func(q, k, v, window_size=5)
    with pytest.raises(ValueError, match="qkv must be \\(B, S, 3, H, D\\), got shape "
                                         "\\(1, 100, 2, 64\\)"):
        bl_fa.flash_attn_qkvpacked_func(q)
    with pytest.raises(ValueError, match="kv must be \\(B, Sk, 2, Hk, D\\)"):
        bl_fa.flash_attn_kvpacked_func(q, torch.stack([k, v, v], dim=2))
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor, got list"):
        bl_fa.flash_attn_qkvpacked_func([q, k, v])
    with pytest.raises(ValueError, match="negl_prob must be in \\[0, 1\\), got 1.0"):
        bl_fa.flash_attn_func(q, k, v, negl_prob=1.0)


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic(monkeypatch, deterministic):
    """deterministic reaches the library's backward call (where CUDA runs its deterministic form:
    tests/gpu has that end to end); the CPU backward gives the same bits either way."""
    seen = []
    launch = ops._launch_backward

    def spy(*args):
        seen.append(args[-1])
        return launch(*args)

    monkeypatch.setattr(ops, "_launch_backward", spy)
    q, k, v = qkv(1, 100, 130, 2, 2)
    dout = torch.randn(1, 100, 2, 64)
    runs = [torch.autograd.grad(bl_fa.flash_attn_func(q, k, v, deterministic=deterministic),
                                (q, k, v), dout) for _ in range(2)]
    assert seen == [deterministic] * 2
    default = torch.autograd.grad(bl_fa.flash_attn_func(q, k, v), (q, k, v), dout)
    for a, b, c in zip(*runs, default):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_exported_from_the_package():
    from back_lite.integrations import flash_attn_func
    assert flash_attn_func is bl_fa.flash_attn_func
    assert back_lite.integrations.flash_attn is bl_fa


def test_compiles_fullgraph():
    """The argument handling is plain Python on shapes and constants: torch.compile traces it
    into one graph with BackLite's ops, and the result is the eager one, bit for bit."""
    q, k, v = qkv(1, 200, 200, 2, 2)

    def attend(q, k, v):
        return bl_fa.flash_attn_func(q, k, v, causal=True, window_size=(-1, 0), negl_prob=0.1)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), attend(q, k, v)
    assert torch.equal(got, want)
    dout = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dout),
                    torch.autograd.grad(want, (q, k, v), dout)):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- FlashAttention-3

def test_fa3_signature_matches_the_reference():
    from back_lite.integrations import flash_attn3 as bl_fa3
    q, k, v = qkv(1, 70, 200, 4, 2)
    out = bl_fa3.flash_attn_func(q, k, v, 0.1, True, num_splits=4, pack_gqa=True, sm_margin=8,
                                 negl_prob=0.0)  # scheduling knobs: no effect
    out2, lse = bl_fa3.flash_attn_func(q, k, v, softmax_scale=0.1, causal=True,
                                       window_size=(None, None), return_attn_probs=True,
                                       negl_prob=0.0)
    assert torch.equal(out, out2)
    dout = torch.randn_like(out)
    out64, lse64, grads64 = reference(q, k, v, dout, 0.1, True)
    torch.testing.assert_close(out.double(), out64, atol=ATOL, rtol=0)
    torch.testing.assert_close(lse.double(), lse64, atol=ATOL, rtol=0)
    for g, g64 in zip(torch.autograd.grad(out, (q, k, v), dout), grads64):
        torch.testing.assert_close(g.double(), g64, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(qv=torch.zeros(1)), "qv=<tensor of shape \\(1,\\)> is not supported"),
    (dict(q_descale=torch.ones(1)), "q_descale=.* no fp8"),
    (dict(v_descale=torch.ones(1)), "v_descale=.* no fp8"),
    (dict(attention_chunk=256), "attention_chunk=256 is not supported"),
    (dict(softcap=15.0), "softcap=15.0"),
    (dict(window_size=(32, 0)), "sliding window of 32 keys"),
])
def test_fa3_refusals(kwargs, needle):
    from back_lite.integrations import flash_attn3 as bl_fa3
    q, k, v = qkv(1, 100, 130, 2, 2)
    with pytest.raises(NotImplementedError, match=needle):
        bl_fa3.flash_attn_func(q, k, v, **kwargs)
