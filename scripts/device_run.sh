#!/usr/bin/env bash
# One call on the lent H200: build the library with its CUDA backend, then run the GPU tests, the
# demo on the GPU, and (mode "bench") the benchmark. Logs go to $OUT (or ./out) for the caller.
#
#   bash scripts/device_run.sh check    build + tests/gpu + demo + a CPU pytest pass under torch 2.x
#   bash scripts/device_run.sh bench    build + bench/bench_attn.py (JSON + table)
#   bash scripts/device_run.sh final    build + tests/gpu + demo + bench (one machine start)
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
out=${OUT:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/env.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' >> "$out/env.txt" 2>&1

echo "== build"
if ! { cmake -S . -B build -G Ninja -DBL_BUILD_TESTS=OFF && cmake --build build -j 16; } \
        > "$out/build.txt" 2>&1; then
    tail -50 "$out/build.txt"; exit 1
fi
export BACK_LITE_LIBRARY=$PWD/build/libbacklite.so PYTHONPATH=$PWD

if [ "$mode" = check ] || [ "$mode" = final ]; then
    echo "== GPU tests"
    python3 -m pytest -q -rs tests/gpu 2>&1 | tee "$out/gpu-pytest.txt" | tail -25
    echo "== demo (GPU)"
    timeout 240 python3 -m back_lite.demo 2>&1 | tee "$out/demo.txt" | tail -30
fi
if [ "$mode" = check ]; then
    echo "== CPU tests under the device's torch (parallel)"
    timeout 200 python3 -m pytest -q -x -n 8 tests --ignore=tests/gpu 2>&1 \
        | tee "$out/cpu-pytest.txt" | tail -8
fi
if [ "$mode" = bench ] || [ "$mode" = final ]; then
    echo "== bench"
    timeout 560 python3 bench/bench_attn.py --out "$out/bench.json" ${BENCH_ARGS:-} 2>&1 \
        | tee "$out/bench.txt" | tail -60
fi
