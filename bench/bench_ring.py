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

Communication, per negl_prob row (rank 0's medians, timed like the rest):
  comm_fwd_ms / comm_bwd_ms   the ring's transfers alone: the RingExchange start/wait calls
                              that ring_forward / ring_backward make, in their order and with
                              the same tensor shapes and dtypes (forward: P-1 hops of k, v;
                              backward: P-1 hops of k, v and P hops of the fp32 dk, dv
                              accumulators, a k/v hop in flight while the dk/dv hop is waited
                              for, as in the ring), with no attention compute between them. The
                              same for every row: the exchanges do not depend on the mask.
  compute_fwd_ms /            ring_forward / ring_backward with the exchange replaced by one that
  compute_bwd_ms              hands the sent tensors straight back (no transfer): the same P
                              steps, library calls (the visiting shard has the local shard's
                              shape; the sparse backward gets the real mask), merges and
                              accumulations, on local data.
  exposed_comm_ms             (fwd_ms + bwd_ms) - (compute_fwd_ms + compute_bwd_ms): what the
                              transfers add to the ring forward + backward, i.e. the part of
                              them that the computation does not hide, plus the time spent
                              waiting for a slower neighbour (the ring's steps are in lockstep;
                              with a sparse backward the ranks keep different numbers of tiles
                              at a step). An estimate: the difference of two medians, so it can
                              come out slightly negative when the transfers are fully hidden.
  comm_share                  (comm_fwd_ms + comm_bwd_ms) / (fwd_ms + bwd_ms): the transfers'
                              time, had they nothing to overlap with, as a share of the ring time.
The selection (select_ms) is in none of them; exposed_comm_ms / (fwd_ms + bwd_ms) is the share
of the ring time actually lost to communication and waiting.
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
from back_lite.distributed import ring as ring_module
from back_lite.distributed._ring_comm import TAG_DKV, TAG_KV, RingExchange, _Pending

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


def comm_forward(k, v):
    """The transfers of ring_forward alone: P-1 hops of (k, v), no compute."""
    exchange = RingExchange()
    k_cur, v_cur = k, v
    for _ in range(exchange.world_size - 1):
        k_cur, v_cur = exchange.start([k_cur, v_cur], TAG_KV).wait()


def comm_backward(k, v):
    """The transfers of ring_backward alone, in its order: per step, start the (k, v) hop (not
    after the last step), wait for the incoming dk/dv accumulators (not at the first step),
    start their hop, wait for (k, v); then wait for the last dk/dv hop. The accumulators are fp32
    tensors of the shapes of k and v."""
    exchange = RingExchange()
    k_cur, v_cur = k, v
    dkv = [torch.zeros(k.shape, dtype=torch.float32, device=k.device),
           torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
    dkv_pending = None
    for t in range(exchange.world_size):
        kv_pending = (exchange.start([k_cur, v_cur], TAG_KV)
                      if t + 1 < exchange.world_size else None)
        if dkv_pending is not None:
            dkv = dkv_pending.wait()
        dkv_pending = exchange.start(dkv, TAG_DKV)
        if kv_pending is not None:
            k_cur, v_cur = kv_pending.wait()
    dkv_pending.wait()


class _NoTransfer:
    """Stands in for RingExchange: start() hands the sent tensors straight back, so the ring
    runs its P steps on the local shard (the visiting shard's shape) with no transfer."""

    def __init__(self, group=None):
        pass

    def start(self, tensors, tag):
        return _Pending([], list(tensors), [])


def compute_only(fn):
    """fn() with ring.py's RingExchange replaced by _NoTransfer (restored afterwards)."""
    def run():
        saved = ring_module.RingExchange
        ring_module.RingExchange = _NoTransfer
        try:
            return fn()
        finally:
            ring_module.RingExchange = saved
    return run


def all_reduce_max(values, device):
    """Element-wise maximum over the ranks, as floats. Under gloo a worker thread drops its
    reference to the tensor after wait() has returned, and needs the GIL to do so; this is
    usually the bench's last collective, and if the interpreter is already finalizing by then
    the thread is ended inside that destructor: std::terminate ("terminate called without an
    active exception", SIGABRT at exit). destroy_process_group does not join those threads
    here because the process group object outlives it (torch._dynamo, imported by the first
    torch.library custom-op call, keeps references to it). So wait, releasing the GIL, until
    the reference is gone."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    base = sys.getrefcount(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    deadline = time.monotonic() + 10.0
    while (dist.get_backend() == "gloo" and sys.getrefcount(t) > base
           and time.monotonic() < deadline):
        time.sleep(1e-3)
    return [float(x) for x in t]


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
        # Communication alone, and the same ring with no transfers (module docstring); added
        # at the end of the row so that the earlier fields keep their order.
        comm = {"comm_fwd_ms": timer(lambda: comm_forward(k, v), dist.group.WORLD),
                "comm_bwd_ms": timer(lambda: comm_backward(k, v), dist.group.WORLD)}
        comm["compute_fwd_ms"] = timer(compute_only(
            lambda: bd.ring_forward(q, k, v, causal=args.causal, layout=layout,
                                    with_stats=sparse, exact_stats=exact)), dist.group.WORLD)
        comm["compute_bwd_ms"] = timer(compute_only(
            lambda: bd.ring_backward(dout, q, k, v, result.out, result.lse, mask=mask,
                                     causal=args.causal, layout=layout)), dist.group.WORLD)
        ring_ms = row["fwd_ms"] + row["bwd_ms"]
        comm["exposed_comm_ms"] = ring_ms - comm["compute_fwd_ms"] - comm["compute_bwd_ms"]
        comm["comm_share"] = (comm["comm_fwd_ms"] + comm["comm_bwd_ms"]) / ring_ms
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
        slowest = all_reduce_max([row["fwd_ms"], row["bwd_ms"], row["fwd_bwd_ms"]], device)
        row["fwd_ms_slowest"], row["bwd_ms_slowest"], row["fwd_bwd_ms_slowest"] = slowest
        row.update(comm)
        if rank == 0:
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
