"""ncu_ab_summary.py -- per-kernel GPU times of dev-checker builds timed against each other.

Reads the logs that dev/cuda/bwd_ncu_ab.sh writes (one `ncu --metrics gpu__time_duration.sum`
text log per build, mode and round, named ncu__BUILD__MODE__ROUND.txt, the mode with spaces as
'_') and prints, per mode and kernel, each build's median over all its launches and rounds, and
the other builds' change against the first build named (against the first that ran the kernel
where the first did not).

Usage: python3 ncu_ab_summary.py [--split N] BUILD1,BUILD2,... LOG...
  --split N   the mode runs N shapes one after another (e.g. `sparse64` runs 3): its launches of
              each kernel are cut into N equal consecutive parts, reported as shapes 0..N-1.
Kernels shorter than 5 us (the kernels that return unpicked) are left out.
"""
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_kernel_times import launches  # noqa: E402

MIN_US = 5.0


def main(argv):
    split = 1
    if argv[:1] == ["--split"]:
        split, argv = int(argv[1]), argv[2:]
    if len(argv) < 2:
        sys.exit(__doc__)
    builds = argv[0].split(",")
    times = collections.defaultdict(list)  # (mode, shape, kernel, build) -> [us]
    modes = []
    for path in argv[1:]:
        parts = os.path.basename(path)[:-4].split("__")
        if len(parts) != 4 or parts[0] != "ncu":
            sys.exit(f"{path}: not an ncu__BUILD__MODE__ROUND.txt log")
        _, build, mode, _round = parts
        if mode not in modes:
            modes.append(mode)
        per_kernel = collections.defaultdict(list)
        for name, us in launches(path):
            if us >= MIN_US:
                per_kernel[name].append(us)
        for name, seq in per_kernel.items():
            part = max(len(seq) // split, 1)
            for shape in range(split):
                chunk = seq[shape * part:(shape + 1) * part] if split > 1 else seq
                times[(mode, shape, name, build)].extend(chunk)
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


if __name__ == "__main__":
    main(sys.argv[1:])
