#!/usr/bin/env bash
# change_ab.sh -- one device call for a backward kernel change: the dev checker's correctness
# checks and compute-sanitizer passes on a checker built from the working tree, then
# lib_timeline_ab.sh (the working tree's library against a base tree's, kernel by kernel), then
# tests/gpu on the working tree's library. Everything lands in $OUT: checks.txt, pytest.txt and
# lib_timeline_ab.sh's timelines.txt / timelines-summary.txt (the summary is also printed).
# It strings together the commands of bench/results/bwd-s39-prepost.txt runs 2-4 (run there
# inline, one by one); the checks are bwd_compare.sh's (no timing modes), the shipped picks only
# (ATTN_BWD_CHECK_SHIPPED=1). As one script: bench/results/bwd-s40-split-tail.txt runs 1-4, ~300-
# 360 s a call with four shapes x two rounds of timelines (within the device's 600 s a command).
# Usage (repository root), after building the checker here and the base tree:
#   bash dev/cuda/bwd_build_tree.sh NAME .          # -> build/sedvar/NAME/attn_bwd
#   git archive REV CMakeLists.txt src include | tar -x -C build/tree_base
#   (device, carry ["build/tree_base", "build/sedvar"])
#   OUT=$OUT bash dev/cuda/change_ab.sh NAME build/tree_base \
#       "1,16384,16,128;1,16384,16,128 --causal" dense,1.0,0.1,0.01 [ROUNDS]
set -uo pipefail
name=$1 base_tree=$2 configs=$3 keeps=$4 rounds=${5:-2}
OUT=${OUT:-out}
mkdir -p "$OUT"
# check, memcheck and racecheck of build/sedvar/NAME (logs check.txt, memcheck.txt, racecheck.txt)
ATTN_BWD_CHECK_SHIPPED=1 OUT=$OUT bash dev/cuda/bwd_compare.sh "$name" "" 1 > "$OUT/checks.txt" 2>&1
cat "$OUT/checks.txt"
# Builds build/ab_new (working tree) and build/ab_base, then the timelines.
OUT=$OUT bash dev/cuda/lib_timeline_ab.sh "$base_tree" "$configs" "$keeps" "$rounds" > /dev/null 2>&1 ||
    echo "lib_timeline_ab.sh failed: see $OUT/build-ab_*.txt and $OUT/timelines.txt"
BACK_LITE_LIBRARY=$PWD/build/ab_new/libbacklite.so python3 -m pytest -q -x tests/gpu \
    > "$OUT/pytest.txt" 2>&1
echo "tests/gpu on the working tree's library: $(tail -1 "$OUT/pytest.txt")"
cat "$OUT/timelines-summary.txt" 2> /dev/null
