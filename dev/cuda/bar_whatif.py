"""What a fixed saving per sparse call would do to the `kept + 2%` bar, on a bench JSON.

    python3 dev/cuda/bar_whatif.py bench/results/bench-2026-12-06-s115-h100.json \\
        --saving 1,16384,16,64=17 --saving 1,16384,16,128=34 --saving 1,32768,24,128=101

Each `--saving SHAPE[:causal|:nc]=US` takes US microseconds off every sparse row of that shape
(the bench's shape list, e.g. 1,16384,16,128; with :causal or :nc only the rows with or without a
causal mask). The dense reference stays as measured unless --dense-too takes the saving off it as
well (a saving that every call gets, dense ones included, also tightens the bar). Rows are judged
as bench_attn.py's bar counts judge them (ratio of medians, the bar shapes only: MHA, S >= 16384).
Prints the rows whose verdict turns, then the counts before and after. A what-if on timings that
were measured in one run: a row within a few microseconds of its bar passes or misses by the run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from bench_attn import is_bar_shape  # noqa: E402

BAR = 0.02  # kept + 2 % of the dense backward


def parse_saving(text: str) -> tuple:
    """'1,16384,16,64:causal=17' -> ((1, 16384, 16, 64), True, 17.0); mask None: both."""
    if "=" not in text:
        raise ValueError(f"--saving {text!r}: expected SHAPE[:causal|:nc]=US")
    key, us = text.rsplit("=", 1)
    causal = None
    if ":" in key:
        key, which = key.split(":", 1)
        if which not in ("causal", "nc"):
            raise ValueError(f"--saving {text!r}: the mask is :causal or :nc, got {which!r}")
        causal = which == "causal"
    shape = tuple(int(x) for x in key.split(","))
    return shape, causal, float(us)


def saving_for(result: dict, savings: list) -> float:
    """Microseconds the savings give this result (a shape + causal flag); 0 when none matches."""
    total = 0.0
    for shape, causal, us in savings:
        if tuple(result["shape"]) == shape and (causal is None or causal == result["causal"]):
            total += us
    return total


def passes(row: dict, saved_us: float, dense_too: bool) -> bool:
    """Whether the row meets kept + 2 % once saved_us is taken off its time (and off the dense
    reference too with dense_too)."""
    t = row["bwd_ms"] - saved_us / 1000.0
    ref = row["dense_ms"] - (saved_us / 1000.0 if dense_too else 0.0)
    return t / ref <= row["kept"] + BAR


def whatif(results: list, savings: list, dense_too: bool = False) -> dict:
    """{"before": n, "after": n, "of": rows, "turned": [(shape, causal, source, kept, before,
    after)]} over the bar shapes' sparse rows."""
    out = {"before": 0, "after": 0, "of": 0, "turned": []}
    for r in results:
        if not is_bar_shape(r["shape"]):
            continue
        us = saving_for(r, savings)
        for row in r["sparse"]:
            before = passes(row, 0.0, False)
            after = passes(row, us, dense_too)
            out["of"] += 1
            out["before"] += before
            out["after"] += after
            if before != after:
                out["turned"].append((tuple(r["shape"]), r["causal"], row["source"], row["kept"],
                                      before, after))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json")
    ap.add_argument("--saving", action="append", default=[], type=parse_saving,
                    help="SHAPE[:causal|:nc]=US, repeatable")
    ap.add_argument("--dense-too", action="store_true",
                    help="take the saving off the dense reference as well")
    args = ap.parse_args(argv)
    with open(args.bench_json) as f:
        results = json.load(f)["results"]
    w = whatif(results, args.saving, args.dense_too)
    for shape, causal, source, kept, before, after in w["turned"]:
        verdict = "passes" if after else "misses"
        print(f"{shape} causal={causal} {source} kept {kept:.3f}: now {verdict}")
    print(f"kept + 2%: {w['before']} -> {w['after']} of {w['of']} rows (ratio of medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
