#!/usr/bin/env bash
# bwd_compare.sh -- one device call comparing dev checkers built by bwd_build_tree.sh (or
# bwd_sed_variants.sh): the first build's float64 check and compute-sanitizer memcheck /
# racecheck on `small`, then each mode timed with every build, builds alternating, ROUNDS times.
# Builds alternate in a rotating order. Logs to $OUT. Usage (repository root, carry ["build/sedvar"]):
#   bash dev/cuda/bwd_compare.sh "base old" "one;sparse1 0.1;sparse1 0.5;sparse64 0.1" 2
# How bench/results/bwd-s9-persistent.txt (runs 6, 7) and bwd-s9-schedule.txt were made.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build/sedvar
read -r -a names <<< "$1"
IFS=';' read -r -a modes <<< "$2"
rounds=${3:-2}
first=$B/${names[0]}/attn_bwd
# SKIP_CHECK=1: timings only (the same builds' check already ran on the device).
if [ "${SKIP_CHECK:-0}" != 1 ]; then
echo "== check (${names[0]})"; timeout 150 "$first" check > "$OUT/check.txt" 2>&1; echo "check rc=$?"
grep -E "FAIL|failed" "$OUT/check.txt" | head -20
echo "== memcheck"; timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$first" small > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$?"; tail -2 "$OUT/memcheck.txt"
echo "== racecheck"; timeout 120 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$first" small > "$OUT/racecheck.txt" 2>&1
echo "racecheck rc=$?"; tail -2 "$OUT/racecheck.txt"
fi
# Round r starts with build r - 1 (rotated): the first build after a lighter run gains a few
# percent from the power budget (bench/results/bwd-s10-noncausal-walk.txt), so no build may
# always be first.
for mode in "${modes[@]}"; do
    for r in $(seq 1 "$rounds"); do
        k=$(( (r - 1) % ${#names[@]} ))
        for n in "${names[@]:k}" "${names[@]:0:k}"; do
            echo "== $n: $mode (round $r)"
            # shellcheck disable=SC2086  # mode is "what [keep]"
            timeout 60 "$B/$n/attn_bwd" $mode 2>&1 | grep -E " ms " | sed 's/^bench //'
        done
    done
done
