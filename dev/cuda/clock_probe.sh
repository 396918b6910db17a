#!/usr/bin/env bash
# clock_probe.sh -- the SM clock and board power while one library runs dense backward calls back
# to back: whether a kernel that keeps every SM busier (the persistent head-dim-64 form) runs at a
# lower clock than another (power or thermal limits), which clock64 stamps alone cannot tell.
# Usage on the device (repository root; libraries built here, e.g. by dev/cuda/variant_libs.sh):
#   OUT=$OUT bash dev/cuda/clock_probe.sh "1,16384,16,64" build/pw/percol.so build/final/libbacklite.so
# For each library in turn (twice, the order flipped, so that warm-up falls on both): nvidia-smi
# samples every 20 ms while CALLS (default 300) backward calls of shape B,S,H,D[,causal] run;
# prints per library the median SM clock (MHz), power (W) and the clock-event reasons seen over
# the samples taken while the calls ran (the first 0.2 s dropped: the clock settles), and the
# calls' mean time from CUDA events. Raw samples: $OUT/clock-NAME-ROUND.csv.
set -euo pipefail
shape=$1; shift
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
libs=("$@")
for round in 1 2; do
    order=("${libs[@]}")
    if [ "$round" = 2 ]; then order=(); for ((i=${#libs[@]}-1; i>=0; i--)); do order+=("${libs[$i]}"); done; fi
    for lib in "${order[@]}"; do
        name=$(basename "$lib" .so)
        csv=$OUT/clock-$name-$round.csv
        BACK_LITE_LIBRARY=$PWD/$lib python3 - "$shape" "${CALLS:-300}" "$csv" "$name" <<'PY'
import statistics, subprocess, sys, time
import torch
from back_lite import functional as blf
shape, calls, csv, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
parts = shape.split(",")
b, s, h, d = (int(x) for x in parts[:4])
causal = len(parts) > 4 and parts[4] == "causal"
torch.manual_seed(0)
q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
out, lse, _ = blf.forward(q, k, v, causal=causal)
for _ in range(5):
    blf.backward(do, q, k, v, out, lse, causal=causal)
torch.cuda.synchronize()
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active",
                        "--format=csv,noheader,nounits", "-lms", "20"], stdout=open(csv, "w"))
time.sleep(0.3)
t_start = time.time()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record()
for _ in range(calls):
    blf.backward(do, q, k, v, out, lse, causal=causal)
e1.record()
torch.cuda.synchronize()
t_end = time.time()
smi.terminate(); smi.wait()
rows = []
for line in open(csv):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 4:
        continue
    try:
        ts = time.mktime(time.strptime(f[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + f[0].split(".")[1])
        rows.append((ts, float(f[1]), float(f[2]), f[3]))
    except ValueError:
        continue
busy = [r for r in rows if t_start + 0.2 <= r[0] <= t_end]
if not busy:
    print(f"{name}: no samples while the calls ran ({len(rows)} in all)")
else:
    reasons = sorted({r[3] for r in busy})
    print(f"{name} [{shape}]: {e0.elapsed_time(e1) / calls * 1000:.1f} us a call; {len(busy)} samples: "
          f"SM clock median {statistics.median(r[1] for r in busy):.0f} MHz (min {min(r[1] for r in busy):.0f}), "
          f"power median {statistics.median(r[2] for r in busy):.0f} W; reasons {reasons}")
PY
    done
done
