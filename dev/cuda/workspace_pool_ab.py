"""A/B of the compressible workspace pool: each configuration's dense and sparse backward with
the workspace from the pool (BACK_LITE_COMPRESSIBLE_WORKSPACE unset) and from plain memory (=0),
interleaved call by call as bench/bench_attn.py times (15 reps x 3 rounds); medians in us and
each row's ratio to its own arm's dense call, against kept + 0.02.

    python3 dev/cuda/workspace_pool_ab.py
"""
import os, sys
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from bench_attn import random_qkv, random_tile_mask, interleaved_times, medians_of  # noqa
from back_lite import functional as blf  # noqa

ENV = "BACK_LITE_COMPRESSIBLE_WORKSPACE"
CONFIGS = [((1, 16384, 16, 128), False, [0.03, 0.1]),
           ((1, 16384, 16, 128), True, [0.5, 0.03]),
           ((1, 32768, 24, 128), True, [0.031, 0.012]),
           ((1, 16384, 16, 64), False, [0.1, 0.25])]


def arm(fn, plain):
    def call():
        if plain:
            os.environ[ENV] = "0"
        try:
            return fn()
        finally:
            os.environ.pop(ENV, None)
    return call


dev = torch.device("cuda")
for shape, causal, keeps in CONFIGS:
    b, s, h, d = shape
    q, k, v = random_qkv(b, s, h, d, torch.bfloat16, dev)
    dout = torch.randn_like(q)
    out, lse, w = blf.forward(q, k, v, causal=causal, with_stats=True)
    tm, tn = w.shape[-2:]
    comp = blf.computable_tiles(s, s, causal, dev)
    fns = {}
    dense = lambda: blf.backward(dout, q, k, v, out, lse, causal=causal)
    fns["dense pool"], fns["dense plain"] = arm(dense, False), arm(dense, True)
    kept = {}
    for keep in keeps:
        mask = random_tile_mask(b, h, tm, tn, keep, dev) & comp
        kept[keep] = 1.0 - blf.backward_sparsity(mask, s, s, causal)
        f = lambda mask=mask: blf.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
        fns[f"{keep} pool"], fns[f"{keep} plain"] = arm(f, False), arm(f, True)
    ms = medians_of(interleaved_times(fns, 15, 3))
    line = f"{shape} causal={causal}: dense pool {1e3*ms['dense pool']:.1f} plain {1e3*ms['dense plain']:.1f} us"
    for keep in keeps:
        rp = ms[f"{keep} pool"] / ms["dense pool"]
        rq = ms[f"{keep} plain"] / ms["dense plain"]
        bar = kept[keep] + 0.02
        line += (f" | keep {kept[keep]:.4f}: pool {1e3*ms[f'{keep} pool']:.1f} plain "
                 f"{1e3*ms[f'{keep} plain']:.1f} us, / dense {rp:.4f} vs {rq:.4f} (bar {bar:.4f})")
    print(line, flush=True)
    del q, k, v, dout, out, lse, w, fns
