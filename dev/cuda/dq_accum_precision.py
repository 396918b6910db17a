"""Would a 16-bit dQ accumulator be accurate enough?  A CPU study, no GPU needed.

Today every backward entry (row tile m, key tile n) adds its fp32 dQ partial into an fp32
accumulator (TMA reduce-adds), which a postprocess converts to dq. The accumulator costs a call
its zeros (preprocess), the postprocess's read-back and 32 KB of reduce-adds per entry: the fixed
bytes that keep the causal low-keep rows out of `kept + 2%` (bench/notes-bwd.md, s96). A 16-bit
accumulator -- dq itself, added to with 16-bit reduce-adds -- would halve the adds and the zeros
and remove the postprocess, but it rounds after every add.

This script emulates both on the CPU, with the kernel's numerics as far as they matter to dq:
  P    = exp(scale S - lse) in fp32 from 16-bit q, k (S an fp32 product);
  dP   = dO v^T in fp32 from 16-bit dO, v;  Dlt = rowsum(dO * out) in fp32 (16-bit out);
  dS   = P (dP - Dlt), rounded to 16 bits (the dQ product's operand);
  part = scale * (dS[:, tile n] @ k[tile n]) in fp32, one per kept (m, n) entry;
  fp32 accumulator: sum the parts in fp32, round once to 16 bits (what the library does);
  16-bit accumulator: acc = round16(acc + round16(part)) over the entries in a random order (the
    staging is 16-bit, and a 16-bit reduce-add is assumed to round to nearest even).
Each result is compared with the float64 dq over the same tiles (tests/reference.py) by the
tests' own criterion (reference.check_close: max error <= 2 x PyTorch's low-precision error +
2 x the rounding of the exact result to 16 bits + 1e-5), reported as the ratio error / allowance
(<= 1 passes), with the relative RMS error beside it.

Masks keep exactly `k` key tiles of every row tile (random tiles), so the table reads by entries
per row tile, the quantity the rounding grows with.

    python3 dev/cuda/dq_accum_precision.py [--sq 1024 --sk 16384 --heads 4 --dims 64,128]
A second table gives, for scale, the error the selection itself accepts at a few negl_prob.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import reference as ref  # noqa: E402  (the tests' float64 reference)
from inputs import local_qkv, random_qkv  # noqa: E402

TILE_M, TILE_N = 64, 128  # the backward's row tile and key tile (DESIGN.md §1)


def tile_masks(heads, tiles_m, tiles_n, kept, gen):
    """(1, H, Tm, Tn) bool keeping exactly `kept` random key tiles of every row tile."""
    scores = torch.rand(1, heads, tiles_m, tiles_n, generator=gen)
    idx = scores.argsort(dim=-1)[..., :kept]
    mask = torch.zeros(1, heads, tiles_m, tiles_n, dtype=torch.bool)
    mask.scatter_(-1, idx, True)
    return mask


def kernel_parts(q, k, v, dout, scale):
    """The fp32 dQ partial of every key tile: (H, Tn, Sq, D), and the 16-bit out it used.

    Non-causal, B = 1, Hq == Hk (the rounding under study does not depend on the mask's shape)."""
    low = q.dtype
    out64, lse64, _ = ref.attention(q, k, v, scale, False)
    out = out64.to(low)  # the forward's 16-bit out
    qh, kh, vh, doh, oh = (t[0].transpose(0, 1).float() for t in (q, k, v, dout, out))  # (H, S, D)
    lse = lse64[0].float()  # (H, Sq)
    s = (qh @ kh.transpose(-1, -2)) * scale
    p = torch.exp(s - lse[..., None])
    dp = doh @ vh.transpose(-1, -2)
    dlt = (doh * oh).sum(-1)
    ds = (p * (dp - dlt[..., None])).to(low).float()
    heads, sk = kh.shape[0], kh.shape[1]
    tiles_n = -(-sk // TILE_N)
    parts = []
    for n in range(tiles_n):
        cols = slice(n * TILE_N, min(sk, (n + 1) * TILE_N))
        parts.append((ds[:, :, cols] @ kh[:, cols, :]) * scale)
    return torch.stack(parts, dim=1), out  # (H, Tn, Sq, D)


def accumulate(parts, mask, low, gen):
    """dq (Sq, H, D) from the kept parts: (fp32 sum then one rounding, 16-bit running sum)."""
    heads, tiles_n, sq, d = parts.shape
    tiles_m = mask.shape[2]
    row_tile = torch.arange(sq) // TILE_M
    keep_rows = mask[0][:, row_tile, :].permute(0, 2, 1)  # (H, Tn, Sq)
    kept_parts = parts * keep_rows[..., None]
    acc32 = kept_parts.sum(dim=1).to(low)
    # one random order of the key tiles per (head, row tile): the order atomics land in
    order = torch.rand(heads, tiles_m, tiles_n, generator=gen).argsort(dim=-1)
    order_rows = order[:, row_tile, :].permute(0, 2, 1)  # (H, Tn, Sq)
    acc16 = torch.zeros(heads, sq, d, dtype=low)
    staged = kept_parts.to(low)  # the 16-bit staging of each part (0 where not kept)
    for j in range(tiles_n):
        idx = order_rows[:, j, :]  # (H, Sq): the j-th tile each row's tile adds
        part = staged.gather(1, idx[:, None, :, None].expand(heads, 1, sq, d))[:, 0]
        acc16 = (acc16.float() + part.float()).to(low)  # adding 0 leaves acc16 as it was
    return acc32.transpose(0, 1)[None], acc16.transpose(0, 1)[None]


def rel_rms(got, want):
    diff = got.double() - want
    return float(diff.pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))


def study_inputs(inputs, head_dim, low, args, gen):
    """q, k, v (1, S, H, D) in `low` -- random, or local attention (peaky rows: the last Sq
    queries of a local Sk x Sk problem) -- and a random dout."""
    if inputs == "random":
        q, k, v = random_qkv(1, args.sq, args.sk, args.heads, args.heads, head_dim, low, seed=1)
    else:
        q, k, v = local_qkv(1, args.sk, args.heads, args.heads, head_dim, low, seed=1)
        q = q[:, -args.sq:].contiguous()
    return q, k, v, torch.randn(q.shape, generator=gen).to(low)


def study(inputs, head_dim, low, args, gen):
    sq, sk, heads = args.sq, args.sk, args.heads
    q, k, v, dout = study_inputs(inputs, head_dim, low, args, gen)
    scale = 1.0 / math.sqrt(head_dim)
    parts, out = kernel_parts(q, k, v, dout, scale)
    tiles_m, tiles_n = -(-sq // TILE_M), -(-sk // TILE_N)
    rows = []
    kept = 1
    while True:
        mask = tile_masks(heads, tiles_m, tiles_n, kept, gen)
        want = ref.backward(q, k, v, out, dout, scale, False, mask, (TILE_M, TILE_N))[0]
        base = ref.backward(q, k, v, out, dout, scale, False, mask, (TILE_M, TILE_N), low)[0]
        acc32, acc16 = accumulate(parts, mask, low, gen)
        bound = ref.allowance(want, base)
        rows.append((kept, ref.max_err(acc32, want) / bound, ref.max_err(acc16, want) / bound,
                     rel_rms(acc32, want), rel_rms(acc16, want), rel_rms(base, want)))
        if kept == tiles_n:
            return rows
        kept = min(2 * kept, tiles_n)


def selection_error(inputs, head_dim, low, args, gen, negls):
    """For scale: the relative RMS error of the float64 dq over the tiles the selection keeps at
    each negl_prob, against the dense float64 dq -- the error a sparse call accepts by design."""
    q, k, v, dout = study_inputs(inputs, head_dim, low, args, gen)
    scale = 1.0 / math.sqrt(head_dim)
    out64, _, p64 = ref.attention(q, k, v, scale, False)
    out = out64.to(low)
    dense = ref.backward(q, k, v, out, dout, scale, False, None, (TILE_M, TILE_N))[0]
    w = ref.tile_mass(p64, TILE_M, TILE_N)
    rows = []
    for negl in negls:
        keep, _ = ref.select(w, negl)
        sparse = ref.backward(q, k, v, out, dout, scale, False, keep, (TILE_M, TILE_N))[0]
        rows.append((negl, float(keep.double().mean()) * w.shape[-1], rel_rms(sparse, dense)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sq", type=int, default=1024)
    ap.add_argument("--sk", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--inputs", default="random,local")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--negls", default="0.01,0.05,0.2",
                    help="negl_prob values for the selection's own error (second table)")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"# dq accumulator precision study: Sq {args.sq}, Sk {args.sk}, {args.heads} heads, "
          f"row tile {TILE_M}, key tile {TILE_N}, seed {args.seed}")
    print("# ratio = max error / tests' allowance (<= 1 passes); rms = relative RMS error vs "
          "float64; base = PyTorch's own low-precision backward")
    print("| inputs | dtype | D | kept tiles per row tile | fp32 acc ratio | 16-bit acc ratio |"
          " fp32 acc rms | 16-bit acc rms | base rms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for inputs in args.inputs.split(","):
        for dtype_name in args.dtypes.split(","):
            low = getattr(torch, dtype_name)
            for head_dim in (int(x) for x in args.dims.split(",")):
                for kept, r32, r16, e32, e16, eb in study(inputs, head_dim, low, args, gen):
                    print(f"| {inputs} | {dtype_name} | {head_dim} | {kept} | {r32:.3f} | "
                          f"{r16:.3f} | {e32:.2e} | {e16:.2e} | {eb:.2e} |", flush=True)
    negls = [float(x) for x in args.negls.split(",") if x]
    if not negls:
        return
    print("\n# for scale, the selection's own error: the float64 dq over the tiles the reference "
          "selection keeps against the dense float64 dq (bf16 inputs)")
    print("| inputs | D | negl_prob | kept tiles per row tile (mean) | dq rms vs dense |")
    print("|---|---|---|---|---|")
    for inputs in args.inputs.split(","):
        for head_dim in (int(x) for x in args.dims.split(",")):
            for negl, kept, err in selection_error(inputs, head_dim, torch.bfloat16, args, gen,
                                                   negls):
                print(f"| {inputs} | {head_dim} | {negl} | {kept:.1f} | {err:.2e} |", flush=True)


if __name__ == "__main__":
    main()
