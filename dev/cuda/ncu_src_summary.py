"""Summarise an ncu source page (--page source --print-source sass --csv): warp stall samples
by reason, the SASS lines where warps wait most, and the samples between landmark instructions
(barriers, wgmma waits, mbarrier waits) so that a loop's phases can be read off.

    python3 dev/cuda/ncu_src_summary.py FILE.csv[.gz] [TOP]
"""
import csv
import gzip
import io
import sys
from collections import Counter

# Instructions that split the kernel into phases: CTA barriers, wgmma waits, mbarrier tries.
LANDMARKS = ("BAR.SYNC", "BAR.ARV", "WARPGROUP.DEPBAR", "SYNCS.PHASECHK", "DEPBAR", "UTMAREDG",
             "UBLKRED", "UTMALDG", "UBLKCP")


def rows(path):
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    lines = [l for l in raw if l.startswith('"')]
    reader = csv.reader(io.StringIO("".join(lines)))
    header = None
    for r in reader:
        if r and r[0] == "Address":
            header = r
            continue
        if header and len(r) == len(header):
            yield dict(zip(header, r))


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    data = list(rows(path))
    reasons = [k for k in data[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(int(r["Warp Stall Sampling (All Samples)"]) for r in data)
    by_reason = Counter()
    for r in data:
        for k in reasons:
            by_reason[k] += int(r[k])
    print(f"{path}: {len(data)} SASS lines, {total} samples")
    print("by reason:", ", ".join(f"{k[6:]} {v / total:.1%}" for k, v in by_reason.most_common(10)))
    print(f"\ntop {top} lines (samples, share, top reasons):")
    ranked = sorted(range(len(data)), key=lambda i: -int(data[i]["Warp Stall Sampling (All Samples)"]))
    for i in ranked[:top]:
        r = data[i]
        n = int(r["Warp Stall Sampling (All Samples)"])
        why = sorted(((int(r[k]), k[6:]) for k in reasons), reverse=True)[:3]
        print(f"{i:5d} {n:7d} {n / total:6.1%}  {r['Source'].strip()[:60]:60s} "
              + " ".join(f"{k}:{v}" for v, k in why if v))
    print("\nphases (samples from one landmark to the next; lines executed >= 1000 times):")
    start, acc, execs = 0, 0, 0
    for i, r in enumerate(data):
        acc += int(r["Warp Stall Sampling (All Samples)"])
        src = r["Source"].strip()
        if any(src.startswith(m) or (" " + m) in src for m in LANDMARKS) or i == len(data) - 1:
            if acc and int(r["Instructions Executed"] or 0) >= 1000:
                print(f"  lines {start:5d}-{i:5d} {acc:7d} {acc / total:6.1%}  ends at {src[:50]}")
                start, acc = i + 1, 0


if __name__ == "__main__":
    main()
