"""ncu_ab_summary.py -- per-kernel GPU times of dev-checker builds timed against each other.

Reads the logs that dev/cuda/bwd_ncu_ab.sh writes (one `ncu --metrics gpu__time_duration.sum`
text log per build, mode and round, named ncu__BUILD__MODE__ROUND.txt, the mode with spaces as
'_') and prints, per mode and kernel, each build's median over all its launches and rounds, and
the other builds' change against the first build named (against the first that ran the kernel
where the first did not).

Usage: python3 ncu_ab_summary.py [--split N] BUILD1,BUILD2,... LOG...
  --split N   the mode runs N shapes one after another (e.g. `sparse64` runs 3), reported as
              shapes 0..N-1: where the log holds whole backward calls (each starts with the lists
              kernel, CALL_START) its calls go to a new shape where the lists kernel's grid
              changes (the dev checker runs fewer calls of a larger shape), or, where that does
              not give N runs (shapes of one size), into N equal consecutive parts -- so that a
              kernel one build runs for one shape only is not mixed into another shape's; else
              (a regex that profiles some kernels only) each kernel's launches are cut into N
              equal consecutive parts.
Kernels shorter than 5 us (the kernels that return unpicked) are left out. Where the logs hold
whole calls, each shape also gets the sum of its kernels' medians per build ("call").
"""
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_kernel_times import launch_records  # noqa: E402

MIN_US = 5.0
CALL_START = "bl_bwd_list_kernel"  # the first kernel of every head-dim-128 backward call


def shape_parts(records, split):
    """[(shape, kernel, us)] of one log's launches `records` [(kernel, grid, us)], cut into
    `split` shapes (see the usage); and whether by whole calls."""
    starts = [i for i, (name, _grid, _us) in enumerate(records) if name == CALL_START]
    if split == 1:
        return [(0, name, us) for name, _grid, us in records], bool(starts)
    if starts:
        calls = [records[a:b] for a, b in zip(starts, starts[1:] + [len(records)])]
        shape_of, shape = [], 0
        for i, call in enumerate(calls):
            shape += i > 0 and call[0][1] != calls[i - 1][0][1]
            shape_of.append(shape)
        if shape + 1 != split:
            part = max(len(calls) // split, 1)
            shape_of = [min(i // part, split - 1) for i in range(len(calls))]
        return [(shape_of[i], name, us)
                for i, call in enumerate(calls) for name, _grid, us in call], True
    per_kernel = collections.defaultdict(list)
    for name, _grid, us in records:
        per_kernel[name].append(us)
    out = []
    for name, runs in per_kernel.items():
        part = max(len(runs) // split, 1)
        out += [(min(i // part, split - 1), name, us) for i, us in enumerate(runs)]
    return out, False


def main(argv):
    split = 1
    if argv[:1] == ["--split"]:
        split, argv = int(argv[1]), argv[2:]
    if len(argv) < 2:
        sys.exit(__doc__)
    builds = argv[0].split(",")
    times = collections.defaultdict(list)  # (mode, shape, kernel, build) -> [us]
    modes, by_calls = [], set()
    for path in argv[1:]:
        parts = os.path.basename(path)[:-4].split("__")
        if len(parts) != 4 or parts[0] != "ncu":
            sys.exit(f"{path}: not an ncu__BUILD__MODE__ROUND.txt log")
        _, build, mode, _round = parts
        if mode not in modes:
            modes.append(mode)
        launch_shapes, whole_calls = shape_parts(launch_records(path), split)
        if whole_calls:
            by_calls.add(mode)
        for shape, name, us in launch_shapes:
            if us >= MIN_US:
                times[(mode, shape, name, build)].append(us)
    for mode in modes:
        print(f"== {mode.replace('_', ' ')}")
        keys = sorted({(s, k) for (m, s, k, _b) in times if m == mode})
        for shape, kernel in keys:
            row = []
            base = None
            for b in builds:
                v = times.get((mode, shape, kernel, b))
                if not v:
                    row.append(f"{b} -")
                    continue
                med = statistics.median(v)
                if base is None:
                    base = med
                    row.append(f"{b} {med:9.1f} (n={len(v)})")
                else:
                    row.append(f"{b} {med:9.1f} ({100.0 * (med / base - 1.0):+.1f} %)")
            label = f"shape {shape} " if split > 1 else ""
            print(f"  {label}{kernel:48s} " + "  ".join(row))
        for shape in sorted({s for (s, _k) in keys}) if mode in by_calls else []:
            sums = [sum(statistics.median(v) for (m, s, _k, b), v in times.items()
                        if m == mode and s == shape and b == build) for build in builds]
            row = [f"{b} {t:9.1f}" + (f" ({100.0 * (t / sums[0] - 1.0):+.1f} %)" if i else "")
                   for i, (b, t) in enumerate(zip(builds, sums))]
            label = f"shape {shape} " if split > 1 else ""
            print(f"  {label}{'call (sum of the medians)':48s} " + "  ".join(row))


if __name__ == "__main__":
    main(sys.argv[1:])
