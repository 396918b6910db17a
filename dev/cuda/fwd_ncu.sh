#!/bin/bash
# fwd_ncu.sh -- Nsight Compute on the TMA forward, with and without statistics, for the shapes
# given as "B S H D causal" strings (default: the two that cost most). One device call.
# Usage (repo root, on the GPU machine): bash dev/cuda/fwd_ncu.sh ["1 16384 16 64 1" ...]; logs in $OUT.
set -u
O=${OUT:-/tmp/fwd_ncu}
mkdir -p "$O" build
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp \
    -I include -I src dev/cuda/attn_fwd.cu -o build/attn_fwd >"$O/ncu-build.txt" 2>&1 || { cat "$O/ncu-build.txt"; exit 1; }
[ $# -gt 0 ] || set -- "1 16384 16 64 1" "1 16384 16 128 0"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis"
for shape in "$@"; do
    for stats in 0 1; do
        echo "==== ncu shape B S H D causal = $shape stats=$stats"
        # launch 2 of 3: warm caches and clocks first
        timeout 120 ncu --clock-control none -k regex:ws_kernel --launch-skip 1 --launch-count 1 $SECTIONS \
            build/attn_fwd one $shape $stats 3 2>&1 | grep -vE "^==PROF==|^ +-+ +-+" 
    done
done 2>&1 | tee "$O/fwd-ncu.txt"
