#!/usr/bin/env bash
# pw_check_ab.sh -- one device call for a kernel variant built here with variant_libs.sh: unpack
# build/pw.tar.xz, run the GPU tests and compute-sanitizer (memcheck, racecheck) on the CHECK
# library, then lib_timeline_ab.sh with the NEW library against the others, each step under its
# own time limit so that the call ends inside the device's 600 s and brings back what it has.
# Usage (on the device, repository root, carry ["build/pw.tar.xz"]):
#   OUT=$OUT bash dev/cuda/pw_check_ab.sh CHECK NEW BASES "CONFIGS" [ROUNDS]
#   e.g. (how the hundred-and-eleventh session checked the rotated walk, bwd-s111-ws64p-rotate.txt)
#   OUT=$OUT bash dev/cuda/pw_check_ab.sh rot3 rot base,kvr \
#       "1,16384,16,64|dense,0.1,0.03,0.008,negl:0.2,negl:0.5;1,16384,16,64 --causal|0.03,0.008" 2
# CHECK / NEW / BASES name libraries build/pw/NAME.so; CONFIGS as lib_timeline_ab.sh's (each with
# its keeps after a bar). Environment: TESTS (pytest -k, default "backward"; "" for all), CASES
# (pool_sanitize cases, default 3,4,9,10,11), LIMIT (seconds for the whole, default 570), BENCH
# (seconds kept out of LIMIT for bench/bench_attn.py --no-flex on the NEW library after the
# timelines, ~150 on an H100; default 0: no bench; skipped where the tests failed). Starts are
# scarce (the hundred-and-twenty-sixth session got no machine in 13 tries), so one call that
# checks, times and benches beats two.
# Writes $OUT/gpu.txt, pytest.txt, san-memcheck.txt, san-racecheck.txt, $OUT/t (the timelines)
# and with BENCH bench.txt / bench.json.
set -uo pipefail
check=$1 new=$2 bases=$3 configs=$4 rounds=${5:-2}
TESTS=${TESTS-backward} CASES=${CASES:-3,4,9,10,11} LIMIT=${LIMIT:-570} BENCH=${BENCH:-0}
OUT=${OUT:-out}
mkdir -p "$OUT" build && tar -xJf build/pw.tar.xz -C build
export PYTHONPATH=$PWD
L=$PWD/build/pw
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
step() {  # NAME SECONDS COMMAND...: run under a limit, report rc and time
    local name=$1 secs=$2 t0=$SECONDS; shift 2
    timeout "$secs" "$@"; local rc=$?
    echo "$name: rc $rc, $((SECONDS - t0)) s"
    return $rc
}
tests_rc=0
step pytest 150 env BACK_LITE_LIBRARY="$L/$check.so" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu -k "$TESTS" > "$OUT/pytest.txt" 2>&1 || tests_rc=$?
tail -2 "$OUT/pytest.txt"
for tool in memcheck racecheck; do
    step "$tool" 90 env BACK_LITE_LIBRARY="$L/$check.so" compute-sanitizer --tool "$tool" \
        python3 dev/cuda/pool_sanitize.py --cases "$CASES" > "$OUT/san-$tool.txt" 2>&1
    tail -2 "$OUT/san-$tool.txt"
done
specs=""
IFS=',' read -r -a names <<< "$bases"
for b in "${names[@]}"; do specs+="${specs:+,}$b=$L/$b.so"; done
left=$((LIMIT - SECONDS - BENCH))
if ((left > 30)); then
    step timelines "$left" env NEW_LIB="$L/$new.so" OUT="$OUT/t" bash dev/cuda/lib_timeline_ab.sh \
        "$specs" "$configs" x "$rounds" > "$OUT/ab.log" 2>&1
    if [ ! -s "$OUT/t/timelines-summary.txt" ] && [ -s "$OUT/t/timelines.txt" ]; then
        # cut by the limit: the summary of the rounds that finished (the last one may be partial)
        echo "(timelines cut short: the summary covers what ran)"
        bash dev/cuda/timeline_summary.sh "$OUT/t/timelines.txt" > "$OUT/t/timelines-summary.txt"
    fi
    cat "$OUT/t/timelines-summary.txt" 2>/dev/null || echo "(no timeline summary: see $OUT/ab.log)"
else
    echo "timelines: no time left ($left s)"
fi
if ((BENCH > 0)); then
    left=$((LIMIT - SECONDS))
    if ((tests_rc != 0)); then
        echo "bench: skipped (pytest rc $tests_rc)"
    elif ((left > 60)); then
        step bench "$left" env BACK_LITE_LIBRARY="$L/$new.so" python3 bench/bench_attn.py --no-flex \
            --out "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
        tail -8 "$OUT/bench.txt"
    else
        echo "bench: no time left ($left s)"
    fi
fi
