#!/usr/bin/env bash
# The session's last device call, in one go (device time is short): builds the library as shipped
# and with the candidate kernel variants (FWD_FLAGS/BWD_FLAGS), checks the candidates in their dev
# checkers, runs the GPU tests on the candidate build, then benchmarks whichever build passed.
# Every step has a timeout so that the logs come back; logs go to $OUT/logs.tgz plus a summary.
#
#   VARIANT_FLAGS="-DBL_BWD_D64_V2 -DBL_FWD_STATS_PROBE=4" bash scripts/device_final.sh
set -u
cd "$(dirname "$0")/.."
O=/tmp/logs; mkdir -p "$O" build
T0=$(date +%s); BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$O/summary.txt"; }

say "== parallel builds"
( cmake -S . -B build -G Ninja -DBL_BUILD_TESTS=OFF && cmake --build build -j 6 ) > "$O/build.txt" 2>&1 &
( cmake -S . -B build-var -G Ninja -DBL_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS="${VARIANT_FLAGS:-}" \
  && cmake --build build-var -j 6 ) > "$O/build-var.txt" 2>&1 &
( OUT=$O bash dev/cuda/run_device_bwd.sh build64 ) > "$O/bwd64-build.txt" 2>&1 &
wait
[ -f build/libbacklite.so ] && say "default build ok" || { say "default build FAILED"; tail -30 "$O/build.txt"; }
[ -f build-var/libbacklite.so ] && say "variant build ok" || { say "variant build FAILED"; tail -30 "$O/build-var.txt"; }

say "== forward stats probe (new values checked against float64)"
OUT=$O timeout 170 bash dev/cuda/attn_fwd_probe.sh > "$O/fwd-probe.txt" 2>&1; say "probe rc=$?"
grep -E "check rc|overhead" "$O/fwd-probe.txt" | tee -a "$O/summary.txt"

say "== backward D=64 v2: check, sanitize, bench"
OUT=$O timeout 150 bash dev/cuda/run_device_bwd.sh check64 sanitize64 bench64 > "$O/bwd64.txt" 2>&1; say "bwd64 rc=$?"
grep -cE "FAIL" "$O/bwd64.txt" | sed 's/^/bwd64 FAIL lines: /' | tee -a "$O/summary.txt"
grep -E "SUMMARY|TFLOP|shipped|v2" "$O/bwd64.txt" | tail -25 | tee -a "$O/summary.txt"

say "== GPU tests on the variant build"
BACK_LITE_LIBRARY=$PWD/build-var/libbacklite.so PYTHONPATH=$PWD timeout 120 \
    python3 -m pytest -q -rs tests/gpu > "$O/gpu-pytest-var.txt" 2>&1; var_rc=$?
say "variant GPU pytest rc=$var_rc: $(tail -1 "$O/gpu-pytest-var.txt")"
lib=$PWD/build/libbacklite.so
if [ $var_rc -eq 0 ] && ! grep -q FAIL "$O/bwd64.txt" && ! grep -q "case(s) failed" <(grep -v " 0 case(s) failed" "$O/fwd-probe.txt"); then
    lib=$PWD/build-var/libbacklite.so
fi
say "benchmarking $lib"

say "== bench ($(left)s left)"
BACK_LITE_LIBRARY=$lib PYTHONPATH=$PWD timeout $(( $(left) - 15 )) \
    python3 bench/bench_attn.py --reps 8 --out "$O/bench.json" > "$O/bench.txt" 2>&1; say "bench rc=$?"
BACK_LITE_LIBRARY=$lib PYTHONPATH=$PWD python3 bench/bench_attn.py --table "$O/bench.json" \
    > "$O/bench-table.txt" 2>&1
tar czf "$OUT/logs.tgz" -C /tmp logs
cp "$O/summary.txt" "$O/bench-table.txt" "$OUT/" 2>/dev/null
cat "$O/bench-table.txt"
