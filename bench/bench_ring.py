"""Context-parallel BackLite benchmark: ring attention over P ranks against one device.

Run with torchrun, one process per GPU (NCCL), or on CPU with gloo for a functional check:

    torchrun --nproc_per_node=8 bench/bench_ring.py --seqlen 131072 --heads 24 --causal \\
        --out bench/results/ring-<date>.jsonl
    torchrun --nproc_per_node=4 bench/bench_ring.py --device cpu --seqlen 4096 --heads 2 \\
        --head-dim 64 --causal --check --reps 1          # gloo, CPU backend

For each negl_prob (0 = dense) it times, with CUDA events (wall clock on CPU) after warm-up, the
median over --reps of: the ring forward (with statistics when sparse), the selection, the ring
backward, and the whole ring_attention forward+backward; rank 0 also times the single-device
BackLite attention on the full sequence (--single, when it fits) for the speed-up. TFLOP/s by the
FlashAttention convention over the whole sequence (forward 4*B*Hq*S*S*D, half for causal;
backward 2.5x), divided by P for the per-device figure.

--check gathers the sharded results on rank 0 and compares them with the single-device run with
the same negl_prob: max |out| and |lse| differences, the fraction of computable tiles whose keep
decision differs, the largest share of a row tile's true mass the ring's mask drops, and the
gradient error |ring - single| against |single sparse - single dense| (relative norms).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import back_lite
from back_lite import distributed as bd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attn import video_qkv  # noqa: E402  (structured, genuinely sparse inputs)

BWD_FLOP_RATIO = 2.5


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlen", type=int, default=65536, help="whole sequence (all ranks)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--layout", choices=bd.LAYOUTS, default=None,
                   help="default: zigzag when causal, else contiguous")
    p.add_argument("--inputs", choices=("video", "random"), default="video")
    p.add_argument("--negl-probs", type=float, nargs="+", default=[0.0, 0.05, 0.2])
    p.add_argument("--exact-stats", action="store_true",
                   help="exact global tile mass (one forward call per visiting key tile)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--single", action="store_true", help="also time one device (rank 0)")
    p.add_argument("--check", action="store_true", help="compare with the single-device run")
    p.add_argument("--out", default=None, help="append one JSON line per result (rank 0)")
    return p.parse_args()


def make_inputs(args, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    kv_heads = args.kv_heads or args.heads
    if args.inputs == "video":
        q, k, v = video_qkv(args.batch, args.seqlen, args.heads, args.head_dim, dtype, "cpu")
        group = args.heads // kv_heads
        k, v = k[:, :, ::group].contiguous(), v[:, :, ::group].contiguous()
    else:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(args.batch, args.seqlen, args.heads, args.head_dim, generator=gen)
        k = torch.randn(args.batch, args.seqlen, kv_heads, args.head_dim, generator=gen)
        v = torch.randn(args.batch, args.seqlen, kv_heads, args.head_dim, generator=gen)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    return tuple(t.to(device=device, dtype=dtype).contiguous() for t in (q, k, v, dout))


class Timer:
    """Median milliseconds of fn() after warm-up; CUDA events on GPU, wall clock on CPU. Every
    rank times its own calls; the ranks are aligned by a barrier before each run."""

    def __init__(self, device, reps, warmup):
        self.cuda = device.type == "cuda"
        self.reps, self.warmup = reps, warmup

    def __call__(self, fn, group=None) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            if group is not None:
                dist.barrier(group)
            if self.cuda:
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                start = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)


def gather(x, layout, dim=1):
    """The full-sequence tensor from every rank's shard (on every rank)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return bd.unshard(parts, layout, dim=dim)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def check(args, full, negl_prob, layout, result, mask, grads):
    """Rank 0: the single-device run with the same negl_prob against the gathered ring run."""
    q, k, v, dout = full
    got = {"out": gather(result.out, layout), "lse": gather(result.lse, layout, dim=2),
           "dq": gather(grads[0], layout), "dk": gather(grads[1], layout),
           "dv": gather(grads[2], layout)}
    if negl_prob > 0:
        # collectives take no bool tensors on every backend: ship the mask as bytes
        got["mask"] = gather(mask.to(torch.uint8), layout, dim=2).bool()
    if dist.get_rank() != 0:
        return {}
    out, lse, tile_mass = back_lite.forward(q, k, v, causal=args.causal, with_stats=True)
    ref_mask = back_lite.select(tile_mass, negl_prob) if negl_prob > 0 else None
    sparse = back_lite.backward(dout, q, k, v, out, lse, mask=ref_mask, causal=args.causal)
    dense = back_lite.backward(dout, q, k, v, out, lse, causal=args.causal)
    report = {"out_max_diff": float((got["out"].float() - out.float()).abs().max()),
              "lse_max_diff": float((got["lse"] - lse).abs().max())}
    for i, key in enumerate(("dq", "dk", "dv")):
        report[f"{key}_rel_err_vs_single"] = rel(got[key], sparse[i])
        report[f"{key}_single_sparse_vs_dense"] = rel(sparse[i], dense[i])
        report[f"{key}_ring_vs_dense"] = rel(got[key], dense[i])
    if negl_prob > 0:
        computable = back_lite.computable_tiles(q.shape[1], k.shape[1], args.causal, q.device)
        differ = (got["mask"] != ref_mask) & computable
        total = int(computable.sum()) * ref_mask.shape[0] * ref_mask.shape[1]
        mass = tile_mass.double()
        dropped = mass.masked_fill(got["mask"], 0.0).sum(-1) / mass.sum(-1)
        ref_dropped = mass.masked_fill(ref_mask, 0.0).sum(-1) / mass.sum(-1)
        report.update(
            mask_disagreement=int(differ.sum()) / total,
            kept_ring=int((got["mask"] & computable).sum()) / total,
            kept_single=int((ref_mask & computable).sum()) / total,
            dropped_share_max_ring=float(dropped.max()),
            dropped_share_max_single=float(ref_dropped.max()))
    return report


def main():
    args = parse_args()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device("cpu")
    layout = args.layout or ("zigzag" if args.causal else "contiguous")
    full = make_inputs(args, device)
    q, k, v, dout = (bd.shard(t, rank, world, layout) for t in full)
    timer = Timer(device, args.reps, args.warmup)
    flops = 4.0 * args.batch * args.heads * args.seqlen ** 2 * args.head_dim
    flops /= 2.0 if args.causal else 1.0
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
            "world": world, "backend": backend, "command": " ".join(sys.argv),
            "shape": [args.batch, args.seqlen, args.heads, args.kv_heads or args.heads,
                      args.head_dim], "dtype": args.dtype, "causal": args.causal,
            "layout": layout, "inputs": args.inputs, "exact_stats": args.exact_stats}
    for negl_prob in args.negl_probs:
        sparse = negl_prob > 0
        row = dict(meta, negl_prob=negl_prob)
        exact = sparse and args.exact_stats
        result = bd.ring_forward(q, k, v, causal=args.causal, layout=layout, with_stats=sparse,
                                 exact_stats=exact)
        mask = back_lite.select(result.tile_mass, negl_prob) if sparse else None
        row["fwd_ms"] = timer(lambda: bd.ring_forward(q, k, v, causal=args.causal, layout=layout,
                                                      with_stats=sparse, exact_stats=exact),
                              dist.group.WORLD)
        if sparse:
            row["select_ms"] = timer(lambda: back_lite.select(result.tile_mass, negl_prob))
            row["kept_local"] = float(mask.float().mean())
        row["bwd_ms"] = timer(lambda: bd.ring_backward(dout, q, k, v, result.out, result.lse,
                                                       mask=mask, causal=args.causal,
                                                       layout=layout), dist.group.WORLD)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

        def fwd_bwd():
            bd.ring_attention(qg, kg, vg, negl_prob=negl_prob, causal=args.causal,
                              layout=layout, exact_stats=exact).backward(dout)

        row["fwd_bwd_ms"] = timer(fwd_bwd, dist.group.WORLD)
        row["fwd_tflops_per_device"] = flops / world / (row["fwd_ms"] * 1e9)
        row["bwd_tflops_per_device_dense_equiv"] = (BWD_FLOP_RATIO * flops / world
                                                     / (row["bwd_ms"] * 1e9))
        if args.single:
            dist.barrier()
            if rank == 0:
                fq, fk, fv = (t.clone().requires_grad_() for t in full[:3])
                fd = full[3]

                def single():
                    back_lite.attention(fq, fk, fv, negl_prob=negl_prob,
                                        causal=args.causal)[0].backward(fd)

                row["single_fwd_bwd_ms"] = timer(single)
                row["speedup_vs_single"] = row["single_fwd_bwd_ms"] / row["fwd_bwd_ms"]
            dist.barrier()
        if args.check:
            grads = bd.ring_backward(dout, q, k, v, result.out, result.lse, mask=mask,
                                     causal=args.causal, layout=layout)
            row.update(check(args, full, negl_prob, layout, result, mask, grads))
        # per-rank medians differ; report rank 0's and the slowest rank's
        slowest = torch.tensor([row["fwd_ms"], row["bwd_ms"], row["fwd_bwd_ms"]],
                               dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        row["fwd_ms_slowest"], row["bwd_ms_slowest"], row["fwd_bwd_ms_slowest"] = (
            float(x) for x in slowest)
        if rank == 0:
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
