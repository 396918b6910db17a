#!/bin/bash
# attn_fwd_probe.sh -- one device call that times candidate statistics paths against the default
# (bench/notes-fwd.md, "open problem"): builds the checker with BL_FWD_STATS_PROBE = 0, 4, 5
# (src/cuda/attn_fwd_sm90.cu says what each value does), checks every one against the float64
# reference (all shapes, W included), then times the TMA kernel with and without statistics,
# in the order 0 4 5 0 4 5 0 4 5 so that drift and run-to-run noise show (about 3 s per timing
# run: the 2026-11-29 call took ~40 s for 4 builds, 2 checks and 5 timing runs). Probes 1..3
# were measured on 2026-11-29 (bench/notes-fwd.md) and are left out.
# Usage (repo root, on the GPU machine): bash dev/cuda/attn_fwd_probe.sh ; logs go to $OUT.
set -u
O=${OUT:-/tmp/fwd_out}
PROBES="0 4 5"
mkdir -p "$O" build
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp -I include -I src"
for P in $PROBES; do
  $NV -DBL_FWD_STATS_PROBE=$P dev/cuda/attn_fwd.cu -o build/attn_fwd_probe$P >"$O/fwd-probe-build$P.txt" 2>&1 &
done
wait
# One build log (few files come back from the device).
for P in $PROBES; do echo "== probe $P"; cat "$O/fwd-probe-build$P.txt"; rm -f "$O/fwd-probe-build$P.txt"; done >"$O/fwd-probe-build.txt"
export OMP_NUM_THREADS=16
{
for P in $PROBES; do
  if [ ! -x build/attn_fwd_probe$P ]; then echo "probe $P BUILD FAILED (see fwd-probe-build.txt)"; continue; fi
  timeout 100 build/attn_fwd_probe$P check >"$O/fwd-probe-check$P.txt" 2>&1
  echo "probe $P check rc=$? $(tail -1 "$O/fwd-probe-check$P.txt")"
done
} 2>&1 | tee "$O/fwd-probe-summary.txt"
for P in $PROBES $PROBES $PROBES; do
  [ -x build/attn_fwd_probe$P ] && timeout 60 build/attn_fwd_probe$P benchstats
done 2>&1 | tee "$O/fwd-probe-bench.txt"
# Short table last: overhead per probe and shape (two runs each).
grep -E "^stats probe|overhead" "$O/fwd-probe-bench.txt" |
  awk '/^stats probe/{p=$3; next} {sub(/.*bench tma +/,""); s=$0; sub(/ \|.*/,"",s); o=$0; sub(/.*overhead /,"",o); sub(/ .*/,"",o); print p, s, o}' |
  tee -a "$O/fwd-probe-summary.txt"
