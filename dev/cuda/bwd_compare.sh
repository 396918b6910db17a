#!/usr/bin/env bash
# bwd_compare.sh -- one device call comparing dev checkers built by bwd_build_tree.sh (or
# bwd_sed_variants.sh): the first build's float64 check and compute-sanitizer memcheck /
# racecheck on `small` (side by side: they only check, and each alone took 150-220 s), then each
# mode timed with every build, builds alternating in a rotating order, ROUNDS times. Logs to
# $OUT, at most 6 files (the device returns 8). Usage (repository root, carry ["build/sedvar"]):
#   bash dev/cuda/bwd_compare.sh "base old" "one;sparse1 0.1;sparse1 0.5;sparse64 0.1" 2
# Timing: the dev checker's own event medians; or, with NCU=REGEX, each run under
#   ncu --metrics gpu__time_duration.sum -k regex:REGEX
# (locked clocks; the event medians of identical kernels wander by 1-2 %), logs
# ncu__BUILD__MODE__ROUND.txt (in $OUT/ncu_logs.tgz) and per mode each kernel's median per build
# (ncu_ab_summary.py; sparse64 and densenc run 3 shapes and sparse1 / sparsec / sparsen 2, reported apart).
# With NCU the dev checker's dense reference call before sparse calls is skipped unless
# SKIP_DENSE=0 (the dense-only modes -- one, one64, dense128, densenc -- time it regardless).
# SKIP_CHECK=1: timings only (the same builds' check already ran on the device).
# How bench/results/bwd-s9-persistent.txt (runs 6, 7) and bwd-s9-schedule.txt were made (events),
# and bwd-s30-zero-acc.txt's runs (ncu, then as ad-hoc scripts of the same steps), e.g.
#   NCU=bwd_ws bash dev/cuda/bwd_compare.sh "new base" "sparse1 0.1;sparse64 0.01" 2
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build/sedvar
read -r -a names <<< "$1"
IFS=';' read -r -a modes <<< "$2"
rounds=${3:-2}
first=$B/${names[0]}/attn_bwd
if [ "${SKIP_CHECK:-0}" != 1 ]; then
    CS="compute-sanitizer --error-exitcode 9"
    (timeout 220 "$first" check > "$OUT/check.txt" 2>&1; echo "check rc=$?" >> "$OUT/check.txt") &
    (timeout 200 $CS --tool memcheck "$first" small > "$OUT/memcheck.txt" 2>&1
     echo "memcheck rc=$?" >> "$OUT/memcheck.txt") &
    (timeout 220 $CS --tool racecheck --racecheck-report all "$first" small > "$OUT/racecheck.txt" 2>&1
     echo "racecheck rc=$?" >> "$OUT/racecheck.txt") &
    wait
    echo "== check (${names[0]})"; grep -E "FAIL|failed|rc=" "$OUT/check.txt" | head -20
    echo "== memcheck"; tail -3 "$OUT/memcheck.txt"
    echo "== racecheck"; tail -3 "$OUT/racecheck.txt"
fi
logs=$(mktemp -d)  # the ncu logs, one per run: packed into one file at the end
skip_dense=()
[ -n "${NCU:-}" ] && [ "${SKIP_DENSE:-1}" = 1 ] && skip_dense=(env ATTN_BWD_SKIP_DENSE=1)
# Round r starts with build r - 1 (rotated): the first build after a lighter run gains a few
# percent from the power budget (bench/results/bwd-s10-noncausal-walk.txt), so no build may
# always be first.
for mode in "${modes[@]}"; do
    tag=${mode// /_}
    for r in $(seq 1 "$rounds"); do
        k=$(( (r - 1) % ${#names[@]} ))
        for n in "${names[@]:k}" "${names[@]:0:k}"; do
            if [ -n "${NCU:-}" ]; then
                # shellcheck disable=SC2086  # mode is "what [args]"
                timeout 150 "${skip_dense[@]}" ncu --metrics gpu__time_duration.sum -k "regex:$NCU" \
                    "$B/$n/attn_bwd" $mode > "$logs/ncu__${n}__${tag}__$r.txt" 2>&1 \
                    || echo "$n $mode: rc $?"
                continue
            fi
            echo "== $n: $mode (round $r)"
            # shellcheck disable=SC2086  # mode is "what [keep]"
            timeout 60 "$B/$n/attn_bwd" $mode 2>&1 | grep -E " ms " | sed 's/^bench //'
        done
    done
    if [ -n "${NCU:-}" ]; then
        case "$mode" in
            sparse64* | densenc*) split=3 ;;
            sparse1* | sparsec* | sparsen*) split=2 ;;
            *) split=1 ;;
        esac
        python3 "$(dirname "$0")/ncu_ab_summary.py" --split "$split" "${1// /,}" \
            "$logs"/ncu__*__"${tag}"__*.txt | tee -a "$OUT/summary.txt"
    fi
done
[ -n "${NCU:-}" ] && tar czf "$OUT/ncu_logs.tgz" -C "$logs" .
exit 0
