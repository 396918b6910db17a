"""Where each call's first kernels start, from lib_timeline_ab.sh's $OUT/timelines.txt.

    python3 dev/cuda/timeline_offsets.py timelines.txt

bwd_call_timeline.py prints per kernel its median duration and its median gap from the previous
kernel's end, and (since the eighty-ninth session) its median start after the call's first
kernel, read per call; kernels launched as programmatic dependents overlap (negative gaps).
Logs without the start column get it by chaining start = previous start + previous duration +
gap (medians, so approximate to ~1 us). Either shows when the preprocess really starts beside
the lists and schedule kernels. Prints the span and the first four kernels (the selection,
where there is one, left out).
"""
import re
import sys


def short(name: str) -> str:
    return name.split("<")[0].split()[-1].replace("bl_bwd::", "").replace("bl_bwd_", "")[:12]


def main(path: str) -> None:
    lib = rnd = shape = flags = keep = ""
    kernels = []
    for line in open(path):
        m = re.match(r"== (\w+) round (\d+): shape (\S+)\s*(.*)", line)
        if m:
            lib, rnd, shape, flags = m.groups()
            continue
        m = re.match(r"== keep (\S+):", line)
        if m:
            keep, kernels = m.group(1), []
            continue
        m = re.match(r"\s+(.+?)\s+([\d.]+) us\s+gap\s+(-?[\d.]+) us(?:\s+start\s+(-?[\d.]+) us)?",
                     line)
        if m:
            name, dur, gap = m.group(1), float(m.group(2)), float(m.group(3))
            if m.group(4) is not None:
                start = float(m.group(4))
            else:
                start = kernels[-1][1] + kernels[-1][2] + gap if kernels else 0.0
            kernels.append((name, start, dur))
            continue
        m = re.match(r"\s+span median ([\d.]+)", line)
        if m:
            first = [k for k in kernels if "select" not in k[0]][:4]
            desc = "  ".join(f"{short(n)} @{s:5.1f} +{d:5.0f}" for n, s, d in first)
            print(f"{lib:4s} r{rnd} {shape:15s} {flags[:8]:8s} {keep:7s} span {m.group(1):>8s} | {desc}")


if __name__ == "__main__":
    main(sys.argv[1])
