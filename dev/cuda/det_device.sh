#!/usr/bin/env bash
# det_device.sh -- dev/cuda/wip/bwd-deterministic.patch (a deterministic CUDA backward, head dims
# 128 and 64, for torch.use_deterministic_algorithms) checked and timed in two device calls.
#
# Here (no GPU needed; ~40 s on 2 cores): HEAD + the patch's library, packed for one carry:
#   bash dev/cuda/det_device.sh pack              # build/pack/det.tar.xz (det.so, ~2.5 MB)
# On the device (carry ["build/pack/det.tar.xz"]), two calls of at most 8 and 3 minutes (each
# command under a time limit, each call under the 600 s limit):
#   bash dev/cuda/det_device.sh check             # the patch applied to this copy of the tree
#                                                 # (its Python is ABI 2, as det.so); tests/gpu;
#                                                 # memcheck / racecheck on pool_sanitize
#                                                 # --deterministic (both head dims, split too)
#   bash dev/cuda/det_device.sh time              # det_backward_ab.py: the two forms' times
# Results go to $OUT (default out/).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
PATCH=dev/cuda/wip/bwd-deterministic.patch
step=${1:?usage: det_device.sh pack|check|time}

unpack() {  # the library, and the patch's Python side and tests in this copy of the tree
    mkdir -p "$OUT" build/det && tar -xJf build/pack/det.tar.xz -C build/det
    # (not the docs, which later commits may have moved). A later call may find it applied, or
    # the tracked files copied afresh beside the file the patch added.
    local x=(--exclude='*.md' "$PATCH")
    if ! git apply --reverse --check "${x[@]}" 2>/dev/null; then
        rm -f dev/cuda/det_backward_ab.py
        git apply "${x[@]}"
    fi
    export PYTHONPATH=$PWD BACK_LITE_LIBRARY=$PWD/build/det/det.so
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
}

case $step in
pack)
    rm -rf build/det && mkdir -p build/det/tree build/pack
    git archive HEAD CMakeLists.txt pyproject.toml src include | tar -x -C build/det/tree
    git apply --directory=build/det/tree --include='build/det/tree/src/*' \
        --include='build/det/tree/include/*' "$PATCH"
    cmake -S build/det/tree -B build/det/b -DCMAKE_BUILD_TYPE=Release -DBL_BUILD_TESTS=OFF \
        > build/det/cmake.log 2>&1
    cmake --build build/det/b -j "$(nproc)" > build/det/build.log 2>&1
    cp "$(find build/det/b -name libbacklite.so | head -1)" build/det/det.so
    tar -cJf build/pack/det.tar.xz -C build/det det.so
    ls -la build/pack/det.tar.xz
    ;;
check)
    unpack
    # (tests/gpu took 65 s in s98; the patch adds 73 small tests and one of 3.3M keys)
    timeout -k 5 260 python3 -m pytest -q tests/gpu -p no:cacheprovider \
        > "$OUT/det-gpu-pytest.txt" 2>&1 || true
    tail -3 "$OUT/det-gpu-pytest.txt"
    # head dim 128 masked and selected, 64 masked, split calls at both (pool_sanitize's CASES)
    for tool in memcheck:100:1,2,4,7,8 racecheck:120:2,4; do
        IFS=: read -r name limit cases <<< "$tool"
        timeout -k 5 "$limit" compute-sanitizer --tool "$name" python3 dev/cuda/pool_sanitize.py \
            --deterministic --cases "$cases" > "$OUT/det-$name.txt" 2>&1 || true
        tail -2 "$OUT/det-$name.txt"
    done
    ;;
time)
    unpack
    timeout -k 5 170 python3 dev/cuda/det_backward_ab.py > "$OUT/det-ab.txt" 2>&1 || true
    cat "$OUT/det-ab.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
