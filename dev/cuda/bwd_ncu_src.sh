#!/usr/bin/env bash
# bwd_ncu_src.sh -- where the backward's warps wait, per SASS instruction, and what the cuDNN
# backward kernels it is measured against look like (grid, block, registers, shared memory,
# throughput). One device call; needs build/dev from `bash dev/cuda/run_device_bwd.sh build`
# (carry it: carry=["build/dev"]).
# Usage (repo root, on the GPU machine): bash dev/cuda/bwd_ncu_src.sh [steps]
# steps: src128 src64 src80 src80m src80p src80cd src80cl src80cp src128s (ncu source page,
# SASS with stall samples per instruction, as $OUT/src-*.csv.gz; summarise with
# dev/cuda/ncu_src_summary.py), details (the D = 128 kernel's memory / scheduler / warp-state
# sections), cudnn (every kernel of an SDPA cuDNN backward at 1 x 8192 x 16 x 128). Default:
# src128 src64 details cudnn.
set -u
O=${OUT:-/tmp/bwd_ncu_src}
mkdir -p "$O"
STEPS=${*:-src128 src64 details cudnn}
BIN=${BIN:-./build/dev/attn_bwd}  # or a build/sedvar/NAME/attn_bwd (carry build/sedvar)
has() { [[ " $STEPS " == *" $1 "* ]]; }
for mode in one one64; do
    step=src128 k="bwd_(wgmma|ws128)_kernel"
    [ $mode = one64 ] && step=src64 k="bwd_(wgmma64p|ws64)_kernel"
    has $step || continue
    # launch 3 of the run: caches and clocks warm
    timeout 200 ncu --clock-control none -k regex:$k -s 2 -c 1 --section SourceCounters \
        --section WarpStateStats --page source --print-source sass --csv \
        "$BIN" $mode > "$O/src-$mode.csv" 2>"$O/src-$mode.err"
    echo "ncu $mode rc=$? $(wc -c < "$O/src-$mode.csv") bytes"
    gzip -f "$O/src-$mode.csv"
done
# Version 11 (80 rows), dense against masked (template ENTRIES: Li0E dense, Li2E aligned
# masked entries, Li3E packed ones; Lb0E: no causal mask). src80: `onemask 1.0`'s dense call
# (8k x 16 x 128); src80m: `onemask 0.96`, a random mask keeping 96 % (aligned entries picked);
# src80p: `sparse1 0.5`, 16k x 16 x 128 keeping 50 % (packed entries picked; how
# bench/results/bwd-s22.txt run 8 was made). With a causal mask (Lb1E): src80cd, `onemask 1.0
# causal` (a mask keeping every allowed tile: the dense kernel, since the thirty-first session);
# src80cl, `onemask 0.99 causal` (aligned entries, LISTS); src80cp, `sparsec 0.5` (packed
# entries, 16k x 16 first). Launch 3 of each.
for step in src80 src80m src80p src80cd src80cl src80cp; do
    has $step || continue
    case $step in
        src80) k=Lb0ELi0E; args="onemask 1.0" ;;
        src80m) k=Lb0ELi2E; args="onemask 0.96" ;;
        src80p) k=Lb0ELi3E; args="sparse1 0.5" ;;
        src80cd) k=Lb1ELi0E; args="onemask 1.0 causal" ;;
        src80cl) k=Lb1ELi1E; args="onemask 0.99 causal" ;;
        src80cp) k=Lb1ELi3E; args="sparsec 0.5" ;;
    esac
    # shellcheck disable=SC2086  # args is "mode keep"
    timeout 200 ncu --clock-control none --kernel-name-base mangled \
        -k regex:"bwd_ws128r80_kernelI13__nv_bfloat16${k}" -s 2 -c 1 --section SourceCounters \
        --section WarpStateStats --page source --print-source sass --csv \
        "$BIN" $args > "$O/src-$step.csv" 2>"$O/src-$step.err"
    echo "ncu $step rc=$? $(wc -c < "$O/src-$step.csv") bytes"
    gzip -f "$O/src-$step.csv"
done
# Version 10 (64 rows) on a 1 %-kept call (16k x 16 x 128 random mask, `sparse1 0.01`): where a
# sparse call's per-column time goes. Launch 3 of the kernel.
if has src128s; then
    timeout 200 ncu --clock-control none -k regex:"bwd_ws128_kernel" -s 2 -c 1 --section SourceCounters \
        --section WarpStateStats --page source --print-source sass --csv \
        "$BIN" sparse1 0.01 > "$O/src-src128s.csv" 2>"$O/src-src128s.err"
    echo "ncu src128s rc=$? $(wc -c < "$O/src-src128s.csv") bytes"
    gzip -f "$O/src-src128s.csv"
fi
if has details; then
    timeout 120 ncu --clock-control none -k regex:"bwd_(wgmma|ws128)_kernel" -s 2 -c 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \
        --section WarpStateStats --section ComputeWorkloadAnalysis "$BIN" one > "$O/bwd128-details.txt" 2>&1
    echo "ncu details rc=$?"
fi
if has cudnn; then
    cat > /tmp/cudnn_bwd_once.py <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
b, h, s, d = 1, 16, 8192, 128
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    out = F.scaled_dot_product_attention(q, k, v)
    for i in range(2):
        torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
    torch.cuda.synchronize()
PY
    # every kernel (randn, forward, two backwards): names, launch shapes, duration, throughput
    timeout 200 ncu --clock-control none -c 40 --section LaunchStats --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section Occupancy python3 /tmp/cudnn_bwd_once.py \
        > "$O/cudnn-bwd-ncu.txt" 2>&1
    echo "ncu cudnn rc=$?"
    grep -E "^  [a-zA-Z_].*Context|Duration|Block Size|Grid Size|Registers Per|Dynamic Shared|Issue Slots|Compute \(SM\) Th" "$O/cudnn-bwd-ncu.txt" | cut -c1-160 | tail -60
fi
