#!/bin/bash
# fwd_ab.sh -- A/B of the sm_90a forward in one device call: the checker (dev/cuda/attn_fwd.cu)
# built twice, "new" = src/cuda/attn_fwd_sm90.cu of the working tree, "old" = the file given
# (e.g. `git show REV:src/cuda/attn_fwd_sm90.cu > dev/ab_old.cu` before the call). "new" gets the
# float64 check and compute-sanitizer memcheck + racecheck; then `benchstats` (TMA kernel, with
# and without statistics) alternates new/old for ROUNDS rounds so clock drift hits both alike.
# Usage (repo root, on the GPU machine): bash dev/cuda/fwd_ab.sh OLD_SOURCE [ROUNDS]; logs in $OUT.
set -u
OLD=$1
ROUNDS=${2:-2}
O=${OUT:-/tmp/fwd_ab}
mkdir -p "$O" build/ab_old
cp "$OLD" build/ab_old/attn_fwd_sm90.cu
sed 's|"../../src/cuda/attn_fwd_sm90.cu"|"attn_fwd_sm90.cu"|' dev/cuda/attn_fwd.cu >build/ab_old/attn_fwd.cu
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp -Xptxas=-v -I include -I src -I src/cuda"
$NV dev/cuda/attn_fwd.cu -o build/attn_fwd_new >"$O/ab-build-new.txt" 2>&1 &
$NV build/ab_old/attn_fwd.cu -o build/attn_fwd_old >"$O/ab-build-old.txt" 2>&1 &
wait
{
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    for v in new old; do
        echo "==== build ($v)"; grep -E "error|spill|C751" "$O/ab-build-$v.txt" | sort | uniq -c | head -8
    done
    export OMP_NUM_THREADS=16
    echo "==== check (new)"; timeout 120 build/attn_fwd_new check 2>&1 | tail -3
    echo "==== memcheck (new)"; timeout 90 compute-sanitizer --tool memcheck build/attn_fwd_new small 2>&1 | grep -E "ERROR SUMMARY|Error" | head -4
    echo "==== racecheck (new)"; timeout 90 compute-sanitizer --tool racecheck build/attn_fwd_new small 2>&1 | grep -E "RACECHECK SUMMARY|Hazard" | head -4
    for r in $(seq 1 "$ROUNDS"); do
        for v in new old; do
            echo "==== benchstats round $r: $v"; timeout 100 build/attn_fwd_$v benchstats 2>&1
        done
    done
} 2>&1 | tee "$O/fwd-ab.txt"
