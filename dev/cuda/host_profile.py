"""Where the host time of an eager forward + backward through autograd goes: cProfile (Python
functions, cumulative) and torch.profiler's CPU events (key_averages) over `--steps` steps queued
behind a GPU sleep, so that no call waits for the GPU.

    BACK_LITE_LIBRARY=build/libbacklite.so PYTHONPATH=. python3 dev/cuda/host_profile.py \
        [--shape 4,4096,16,64] [--causal] [--negl 0.5] [--steps 50]
"""
import argparse
import cProfile
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from bench_attn import random_qkv  # noqa: E402
from host_overhead import SLEEP_CYCLES, autograd_step  # noqa: E402
from back_lite import functional as blf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,4096,16,64")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--negl", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    dev = torch.device("cuda")
    q, k, v = random_qkv(b, s, h, d, torch.bfloat16, dev)
    dout = torch.randn_like(q)

    def step():
        autograd_step(lambda *t: blf.attention(*t, negl_prob=args.negl, causal=args.causal),
                      q, k, v, dout)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    print(f"cProfile, {args.steps} steps (us a step = cumtime / steps x 1e6):")
    stats.sort_stats("cumulative").print_stats(28)
    torch.cuda._sleep(SLEEP_CYCLES)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        for _ in range(args.steps):
            step()
    torch.cuda.synchronize()
    print(tp.key_averages().table(sort_by="cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
