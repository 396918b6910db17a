"""torch.compile(fullgraph=True) through the custom ops: forward + backward, dense and sparse,
and the low-level functional API (mutating ops)."""
import pytest
import torch

import back_lite
from inputs import local_qkv, random_qkv


def grads_of(fn, q, k, v, dout):
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = fn(qg, kg, vg)
    return (out,) + torch.autograd.grad(out, (qg, kg, vg), dout)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("negl_prob", [0.0, 0.1])
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_module_matches_eager(backend, negl_prob, causal):
    torch._dynamo.reset()
    q, k, v = local_qkv(1, 256, 4, 2, 64, torch.bfloat16, sharpness=8.0)
    dout = torch.randn(q.shape).to(torch.bfloat16)
    attn = back_lite.BackLite(negl_prob=negl_prob)

    def fn(q, k, v):
        return attn(q, k, v, causal=causal) * 2.0

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for a, b in zip(grads_of(compiled, q, k, v, dout), grads_of(fn, q, k, v, dout)):
        assert torch.equal(a, b)


def test_compiled_functional_low_level_api():
    """forward into caller buffers, select, explicit-mask backward into caller buffers."""
    torch._dynamo.reset()
    q, k, v = random_qkv(1, 130, 200, 4, 2, 64, torch.float32)
    dout = torch.randn(q.shape)

    def fn(q, k, v, dout, out, lse, stats, dq, dk, dv):
        back_lite.forward(q, k, v, causal=True, out=out, lse=lse, tile_stats=stats)
        mask = back_lite.select(stats, 0.05)
        back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=True, dq=dq, dk=dk, dv=dv)
        return mask

    def buffers():
        tm, tn = back_lite.num_tiles(130, 200)
        return (torch.empty_like(q), torch.empty(1, 4, 130), torch.empty(1, 4, tm, tn),
                torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))

    eager_bufs, compiled_bufs = buffers(), buffers()
    eager_mask = fn(q, k, v, dout, *eager_bufs)
    compiled_mask = torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k, v, dout,
                                                                           *compiled_bufs)
    assert torch.equal(eager_mask, compiled_mask)
    for a, b in zip(eager_bufs, compiled_bufs):
        assert torch.equal(a, b)


def test_compiled_with_inductor():
    torch._dynamo.reset()
    q, k, v = random_qkv(2, 100, 160, 4, 2, 64, torch.float32)
    dout = torch.randn(q.shape)
    attn = back_lite.BackLite(negl_prob=0.05)

    def fn(q, k, v):
        out, lse = attn(q, k, v, causal=True, return_softmax_lse=True)
        return out + 0.0 * lse.transpose(1, 2)[..., None]

    compiled = torch.compile(fn, fullgraph=True)
    for a, b in zip(grads_of(compiled, q, k, v, dout), grads_of(fn, q, k, v, dout)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration and dispatch agree."""
    q, k, v = random_qkv(1, 70, 90, 2, 1, 64, torch.float32)
    q.requires_grad_()
    torch.library.opcheck(torch.ops.back_lite.attention.default, (q, k, v, 0.125, True, 0.1, True))
    torch.library.opcheck(torch.ops.back_lite.forward.default, (q.detach(), k, v, 0.125, False, False))
    out, lse, w = back_lite.forward(q.detach(), k, v, with_stats=True)
    torch.library.opcheck(torch.ops.back_lite.select_tiles.default, (w, 0.1))
    torch.library.opcheck(torch.ops.back_lite.backward.default,
                          (torch.randn_like(out), q.detach(), k, v, out, lse, w, 0.1, None,
                           0.125, False))


def test_compiled_dynamic_shapes():
    """Fake implementations size W from symbolic sequence lengths (ceil-div on SymInts)."""
    torch._dynamo.reset()
    attn = back_lite.BackLite(negl_prob=0.05)
    compiled = torch.compile(lambda q, k, v: attn(q, k, v, causal=True), backend="aot_eager",
                             fullgraph=True, dynamic=True)
    for seqlen in (100, 300, 700):
        q, k, v = random_qkv(1, seqlen, seqlen, 2, 2, 64, torch.float32)
        dout = torch.randn(q.shape)
        eager = grads_of(lambda a, b, c: attn(a, b, c, causal=True), q, k, v, dout)
        for a, b in zip(grads_of(compiled, q, k, v, dout), eager):
            assert torch.equal(a, b)
