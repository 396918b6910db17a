#!/usr/bin/env bash
# bwd_sed_variants.sh -- ablations and quick variants of the backward main kernels: each variant
# is src/cuda with one sed expression applied to one file, built into its own dev checker here
# (no GPU needed), then timed on the device with `attn_bwd one` (1 x 8192 x 16 x 128 dense;
# `one64` for head dim 64), all variants interleaved round by round. "base" (no edit) is always
# built. Variants that remove work compute wrong gradients: they are for timing only.
# How bench/results/bwd128-ablation-2026-11-29.txt was made.
#
#   here:   bash dev/cuda/bwd_sed_variants.sh build NAME FILE 'SED' [NAME FILE 'SED' ...]
#           e.g. ... build noatom bwd_wgmma_sm90.cuh 's/if (i < dm.seqlen_q) atomicAdd/if (false) atomicAdd/'
#   device: bash dev/cuda/bwd_sed_variants.sh run [ROUNDS] [one|one64]   (run with carry=["build/sedvar"])
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=build/sedvar
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr -DBL_BWD_WITH_MMA_VARIANT -I include -I src -I dev/cuda"

build_one() {  # NAME FILE SED
    local d=$DIR/$1
    rm -rf "$d" && mkdir -p "$d" && cp -r src/cuda "$d/cuda"
    sed -i "$3" "$d/cuda/$2"
    diff "src/cuda/$2" "$d/cuda/$2" > "$d/diff.txt" || true
    if [ "$1" != base ] && [ ! -s "$d/diff.txt" ]; then echo "$1: the sed expression changed nothing" >&2; exit 1; fi
    $NV -I "$d/cuda" -Xptxas=-v -c "$d/cuda/attn_bwd_sm90.cu" -o "$d/main.o" > "$d/ptxas.log" 2>&1
    nvcc -gencode=arch=compute_90a,code=sm_90a -o "$d/attn_bwd" $DIR/common/*.o "$d/main.o"
    rm -rf "$d/cuda" "$d/main.o"
    echo "$1: $(wc -l < "$d/diff.txt") diff lines, $(grep -c C75 "$d/ptxas.log" || true) ptxas C75xx notes"
}

if [ "${1:-}" = build ]; then
    shift
    rm -rf $DIR && mkdir -p $DIR/common
    for f in dev/cuda/attn_bwd.cu src/cuda/select_sm90.cu src/cuda/bwd_lists_sm90.cu src/cuda/bwd_prepost_sm90.cu; do
        $NV -I src/cuda -c "$f" -o "$DIR/common/$(basename "$f" .cu).o"
    done
    gcc -O2 -I include -I src -c src/select.c -o $DIR/common/select.o
    gcc -O2 -I include -I src -c src/error.c -o $DIR/common/error.o
    build_one base attn_bwd_sm90.cu 's/^$//'
    names=(base)
    while [ $# -ge 3 ]; do build_one "$1" "$2" "$3"; names+=("$1"); shift 3; done
    echo "${names[*]}" > $DIR/names.txt
elif [ "${1:-}" = run ]; then
    rounds=${2:-3} mode=${3:-one}
    for r in $(seq 1 "$rounds"); do
        for v in $(cat $DIR/names.txt); do
            echo "== $v round $r: $(timeout 60 $DIR/$v/attn_bwd "$mode" 2>&1 | grep dense)"
        done
    done
else
    sed -n '2,14p' "$0"; exit 1
fi
