"""How much the order of the timed calls moves a figure (GPU clock / power state), on one shape.

bench_attn.py times each contender in a block of `--reps` back-to-back calls. A kernel near the
chip's power limit may run faster right after a lighter kernel or an idle pause than in the middle
of a long block of its own calls. This tool measures that directly, for two pairs of contenders:
BackLite's forward without / with statistics, and BackLite's dense backward / SDPA FLASH's:

    python bench/bench_order.py --shape 1 16384 16 128          # GPU only
    python bench/bench_order.py --shape 1 16384 16 64 --causal

For each pair (A, B) it prints: per-call times of a long block of A after an idle pause (the
series shows whether the first calls are faster), then the A/B ratio timed four ways --
blocks "A then B", blocks "B then A", and call by call "ABAB..." (each call of A and B sees the
same recent history), each as the median over calls.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from back_lite import functional as blf

from bench_attn import per_call_ms, random_qkv, sdpa_callables

IDLE_S = 2.0  # pause before a series: lets clocks and power recover, as between bench contenders


def series(name, fn, calls):
    time.sleep(IDLE_S)
    ms = per_call_ms([fn] * calls)
    first = " ".join(f"{t:.3f}" for t in ms[:8])
    print(f"  [{time.strftime('%H:%M:%S')}] {name}: {calls} calls after {IDLE_S:.0f} s idle: first 8 [{first}] | median of "
          f"calls 1-10 {statistics.median(ms[:10]):.3f}, 11-50 {statistics.median(ms[10:50]):.3f}, "
          f"51-{calls} {statistics.median(ms[50:]):.3f} ms")


def ratios(name_a, fa, name_b, fb, reps, rounds):
    """A/B median-time ratio: in blocks A-first, blocks B-first, and call-by-call alternation."""
    out = {}
    for a_first in (True, False):
        ta, tb = [], []
        for _ in range(rounds):
            if a_first:
                ta += per_call_ms([fa] * reps)
                tb += per_call_ms([fb] * reps)
            else:
                tb += per_call_ms([fb] * reps)
                ta += per_call_ms([fa] * reps)
        out["AB blocks" if a_first else "BA blocks"] = (statistics.median(ta), statistics.median(tb))
    ms = per_call_ms([fa, fb] * (reps * rounds))
    out["ABAB calls"] = (statistics.median(ms[0::2]), statistics.median(ms[1::2]))
    for order, (a, b) in out.items():
        print(f"  [{time.strftime('%H:%M:%S')}] {order:>10}: {name_a} {a:.3f} ms, {name_b} {b:.3f} ms, ratio {a / b:.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=int, nargs=4, metavar=("B", "S", "H", "D"), required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=200, help="calls in each per-call series")
    ap.add_argument("--reps", type=int, default=8, help="calls per block in the ratio timings")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or not blf.backend_available("cuda"):
        sys.exit("bench_order.py needs a CUDA device and the BackLite CUDA backend")
    b, s, h, d = args.shape
    q, k, v = random_qkv(b, s, h, d, torch.bfloat16, torch.device("cuda"))
    dout = torch.randn_like(q)
    c = args.causal
    out, lse, _ = blf.forward(q, k, v, causal=c)
    fwd = lambda: blf.forward(q, k, v, causal=c)
    fwd_stats = lambda: blf.forward(q, k, v, causal=c, with_stats=True)
    bwd = lambda: blf.backward(dout, q, k, v, out, lse, causal=c)
    print(f"shape {tuple(args.shape)} causal={c} on {torch.cuda.get_device_name()}")
    series("bl_fwd", fwd, args.calls)
    series("bl_fwd_stats", fwd_stats, args.calls)
    ratios("bl_fwd_stats", fwd_stats, "bl_fwd", fwd, args.reps, args.rounds)
    series("bl_bwd", bwd, args.calls // 2)
    peers = sdpa_callables(q, k, v, c)
    if "sdpa_flash" in peers:
        flash_bwd = peers["sdpa_flash"][1]
        series("sdpa_flash_bwd", flash_bwd, args.calls // 2)
        ratios("bl_bwd", bwd, "sdpa_flash_bwd", flash_bwd, args.reps, args.rounds)


if __name__ == "__main__":
    main()
