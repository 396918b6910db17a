"""Where a sparse backward's time above `kept x dense` goes, from a bench JSON: per shape, the
two-number model fitted to the random-mask rows (kept < 1) by least squares,

    sparse / dense = kept x (1 + delta) + (1 - kept) x fixed

delta: how much dearer a kept tile is in the sparse walk than in the dense one; fixed: what the
call pays whatever it keeps (pre- and postprocessing, lists, schedule, each key tile's start and
dK / dV stores), as a share of the dense call. The `kept + 2%` bar asks for
kept x delta + (1 - kept) x fixed <= 0.02 at every kept fraction, i.e. (a line in kept) both
delta <= 2 % and fixed <= 2 %: the model says which of the two a shape misses by how much.

    python3 bench/sparse_cost_fit.py bench/results/bench-2026-11-30-s36.json [more.json ...]

Plain Python (no numpy): the normal equations of a two-parameter fit.
"""
from __future__ import annotations

import argparse
import json


def fit(rows):
    """(delta, fixed, worst residual) for rows [(kept, sparse / dense)] with 0 < kept < 1."""
    # y - k = delta * k + fixed * (1 - k): least squares over the two columns k and 1 - k
    saa = sum(k * k for k, _ in rows)
    sab = sum(k * (1 - k) for k, _ in rows)
    sbb = sum((1 - k) ** 2 for k, _ in rows)
    say = sum(k * (y - k) for k, y in rows)
    sby = sum((1 - k) * (y - k) for k, y in rows)
    det = saa * sbb - sab * sab
    if len(rows) < 2 or det <= 0:
        raise ValueError("need at least two distinct kept fractions below 1")
    delta = (say * sbb - sby * sab) / det
    fixed = (saa * sby - sab * say) / det
    worst = max(abs(y - (k * (1 + delta) + (1 - k) * fixed)) for k, y in rows)
    return delta, fixed, worst


def shape_rows(result, source="random mask"):
    return [(x["kept"], x["vs_dense"]) for x in result.get("sparse", [])
            if x["source"] == source and 0 < x["kept"] < 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="bench_attn.py --out files")
    args = ap.parse_args()
    for path in args.json:
        with open(path) as f:
            results = json.load(f)["results"]
        print(f"== {path}")
        for r in results:
            rows = shape_rows(r)
            if len(rows) < 2:
                continue
            delta, fixed, worst = fit(rows)
            shape = "x".join(str(v) for v in r["shape"])
            print(f"  {shape:16s} {'causal' if r['causal'] else 'full  '}  delta {100 * delta:+5.1f} %"
                  f"  fixed {100 * fixed:4.2f} % of dense  (worst residual {100 * worst:.2f} points)")


if __name__ == "__main__":
    main()
