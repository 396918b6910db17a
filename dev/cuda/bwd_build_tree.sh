#!/usr/bin/env bash
# bwd_build_tree.sh -- build the backward dev checker (dev/cuda/attn_bwd.cu with the library's
# backward sources) entirely from one source tree into build/sedvar/NAME/attn_bwd, here (no GPU
# needed), so that two commits can be timed against each other on the device even when they
# differ in shared structs (workspace layout, kernel parameters). Run from the repository root:
#   git archive REV src include dev | tar -x -C /tmp/old
#   bash dev/cuda/bwd_build_tree.sh old /tmp/old && bash dev/cuda/bwd_build_tree.sh base .
# then on the device (carry ["build/sedvar"]): bash dev/cuda/bwd_compare.sh "base old" ...
# EXTRA_NVCC adds nvcc flags, e.g. EXTRA_NVCC=-DBL_BWD_TIMELINE for `attn_bwd timeline64`.
set -euo pipefail
name=$1 tree=$2
out=build/sedvar/$name
rm -rf "$out" && mkdir -p "$out/o"
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr -DBL_BWD_WITH_MMA_VARIANT ${EXTRA_NVCC:-}"
INC="-I $tree/include -I $tree/src -I $tree/src/cuda -I $tree/dev/cuda"
pids=()
for f in dev/cuda/attn_bwd.cu src/cuda/attn_bwd_sm90.cu src/cuda/select_sm90.cu src/cuda/bwd_lists_sm90.cu src/cuda/bwd_prepost_sm90.cu src/cuda/cuda_supports.cu; do
    $NV $INC -Xptxas=-v -c "$tree/$f" -o "$out/o/$(basename "$f" .cu).o" > "$out/o/$(basename "$f" .cu).log" 2>&1 &
    pids+=($!)
done
gcc -O2 -I "$tree/include" -I "$tree/src" -c "$tree/src/select.c" -o "$out/o/select.o"
gcc -O2 -I "$tree/include" -I "$tree/src" -c "$tree/src/error.c" -o "$out/o/error.o"
for p in "${pids[@]}"; do wait "$p" || { cat "$out"/o/*.log; exit 1; }; done
nvcc -gencode=arch=compute_90a,code=sm_90a -o "$out/attn_bwd" "$out"/o/*.o
echo "$name: $(grep -c C75 "$out/o/attn_bwd_sm90.log" || true) ptxas C75xx notes"
rm -f "$out"/o/*.o
