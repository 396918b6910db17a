#!/bin/bash
# attn_fwd_probe.sh -- one device call that splits the cost of the tile statistics
# (bench/notes-fwd.md, "open problem"): builds the checker with BL_FWD_STATS_PROBE = 0..3
# (src/cuda/attn_fwd_sm90.cu says what each value does), checks 0 and 1 against the float64
# reference, then times the TMA kernel with and without statistics for each.
# Usage (repo root, on the GPU machine): bash dev/cuda/attn_fwd_probe.sh ; logs go to $OUT.
set -u
O=${OUT:-/tmp/fwd_out}
mkdir -p "$O" build
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp -I include -I src"
for P in 0 1 2 3; do
  $NV -DBL_FWD_STATS_PROBE=$P dev/cuda/attn_fwd.cu -o build/attn_fwd_probe$P >"$O/fwd-probe-build$P.txt" 2>&1 &
done
wait
export OMP_NUM_THREADS=16
for P in 0 1; do
  timeout 120 build/attn_fwd_probe$P check >"$O/fwd-probe-check$P.txt" 2>&1
  echo "probe $P check rc=$? $(tail -1 "$O/fwd-probe-check$P.txt")"
done
for P in 0 1 2 3 0; do timeout 120 build/attn_fwd_probe$P benchstats; done 2>&1 | tee "$O/fwd-probe-bench.txt"
