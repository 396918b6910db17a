"""Eager calls skip the torch.library dispatch (back_lite.ops.direct_call_ok) and must give what
the custom ops give; traced, mode-wrapped, subclass and grad-recording calls keep the ops."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import back_lite
from back_lite import ops
from inputs import random_qkv


class CountOps(TorchDispatchMode):
    """Records the names of the ops dispatched under it (and forces the op path)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


class Sub(torch.Tensor):
    pass


def inputs(causal=True):
    q, k, v = random_qkv(1, 130, 200, 4, 2, 64, torch.float32, seed=3)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    return q, k, v, out, lse, w, dout


def profiled_ops(fn) -> set:
    """Names of the events the CPU profiler records while fn runs (a custom op's dispatch records
    its name, e.g. back_lite::backward)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def test_eager_calls_skip_the_dispatch():
    q, k, v, out, lse, w, dout = inputs()
    names = profiled_ops(lambda: back_lite.backward(dout, q, k, v, out, lse, causal=True))
    assert not any(n.startswith("back_lite::") for n in names), names
    names = profiled_ops(lambda: back_lite.forward(q, k, v, causal=True))
    assert not any(n.startswith("back_lite::") for n in names), names
    # the same calls with a grad-recording input go through the ops (the check above can fail)
    qg = q.clone().requires_grad_()
    names = profiled_ops(lambda: back_lite.backward(dout, qg, k, v, out, lse, causal=True))
    assert "back_lite::backward" in names, names


def test_direct_call_ok_cases():
    q, k, v, *_ = inputs()
    assert ops.direct_call_ok(q, k, None, v)
    with CountOps():
        assert not ops.direct_call_ok(q, k, v)
    assert not ops.direct_call_ok(q.as_subclass(Sub), k, v)
    qg = q.clone().requires_grad_()
    assert not ops.direct_call_ok(qg, k, v)
    with torch.no_grad():
        assert ops.direct_call_ok(qg, k, v)


@pytest.mark.parametrize("kind", ["dense", "sparse", "mask", "out_buffers"])
def test_direct_backward_equals_op_path(kind):
    q, k, v, out, lse, w, dout = inputs()
    kw = {"causal": True}
    if kind == "sparse":
        kw.update(tile_mass=w, negl_prob=0.2)
    if kind == "mask":
        kw["mask"] = torch.rand(w.shape, generator=torch.Generator().manual_seed(5)) < 0.5
    if kind == "out_buffers":
        kw.update(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
    direct = back_lite.backward(dout, q, k, v, out, lse, **kw)
    if kind == "out_buffers":
        kw.update(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
    with CountOps() as mode:
        via_op = back_lite.backward(dout, q, k, v, out, lse, **kw)
    op = "back_lite.backward_out.default" if kind == "out_buffers" else "back_lite.backward.default"
    assert op in mode.names
    for a, b in zip(direct, via_op):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("buffers", [False, True])
def test_direct_forward_equals_op_path(buffers):
    q, k, v, *_ = inputs(causal=False)

    def run():
        if not buffers:
            return back_lite.forward(q, k, v, with_stats=True)
        tm, tn = back_lite.num_tiles(q.shape[1], k.shape[1])
        return back_lite.forward(q, k, v, out=torch.empty_like(q),
                                 lse=torch.empty(1, 4, 130),
                                 tile_stats=torch.empty(1, 4, tm, tn))

    direct = run()
    with CountOps() as mode:
        via_op = run()
    assert ("back_lite.forward_out.default" if buffers else "back_lite.forward.default") \
        in mode.names
    for a, b in zip(direct, via_op):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_grad_recording_call_keeps_the_op():
    """With grad mode on and an input that requires grad, the op path runs, so a backward
    through the no-autograd backward still raises instead of silently giving nothing."""
    q, k, v, out, lse, _, dout = inputs()
    qg = q.clone().requires_grad_()
    dq, _, _ = back_lite.backward(dout, qg, k, v, out, lse, causal=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        dq.sum().backward()


def test_autograd_backward_equals_op_path():
    """back_lite.attention's backward (run by autograd without grad mode: the direct path) gives
    the op path's gradients bit for bit."""
    q, k, v, *_ = inputs()
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))

    def grads():
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o, _, _ = back_lite.attention(qg, kg, vg, negl_prob=0.1, causal=True)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    direct = grads()
    with CountOps() as mode:
        via_op = grads()
    assert "back_lite.backward.default" in mode.names
    for a, b in zip(direct, via_op):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def attention_grads(q, k, v, dout, **kw):
    """(out, dq, dk, dv) of back_lite.attention on fresh leaves of q, k, v."""
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o, _, _ = back_lite.attention(qg, kg, vg, **kw)
    return (o.detach(), *torch.autograd.grad(o, (qg, kg, vg), dout))


def test_eager_attention_skips_the_op():
    """An eager back_lite.attention runs ops.EagerAttention: no back_lite:: op is dispatched in its
    forward or backward, though its inputs record autograd."""
    q, k, v, *_, dout = inputs()
    names = profiled_ops(lambda: attention_grads(q, k, v, dout, negl_prob=0.1, causal=True))
    assert not any(n.startswith("back_lite::") for n in names), names
    with CountOps() as mode:  # a dispatch mode keeps the op (the check above can fail)
        attention_grads(q, k, v, dout, negl_prob=0.1, causal=True)
    assert "back_lite.attention.default" in mode.names


def test_eager_attention_ok_cases():
    q, k, v, *_ = inputs()
    qg = q.clone().requires_grad_()
    assert ops.eager_attention_ok(qg, k, v)
    with CountOps():
        assert not ops.eager_attention_ok(q, k, v)
    assert not ops.eager_attention_ok(q.as_subclass(Sub), k, v)
    seen = []
    torch.func.grad(lambda x: seen.append(ops.eager_attention_ok(x, k, v)) or x.sum())(q)
    assert seen == [False]


@pytest.mark.parametrize("negl_prob,causal", [(0.0, False), (0.1, True), (0.3, False)])
def test_eager_attention_equals_op_path(negl_prob, causal):
    q, k, v, *_, dout = inputs(causal)
    eager = attention_grads(q, k, v, dout, negl_prob=negl_prob, causal=causal)
    with CountOps():
        via_op = attention_grads(q, k, v, dout, negl_prob=negl_prob, causal=causal)
    for a, b in zip(eager, via_op):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_eager_attention_expanded_dout():
    """out.sum()'s gradient (stride-0 dims, copied once) gives the op path's gradients."""
    q, k, v, *_ = inputs()
    grads = []
    for mode in (None, CountOps()):
        qg = q.clone().requires_grad_()
        with mode or torch.enable_grad():
            o, _, _ = back_lite.attention(qg, k, v, negl_prob=0.1, causal=True)
            o.sum().backward()
        grads.append(qg.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_eager_attention_double_backward_raises():
    """The backward is not differentiable: asking for a second derivative raises, on both paths."""
    q, k, v, *_ = inputs()
    for mode in (None, CountOps()):
        qg = q.clone().requires_grad_()
        with mode or torch.enable_grad():
            o, _, _ = back_lite.attention(qg, k, v, causal=True)
            (g,) = torch.autograd.grad(o.square().sum(), qg, create_graph=True)
            with pytest.raises(RuntimeError):
                g.sum().backward()
