"""select_time.py -- the GPU selection (W -> block mask) alone, on the bench's video inputs: its
masks against the CPU rule, bit for bit, and its time per call (CUDA events around each call,
median of --reps). The events also hold the host's launch of the torch op (~80 us on the H200
machine, bench/results/bwd-s91-select-search.txt): read the kernel's own duration from
dev/cuda/bwd_call_timeline.py's `negl:P` keeps instead.

    BACK_LITE_LIBRARY=build/ab/X.so python3 dev/cuda/select_time.py \
        --shape 1,32768,24,128 --causal --negls 0.01,0.05,0.2,0.5

Prints one line per negl_prob: the kept share, the median / min time in us, and how many masks
differ from the CPU rule's (must be 0). W comes from the library's own forward with statistics.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from bench_attn import video_qkv  # noqa: E402
from back_lite import functional as blf  # noqa: E402


def time_select(w: torch.Tensor, negl: float, reps: int) -> list:
    """Per-call times (us) of blf.select, each between two events on the current stream."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        blf.select(w, negl)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,32768,24,128", help="B,S,H,D of the video inputs")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--negls", default="0.01,0.05,0.2,0.5")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args(argv)
    b, s, h, d = (int(x) for x in args.shape.split(","))
    q, k, v = video_qkv(b, s, h, d, torch.bfloat16, torch.device("cuda"))
    _, _, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)
    w_cpu = w.cpu()
    print(f"select: W {tuple(w.shape)} causal={args.causal} {torch.cuda.get_device_name()}")
    for negl in (float(x) for x in args.negls.split(",")):
        mask = blf.select(w, negl)
        differ = int((mask.cpu() != blf.select(w_cpu, negl)).sum())
        times = time_select(w, negl, args.reps)
        kept = float(mask.float().mean())
        print(f"negl {negl:<5} kept {kept:.3f}  select {statistics.median(times):8.1f} us "
              f"(min {min(times):.1f})  masks differing from the CPU rule: {differ}")


if __name__ == "__main__":
    main()
