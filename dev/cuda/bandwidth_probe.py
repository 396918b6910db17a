"""What DRAM rate PyTorch's own elementwise kernels reach with the backward's fixed traffic.

    python3 dev/cuda/bandwidth_probe.py [--shape B,S,H,D]

The backward's preprocess reads out and dO (16-bit) and writes the fp32 dq accumulator's zeros;
its dq conversion reads the accumulator and writes dq (16-bit). This times, with CUDA events
(median of --reps calls, each behind the last), PyTorch kernels that move the same bytes:
  preprocess-like : torch.mul(out, dO, out=acc32)   reads 2 x 16-bit, writes fp32
  zeros           : acc32.zero_()                   writes fp32
  conversion-like : dq16.copy_(acc32)               reads fp32, writes 16-bit
  copy            : acc32b.copy_(acc32)             reads fp32, writes fp32
and prints each one's time and rate (bytes read + written over time), as the ceiling our own
kernels of the same traffic can be held against (bwd_call_timeline.py gives theirs).
"""
from __future__ import annotations

import argparse
import statistics

import torch


def time_op(fn, reps: int) -> float:
    """Median time of fn in microseconds over `reps` back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return 1000.0 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,16384,16,128")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    n = 1
    for x in shape:
        n *= x
    dev = "cuda"
    out = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    dout = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    acc = torch.randn(shape, device=dev, dtype=torch.float32)
    acc_b = torch.empty_like(acc)
    dq = torch.empty(shape, device=dev, dtype=torch.bfloat16)
    ops = [
        ("preprocess-like", lambda: torch.mul(out, dout, out=acc), n * (2 + 2 + 4)),
        ("zeros", lambda: acc.zero_(), n * 4),
        ("conversion-like", lambda: dq.copy_(acc), n * (4 + 2)),
        ("copy", lambda: acc_b.copy_(acc), n * 8),
    ]
    print(f"shape {shape} ({torch.cuda.get_device_name()})")
    for name, fn, nbytes in ops:
        us = time_op(fn, args.reps)
        print(f"  {name:16s} {us:8.1f} us  {nbytes / 1e6:7.1f} MB  {nbytes / us / 1e6:5.2f} TB/s")


if __name__ == "__main__":
    main()
