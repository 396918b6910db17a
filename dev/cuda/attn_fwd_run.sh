#!/bin/bash
# attn_fwd_run.sh -- everything one device call does for the forward kernel: build the checker
# check against the float64 reference, compute-sanitizer
# memcheck + racecheck on small shapes, SASS summary, timings against SDPA FLASH/cuDNN.
# Usage (repo root, on the GPU machine): bash dev/cuda/attn_fwd_run.sh ; logs go to $OUT.
set -u
O=${OUT:-/tmp/fwd_out}
mkdir -p "$O" build
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv >"$O/fwd-gpu.txt" 2>&1
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp -Xptxas=-v -I include -I src"
$NV dev/cuda/attn_fwd.cu -o build/attn_fwd >"$O/fwd-build.txt" 2>&1 &
wait
grep -E "error|spill|registers" "$O/fwd-build.txt" | sort | uniq -c | head -20
export OMP_NUM_THREADS=16
timeout 120 build/attn_fwd check >"$O/fwd-check.txt" 2>&1
check_rc=$?
timeout 90 compute-sanitizer --tool memcheck build/attn_fwd small >"$O/fwd-sanitize.txt" 2>&1
mem_rc=$?
timeout 90 compute-sanitizer --tool racecheck build/attn_fwd small >>"$O/fwd-sanitize.txt" 2>&1
race_rc=$?
cuobjdump --dump-sass build/attn_fwd | grep -oE "HGMMA\.[0-9A-Za-z.]+|Function : [A-Za-z0-9_]+" | uniq -c >"$O/fwd-sass.txt" 2>&1
timeout 150 build/attn_fwd bench "$O/fwd-bench.csv" >"$O/fwd-bench.txt" 2>&1
timeout 120 python3 dev/cuda/attn_fwd_sdpa.py "$O/fwd-sdpa.csv" >"$O/fwd-sdpa.txt" 2>&1
echo "==== check (rc=$check_rc)"
cat "$O/fwd-check.txt"
echo "==== sanitizer memcheck rc=$mem_rc racecheck rc=$race_rc"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Hazard" "$O/fwd-sanitize.txt" | sort | uniq -c | head -12
echo "==== SASS"; grep -c HGMMA "$O/fwd-sass.txt"; head -4 "$O/fwd-sass.txt"
cat "$O/fwd-gpu.txt"
echo "==== bench"; cat "$O/fwd-bench.txt"; cat "$O/fwd-sdpa.txt"
