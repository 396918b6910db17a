#!/usr/bin/env bash
# One device call for the backward: build the checker, check correctness against the float64 CPU
# reference, compute-sanitizer (memcheck, racecheck) on small shapes, time BackLite and the SDPA
# peers. Logs go to $OUT (bwd-*.txt). Usage (repo root): bash dev/cuda/run_device_bwd.sh [steps]
# steps: any of build check sanitize bench bench128 ncu ncu64 sdpa (default: all but ncu, ncu64
# and bench128).
# Head dim 64 (shipped: version 3, bwd_wgmma64p_sm90.cuh; version 1 = bwd_wgmma_sm90.cuh at
# D = 64 for comparison): steps build64 check64 sanitize64 bench64 sdpa64 build build/dev64 without
# the mma.sync kernel, check both kernels on D = 64 cases, time them, time SDPA at the same
# shapes; they print to stdout only:
#   bash dev/cuda/run_device_bwd.sh build64 check64 sanitize64 bench64 sdpa64 > "$OUT/bwd64.txt" 2>&1
set -u
OUT=${OUT:-out}
mkdir -p "$OUT" build/dev
STEPS=${*:-build check sanitize bench sdpa}
NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr -DBL_BWD_WITH_MMA_VARIANT -I include -I src -I src/cuda -I dev/cuda"
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has build; then
  (nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvcc --version | tail -1) > "$OUT/bwd-env.txt" 2>&1
  pids=()
  for f in dev/cuda/attn_bwd.cu src/cuda/attn_bwd_sm90.cu src/cuda/select_sm90.cu src/cuda/bwd_lists_sm90.cu src/cuda/bwd_prepost_sm90.cu; do
    nvcc $NVFLAGS -Xptxas=-v,--warn-on-spills -c "$f" -o "build/dev/$(basename "$f" .cu).o" > "build/dev/$(basename "$f" .cu).log" 2>&1 &
    pids+=($!)
  done
  gcc -O2 -I include -I src -c src/select.c -o build/dev/select.o && gcc -O2 -I include -I src -c src/error.c -o build/dev/error.o
  for p in "${pids[@]}"; do wait "$p" || { cat build/dev/*.log; exit 1; }; done
  grep -hE "registers|spill" build/dev/attn_bwd_sm90.log | sort | uniq -c > "$OUT/bwd-ptxas.txt"
  nvcc -gencode=arch=compute_90a,code=sm_90a -o build/dev/attn_bwd build/dev/*.o || exit 1
  cuobjdump --dump-sass build/dev/attn_bwd_sm90.o | grep -cE "HMMA" >> "$OUT/bwd-ptxas.txt"
fi
if has build64; then
  mkdir -p build/dev64
  F64="-gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr -I include -I src -I src/cuda"
  pids=()
  for f in dev/cuda/attn_bwd.cu src/cuda/attn_bwd_sm90.cu src/cuda/select_sm90.cu src/cuda/bwd_lists_sm90.cu src/cuda/bwd_prepost_sm90.cu; do
    nvcc $F64 -Xptxas=-v,--warn-on-spills -c "$f" -o "build/dev64/$(basename "$f" .cu).o" > "build/dev64/$(basename "$f" .cu).log" 2>&1 &
    pids+=($!)
  done
  gcc -O2 -I include -I src -c src/select.c -o build/dev64/select.o && gcc -O2 -I include -I src -c src/error.c -o build/dev64/error.o
  for p in "${pids[@]}"; do wait "$p" || { cat build/dev64/*.log; exit 1; }; done
  nvcc -gencode=arch=compute_90a,code=sm_90a -o build/dev64/attn_bwd build/dev64/*.o || exit 1
  echo "==== build64: ptxas (main kernels)"
  grep -A3 -E "Compiling entry function .*bwd_wgmma" build/dev64/attn_bwd_sm90.log | grep -E "entry|registers|spill"
  cuobjdump --dump-sass build/dev64/attn_bwd_sm90.o | awk '/Function :/{f=$3} /HGMMA/{h[f]++} /RED/{r[f]++} /STL|LDL/{l[f]++} END{for (k in h) if (k ~ /wgmma64/) print k ": HGMMA " h[k] ", RED " r[k]+0 ", local " l[k]+0}'
fi
if has bench128; then
  echo "==== bench128"; timeout 90 ./build/dev/attn_bwd bench128 2>&1; echo "bench128 rc=$?"
fi
if has check64; then
  echo "==== check64"; timeout 60 ./build/dev64/attn_bwd check64 2>&1; echo "check64 rc=$?"
fi
if has sanitize64; then
  echo "==== sanitize64"
  timeout 30 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/dev64/attn_bwd small64 2>&1 | tail -8; echo "memcheck rc=${PIPESTATUS[0]}"
  timeout 40 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 ./build/dev64/attn_bwd small64 2>&1 | tail -8; echo "racecheck rc=${PIPESTATUS[0]}"
fi
if has bench64; then
  echo "==== bench64"; timeout 60 ./build/dev64/attn_bwd bench64 2>&1; echo "bench64 rc=$?"
fi
if has sdpa64; then
  echo "==== sdpa64 (FLASH = FlashAttention-2, cuDNN; bf16, backward only)"
  timeout 90 python3 - <<'PY' 2>&1 | grep -v Warning
import sys
sys.path.insert(0, "dev/cuda")
import sdpa_bwd_ref as r
from torch.nn.attention import SDPBackend
for b, s, h, d, causal in [(4, 4096, 16, 64, False), (1, 16384, 16, 64, False),
                           (1, 16384, 16, 64, True), (1, 32768, 16, 64, False)]:
    flops = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            ms = r.time_backward(be, b, s, h, d, causal, 3 if s >= 32768 else 7)
            print(f"sdpa-{name} B{b} S{s} H{h} D{d} {'causal' if causal else 'full  '}: {ms:8.3f} ms  {flops / ms * 1e-9:6.1f} TFLOP/s")
        except Exception as e:
            print(f"sdpa-{name} B{b} S{s} H{h} D{d}: unavailable ({type(e).__name__})")
PY
fi
if has check; then
  timeout 120 ./build/dev/attn_bwd check 2>&1 | tee "$OUT/bwd-check.txt"
fi
if has sanitize; then
  { timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/dev/attn_bwd small; echo "memcheck rc=$?";
    timeout 90 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 ./build/dev/attn_bwd small; echo "racecheck rc=$?"; } 2>&1 | tail -40 | tee "$OUT/bwd-sanitize.txt"
fi
if has bench; then
  timeout 120 ./build/dev/attn_bwd bench 2>&1 | tee "$OUT/bwd-bench.txt"
fi
if has ncu; then
  # One launch of the wgmma main kernel (dense, S=8192, H=16, D=128, bf16): where its time goes.
  timeout 150 ncu --clock-control none -k regex:bwd_wgmma_kernel -s 2 -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    ./build/dev/attn_bwd one > "$OUT/bwd-ncu.txt" 2>&1; echo "ncu rc=$?"
  grep -E "Duration|Throughput|Pipe|Issue|Stall|stall|Warp Cycles|Registers|Shared Memory|Bank|Achieved|Eligible|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/bwd-ncu.txt" | head -60
fi
if has ncu64; then
  # One launch of the shipped D = 64 kernel (dense, S=8192, H=16): stall reasons and the SASS
  # lines where warps wait most.
  timeout 150 ncu --clock-control none -k regex:bwd_wgmma64p_kernel -s 2 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section SourceCounters \
    ./build/dev/attn_bwd one64 > "$OUT/bwd-ncu64.txt" 2>&1; echo "ncu64 rc=$?"
  grep -E "Duration|Throughput|Pipe|Issue|Stall|stall|Warp Cycles|Eligible|L2 Hit|Mem Busy" "$OUT/bwd-ncu64.txt" | head -40
fi
if has sdpa; then
  timeout 90 python3 dev/cuda/sdpa_bwd_ref.py 2>&1 | grep -v Warning | tee "$OUT/bwd-sdpa.txt"
fi
echo "==== summary"; cat "$OUT/bwd-ptxas.txt" 2>/dev/null
grep -hE "FAIL|failed|rc=|TFLOP|x dense" "$OUT"/bwd-check.txt "$OUT"/bwd-sanitize.txt "$OUT"/bwd-bench.txt "$OUT"/bwd-sdpa.txt 2>/dev/null
