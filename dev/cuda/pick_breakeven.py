#!/usr/bin/env python3
"""pick_breakeven.py -- what a packed 80-row entry costs against version 10's 64-row one, from
two timings of the same masked call (one build forced onto each kind of entry).

The masked head-dim-128 backward picks its kernel on the device from entry totals
(src/cuda/bwd_common.cuh, bl_bwd_rows80_cheaper): packed 80-row entries where
  packed_entries * BL_PACKED_ENTRY_COST[_CAUSAL] < tiles_kept * BL_R64_ENTRY_COST (64).
For the dev checker's random tile masks (dev/cuda/attn_bwd.cu mask_kernel: each 64 x 128 tile
kept with probability `keep`) this script takes the expected totals -- per key-tile column the
kept count c64 ~ Binomial(allowed row tiles, keep), packed entries bl_bwd_packed_count(c64) =
ceil(4 c64 / 5) (1 where c64 = 0) -- and turns two measured call times (main kernel plus dq
conversion, the kernels that differ) into the cost constant at which the rule would tie:
  64 * (t_packed / packed_entries) / (t_v10 / tiles_kept).
Usage (times in us, e.g. ncu medians from dev/cuda/bwd_compare.sh):
  python3 dev/cuda/pick_breakeven.py --call 16384,16,1,0.1,676.3,698.1 [--call ...]
"""
import argparse
import math


def binom_pmf(n: int, k: int, p: float) -> float:
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    if p >= 1.0:
        return 1.0 if k == n else 0.0
    log = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) +
           k * math.log(p) + (n - k) * math.log1p(-p))
    return math.exp(log)


def packed_count(c64: int) -> int:
    """bl_bwd_packed_count: the packed 80-row entries of a column keeping c64 64-row tiles."""
    return 1 if c64 == 0 else (4 * c64 + 4) // 5


def expected_totals(seqlen: int, heads: int, causal: bool, keep: float) -> tuple[float, float]:
    """(kept 64-row tiles, packed 80-row entries) expected over the call (Sq = Sk = seqlen,
    no GQA: one column per (head, key tile))."""
    tiles_m, tiles_n = math.ceil(seqlen / 64), math.ceil(seqlen / 128)
    kept = packed = 0.0
    for n in range(tiles_n):
        # bl_bwd_allowed_row_tiles with Sq = Sk: row tiles m >= 2n share a pair with key tile n
        allowed = tiles_m - 2 * n if causal else tiles_m
        for c in range(allowed + 1):
            w = binom_pmf(allowed, c, keep)
            kept += w * c
            packed += w * packed_count(c)
    return heads * kept, heads * packed


def breakeven(seqlen: int, heads: int, causal: bool, keep: float, t_v10: float,
              t_packed: float) -> tuple[float, float, float]:
    kept, packed = expected_totals(seqlen, heads, causal, keep)
    return kept, packed, 64.0 * (t_packed / packed) / (t_v10 / kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--call", action="append", required=True,
                    help="S,H,causal(0/1),keep,t_v10_us,t_packed_us")
    args = ap.parse_args()
    for spec in args.call:
        s, h, c, keep, tv, tp = spec.split(",")
        kept, packed, cost = breakeven(int(s), int(h), c == "1", float(keep), float(tv),
                                       float(tp))
        print(f"S={s} H={h} causal={c} keep={keep}: tiles {kept:.0f}, packed entries "
              f"{packed:.0f} ({packed / kept:.4f}); version 10 {float(tv):.1f} us, packed "
              f"{float(tp):.1f} us -> a packed entry costs {cost:.1f} (version 10's: 64)")


if __name__ == "__main__":
    main()
