"""Which main kernel the device picks for each random-mask row of the bench, and how near the pick
sits to each of its rules' thresholds.

    PYTHONPATH=. python3 dev/cuda/bench_picks.py [--shape B,S,H,D ...]

For every MHA shape of bench/bench_attn.py (or --shape), with and without a causal mask, and every
keep of RANDOM_MASK_KEEP, the bench's own mask (random_tile_mask, same seed, & the tiles a causal
mask allows) is summed as the lists kernel sums its totals (64-row entries, aligned and packed
80-row entries: entry_totals), and the rules of src/cuda/bwd_common.cuh are applied
at the constants read from that header: head dim 128 -- the 80-row entries against version 10's
64-row ones (bl_bwd_rows80_chosen, bl_bwd_packed_chosen) and version 10's DIRECT form
(bl_bwd_dq_direct_chosen); head dim 64 -- the persistent kernel's 16-bit dq form
(bl_bwd_ws64p_dq16_chosen).
Printed per row: the kept share, the mean entries a 64-row tile, the 80-row / 64-row cost ratio
(< 1 picks 80 rows) and the pick. "(inside the DIRECT gate)" marks an 80-row pick whose entries
would pass the DIRECT form's gate: the per-entry rule decides there, not the fixed bytes the DIRECT
form saves (the hundred-and-thirty-fifth session ran DIRECT on both such rows and lost 120-160 us:
bench/results/bwd-s135-direct-first-pick.txt). CPU only, ~2 s for the bench's shapes.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_attn import RANDOM_MASK_KEEP, SHAPES_FULL, random_tile_mask  # noqa: E402
from back_lite import functional as blf  # noqa: E402

TM, TN = 64, 128  # BL_BWD_TM, BL_TILE_N: the row and key tiles the totals count
TM80 = 80  # BL_BWD_TM_DENSE: the 80-row kernel's query rows per entry
# The constants the rules use, as bwd_common.cuh names them.
RULE_CONSTANTS = ("BL_R80_ENTRY_COST", "BL_R64_ENTRY_COST", "BL_PACKED_ENTRY_COST",
                  "BL_PACKED_ENTRY_COST_KEYS_FULL", "BL_PACKED_ENTRY_COST_CAUSAL",
                  "BL_PACKED_VS_ALIGNED_COST", "BL_PACKED_VS_ALIGNED_COST_CAUSAL",
                  "BL_DQ_DIRECT_MAX_ENTRIES_X2", "BL_WS64P_DQ16_MAX_ENTRIES")


def header_constants(path: str = os.path.join(ROOT, "src", "cuda", "bwd_common.cuh")) -> dict:
    """{name: value} of the rule constants, as the header defines them (enum members and
    constexpr integers); raises if one is missing, so a renamed constant stops the tool."""
    text = open(path).read()
    found = {name: int(value) for name, value in re.findall(r"\b(BL_\w+) = (\d+)", text)}
    missing = [name for name in RULE_CONSTANTS if name not in found]
    if missing:
        raise KeyError(f"not in {path}: {', '.join(missing)}")
    return {name: found[name] for name in RULE_CONSTANTS}


def entry_totals(m: torch.Tensor, s: int) -> tuple:
    """(64-row entries, aligned 80-row entries, packed entries) of a mask m (H, Tm, Tn) over
    s query rows, as the lists kernel counts them."""
    tm = m.shape[1]
    t64 = int(m.sum())
    t80 = 0
    for a in range((s + TM80 - 1) // TM80):  # the 64-row tiles an 80-row tile overlaps
        lo, hi = (TM80 * a) // TM, min((TM80 * a + TM80 - 1) // TM, tm - 1)
        t80 += int(m[:, lo:hi + 1].any(1).sum())
    c = m.sum(1)  # (H, Tn): kept 64-row tiles per column
    # bl_bwd_packed_count: a column's kept tiles end to end, ceil(64 c / 80); one if empty
    packed = int(torch.where(c == 0, 1, (4 * c + 4) // 5).sum())
    return t64, t80, packed


def allowed_tiles(s: int, causal: bool) -> torch.Tensor:
    """(Tm, Tn) bool: the (64-row tile, key tile) pairs with an allowed key, Sq = Sk = s -- the
    package's computable_tiles, which the bench ANDs into its masks (the lists kernel's
    bl_bwd_allowed_row_tiles: the tile's last row sees the key tile's first key)."""
    return blf.computable_tiles(s, s, causal, "cpu")


def pick(totals: tuple, row_tiles: int, head_dim: int, causal: bool, keys_full: bool,
         c: dict) -> dict:
    """The device's choice from totals = (64-row entries, aligned 80-row entries, pairs the mask
    drops, packed 80-row entries) over row_tiles 64-row tiles (B x H x Tm)."""
    t64, t80, dropped, packed = totals
    mean = t64 / row_tiles
    if head_dim == 64:
        dq16 = t64 <= c["BL_WS64P_DQ16_MAX_ENTRIES"] * row_tiles
        return {"mean": mean, "ratio": None, "rows80": False, "full": False, "direct_gate": dq16,
                "pick": "persistent, 16-bit dq" if dq16 else "persistent"}
    vs_aligned = c["BL_PACKED_VS_ALIGNED_COST_CAUSAL" if causal else "BL_PACKED_VS_ALIGNED_COST"]
    use_packed = packed != 0 and packed * vs_aligned < t80 * c["BL_R80_ENTRY_COST"]
    packed_cost = c["BL_PACKED_ENTRY_COST_CAUSAL" if causal else
                    "BL_PACKED_ENTRY_COST_KEYS_FULL" if keys_full else "BL_PACKED_ENTRY_COST"]
    cost80 = packed * packed_cost if use_packed else t80 * c["BL_R80_ENTRY_COST"]
    ratio = cost80 / max(1, t64 * c["BL_R64_ENTRY_COST"])
    full = dropped == 0
    rows80 = full or cost80 < t64 * c["BL_R64_ENTRY_COST"]
    direct_gate = 2 * t64 <= c["BL_DQ_DIRECT_MAX_ENTRIES_X2"] * row_tiles
    if full:
        name = "80 rows, the dense walk (every tile kept)"
    elif rows80:
        name = "80 rows packed" if use_packed else "80 rows aligned"
    else:
        name = "version 10 DIRECT" if direct_gate else "version 10"
    return {"mean": mean, "ratio": ratio, "rows80": rows80, "full": full,
            "direct_gate": direct_gate, "pick": name}


def bench_rows(shape: tuple, causal: bool, c: dict):
    """(keep, kept share, pick()) for each random-mask row of an MHA shape (B, S, H, D)."""
    b, s, h, d = shape
    allowed = allowed_tiles(s, causal)
    tm, tn = allowed.shape
    for keep in RANDOM_MASK_KEEP:
        m = random_tile_mask(b, h, tm, tn, keep, "cpu") & allowed  # (B, H, Tm, Tn)
        t64, t80, packed = entry_totals(m.reshape(b * h, tm, tn), s)
        dropped = b * h * int(allowed.sum()) - t64
        yield keep, t64 / (b * h * int(allowed.sum())), pick(
            (t64, t80, dropped, packed), b * h * tm, d, causal, s % TN == 0, c)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", help="B,S,H,D (MHA; default: the bench's)")
    args = ap.parse_args()
    shapes = ([tuple(int(x) for x in sh.split(",")) for sh in args.shape] if args.shape
              else [sh for sh in SHAPES_FULL if len(sh) == 4])
    c = header_constants()
    for shape in shapes:
        for causal in (False, True):
            for keep, kept, p in bench_rows(shape, causal, c):
                ratio = f"{p['ratio']:.3f}" if p["ratio"] is not None else "-"
                inside = p["rows80"] and not p["full"] and p["direct_gate"]
                note = " (inside the DIRECT gate)" if inside else ""
                print(f"{shape} causal={int(causal)} keep {keep:<5} kept {kept:.4f} "
                      f"entries / row tile {p['mean']:6.1f} 80/64 cost {ratio} "
                      f"-> {p['pick']}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
