#!/usr/bin/env bash
# bwd_ab.sh -- A/B of one backward main kernel in one device call. D = 64: the paired kernel
# (src/cuda/bwd_wgmma64p_sm90.cuh); D = 128: version 4+ (src/cuda/bwd_wgmma_sm90.cuh). The
# checker (dev/cuda/attn_bwd.cu) is built twice: "new" = the working tree, "old" = the working
# tree with that header replaced by the file given (e.g. `git show REV:src/cuda/<header> >
# dev/ab_old.cuh` first). "new" gets the float64 check and compute-sanitizer memcheck +
# racecheck; then bench64 / bench128 alternates new / old for ROUNDS rounds (each also times an
# older kernel, unchanged in both builds: a yardstick for clock drift).
# Usage (repo root, on the GPU machine): bash dev/cuda/bwd_ab.sh 64|128 OLD_HEADER [ROUNDS]
# [OLD_OTHER_HEADER] (AB_CHECKS= to time only). OLD_OTHER_HEADER replaces the other head dim's
# header in the "old" build too: needed when the change touched both (bwd_wgmma64p_sm90.cuh
# includes bwd_wgmma_sm90.cuh). OLD_HEADER may also be a directory: each file in it replaces the
# src/cuda file of the same name in the "old" build (e.g. `git show REV:src/cuda/X > DIR/X`).
set -u
D=$1
OLD=$2
ROUNDS=${3:-2}
OTHER=${4:-}
if [ "$D" = 64 ]; then
    header=bwd_wgmma64p_sm90.cuh other=bwd_wgmma_sm90.cuh dir=build/dev64 flags="" bench=bench64
    # run_device_bwd.sh's exit status is its summary grep's, not the checks'
    bash dev/cuda/run_device_bwd.sh build64 ${AB_CHECKS-check64 sanitize64}
else
    header=bwd_wgmma_sm90.cuh other=bwd_wgmma64p_sm90.cuh dir=build/dev flags="-DBL_BWD_WITH_MMA_VARIANT -I dev/cuda" bench=bench128
    bash dev/cuda/run_device_bwd.sh build ${AB_CHECKS-check sanitize}
fi
[ -x $dir/attn_bwd ] || exit 1
old=build/ab_old$D
rm -rf $old && mkdir -p $old && cp -r src/cuda $old/cuda
if [ -d "$OLD" ]; then cp "$OLD"/* $old/cuda/; else cp "$OLD" $old/cuda/$header; fi
[ -z "$OTHER" ] || cp "$OTHER" $old/cuda/$other
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr \
    $flags -I include -I src -I $old/cuda -c $old/cuda/attn_bwd_sm90.cu -o $old/attn_bwd_sm90.o || exit 1
objs=$(ls $dir/*.o | grep -v attn_bwd_sm90.o)
nvcc -gencode=arch=compute_90a,code=sm_90a -o $old/attn_bwd $objs $old/attn_bwd_sm90.o || exit 1
for r in $(seq 1 "$ROUNDS"); do
    for v in new old; do
        bin=$dir/attn_bwd; [ "$v" = old ] && bin=$old/attn_bwd
        echo "==== $bench round $r: $v"; timeout 120 "$bin" $bench 2>&1 | tail -7
    done
done
