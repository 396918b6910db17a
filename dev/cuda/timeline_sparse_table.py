"""timeline_sparse_table.py -- version 10's entry and column stamps (`attn_bwd timelinesparse`) as tables.

    EXTRA_NVCC="-DBL_BWD_TIMELINE -DBL_BWD_TL_GLOBAL" bash dev/cuda/bwd_build_tree.sh tls .
    (device) for k in 0.03 0.1; do echo "=== keep $k"; build/sedvar/tls/attn_bwd timelinesparse $k; done > LOG
    python3 dev/cuda/timeline_sparse_table.py LOG [STAGINGS]

Per entry of CTA 0's walk (ring position gi, its column k and place in it): the period to the next
entry's loop top and the consumer warpgroup 0's phases between its stamps (bwd_ws128_sm90.cuh,
BL_TLE points 0-11), then the reducer's DQFULL wait, reduce-add issue and staging-read wait for
the same entry -- at staging position gj = gi + STAGINGS k, since each column before it staged
STAGINGS of its dK / dV in the same ring: 2 (dK and dV) in the shipped kernel, 1 with
dev/cuda/wip/bwd-v10-dv-in-ds-v2.patch (dK; dV in the dS buffers). Then the column stamps as
`attn_bwd` printed them. All in SM clocks.
A block per "=== keep K" line (a log without one is read as a single block).
"""
import re
import sys

# consumer phases printed: (from point, to point)
PHASES = [(0, 1), (1, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11)]
STAGINGS_PER_COLUMN = 2  # staging ring positions a column's dK / dV take after its entries


def parse(block):
    stamps = {}
    for m in re.finditer(r"^\s+(\d+) (\d):((?:\s+-?\d+)+)$", block, re.M):
        stamps[(int(m.group(1)), int(m.group(2)))] = [int(x) for x in m.group(3).split()]
    cols = []
    for m in re.finditer(r"^\s+(\d+)\s+(-?\d+) \|((?:\s+-?\d+)+) \|((?:\s+-?\d+)+) \|", block, re.M):
        cols.append((int(m.group(1)), int(m.group(2)), [int(x) for x in m.group(3).split()]))
    return stamps, cols


def table(keep, stamps, cols, stagings):
    print(f"== keep {keep}: {len(cols)} columns of CTA 0, entry counts {[c[1] for c in cols]}")
    where, g = {}, 0  # ring position -> (column, place, count)
    for k, count, _ in cols:
        for e in range(max(count, 0)):
            where[g + e] = (k, e, count)
        g += max(count, 0)
    n = max((i for i, _ in stamps), default=-1) + 1
    print(" gi col e/cnt | period | " + " ".join(f"{a}>{b}".rjust(5) for a, b in PHASES) +
          " | reducer: DQFULL-wait issue read-wait")
    for i in range(n - 1):
        a, b = stamps.get((i, 0)), stamps.get((i + 1, 0))
        if not a or not b or not a[0] or not b[0] or i not in where:
            continue
        k, e, count = where[i]
        r = stamps.get((i + stagings * k, 2), [0, 0, 0, 0])
        ph = [a[q] - a[p] if a[p] and a[q] else 0 for p, q in PHASES]
        print(f" {i:2d} {k:3d} {e:2d}/{count:<2d} | {b[0] - a[0]:6d} | " + " ".join(f"{x:5d}" for x in ph) +
              f" | {r[1] - r[0]:6d} {r[2] - r[1]:6d} {r[3] - r[2]:6d}")
    print(" columns: k count | taken K/V-full S^T(0) loop-end dK/dV-staged next")
    for k, count, v in cols:
        print(f"  {k:2d} {count:3d} | " + " ".join(f"{x:8d}" for x in v))


def main():
    text = open(sys.argv[1]).read()
    stagings = int(sys.argv[2]) if len(sys.argv) > 2 else STAGINGS_PER_COLUMN
    blocks = text.split("=== keep ")[1:] or ["? (one run)\n" + text]
    for block in blocks:
        table(block.split("\n")[0].strip(), *parse(block), stagings)


if __name__ == "__main__":
    main()
