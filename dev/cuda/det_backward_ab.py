"""The deterministic backward's cost: each call's backward in the fastest form and in the
deterministic one (torch.use_deterministic_algorithms(True): the dq-rows kernel, and at head dim
128 version 10 without its dQ), interleaved call by call as bench/bench_attn.py times (15 reps x
3 rounds); medians in ms and the deterministic / fastest ratio, dense, masked and selected.

    python3 dev/cuda/det_backward_ab.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from bench_attn import random_qkv, random_tile_mask, interleaved_times, medians_of  # noqa: E402
from back_lite import functional as blf  # noqa: E402

# (shape, causal, tiles): "dense", a random mask keeping this share, or "negl:P" (selection)
CONFIGS = [((1, 16384, 16, 128), False, ["dense", 0.1, 0.03]),
           ((1, 16384, 16, 128), True, ["dense", 0.25, 0.03]),
           ((1, 4096, 16, 128), True, ["dense", "negl:0.05"]),
           ((1, 16384, 16, 64), True, ["dense", 0.03])]


def arm(fn, deterministic):
    def call():
        torch.use_deterministic_algorithms(deterministic)
        try:
            return fn()
        finally:
            torch.use_deterministic_algorithms(False)
    return call


dev = torch.device("cuda")
print(f"{'shape':>18} {'causal':>6} {'tiles':>9} {'fast ms':>8} {'det ms':>8} {'det/fast':>8}")
for shape, causal, tiles in CONFIGS:
    b, s, h, d = shape
    q, k, v = random_qkv(b, s, h, d, torch.bfloat16, dev)
    dout = torch.randn_like(q)
    out, lse, w = blf.forward(q, k, v, causal=causal, with_stats=True)
    tm, tn = w.shape[-2:]
    for t in tiles:
        if t == "dense":
            kw = {}
        elif isinstance(t, str):
            kw = {"tile_mass": w, "negl_prob": float(t.partition(":")[2])}
        else:
            kw = {"mask": random_tile_mask(b, h, tm, tn, t, dev)}

        def backward(kw=kw):
            return blf.backward(dout, q, k, v, out, lse, causal=causal, **kw)

        times = interleaved_times({"fast": arm(backward, False), "det": arm(backward, True)},
                                  reps=15, rounds=3)
        med = medians_of(times)
        print(f"{str(shape):>18} {str(causal):>6} {str(t):>9} {med['fast']:8.3f} "
              f"{med['det']:8.3f} {med['det'] / med['fast']:8.3f}", flush=True)
