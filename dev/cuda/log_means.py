"""Means per build and shape of a comparison log, so that A/B runs read as one table.

Two log formats, told apart by their lines:
  - dev/cuda/bwd_compare.sh (backward checker): "== NAME: MODE (round R)" headers, then lines
    "... B1 S16384 H16 D128 full   dense        :    9.483 ms ..."; prints each build's mean ms
    and its ratio to the build named "base" (if there is one).
  - dev/cuda/fwd_sed_variants.sh run (forward checker's benchstats): "== NAME round R" headers,
    then "bench tma  B=1 S=16384 H=16 D=64 causal=0 | no-stats 2.4 ms ... | stats 2.3 ms ...";
    prints each build's mean ms without / with statistics and their ratio.

    python3 dev/cuda/log_means.py LOG
"""
import re
import sys
from collections import defaultdict

BWD_HEAD = re.compile(r"== (\S+): .* \(round \d+\)")
BWD_LINE = re.compile(r"(B\d+ S\d+ H\d+ D\d+ \w+ +(?:dense|mask keep [\d.]+)) *: +([\d.]+) ms")
FWD_HEAD = re.compile(r"== (\S+) round \d+")
FWD_LINE = re.compile(r"B=(\d+) S=(\d+) H=(\d+) D=(\d+) causal=(\d) \| no-stats ([\d.]+) ms .*"
                      r"\| stats ([\d.]+) ms")


def mean(xs):
    return sum(xs) / len(xs)


def main(path):
    bwd = defaultdict(list)  # (build, shape) -> [ms]
    fwd = defaultdict(list)  # (build, shape) -> [(no-stats ms, stats ms)]
    builds, shapes = [], []
    build = None
    for line in open(path):
        m = BWD_HEAD.match(line) or FWD_HEAD.match(line)
        if m:
            build = m.group(1)
            if build not in builds:
                builds.append(build)
            continue
        if build is None:
            continue
        m = BWD_LINE.search(line)
        if m:
            key = m.group(1)
            bwd[(build, key)].append(float(m.group(2)))
        else:
            m = FWD_LINE.search(line)
            if not m:
                continue
            key = "B%s S%s H%s D%s causal=%s" % m.groups()[:5]
            fwd[(build, key)].append((float(m.group(6)), float(m.group(7))))
        if key not in shapes:
            shapes.append(key)
    for key in shapes:
        cells = []
        if any((b, key) in bwd for b in builds):
            base = mean(bwd[("base", key)]) if ("base", key) in bwd else None
            for b in builds:
                if (b, key) in bwd:
                    ms = mean(bwd[(b, key)])
                    ratio = " (%.3f)" % (ms / base) if base else ""
                    cells.append("%s %.3f%s x%d" % (b, ms, ratio, len(bwd[(b, key)])))
        else:
            for b in builds:
                if (b, key) in fwd:
                    plain = mean([x[0] for x in fwd[(b, key)]])
                    stats = mean([x[1] for x in fwd[(b, key)]])
                    cells.append("%s %.3f / %.3f (%.3f)" % (b, plain, stats, stats / plain))
        print("%-42s %s" % (key, "  ".join(cells)))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
