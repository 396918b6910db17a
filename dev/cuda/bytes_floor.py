"""The least DRAM traffic a sparse backward call can move, against the `kept + 2%` bar.

    PYTHONPATH=. BACK_LITE_LIBRARY=build/libbacklite.so python3 dev/cuda/bytes_floor.py \
        bench/results/bench-2026-12-03-s81.json [--tbps 4.3]

For every random-mask row of a bench JSON (bench/bench_attn.py), with the bench's own masks
(random_tile_mask & the computable tiles, same seed): whatever the kernels, a call must write dq,
dk and dv in full (zeros where nothing is kept), read q, dO and out (for Dlt) of every 64-row tile
that keeps a key tile, and K and V of every key tile (column) that some query head keeps. Read
once each at the device's copy rate (`--tbps`, read + write bytes; 4.3 TB/s measured on the
H200s here, ../.library/device/KINDS.md), that is the memory floor; the kept tiles' matrix work,
at best kept x the dense call, overlaps it. Printed per row: the floor's bytes and microseconds,
the lower bound max(floor, kept x dense), the bar (kept + 0.02) x dense, the measured time, and
the slack the bar leaves above the lower bound -- where it is small or negative no kernel passes
that row, and where the measured call is far above the floor the bytes say what to cut.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from bench_attn import RANDOM_MASK_KEEP, random_tile_mask  # noqa: E402
from back_lite import functional as blf  # noqa: E402

ELEM = 2        # bf16 / fp16 bytes
LSE = 4         # fp32 per row


def floor_bytes(mask: torch.Tensor, b: int, s: int, hq: int, hk: int, d: int) -> dict:
    """mask: (B, Hq, Tm, Tn) bool, the tiles the call keeps (computable ones only).
    Returns the floor's parts in bytes and the row / column shares that carry reads."""
    group = hq // hk
    rows_kept = mask.any(dim=-1)                                    # (B, Hq, Tm)
    cols_kept = mask.view(b, hk, group, *mask.shape[2:]).any(dim=2).any(dim=2)  # (B, Hk, Tn)
    row_share = rows_kept.float().mean().item()
    col_share = cols_kept.float().mean().item()
    x_q = b * s * hq * d * ELEM
    x_k = b * s * hk * d * ELEM
    return {"out": x_q + 2 * x_k,                                   # dq, dk, dv in full
            "rows": row_share * (3 * x_q + b * hq * s * LSE),      # q, dO, out, lse
            "cols": col_share * 2 * x_k,                            # K, V
            "row_share": row_share, "col_share": col_share}


def rows_of(bench: dict):
    """(shape, causal, keep label, kept, measured ms, dense ms) of the bench's random-mask rows,
    with the keep each mask was drawn at (RANDOM_MASK_KEEP's order in the bench)."""
    for r in bench["results"]:
        randoms = [x for x in r["sparse"] if x["source"] == "random mask"]
        for keep, x in zip(RANDOM_MASK_KEEP, randoms):
            yield r["shape"], r["causal"], keep, x["kept"], x["bwd_ms"], x["dense_ms"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_json")
    ap.add_argument("--tbps", type=float, default=4.3, help="copy rate, read + write bytes")
    ap.add_argument("--min-seqlen", type=int, default=16384)
    args = ap.parse_args()
    bench = json.load(open(args.bench_json))
    print(f"# {args.bench_json}: memory floor at {args.tbps} TB/s; us = microseconds")
    print("| shape | causal | kept | rows / cols read | floor MB | floor us | lower bound us "
          "| bar us | measured us | bar - bound us | measured - bar us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    masks = {}
    for shape, causal, keep, kept, ms, dense_ms in rows_of(bench):
        b, s, hq, d = shape[:4]
        if s < args.min_seqlen:
            continue
        hk = shape[4] if len(shape) > 4 else hq
        key = (b, s, hq, causal)
        if key not in masks:
            tm, tn = blf.num_tiles(s, s, "cpu")
            masks[key] = (tm, tn, blf.computable_tiles(s, s, causal, "cpu"))
        tm, tn, computable = masks[key]
        mask = random_tile_mask(b, hq, tm, tn, keep, "cpu") & computable
        f = floor_bytes(mask, b, s, hq, hk, d)
        total = f["out"] + f["rows"] + f["cols"]
        floor_us = total / (args.tbps * 1e12) * 1e6
        bound_us = max(floor_us, kept * dense_ms * 1e3)
        bar_us = (kept + 0.02) * dense_ms * 1e3
        print(f"| {tuple(shape)} | {causal} | {kept:.3f} | {f['row_share']:.2f} / "
              f"{f['col_share']:.2f} | {total / 1e6:.0f} | {floor_us:.0f} | {bound_us:.0f} | "
              f"{bar_us:.0f} | {ms * 1e3:.0f} | {bar_us - bound_us:.0f} | "
              f"{ms * 1e3 - bar_us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
