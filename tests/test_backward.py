"""Backward on the CPU backend: dense (negl_prob = 0) against autograd through the float64
reference; explicit-mask and sparse (tile mass + negl_prob) against the reference masked backward."""
import math

import pytest
import torch

import back_lite
import reference as ref
from inputs import local_qkv, random_qkv

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
LENGTHS = [(1, 1), (63, 63), (65, 130), (130, 63), (130, 130), (1, 130)]


def lowp_autograd(q, k, v, dout, scale, causal):
    """PyTorch's own low-precision gradients: autograd through the reference in q's dtype."""
    ql, kl, vl = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, _, _ = ref.attention(ql, kl, vl, scale, causal, q.dtype)
    return torch.autograd.grad(out, (ql, kl, vl), dout)


def check_grads(got, want64, baseline, names=("dq", "dk", "dv")):
    for name, g, w, b in zip(names, got, want64, baseline):
        ref.check_close(name, g, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 96])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", LENGTHS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dense_backward_equals_autograd(dtype, head_dim, causal, seqlens):
    q, k, v = random_qkv(2, seqlens[0], seqlens[1], 2, 2, head_dim, dtype)
    dout = torch.randn(q.shape).to(dtype)
    scale = 1.0 / math.sqrt(head_dim)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = back_lite.BackLite(negl_prob=0.0)(qg, kg, vg, causal=causal)
    got = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert all(g.dtype == dtype for g in got)
    check_grads(got, ref.dense_autograd(q, k, v, dout, scale, causal),
                lowp_autograd(q, k, v, dout, scale, causal))
    empty = ~ref.allowed_keys(seqlens[0], seqlens[1], causal).any(dim=1)
    if empty.any():  # rows with no allowed key get no gradient
        assert torch.all(got[0][:, empty] == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (6, 3)], ids=lambda h: f"Hq{h[0]}Hk{h[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_dense_backward_gqa_mqa(dtype, heads, causal):
    q, k, v = random_qkv(2, 97, 150, heads[0], heads[1], 64, dtype)
    dout = torch.randn(q.shape).to(dtype)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = back_lite.BackLite(negl_prob=0.0)(qg, kg, vg, causal=causal)
    got = torch.autograd.grad(out, (qg, kg, vg), dout)
    check_grads(got, ref.dense_autograd(q, k, v, dout, 0.125, causal),
                lowp_autograd(q, k, v, dout, 0.125, causal))


def masked_reference(q, k, v, out, dout, scale, causal, mask):
    tile = back_lite.tile_shape("cpu")
    want = ref.backward(q, k, v, out, dout, scale, causal, mask, tile, torch.float64)
    base = ref.backward(q, k, v, out, dout, scale, causal, mask, tile, q.dtype)
    return want, base


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2)], ids=lambda h: f"Hq{h[0]}Hk{h[1]}")
def test_explicit_mask_backward(dtype, causal, heads):
    q, k, v = random_qkv(2, 200, 300, heads[0], heads[1], 64, dtype)
    dout = torch.randn(q.shape).to(dtype)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    tm, tn = back_lite.num_tiles(200, 300)
    mask = torch.rand(2, heads[0], tm, tn) < 0.5
    got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    want, base = masked_reference(q, k, v, out, dout, 0.125, causal, mask)
    check_grads(got, want, base)
    # an all-true mask is the dense backward, bit for bit
    dense = back_lite.backward(dout, q, k, v, out, lse, causal=causal)
    full = back_lite.backward(dout, q, k, v, out, lse, causal=causal,
                              mask=torch.ones(2, heads[0], tm, tn, dtype=torch.bool))
    for a, b in zip(dense, full):
        assert torch.equal(a, b)
    # an all-false mask computes nothing
    none = back_lite.backward(dout, q, k, v, out, lse, causal=causal,
                              mask=torch.zeros(2, heads[0], tm, tn, dtype=torch.bool))
    for g in none:
        assert torch.all(g == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("negl_prob", [0.02, 0.1, 0.3])
def test_sparse_backward_equals_reference_masked(dtype, causal, negl_prob):
    q, k, v = local_qkv(1, 512, 4, 2, 64, dtype, sharpness=8.0)
    dout = torch.randn(q.shape).to(dtype)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    mask = back_lite.select(w, negl_prob)
    want_mask, ambiguous = ref.select(w, negl_prob)
    assert torch.equal(mask | ambiguous, want_mask | ambiguous)
    sparsity = back_lite.backward_sparsity(mask, 512, 512, causal)
    assert sparsity > 0.1, f"inputs not sparse enough to test the sparse path: {sparsity}"
    got = back_lite.backward(dout, q, k, v, out, lse, tile_mass=w, negl_prob=negl_prob,
                             causal=causal)
    want, base = masked_reference(q, k, v, out, dout, 0.125, causal, mask)
    check_grads(got, want, base)
    # the same backward through autograd (BackLite module) gives the same numbers
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out_m = back_lite.BackLite(negl_prob=negl_prob)(qg, kg, vg, causal=causal)
    assert torch.equal(out_m, out)
    grads = torch.autograd.grad(out_m, (qg, kg, vg), dout)
    for a, b in zip(grads, got):
        assert torch.equal(a, b)


def test_sparse_backward_error_shrinks_with_negl_prob():
    q, k, v = local_qkv(1, 512, 2, 2, 64, torch.float32, sharpness=8.0)
    dout = torch.randn(q.shape)
    out, lse, w = back_lite.forward(q, k, v, with_stats=True)
    dense = back_lite.backward(dout, q, k, v, out, lse)
    errors = []
    for negl_prob in (0.3, 0.1, 0.01, 0.0):
        sparse = back_lite.backward(dout, q, k, v, out, lse, tile_mass=w, negl_prob=negl_prob)
        errors.append(float((sparse[0] - dense[0]).norm() / dense[0].norm()))
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] == 0.0


def test_backward_through_sum_uses_expanded_gradient():
    """out.sum() hands autograd a stride-0 gradient; it must still work."""
    q, k, v = random_qkv(1, 70, 70, 2, 2, 64, torch.float32)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    back_lite.BackLite(negl_prob=0.0)(qg, kg, vg).sum().backward()
    want = ref.dense_autograd(q, k, v, torch.ones(q.shape), 0.125, False)
    for g, w in zip((qg.grad, kg.grad, vg.grad), want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)


def test_backward_into_caller_buffers():
    q, k, v = random_qkv(2, 100, 140, 4, 2, 64, torch.bfloat16)
    dout = torch.randn(q.shape).to(torch.bfloat16)
    out, lse, _ = back_lite.forward(q, k, v, causal=True)
    dq, dk, dv = torch.full_like(q, 7.0), torch.full_like(k, 7.0), torch.full_like(v, 7.0)
    res = back_lite.backward(dout, q, k, v, out, lse, causal=True, dq=dq, dk=dk, dv=dv)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    for a, b in zip(res, back_lite.backward(dout, q, k, v, out, lse, causal=True)):
        assert torch.equal(a, b)  # overwritten, not accumulated


def test_ring_attention_with_global_out_and_lse():
    """Two key shards, each run with the low-level API, merged through the global out and lse
    (as ring attention does), give the full attention's forward and gradients."""
    q, k, v = random_qkv(1, 150, 256, 4, 2, 64, torch.float32)
    dout = torch.randn(q.shape)
    shards = [(k[:, :128], v[:, :128]), (k[:, 128:], v[:, 128:])]
    parts = [back_lite.forward(q, ks, vs) for ks, vs in shards]
    lse = torch.logaddexp(parts[0][1], parts[1][1])  # (B, Hq, Sq)
    weight = [torch.exp(p[1] - lse).transpose(1, 2)[..., None] for p in parts]  # (B, Sq, Hq, 1)
    out = weight[0] * parts[0][0] + weight[1] * parts[1][0]
    full_out, full_lse, _ = back_lite.forward(q, k, v)
    torch.testing.assert_close(out, full_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, full_lse, rtol=1e-5, atol=1e-5)
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for ks, vs in shards:
        dq_s, dk_s, dv_s = back_lite.backward(dout, q, ks, vs, out, lse)
        dq += dq_s
        dks.append(dk_s)
        dvs.append(dv_s)
    full = back_lite.backward(dout, q, k, v, full_out, full_lse)
    torch.testing.assert_close(dq, full[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(dks, 1), full[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(dvs, 1), full[2], rtol=1e-4, atol=1e-5)
