#!/usr/bin/env bash
# bwd_ncu_ab.sh -- one device call timing dev-checker builds (bwd_build_tree.sh) against each
# other kernel by kernel under ncu (locked clocks: decisions rest on these, the event medians of
# identical kernels wander by 1-2 %): the first build's float64 check and compute-sanitizer
# memcheck / racecheck on `small`, then every mode with every build, builds alternating in a
# rotated order, ROUNDS times; logs and a summary (ncu_ab_summary.py) in $OUT. Usage (repository
# root, carry ["build/sedvar"]):
#   bash dev/cuda/bwd_ncu_ab.sh "new base" "sparse1 0.1;sparse64 0.01;onemask 1.0 causal" [ROUNDS] [REGEX]
# REGEX picks the kernels (default: the main kernels, bwd_ws); SKIP_DENSE=0 times the dev
# checker's dense reference call too (the default skips it: the sparse calls alone);
# SKIP_CHECK=1 skips the check and the sanitizers. sparse64 runs 3 shapes and sparse1 / sparsec
# 2, reported apart. How bench/results/bwd-s30-zero-acc.txt's runs were made (there as
# build/sedvar scripts).
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build/sedvar
read -r -a names <<< "$1"
IFS=';' read -r -a modes <<< "$2"
rounds=${3:-2}
regex=${4:-bwd_ws}
first=$B/${names[0]}/attn_bwd
here=$(dirname "$0")
if [ "${SKIP_CHECK:-0}" != 1 ]; then
    echo "== check (${names[0]})"; timeout 220 "$first" check > "$OUT/check.txt" 2>&1
    echo "check rc=$? $(tail -1 "$OUT/check.txt")"
    echo "== memcheck"; timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$first" small > "$OUT/memcheck.txt" 2>&1
    echo "memcheck rc=$? $(tail -1 "$OUT/memcheck.txt")"
    echo "== racecheck"; timeout 180 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$first" small > "$OUT/racecheck.txt" 2>&1
    echo "racecheck rc=$? $(tail -1 "$OUT/racecheck.txt")"
fi
skip_dense=()
[ "${SKIP_DENSE:-1}" = 1 ] && skip_dense=(env ATTN_BWD_SKIP_DENSE=1)
for mode in "${modes[@]}"; do
    tag=${mode// /_}
    for r in $(seq 1 "$rounds"); do
        k=$(( (r - 1) % ${#names[@]} ))
        for n in "${names[@]:k}" "${names[@]:0:k}"; do
            # shellcheck disable=SC2086  # mode is "what [args]"
            timeout 150 "${skip_dense[@]}" ncu --metrics gpu__time_duration.sum -k "regex:$regex" \
                "$B/$n/attn_bwd" $mode > "$OUT/ncu__${n}__${tag}__$r.txt" 2>&1 || echo "$n $mode: rc $?"
        done
    done
    case "$mode" in sparse64*) split=3 ;; sparse1* | sparsec*) split=2 ;; *) split=1 ;; esac
    python3 "$here/ncu_ab_summary.py" --split "$split" "${1// /,}" "$OUT"/ncu__*__"${tag}"__*.txt \
        | tee -a "$OUT/summary.txt"
done
