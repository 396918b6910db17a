#!/usr/bin/env bash
# bwd64_ab.sh -- A/B of the head-dim-64 backward kernel in one device call: the checker
# (dev/cuda/attn_bwd.cu) built twice, "new" = the working tree, "old" = the working tree with
# src/cuda/bwd_wgmma64p_sm90.cuh replaced by the file given (e.g. `git show
# REV:src/cuda/bwd_wgmma64p_sm90.cuh > dev/ab64_old.cuh` first). "new" gets check64 and
# compute-sanitizer memcheck + racecheck; then bench64 alternates new / old for ROUNDS rounds (each
# bench64 also times version 1, unchanged in both builds: a yardstick for clock drift).
# Usage (repo root, on the GPU machine): bash dev/cuda/bwd64_ab.sh OLD_HEADER [ROUNDS] > "$OUT/x.txt"
set -u
OLD=$1
ROUNDS=${2:-2}
# (AB_CHECKS= to time only; run_device_bwd.sh's exit status is its summary grep's, not the checks')
bash dev/cuda/run_device_bwd.sh build64 ${AB_CHECKS-check64 sanitize64}
[ -x build/dev64/attn_bwd ] || exit 1
rm -rf build/ab64_old && mkdir -p build/ab64_old && cp -r src/cuda build/ab64_old/cuda
cp "$OLD" build/ab64_old/cuda/bwd_wgmma64p_sm90.cuh
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr \
    -I include -I src -I build/ab64_old/cuda -c build/ab64_old/cuda/attn_bwd_sm90.cu \
    -o build/ab64_old/attn_bwd_sm90.o || exit 1
objs=$(ls build/dev64/*.o | grep -v attn_bwd_sm90.o)
nvcc -gencode=arch=compute_90a,code=sm_90a -o build/ab64_old/attn_bwd $objs build/ab64_old/attn_bwd_sm90.o || exit 1
for r in $(seq 1 "$ROUNDS"); do
    for v in new old; do
        bin=build/dev64/attn_bwd; [ "$v" = old ] && bin=build/ab64_old/attn_bwd
        echo "==== bench64 round $r: $v"; timeout 90 "$bin" bench64 2>&1 | tail -7
    done
done
