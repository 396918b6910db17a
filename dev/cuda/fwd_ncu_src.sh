#!/usr/bin/env bash
# fwd_ncu_src.sh -- where the forward's warps wait, per SASS instruction: ncu's source page (SASS
# with warp stall samples per instruction) of the warp-specialized forward kernel, for each variant
# built by `fwd_sed_variants.sh build` and each shape, with and without statistics. One device call
# (carry ["build/fwdvar"]); files $OUT/src-VARIANT-B_S_H_D_CAUSAL-sSTATS.csv.gz, to be summarised
# here with dev/cuda/ncu_src_summary.py.
# Usage (repo root, on the GPU machine): bash dev/cuda/fwd_ncu_src.sh VARIANT [VARIANT ...]
#   shapes: FWD_SRC_SHAPES="B S H D causal;..." (default "1 16384 16 128 0"); STATS="0 1" (default).
set -u
O=${OUT:-/tmp/fwd_ncu_src}
DIR=build/fwdvar
mkdir -p "$O"
IFS=';' read -r -a shapes <<< "${FWD_SRC_SHAPES:-1 16384 16 128 0}"
for v in "$@"; do
    for shape in "${shapes[@]}"; do
        for stats in ${STATS:-0 1}; do
            f="$O/src-$v-${shape// /_}-s$stats.csv"
            # launch 2 of 3: caches and clocks warm
            # shellcheck disable=SC2086  # shape is "B S H D causal"
            timeout 200 ncu --clock-control none -k regex:ws_kernel -s 1 -c 1 --section SourceCounters \
                --section WarpStateStats --page source --print-source sass --csv \
                "$DIR/$v/attn_fwd" one $shape $stats 3 > "$f" 2> "${f%.csv}.err"
            echo "ncu $v [$shape] stats=$stats rc=$? $(wc -c < "$f") bytes"
            gzip -f "$f"
            [ -s "${f%.csv}.err" ] || rm -f "${f%.csv}.err"  # the device returns a few files only
        done
    done
done
