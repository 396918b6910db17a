"""Spans of lib_timeline_ab.sh's summary side by side: one line per (shape, keep), one column
per build (mean over its rounds, us), the fastest build last.

    python3 dev/cuda/timeline_span_table.py OUT/timelines-summary.txt [--builds new,f1,f2,f3]

A summary line reads `NAME rR: SHAPE [causal] keep KEEP:  k1 k2 ... | span X` (lib_timeline_ab.sh's
awk); lines without a span (a call cut off) are skipped.
"""
from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict

LINE = re.compile(r"^(\S+)\s+r(\d+):?\s+(\S+)( causal)?\s+keep\s+([^\s:]+):?.*\|\s*span\s+([0-9.]+)")


def read_spans(path: str) -> dict:
    """{(shape, keep): {build: [span us per round]}} in the file's order."""
    spans: dict = defaultdict(lambda: defaultdict(list))
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                build, _, shape, causal, keep, span = m.groups()
                spans[(shape + (" causal" if causal else ""), keep)][build].append(float(span))
    return spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary")
    ap.add_argument("--builds", default="", help="column order (default: as first seen)")
    args = ap.parse_args()
    spans = read_spans(args.summary)
    builds = [b for b in args.builds.split(",") if b]
    for per in spans.values():
        builds += [b for b in per if b not in builds]
    print(f"{'shape':<28} {'keep':<9}" + "".join(f"{b:>9}" for b in builds) + "   best")
    for (shape, keep), per in spans.items():
        means = {b: statistics.mean(v) for b, v in per.items()}
        cells = "".join(f"{means[b]:9.1f}" if b in means else f"{'-':>9}" for b in builds)
        print(f"{shape:<28} {keep:<9}{cells}   {min(means, key=means.get)}")


if __name__ == "__main__":
    main()
