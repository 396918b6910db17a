"""The CUDA ops under CUDA-graph capture (torch.cuda.graph), as torch.compile's reduce-overhead
mode and hand-made training-step graphs use them: captured once, replayed on new inputs copied
into the captured tensors, against eager calls on the same inputs. A very sparse backward takes
about as long on the GPU as the library's host work per call
(bench/results/bench-yardstick-s37.txt run 2), so graphs are how such calls stay GPU-bound.

What makes capture legal is the library's design: no host synchronisation and no allocation
outside the caching allocator on the hot path, and the kernel picks of masked calls taken on
the device from entry totals (a host-side pick would read them back). Skipped without a device.
"""
import pytest
import torch

import back_lite
from cuda_required import skip_module_without_cuda_backend
from inputs import local_qkv, random_qkv

skip_module_without_cuda_backend()

DEV = "cuda"
NEGL_PROB = 0.05


def capture(step):
    """step() warmed up on a side stream (what torch.cuda.graph's documentation asks), then
    captured; returns the graph and the outputs of the captured call (static tensors)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def assert_replay_matches(names, replayed, eager):
    """Everything bit for bit but dq, which fp32 reduce-adds from several key tiles' CTAs sum in
    no fixed order (asserted to rounding, as in test_gpu_attention.py)."""
    for name, r, e in zip(names, replayed, eager):
        assert r.shape == e.shape and r.dtype == e.dtype, name
        if name == "dq":
            torch.testing.assert_close(r, e, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(r, e), name


def new_inputs(kind, seed, seqlen, head_dim):
    """(q, k, v, dout): random inputs or local ones (whose selection drops many tiles)."""
    if kind == "random":
        q, k, v = random_qkv(1, seqlen, seqlen, 4, 2, head_dim, torch.bfloat16, DEV, seed=seed)
    else:
        q, k, v = local_qkv(1, seqlen, 4, 2, head_dim, torch.bfloat16, DEV, seed=seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    dout = torch.randn(q.shape, generator=gen).to(device=DEV, dtype=torch.bfloat16)
    return q, k, v, dout


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_graph_forward_stats_and_selected_backward(head_dim, causal):
    """Forward with statistics, then the backward from W + negl_prob, in one graph: replays on
    two new inputs (one whose selection keeps a different set of tiles) give the eager results."""
    seqlen = 1000  # not a multiple of 64 or 80
    static = [t.clone() for t in new_inputs("random", 0, seqlen, head_dim)]
    names = ("out", "lse", "W", "dq", "dk", "dv")

    def step(q, k, v, dout):
        out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
        dq, dk, dv = back_lite.backward(dout, q, k, v, out, lse, tile_mass=w,
                                        negl_prob=NEGL_PROB, causal=causal)
        return out, lse, w, dq, dk, dv

    graph, outs = capture(lambda: step(*static))
    for kind, seed in (("random", 1), ("local", 2)):
        fresh = new_inputs(kind, seed, seqlen, head_dim)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        eager = step(*fresh)
        assert_replay_matches(names, outs, eager)
        if kind == "local":  # the selection really skipped tiles, so the sparse path ran
            kept = back_lite.select(eager[2], NEGL_PROB)  # (skips 18 % with a causal mask)
            assert back_lite.backward_sparsity(kept, seqlen, seqlen, causal) > 0.1


@pytest.mark.parametrize("causal", [False, True])
def test_graph_backward_with_explicit_mask(causal):
    """The explicit-mask backward captured with one mask tensor, replayed after the mask's
    contents change: the replay follows the new mask (the picks are taken on the device)."""
    seqlen, head_dim = 700, 128
    q, k, v, dout = new_inputs("random", 3, seqlen, head_dim)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    tm, tn = back_lite.num_tiles(seqlen, seqlen, DEV)
    gen = torch.Generator().manual_seed(5)
    masks = [torch.rand(1, 4, tm, tn, generator=gen) < keep for keep in (0.9, 0.15)]
    static_mask = masks[0].to(DEV)

    def step():
        return back_lite.backward(dout, q, k, v, out, lse, mask=static_mask, causal=causal)

    graph, outs = capture(step)
    for m in masks[::-1]:
        static_mask.copy_(m)
        graph.replay()
        torch.cuda.synchronize()
        assert_replay_matches(("dq", "dk", "dv"), outs, step())


def test_graph_autograd_step():
    """Autograd through the BackLite module captured whole (forward, loss, backward), as a
    training step graph does: the captured gradients match an eager step's."""
    seqlen, head_dim = 640, 64
    attn = back_lite.BackLite(negl_prob=NEGL_PROB)
    static = [t.clone().requires_grad_() for t in new_inputs("local", 4, seqlen, head_dim)[:3]]

    def step():
        for t in static:
            t.grad = None
        out = attn(*static, causal=True)
        out.float().square().sum().backward()
        return [t.grad for t in static]

    graph, grads = capture(step)
    fresh = new_inputs("local", 6, seqlen, head_dim)[:3]
    with torch.no_grad():
        for s, f in zip(static, fresh):
            s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [g.clone() for g in grads]
    eager = step()
    assert_replay_matches(("dq", "dk", "dv"), replayed, eager)
