#!/usr/bin/env bash
# ncu_r80_times.sh -- the 80-row kernel's duration under ncu (locked clocks) on a dense call and
# on a call whose mask keeps every tile (or KEEP), for each dev-checker build named: the masked
# kernel against the dense one without the power drift of event timings. On the device, from the
# repository root (carry ["build/sedvar"]):
#   bash dev/cuda/ncu_r80_times.sh "base old" [KEEP] [causal]
# Prints, per build, the mean and count of each kernel's launches (onemask: 8k x 16 x 128).
set -u
keep=${2:-1.0}
for n in $1; do
    log=/tmp/ncu_r80_$n.txt
    timeout 300 ncu --metrics gpu__time_duration.sum -k regex:bwd_ws128 -c 27 \
        "build/sedvar/$n/attn_bwd" onemask "$keep" ${3:-} > "$log" 2>&1
    echo "== $n: onemask $keep ${3:-} (rc $?)"
    python3 "$(dirname "$0")/ncu_kernel_times.py" "$log" | awk '{
        t = $NF == "us" ? $(NF-1) : $NF; name = $1; for (i = 2; i < NF - 1; ++i) name = name " " $i
        s[name] += t; c[name]++ } END { for (k in s) printf "  %-50s %9.1f us  x%d\n", k, s[k] / c[k], c[k] }'
done
