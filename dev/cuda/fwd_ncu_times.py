"""fwd_ncu_times.py -- the forward's kernel times per variant from `fwd_sed_variants.sh ncu` logs.

Each "== NAME round R" header is followed by ncu's CSV rows (gpu__time_duration.sum of the TMA
forward kernel, two launches per `attn_fwd one` process, plain then statistics per shape). Prints
per variant and shape the mean plain and statistics kernel times (us) over launches and rounds,
their ratio, and each time's ratio to the variant named "base".

    python3 dev/cuda/fwd_ncu_times.py LOG [LOG ...]
"""
import csv
import re
import sys
from collections import defaultdict

HEAD = re.compile(r"== (\S+) round \d+")
# Template arguments of attn_fwd_sm90_ws_kernel: D, BF16, CAUSAL, STATS, PARK_SMEM, NWG (builds of
# dev/cuda/wip/fwd-park-bulk-ring.patch have an enum in place of PARK_SMEM).
KERNEL = re.compile(r"attn_fwd_sm90_ws_kernel<(\d+), [^,]+, ([^,]+), ([^,]+), [^,]+, [^,>]+>")


def flag(arg):
    """A bool template argument as ncu prints it ("1", "true" or "(bool)1")."""
    return 1 if arg.strip().endswith(("1", "true")) else 0

SHAPES = ["1x16384x16x128", "1x16384x16x128 causal", "1x32768x24x128", "1x32768x24x128 causal",
          "1x16384x16x64", "1x16384x16x64 causal", "4x4096x16x64", "4x4096x16x64 causal"]


def parse(paths):
    """(variant, shape index, stats) -> [us]; launches grouped by profiled process, in order."""
    times = defaultdict(list)
    for path in paths:
        name, procs = None, []  # procs: [(pid, stats, [us])] of the current variant block
        lines = open(path, errors="replace").read().splitlines()
        for line in lines + ["== end round 0"]:
            m = HEAD.match(line)
            if m:
                for i, (_, stats, us) in enumerate(procs):
                    times[(name, i // 2, stats)].extend(us)
                name, procs = m.group(1), []
                continue
            if not line.startswith('"') or "gpu__time_duration.sum" not in line:
                continue
            row = next(csv.reader([line]))
            k = KERNEL.search(row[4])
            if not k:
                continue
            stats, us = flag(k.group(3)), float(row[-1].replace(",", "")) / 1e3
            if procs and procs[-1][0] == row[1]:
                procs[-1][2].append(us)
            else:
                procs.append((row[1], stats, [us]))
    return times


def main(paths):
    times = parse(paths)
    names = list(dict.fromkeys(k[0] for k in times))
    mean = lambda xs: sum(xs) / len(xs)
    print(f"{'variant':10s} {'shape':24s} {'plain us':>10s} {'stats us':>10s} {'stats/plain':>11s}"
          f" {'plain/base':>10s} {'stats/base':>10s}")
    for i, shape in enumerate(SHAPES):
        for v in names:
            p, s = times.get((v, i, 0)), times.get((v, i, 1))
            if not p or not s:
                continue
            bp, bs = times.get(("base", i, 0)), times.get(("base", i, 1))
            rel = f" {mean(p) / mean(bp):10.3f} {mean(s) / mean(bs):10.3f}" if bp and bs else ""
            print(f"{v:10s} {shape:24s} {mean(p):10.1f} {mean(s):10.1f} {mean(s) / mean(p):11.3f}{rel}")


if __name__ == "__main__":
    main(sys.argv[1:])
