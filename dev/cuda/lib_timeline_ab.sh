#!/usr/bin/env bash
# lib_timeline_ab.sh -- library builds compared kernel by kernel on one device call: the library
# of the working tree ("new") and those of one or more other trees (CMakeLists.txt, src, include),
# each built with the release flags, then dev/cuda/bwd_call_timeline.py on each in turn, ROUNDS
# times per configuration (the builds alternate, so clock drift falls on all). Logs to
# $OUT/timelines.txt; a summary (per build, round and keep: each kernel's median duration in us,
# then the call's span) to $OUT/timelines-summary.txt, and the first kernels' start offsets in
# each call (dev/cuda/timeline_offsets.py) to $OUT/timelines-offsets.txt.
# Usage (repository root; carry the other trees, e.g. ["build/tree_base"]):
#   git archive REV CMakeLists.txt src include | tar -x -C build/tree_base
#   OUT=$OUT bash dev/cuda/lib_timeline_ab.sh build/tree_base "1,16384,16,128 --causal;1,16384,16,128" \
#       dense,1.0,0.1 2
# TREES is one tree (named "base") or NAME=TREE[,NAME=TREE...]; a configuration may carry its own
# keeps after a bar, "1,32768,24,128 --causal|0.1,negl:0.5", in place of KEEPS:
#   OUT=$OUT bash dev/cuda/lib_timeline_ab.sh base=build/tree_base,fix=build/tree_fix \
#       "1,16384,16,128|dense,0.01,negl:0.5;1,16384,16,64 --causal" 0.1,0.01 2
# A TREE that ends in .so is a library built here (cmake --build, then cp): it is used as it is,
# and NEW_LIB=PATH.so does the same for "new" -- no build on the device, whose minutes count
# (each carried library ~11 MB): NEW_LIB=build/ab/new.so bash dev/cuda/lib_timeline_ab.sh \
#   base=build/ab/base.so "1,16384,16,128|0.03" dense 3
# The builds' order flips every other round.
set -euo pipefail
IFS=',' read -r -a specs <<< "$1"
IFS=';' read -r -a configs <<< "$2"
keeps=$3 rounds=${4:-2}
OUT=${OUT:-out}
mkdir -p "$OUT"
names=() trees=()
for spec in "${specs[@]}"; do
    if [[ $spec == *=* ]]; then names+=("${spec%%=*}"); trees+=("${spec#*=}")
    else names+=(base); trees+=("$spec"); fi
done
build() {  # build DIR SOURCE (a tree, or a prebuilt libbacklite.so: copied)
    if [[ $2 == *.so ]]; then mkdir -p "$1" && cp "$2" "$1/libbacklite.so"; return; fi
    cmake -S "$2" -B "$1" -G Ninja -DBL_BUILD_TESTS=OFF > "$OUT/build-$(basename "$1").txt" 2>&1
    cmake --build "$1" -j 16 >> "$OUT/build-$(basename "$1").txt" 2>&1
}
pids=()
build build/ab_new "${NEW_LIB:-.}" & pids+=($!)
for i in "${!names[@]}"; do build "build/ab_${names[$i]}" "${trees[$i]}" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
export PYTHONPATH=$PWD
for cfg in "${configs[@]}"; do
    cfg_keeps=$keeps
    if [[ $cfg == *"|"* ]]; then cfg_keeps=${cfg##*|}; cfg=${cfg%%|*}; fi
    read -r shape flags <<< "$cfg"
    for r in $(seq "$rounds"); do
        order=("${names[@]}" new)
        if (( r % 2 == 0 )); then  # flipped: no build always runs right after the same one
            for ((i = 0, j = ${#order[@]} - 1; i < j; ++i, --j)); do
                t=${order[i]}; order[i]=${order[j]}; order[j]=$t
            done
        fi
        for lib in "${order[@]}"; do
            echo "== $lib round $r: shape $shape $flags"
            BACK_LITE_LIBRARY=$PWD/build/ab_$lib/libbacklite.so \
                python3 dev/cuda/bwd_call_timeline.py --shape "$shape" $flags --calls 9 \
                --keeps "$cfg_keeps" 2>&1 | grep -v -i "warn"
        done
    done
done > "$OUT/timelines.txt"
# Summary: per build, round and keep, the span and each kernel's median duration (us).
bash dev/cuda/timeline_summary.sh "$OUT/timelines.txt" | tee "$OUT/timelines-summary.txt"
python3 dev/cuda/timeline_offsets.py "$OUT/timelines.txt" > "$OUT/timelines-offsets.txt"
