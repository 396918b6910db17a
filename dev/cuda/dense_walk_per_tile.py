"""dense_walk_per_tile.py -- the dense backward's main kernel time per computable 64 x 128 tile,
causal and non-causal, at shapes with Sq != Sk. Device only, head dim 128.

bench/results/bwd-s63-causal-code-ab.txt found the dense causal walk ~3.7 % cheaper per tile than
the dense non-causal walk at Sq == Sk. With Sk = 2 Sq a causal call's rows see the first Sk - Sq
keys whole (bottom-right aligned diagonal): most of its tiles are unmasked, its columns are equal
but for the last ones. If the causal walk keeps its lead there, the lead is the kernel's (its loop),
not the triangle's geometry (columns of unequal length, early-ending CTAs).
Kernel times by torch.profiler (causal_code_ab.kernel_us), rounds alternating, medians. Usage:
    BACK_LITE_LIBRARY=build/libbacklite.so PYTHONPATH=. python3 dev/cuda/dense_walk_per_tile.py \
        --shapes 1,16384,32768,16 --rounds 5
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

import back_lite.functional as blf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from causal_code_ab import kernel_us  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1,16384,32768,16;1,16384,16384,16", help="B,Sq,Sk,H;...")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    for shape in args.shapes.split(";"):
        b, sq, sk, h = (int(x) for x in shape.split(","))
        torch.manual_seed(0)
        q = torch.randn(b, sq, h, 128, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, h, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn_like(q)
        runs = {}
        for causal in (True, False):
            out, lse, _ = blf.forward(q, k, v, causal=causal, with_stats=False)
            fn = (lambda out=out, lse=lse, causal=causal:
                  blf.backward(dout, q, k, v, out, lse, causal=causal))
            tiles = b * h * int(blf.computable_tiles(sq, sk, causal, dev).sum())
            runs["causal" if causal else "non-causal"] = (fn, tiles, [])
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for name in order:
                fn, _, times = runs[name]
                per = kernel_us(fn, args.reps)
                times.append(max(t for kk, t in per.items() if "bwd_ws128" in kk))
        for name, (_, tiles, times) in runs.items():
            ns = sorted(1e3 * t / tiles for t in times)
            print(f"B={b} Sq={sq} Sk={sk} H={h} {name:10s}: {tiles} tiles, main kernel "
                  f"{statistics.median(times):8.0f} us, {1e3 * statistics.median(times) / tiles:6.2f} ns "
                  f"a tile (rounds {', '.join(f'{x:.2f}' for x in ns)})")


if __name__ == "__main__":
    main()
