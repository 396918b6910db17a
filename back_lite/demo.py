"""python -m back_lite.demo -- the sparse backward on inputs whose attention is genuinely sparse.

Two inputs:
  video  tokens on a small 3-D (frames x height x width) grid; q and k are made from positional
         features of each token's grid position, so a token attends to its space-time
         neighbourhood (the pattern of video diffusion transformers);
  peaky  random q and k with a sharpened softmax (scores x PEAKY_SHARPEN): few heavy keys per
         row, but scattered over all key tiles -- a harder case for tile sparsity.
For each, one exact forward (with tile statistics), the dense backward, and the sparse backward at
a few negl_prob values. The table gives the backward sparsity (share of computable tiles skipped),
dense vs sparse backward time, and how close the sparse dq, dk, dv are to the dense ones.

CUDA (if a GPU and the CUDA backend are present): B=1, S=16384, H=16, D=128, bf16, timed with CUDA
events. Otherwise the CPU backend: B=1, S=2048, H=4, D=64, bf16.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import back_lite

NEGL_PROBS = (0.01, 0.05, 0.2)
PEAKY_SHARPEN = 3.0
# Features per grid axis (sin/cos pairs), and the neighbourhood radius in grid steps that the
# lowest frequency spans: q.k falls off beyond about this distance along each axis.
FREQS_PER_AXIS = 8
NEIGHBOURHOOD = 3.0
# Softmax logit at zero distance; larger means sharper (more local) attention.
PEAK_LOGIT = 12.0
QK_NOISE = 0.1


def grid_shape(seqlen: int) -> tuple[int, int, int]:
    """(frames, height, width) with height == width (a power of two) and frames * h * w == S."""
    side = 2 ** int(math.log2(math.isqrt(seqlen // 4) or 1))
    while seqlen % (side * side):
        side //= 2
    return seqlen // (side * side), side, side


def video_qkv(batch, seqlen, heads, head_dim, dtype, device, gen):
    frames, height, width = grid_shape(seqlen)
    t, y, x = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width),
                             indexing="ij")
    coords = torch.stack([t, y, x], dim=-1).reshape(seqlen, 3).double()  # (S, 3)
    freqs = torch.linspace(0.0, math.pi / NEIGHBOURHOOD, FREQS_PER_AXIS, dtype=torch.float64)
    angle = coords[:, :, None] * freqs  # (S, 3, F)
    feat = torch.cat([angle.cos(), angle.sin()], dim=-1).reshape(seqlen, -1)  # (S, 6F)
    feat = torch.nn.functional.pad(feat, (0, head_dim - feat.shape[1]))
    # q.k at distance 0 is amp^2 * 3F; times scale 1/sqrt(D) it should be PEAK_LOGIT
    amp = math.sqrt(PEAK_LOGIT * math.sqrt(head_dim) / (3 * FREQS_PER_AXIS))
    shape = (batch, seqlen, heads, head_dim)
    q = amp * feat[None, :, None] + QK_NOISE * torch.randn(shape, generator=gen, dtype=torch.float64)
    k = amp * feat[None, :, None] + QK_NOISE * torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    return [t_.to(device=device, dtype=dtype) for t_ in (q, k, v)], None


def peaky_qkv(batch, seqlen, heads, head_dim, dtype, device, gen):
    shape = (batch, seqlen, heads, head_dim)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    return [t_.to(device=device, dtype=dtype) for t_ in (q, k, v)], \
        PEAKY_SHARPEN / math.sqrt(head_dim)


class Timer:
    """Median wall times of two callables timed in alternation: CUDA events on the GPU,
    perf_counter on the CPU. Alternating (and swapping which goes first each round) keeps drift
    -- clocks, other load, the allocator -- out of their ratio: timed one after the other, the
    dense and sparse calls of a 2-core CPU run differed by 10-15 % at 0 % sparsity."""

    def __init__(self, device: torch.device, repeats: int, warmup: int):
        self.device, self.repeats, self.warmup = device, repeats, warmup

    def _once(self, fn) -> float:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def pair(self, fn_a, fn_b) -> tuple[float, float, float]:
        """(median of a, median of b, median of the rounds' a / b ratios)"""
        for _ in range(self.warmup):
            fn_a()
            fn_b()
        times_a, times_b = [], []
        for i in range(self.repeats):
            if i % 2 == 0:
                times_a.append(self._once(fn_a))
                times_b.append(self._once(fn_b))
            else:
                times_b.append(self._once(fn_b))
                times_a.append(self._once(fn_a))
        ratios = [a / b for a, b in zip(times_a, times_b)]
        return statistics.median(times_a), statistics.median(times_b), statistics.median(ratios)


def compare(sparse: torch.Tensor, dense: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity, relative L2 error) of a sparse gradient against the dense one."""
    s, d = sparse.double().flatten(), dense.double().flatten()
    cos = float(torch.dot(s, d) / (s.norm() * d.norm()).clamp_min(1e-300))
    rel = float((s - d).norm() / d.norm().clamp_min(1e-300))
    return cos, rel


def run(args) -> list[dict]:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    timer = Timer(device, args.repeats, args.warmup)
    rows = []
    for name, make in (("video", video_qkv), ("peaky", peaky_qkv)):
        gen = torch.Generator().manual_seed(0)
        (q, k, v), scale = make(args.batch, args.seqlen, args.heads, args.head_dim, dtype, device,
                                gen)
        dout = torch.randn(q.shape, generator=gen).to(device=device, dtype=dtype)
        out, lse, w = back_lite.forward(q, k, v, scale=scale, with_stats=True)
        dense = back_lite.backward(dout, q, k, v, out, lse, scale=scale)
        for negl_prob in args.negl_probs:
            mask = back_lite.select(w, negl_prob)
            sparsity = back_lite.backward_sparsity(mask, args.seqlen, args.seqlen, False)
            sparse = back_lite.backward(dout, q, k, v, out, lse, tile_mass=w,
                                        negl_prob=negl_prob, scale=scale)
            t_dense, t_sparse, speedup = timer.pair(
                lambda: back_lite.backward(dout, q, k, v, out, lse, scale=scale),
                lambda: back_lite.backward(dout, q, k, v, out, lse, tile_mass=w,
                                           negl_prob=negl_prob, scale=scale))
            row = dict(input=name, negl_prob=negl_prob, sparsity=sparsity, dense_ms=t_dense,
                       sparse_ms=t_sparse, speedup=speedup)
            for grad_name, s, d in zip(("dq", "dk", "dv"), sparse, dense):
                row["cos_" + grad_name], row["rel_" + grad_name] = compare(s, d)
            rows.append(row)
    return rows


def print_table(args, rows) -> None:
    backend = "CUDA (sm_90a)" if args.device.startswith("cuda") else "CPU"
    print(f"BackLite {back_lite.version} demo -- backend {backend}, shape B={args.batch} "
          f"S={args.seqlen} H={args.heads} D={args.head_dim}, {args.dtype}, non-causal, "
          f"median of {args.repeats} runs, dense and sparse in alternation")
    header = (f"{'input':<6} {'negl_prob':>9} {'sparsity':>8} {'dense ms':>9} {'sparse ms':>9} "
              f"{'speedup':>7} {'cos dq':>8} {'cos dk':>8} {'cos dv':>8} {'relL2 dq':>9} "
              f"{'relL2 dk':>9} {'relL2 dv':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['input']:<6} {r['negl_prob']:>9.3g} {r['sparsity']:>8.1%} "
              f"{r['dense_ms']:>9.2f} {r['sparse_ms']:>9.2f} "
              f"{r['speedup']:>6.2f}x "
              f"{r['cos_dq']:>8.5f} {r['cos_dk']:>8.5f} {r['cos_dv']:>8.5f} "
              f"{r['rel_dq']:>9.2e} {r['rel_dk']:>9.2e} {r['rel_dv']:>9.2e}")
    print("sparsity: share of key tiles the sparse backward skips; speedup: median of the rounds' "
          "dense / sparse time; cos / relL2: sparse gradient vs the dense backward's")


def parse_args(argv=None):
    cuda = torch.cuda.is_available() and back_lite.backend_available("cuda")
    p = argparse.ArgumentParser(prog="python -m back_lite.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlen", type=int, default=None, help="16384 on CUDA, 2048 on CPU")
    p.add_argument("--heads", type=int, default=None, help="16 on CUDA, 4 on CPU")
    p.add_argument("--head-dim", type=int, default=None, help="128 on CUDA, 64 on CPU")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--negl-probs", type=float, nargs="+", default=list(NEGL_PROBS))
    p.add_argument("--repeats", type=int, default=None, help="timed runs (median)")
    p.add_argument("--warmup", type=int, default=None)
    args = p.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    args.seqlen = args.seqlen or (16384 if on_cuda else 2048)
    args.heads = args.heads or (16 if on_cuda else 4)
    args.head_dim = args.head_dim or (128 if on_cuda else 64)
    args.repeats = args.repeats or (20 if on_cuda else 5)
    args.warmup = args.warmup if args.warmup is not None else (5 if on_cuda else 1)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print_table(args, run(args))


if __name__ == "__main__":
    main()
