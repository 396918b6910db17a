"""split_order_model.py -- the tail of a split call's main kernel (GQA / MQA, bl_bwd_head_split)
under several record orders, in a model of the persistent head-dim-128 kernel (no GPU needed).

A split call cuts each column (b, kv head, key tile) into P parts of G / P query heads; each
(column, part) is one record the 132 CTAs draw in turn (the dynamic walk). The library orders
the records part-major: every column of a window in count order (the whole column's kept
entries, heaviest first) for part 0, then for part 1, ... (sched_split_order in
src/cuda/bwd_lists_sm90.cu). Here a record costs COST_RECORD_US + COST_ENTRY_US per kept 64-row
tile of its part (SPLIT_FIT_ENTRY_US in src/cuda/bwd_prepost_sm90.cu; the record's start, end and
partial ~2-3 us by bench/results/bwd-s87-timeline-sparse.txt), and the makespan above total work /
CTAs is the tail. Orders:
  library      part-major, columns by whole-column count (what the schedule kernel writes)
  part-count   part-major, each part's columns by that part's own count
  bands:K      the window's columns (by whole-column count) cut into K runs, each run part-major:
               the heavy columns of every part before the light ones
  lpt          every record by its own count, heaviest first (no part-major L2 locality)

The model knows nothing of L2: on the device (bench/results/bwd-s92-split-bands.txt) bands of 8
lost 34-128 us everywhere, though the model ranked them above the library's order on every masked
call (below it only on the dense one): the CTAs running at once then walk ~4 query heads instead
of 1-2 (a staircase with two heads in flight, modelled apart, lost 32-700 us on all calls but
one). Read its tails as an upper bound on what an order can take back, not as a ranking of orders
that trade away locality.

Masks: `random:KEEP` (bench_attn.random_tile_mask, as the bench draws them) or `video:NEGL` (the
bench's video-grid inputs; W from the library's CPU forward, then its CPU selection).

    python3 dev/cuda/split_order_model.py --shape 2,16384,8,128,1 --causal \
        --masks random:0.5,random:0.25,video:0.05,video:0.2 --parts 8
"""
from __future__ import annotations

import argparse
import heapq
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from bench_attn import grouped, random_tile_mask, video_qkv  # noqa: E402
from back_lite import functional as blf  # noqa: E402

CTAS = 132
TM, TN = 64, 128  # the CUDA backend's row and key tiles (W's tiles)
WINDOW_ROUNDS_CAUSAL = 4  # SCHED_WINDOW_ROUNDS_CAUSAL (one round for non-causal split calls)
COST_ENTRY_US = 1.93
COST_RECORD_US = 2.5
BANDS = (2, 4, 8)
ORDERS = ("library", "part-count") + tuple(f"bands:{k}" for k in BANDS) + ("lpt",)


def video_w(b: int, s: int, h: int, d: int, hk: int, causal: bool) -> torch.Tensor:
    """W (B, H, Tm, Tn) of the bench's video inputs, from the library's CPU forward (~20 s at
    2 x 16k x 8 q heads on two cores)."""
    q, k, v = grouped(*video_qkv(b, s, h, d, torch.bfloat16, "cpu"), hk)
    return blf.forward(q, k, v, causal=causal, with_stats=True)[2]


def part_counts(mask: torch.Tensor, hk: int, parts: int) -> torch.Tensor:
    """(columns, parts) kept 64-row tiles of each record; columns in (b, kv head, key tile)
    order."""
    b, h, tm, tn = mask.shape
    g = h // hk
    per_head = mask.sum(2)                                     # (B, H, Tn)
    per_part = per_head.view(b, hk, parts, g // parts, tn).sum(3)  # (B, Hk, P, Tn)
    return per_part.permute(0, 1, 3, 2).reshape(-1, parts)


def walk(times: list) -> tuple:
    """(makespan, spread): when the last CTA ends, and how long after the first one ran out of
    records (what the next kernel's "duration" shows in a timeline: its CTAs start as the SMs
    free up)."""
    free_at = [0.0] * CTAS
    for t in times:
        heapq.heappush(free_at, heapq.heappop(free_at) + t)
    return max(free_at), max(free_at) - min(free_at)


def orders(counts: torch.Tensor, window: int) -> dict:
    """{name: [record cost, in draw order]}."""
    cols, parts = counts.shape
    cost = (COST_RECORD_US + COST_ENTRY_US * counts.double()).tolist()
    whole = counts.sum(1).tolist()
    out = {name: [] for name in ORDERS}
    for lo in range(0, cols, window):
        hi = min(cols, lo + window)
        by_whole = sorted(range(lo, hi), key=lambda c: (-whole[c], c))
        for j in range(parts):
            out["library"] += [cost[c][j] for c in by_whole]
            by_part = sorted(range(lo, hi), key=lambda c: (-counts[c, j].item(), c))
            out["part-count"] += [cost[c][j] for c in by_part]
        for bands in BANDS:  # the sorted window cut into `bands` runs, each part-major
            n = hi - lo
            for k in range(bands):
                run = by_whole[k * n // bands:(k + 1) * n // bands]
                for j in range(parts):
                    out[f"bands:{bands}"] += [cost[c][j] for c in run]
    out["lpt"] = sorted((x for row in cost for x in row), reverse=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="2,16384,8,128,1", help="B,S,H,D,HK")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--masks", default="random:0.5,video:0.05")
    ap.add_argument("--parts", type=int, default=8)
    args = ap.parse_args()
    b, s, h, d, hk = (int(x) for x in args.shape.split(","))
    if blf.tile_shape("cpu") != (TM, TN):
        raise SystemExit(f"the CPU backend's tiles {blf.tile_shape('cpu')} are not the CUDA ones")
    tm, tn = math.ceil(s / TM), math.ceil(s / TN)
    comp = blf.computable_tiles(s, s, args.causal)  # (Tm, Tn)
    window = (WINDOW_ROUNDS_CAUSAL if args.causal else 1) * CTAS
    w = None
    print(f"shape {(b, s, h, d, hk)} causal={args.causal}, {args.parts} parts, {CTAS} CTAs, "
          f"record {COST_RECORD_US} us + {COST_ENTRY_US} us a kept 64-row tile")
    print("tail us (spread us) per order")
    print("mask          kept   ideal us  longest us  " + "  ".join(f"{n:>12s}" for n in ORDERS))
    for spec in args.masks.split(","):
        kind, val = spec.split(":")
        if kind == "random":
            mask = random_tile_mask(b, h, tm, tn, float(val), "cpu") & comp
        else:
            if w is None:
                w = video_w(b, s, h, d, hk, args.causal)
            mask = blf.select(w.contiguous(), float(val)) & comp
        kept = float(mask.sum()) / float(comp.sum() * b * h)
        counts = part_counts(mask, hk, args.parts)
        recs = orders(counts, window)
        ideal = sum(recs["lpt"]) / CTAS
        cells = []
        for n in ORDERS:
            end, spread = walk(recs[n])
            cells.append(f"{end - ideal:5.0f} ({spread:4.0f})")
        print(f"{spec:12s} {kept:6.3f} {ideal:9.0f} {max(recs['lpt']):10.0f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
