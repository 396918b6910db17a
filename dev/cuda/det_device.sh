#!/usr/bin/env bash
# det_device.sh -- dev/cuda/wip/bwd-deterministic.patch (a deterministic head-dim-128 CUDA backward
# for torch.use_deterministic_algorithms) checked and timed in one device call.
#
# Here (no GPU needed; ~4 min on 2 cores): HEAD + the patch's library, packed for one carry:
#   bash dev/cuda/det_device.sh pack              # build/pack/det.tar.xz (det.so, ~5 MB)
# On the device (carry ["build/pack/det.tar.xz"]), ~5 minutes, each command under a time limit:
#   bash dev/cuda/det_device.sh check             # the patch applied to this copy of the tree
#                                                 # (its Python is ABI 2, as det.so); tests/gpu;
#                                                 # memcheck / racecheck on pool_sanitize
#                                                 # --deterministic; det_backward_ab.py
# Results go to $OUT (default out/).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
PATCH=dev/cuda/wip/bwd-deterministic.patch
step=${1:?usage: det_device.sh pack|check}

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
    mkdir -p "$OUT" build/det && tar -xJf build/pack/det.tar.xz -C build/det
    # (this copy only: the Python side and the tests of ABI 2; not the docs, which later commits
    # may have moved)
    git apply --exclude='*.md' "$PATCH"
    export PYTHONPATH=$PWD BACK_LITE_LIBRARY=$PWD/build/det/det.so
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
    timeout -k 5 200 python3 -m pytest -q tests/gpu -p no:cacheprovider \
        > "$OUT/det-gpu-pytest.txt" 2>&1 || true
    tail -3 "$OUT/det-gpu-pytest.txt"
    for tool in memcheck:60 racecheck:120; do
        timeout -k 5 "${tool#*:}" compute-sanitizer --tool "${tool%:*}" \
            python3 dev/cuda/pool_sanitize.py --deterministic > "$OUT/det-${tool%:*}.txt" 2>&1 || true
        tail -2 "$OUT/det-${tool%:*}.txt"
    done
    timeout -k 5 150 python3 dev/cuda/det_backward_ab.py > "$OUT/det-ab.txt" 2>&1 || true
    cat "$OUT/det-ab.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
