"""Host time per library call against its GPU time, and what a dense backward reads on the
GPU when light sparse calls run between its calls -- with and without a sleep kernel in front
of each pair, which keeps the host ahead of the GPU (the queue never drains).

    BACK_LITE_LIBRARY=build/libbacklite.so PYTHONPATH=. python3 dev/cuda/host_overhead.py \
        [--shape 1,16384,16,128] [--causal] [--keep 0.01] [--reps 20] [--op-paths [--passes 2]]

Prints, per call kind, the host's enqueue time per call (no sync inside the loop, the GPU held
busy by a sleep kernel so that the host never waits on it) and the CUDA-event time per call;
then the dense call's event time in the pattern (sparse, dense) x reps, queue drained or kept
full (bench/results/bench-yardstick-s37.txt says why).

With --op-paths it prints instead the host time of each call through back_lite's functions (the
eager direct path, back_lite/ops.py direct_call_ok, after the argument checks) and through the
torch.ops.back_lite op it skips (no checks), the rows alternating over --passes passes: a single
pass's first rows read high (bench/results/host-s93-call-overhead.txt); and a forward + backward
through autograd, back_lite.attention (eager: ops.EagerAttention) against the op's autograd.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_attn  # noqa: E402  (random_tile_mask)
from back_lite import functional as blf  # noqa: E402

SLEEP_CYCLES = 200_000_000  # ~0.1 s at 1.98 GHz: longer than any enqueue loop below


def event_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start, end


def host_ms(fn, reps: int) -> float:
    """The host's enqueue time of fn, ms a call, with the GPU held busy (no launch waits)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)  # the GPU busy: the loop below measures the host alone
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps * 1e3
    torch.cuda.synchronize()
    return host


def autograd_step(attn, q, k, v, dout) -> None:
    """One forward and backward of attn(q, k, v) through autograd, on q, k, v as leaves."""
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    o, _, _ = attn(qg, kg, vg)
    torch.autograd.grad(o, (qg, kg, vg), dout)


def attention_steps(q, k, v, dout, causal, negl_prob) -> dict:
    """{name: one forward + backward through autograd}: back_lite.attention (eager:
    ops.EagerAttention) and the autograd of the op it skips (torch.ops.back_lite.attention)."""
    scale = q.shape[-1] ** -0.5
    return {
        f"attention fwd+bwd negl {negl_prob} (eager)":
            lambda: autograd_step(lambda *t: blf.attention(*t, negl_prob=negl_prob, causal=causal),
                                  q, k, v, dout),
        "torch.ops.back_lite.attention fwd+bwd":
            lambda: autograd_step(lambda *t: torch.ops.back_lite.attention(
                *t, scale, causal, negl_prob, True), q, k, v, dout),
    }


def op_paths(q, k, v, out, lse, dout, mask, causal, reps, passes) -> None:
    """--op-paths: each call through back_lite's functions against the torch.ops op it skips."""
    scale = q.shape[-1] ** -0.5
    rows = {
        "functional.backward dense (direct)":
            lambda: blf.backward(dout, q, k, v, out, lse, causal=causal),
        "torch.ops.back_lite.backward dense":
            lambda: torch.ops.back_lite.backward(dout, q, k, v, out, lse, None, 0.0, None,
                                                 scale, causal),
        "functional.backward mask (direct)":
            lambda: blf.backward(dout, q, k, v, out, lse, mask=mask, causal=causal),
        "torch.ops.back_lite.backward mask":
            lambda: torch.ops.back_lite.backward(dout, q, k, v, out, lse, None, 0.0, mask,
                                                 scale, causal),
        "functional.forward stats (direct)":
            lambda: blf.forward(q, k, v, causal=causal, with_stats=True),
        "torch.ops.back_lite.forward stats":
            lambda: torch.ops.back_lite.forward(q, k, v, scale, causal, True),
        # forward + backward with autograd: the eager path against the op's
        **attention_steps(q, k, v, dout, causal, 0.1),
    }
    for _ in range(passes):
        for name, fn in rows.items():
            print(f"{name:>36}: host {host_ms(fn, reps) * 1e3:.1f} us a call")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,16384,16,128")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--keep", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--op-paths", action="store_true",
                    help="the direct path against the torch.ops op instead (see above)")
    ap.add_argument("--passes", type=int, default=2, help="--op-paths: passes over the rows")
    args = ap.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    dev = torch.device("cuda")
    q, k, v = bench_attn.random_qkv(b, s, h, d, torch.bfloat16, dev)
    out, lse, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)
    dout = torch.randn_like(out)
    tm, tn = w.shape[-2:]
    mask = bench_attn.random_tile_mask(b, h, tm, tn, args.keep, dev) & \
        blf.computable_tiles(s, s, args.causal, dev)
    if args.op_paths:
        op_paths(q, k, v, out, lse, dout, mask, args.causal, args.reps, args.passes)
        return
    calls = {
        "forward": lambda: blf.forward(q, k, v, causal=args.causal),
        "dense bwd": lambda: blf.backward(dout, q, k, v, out, lse, causal=args.causal),
        f"sparse bwd {args.keep}": lambda: blf.backward(dout, q, k, v, out, lse, mask=mask,
                                                        causal=args.causal),
    }
    for name, fn in calls.items():
        host = host_ms(fn, args.reps)
        ev = [event_ms(fn) for _ in range(args.reps)]
        torch.cuda.synchronize()
        gpu = statistics.median(a.elapsed_time(z) for a, z in ev)
        print(f"{name:>18}: host {host:.3f} ms a call, GPU {gpu:.3f} ms a call")
    dense, sparse = calls["dense bwd"], calls[f"sparse bwd {args.keep}"]
    for full_queue in (False, True):
        torch.cuda.synchronize()
        if full_queue:
            torch.cuda._sleep(SLEEP_CYCLES)
        ev = []
        for _ in range(args.reps):
            sparse()
            ev.append(event_ms(dense))
        torch.cuda.synchronize()
        gpu = statistics.median(a.elapsed_time(z) for a, z in ev)
        print(f"dense bwd after each sparse call, queue {'kept full' if full_queue else 'as it comes'}: "
              f"{gpu:.3f} ms")


if __name__ == "__main__":
    main()
