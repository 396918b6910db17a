#!/usr/bin/env bash
# lib_timeline_ab.sh -- two library builds compared kernel by kernel on one device call: the
# library of the working tree and that of a base tree (CMakeLists.txt, src, include), each built
# with the release flags, then dev/cuda/bwd_call_timeline.py on each in turn, ROUNDS times per
# configuration (the builds alternate, so clock drift falls on both). Logs to
# $OUT/timelines.txt; a summary (per build, round and keep: each kernel's median duration in us,
# then the call's span) to $OUT/timelines-summary.txt.
# Usage (repository root; carry the base tree, e.g. ["build/tree_base"]):
#   git archive REV CMakeLists.txt src include | tar -x -C build/tree_base
#   OUT=$OUT bash dev/cuda/lib_timeline_ab.sh build/tree_base "1,16384,16,128 --causal;1,16384,16,128" \
#       dense,1.0,0.1 2
set -euo pipefail
base_tree=$1
IFS=';' read -r -a configs <<< "$2"
keeps=$3 rounds=${4:-2}
OUT=${OUT:-out}
mkdir -p "$OUT"
build() {  # build DIR SOURCE
    cmake -S "$2" -B "$1" -G Ninja -DBL_BUILD_TESTS=OFF > "$OUT/build-$(basename "$1").txt" 2>&1
    cmake --build "$1" -j 16 >> "$OUT/build-$(basename "$1").txt" 2>&1
}
build build/ab_new . &
build build/ab_base "$base_tree" &
wait %1 && wait %2
export PYTHONPATH=$PWD
for cfg in "${configs[@]}"; do
    read -r shape flags <<< "$cfg"
    for r in $(seq "$rounds"); do
        for lib in base new; do
            echo "== $lib round $r: shape $shape $flags"
            BACK_LITE_LIBRARY=$PWD/build/ab_$lib/libbacklite.so \
                python3 dev/cuda/bwd_call_timeline.py --shape "$shape" $flags --calls 9 \
                --keeps "$keeps" 2>&1 | grep -v -i "warn"
        done
    done
done > "$OUT/timelines.txt"
# Summary: per build, round and keep, the span and each kernel's median duration (us).
awk '/^== (base|new) round/ {lib = $2; rnd = $4; shape = $6 ($7 == "--causal" ? " causal" : "")}
     /^== keep/ {printf "\n%-4s r%s %-22s keep %-6s", lib, rnd, shape, $3}
     /^  [a-z_: ]*[a-zA-Z]/ && / us  gap/ {printf " %s", $(NF-4)}
     /span median/ {printf " | span %s", $3}
     END {print ""}' "$OUT/timelines.txt" | tee "$OUT/timelines-summary.txt"
