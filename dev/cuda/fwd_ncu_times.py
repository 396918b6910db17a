"""fwd_ncu_times.py -- the forward's kernel times per variant from `fwd_sed_variants.sh ncu` logs.

Each "== NAME round R" header is followed by ncu's CSV rows (gpu__time_duration.sum of the TMA
forward kernel, two launches per `attn_fwd one` process, plain then statistics per shape). Prints
per variant and shape the mean plain and statistics kernel times (us) over launches and rounds,
their ratio, and each time's ratio to the variant named "base".

    python3 dev/cuda/fwd_ncu_times.py LOG [LOG ...] [--shapes "1x16384x16x64 causal;4x4096x16x64"]

The rows are labelled with the shapes the log's "# shapes: ..." line names (written by
`fwd_sed_variants.sh ncu`, which can run a subset: NCU_SHAPES), else in the order it ran them
before it wrote that line (SHAPES); --shapes overrides both. A label whose head dim or mask
disagrees with the kernel's template arguments stops the tool (the thirty-eighth session
relabelled such a table by hand).
"""
import csv
import re
import sys
from collections import defaultdict

HEAD = re.compile(r"== (\S+) round \d+")
SHAPES_LINE = "# shapes: "
# Template arguments of attn_fwd_sm90_ws_kernel: D, BF16, CAUSAL, STATS, PARK_SMEM, NWG (builds of
# dev/cuda/wip/fwd-park-bulk-ring.patch have an enum in place of PARK_SMEM).
KERNEL = re.compile(r"attn_fwd_sm90_ws_kernel<(\d+), [^,]+, ([^,]+), ([^,]+), [^,]+, [^,>]+>")


def flag(arg):
    """A bool template argument as ncu prints it ("1", "true" or "(bool)1")."""
    return 1 if arg.strip().endswith(("1", "true")) else 0

SHAPES = ["1x16384x16x128", "1x16384x16x128 causal", "1x32768x24x128", "1x32768x24x128 causal",
          "1x16384x16x64", "1x16384x16x64 causal", "4x4096x16x64", "4x4096x16x64 causal"]


def parse(paths, kernels=None):
    """(variant, shape index, stats) -> [us]; launches grouped by profiled process, in order.
    kernels, if given, gets (variant, shape index) -> (head dim, causal) of the kernel timed."""
    times = defaultdict(list)
    kernels = {} if kernels is None else kernels
    for path in paths:
        name, procs = None, []  # [(pid, stats, [us], (head dim, causal))] of the variant block
        lines = open(path, errors="replace").read().splitlines()
        for line in lines + ["== end round 0"]:
            m = HEAD.match(line)
            if m:
                for i, (_, stats, us, dc) in enumerate(procs):
                    times[(name, i // 2, stats)].extend(us)
                    kernels[(name, i // 2)] = dc
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
                procs.append((row[1], stats, [us], (int(k.group(1)), flag(k.group(2)))))
    return times


def check_labels(shapes, kernels):
    """Stops with the label and the kernel's arguments where a label's head dim or mask is not
    the kernel's ("BxSxHxD" or "BxSxHxD causal")."""
    for (v, i), (d, causal) in sorted(kernels.items()):
        if i >= len(shapes):
            sys.exit(f"fwd_ncu_times: {v} timed shape {i + 1} but only {len(shapes)} labels were given")
        label = shapes[i]
        want_d, want_causal = int(label.split()[0].split("x")[3]), int(label.endswith("causal"))
        if (want_d, want_causal) != (d, causal):
            sys.exit(f"fwd_ncu_times: label {label!r} (shape {i + 1}) but {v}'s kernel has head dim "
                     f"{d}, causal={causal}: pass --shapes in the order the log ran them")


def logged_shapes(paths):
    """The labels of the first "# shapes: ..." line in the logs, or None."""
    for path in paths:
        for line in open(path, errors="replace"):
            if line.startswith(SHAPES_LINE):
                return [x.strip() for x in line[len(SHAPES_LINE):].split(";")]
    return None


def main(argv):
    paths = list(argv)
    shapes = None
    if "--shapes" in paths:
        k = paths.index("--shapes")
        shapes = [x.strip() for x in paths[k + 1].split(";")]
        del paths[k:k + 2]
    shapes = shapes or logged_shapes(paths) or SHAPES
    kernels = {}
    times = parse(paths, kernels)
    check_labels(shapes, kernels)
    names = list(dict.fromkeys(k[0] for k in times))
    mean = lambda xs: sum(xs) / len(xs)
    print(f"{'variant':10s} {'shape':24s} {'plain us':>10s} {'stats us':>10s} {'stats/plain':>11s}"
          f" {'plain/base':>10s} {'stats/base':>10s}")
    for i, shape in enumerate(shapes):
        for v in names:
            p, s = times.get((v, i, 0)), times.get((v, i, 1))
            if not p or not s:
                continue
            bp, bs = times.get(("base", i, 0)), times.get(("base", i, 1))
            rel = f" {mean(p) / mean(bp):10.3f} {mean(s) / mean(bs):10.3f}" if bp and bs else ""
            print(f"{v:10s} {shape:24s} {mean(p):10.1f} {mean(s):10.1f} {mean(s) / mean(p):11.3f}{rel}")


if __name__ == "__main__":
    main(sys.argv[1:])
