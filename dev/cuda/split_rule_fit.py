"""Fit the device's head-split part rule (bl_bwd_split_rule_make, src/cuda/bwd_prepost_sm90.cu) to
sweeps of the part count, and score rules by what their picks lose against the fastest part count.

A sweep is lib_timeline_ab.sh run with the dev-only force libraries (cmake ...
-DCMAKE_CUDA_FLAGS=-DBL_BWD_SPLIT_FORCE_LEVEL=k: every masked causal head-dim-128 split call uses
P >> k parts, P the host's bl_bwd_head_split), one build name per level:

    python3 dev/cuda/split_rule_fit.py \
        bench/results/bwd-s78-split-sweep.txt:new=0,f1=1,f2=2,f3=3 \
        "bench/results/bwd-s79-split-sweep.txt:new=0,f1=1,f2=2:1,8192,32,128=8;1,16384,16,128=4"

Each argument is a file holding lib_timeline_ab.sh's summary lines (`NAME rR: SHAPE causal keep
KEEP: ... | span X`), the level of each build name and, last, the kv heads of the file's shapes
that have more than one (the summary's shape is B,S,Hq,D only). The model, per (file, shape, keep) a constant K plus what depends on p:

    span = K + te x f x E x max(1 / p, C / (2 SMs) + tail / p) x (1 + head x p / G) + part x C x p

(C = B x Hk x Tn columns, E = G x Tm entries a column, f the kept share.) Only the ratios part /
te, tail and head change the picks; the grid below scores each by its picks' summed loss.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timeline_span_table import read_spans  # noqa: E402

SMS = 132
TN, TM = 128, 64  # key tile, row tile (BL_BWD_TN, BL_BWD_TM)
HOST_PART_COST = 0.012  # SPLIT_PART_COST_D128
SPLIT_MAX, SPLIT_MIN_ROUNDS = 8, 4


def host_parts(cols: int, group: int) -> int:
    """bl_bwd_head_split for a causal head-dim-128 call."""
    if group < 2 or cols >= SPLIT_MIN_ROUNDS * SMS:
        return 1

    def cost(p: int) -> float:
        bal = max(1.0 / p, cols / (2.0 * SMS) + 0.5 / p)
        return bal + HOST_PART_COST * p * cols / SMS

    best, p = 1, 2
    while p <= SPLIT_MAX and group % p == 0:
        if cost(p) < cost(best):
            best = p
        p *= 2
    return best


def model(f, p, C, E, G, te, tail, head, part):
    bal = max(1.0 / p, C / (2.0 * SMS) + tail / p) * (1.0 + head * p / G)
    return te * f * E * bal + part * C * p


def load(args) -> list[dict]:
    rows = []
    for src in args.sweeps:
        path, levels, kvs = (src.split(":") + [""])[:3]
        kv = {shape: int(n) for shape, n in (x.split("=") for x in filter(None, kvs.split(";")))}
        level = {name: int(k) for name, k in (x.split("=") for x in levels.split(","))}
        for (shape, keep), per in read_spans(path).items():
            key = shape.split()[0]
            b, s, h, _ = map(int, key.split(","))
            hk = kv.get(key, 1)
            G, C, E = h // hk, b * hk * -(-s // TN), (h // hk) * -(-s // TM)
            P = host_parts(C, G)
            times = {}
            for name, spans in per.items():
                p = max(P >> level[name], 1)
                times.setdefault(p, statistics.mean(spans))  # force levels past 1 repeat p = 1
            rows.append(dict(src=Path(path).stem, shape=key, kv=hk, f=float(keep), C=C, E=E, G=G,
                             P=P, t=times))
    return rows


def pick(row, te, tail, head, part, max_cols):
    if row["C"] > max_cols:
        return row["P"]
    return min(row["t"], key=lambda p: model(row["f"], p, row["C"], row["E"], row["G"], te, tail,
                                             head, part))


def score(rows, **kw):
    loss = [r["t"][pick(r, **kw)] - min(r["t"].values()) for r in rows]
    return sum(loss), max(loss), sum(x > 0 for x in loss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="FILE:name=level,...[:SHAPE=kv;...] (see above)")
    ap.add_argument("--max-rounds", type=float, default=SPLIT_MIN_ROUNDS,
                    help="the rule applies up to this many columns per SM (else the host's P)")
    ap.add_argument("--rule", default="1.93,0.5,0.2,0.08,4",
                    help="te,tail,head,part,max rounds of the rule to score (default: the shipped"
                         " one; the seventy-fourth session's was 1.93,0.4,0.2,0.08,2)")
    args = ap.parse_args()
    rows = load(args)
    te0, tail0, head0, part0, rounds0 = map(float, args.rule.split(","))
    rule = dict(te=te0, tail=tail0, head=head0, part=part0, max_cols=rounds0 * SMS)
    host = dict(te=1.0, tail=0.0, head=0.0, part=0.0, max_cols=-1)
    grid = []
    for tail, head, part in itertools.product(
            [0.2, 0.3, 0.4, 0.5, 0.6], [0.0, 0.1, 0.2, 0.3, 0.4, 0.6],
            [0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12, 0.14, 0.16]):
        kw = dict(te=1.93, tail=tail, head=head, part=part, max_cols=args.max_rounds * SMS)
        grid.append((score(rows, **kw), kw))
    grid.sort(key=lambda x: (x[0][0], x[0][1]))
    print(f"{len(rows)} rows; SMs {SMS}; the rule applies to C <= {args.max_rounds:g} x SMs")
    for name, kw in [("host P", host), ("rule", rule)]:
        tot, worst, n = score(rows, **kw)
        print(f"{name:>8}: loss {tot:7.1f} us in all, {worst:6.1f} at most, {n} rows")
    print("best of the grid (te 1.93 us an entry fixed; only the ratios matter):")
    for (tot, worst, n), kw in grid[:8]:
        print(f"  tail {kw['tail']:.1f} head {kw['head']:.1f} part {kw['part']:.2f}: loss {tot:7.1f}"
              f" us in all, {worst:6.1f} at most, {n} rows")
    best = grid[0][1]
    print("\nper row (span us by p; best, the grid's best rule, --rule):")
    for r in rows:
        pb = min(r["t"], key=r["t"].get)
        pn, ps = pick(r, **best), pick(r, **rule)
        cells = " ".join(f"{p}:{r['t'][p]:.0f}" for p in sorted(r["t"]))
        print(f"{r['src']:<24} {r['shape']:<16} kv {r['kv']} C {r['C']:3d} E {r['E']:5d} "
              f"f {r['f']:<6} {cells:<34} best {pb} fit {pn} (+{r['t'][pn] - r['t'][pb]:5.1f}) "
              f"rule {ps} (+{r['t'][ps] - r['t'][pb]:5.1f})")


if __name__ == "__main__":
    main()
