#!/usr/bin/env bash
# dq16_probe_device.sh -- the dQ16 probe (dev/cuda/wip/bwd-dq16-acc-probe.patch: a 16-bit dq
# accumulator where version 10 runs in its DIRECT form) checked and timed in device calls.
#
# Here (no GPU needed; ~5 min on 2 cores), the four libraries, packed for one carry (~10 MB):
#   bash dev/cuda/dq16_probe_device.sh build
# On the device (carry ["build/pack/dq16.tar.xz"]), one step per call (each well under 600 s):
#   bash dev/cuda/dq16_probe_device.sh check        # tests/gpu on p1; dq16_probe_check on all
#                                                   # four; memcheck + racecheck on p1
#   bash dev/cuda/dq16_probe_device.sh time         # timelines without a causal mask
#   bash dev/cuda/dq16_probe_device.sh time causal  # and with one (2 rounds each)
# Libraries: la = the working tree as it is; p1 = the patch with -DBL_BWD_DQ16_PROBE=1 (dq and
# the fp32 accumulator both zeroed: correct whatever kernel is picked); p2 = with =2 (only dq
# zeroed: the probe's real cost, correct only where the DIRECT form runs -- masked head-dim-128
# calls averaging <= 4.5 entries a row tile, bl_bwd_dq_direct_chosen); p3 = p2 with the DIRECT
# gate at 16.5 entries (-DBL_BWD_DQ16_MAX_X2=33: the 10 % rows, causal 25 %); p4 = probe 3 (each
# preprocess CTA zeroes the kind the device picks once the totals are final, both before) with
# that gate, packed apart (build/pack/dq16b.tar.xz): correct whatever is picked (run once:
# bench/results/bwd-s97-dq16-probe3.txt).
# Results go to $OUT (default out/). Measured this way: bench/results/bwd-s97-dq16-probe-*.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
step=${1:?usage: dq16_probe_device.sh build|check|time}

build_lib() {  # NAME TREE [CUDA_FLAGS]: TREE's library (release flags) into build/ab/NAME.so
    local args=(-S "$2" -B "$2/b" -DCMAKE_BUILD_TYPE=Release -DBL_BUILD_TESTS=OFF)
    [ -n "${3:-}" ] && args+=("-DCMAKE_CUDA_FLAGS=$3")
    cmake "${args[@]}" > "$2/cmake.log" 2>&1
    cmake --build "$2/b" -j "$(nproc)" > "$2/build.log" 2>&1
    cp "$(find "$2/b" -name libbacklite.so | head -1)" "build/ab/$1.so"
}

case $step in
build)
    rm -rf build/dq16 && mkdir -p build/dq16/base build/dq16/probe build/ab build/pack
    git ls-files -z CMakeLists.txt pyproject.toml src include | tar --null -T - -c |
        tar -x -C build/dq16/base
    cp -r build/dq16/base/. build/dq16/probe/
    (cd build/dq16/probe && patch -s -p1 < ../../../dev/cuda/wip/bwd-dq16-acc-probe.patch)
    build_lib la build/dq16/base
    cp -r build/dq16/probe build/dq16/probe2
    cp -r build/dq16/probe build/dq16/probe3
    build_lib p1 build/dq16/probe "-DBL_BWD_DQ16_PROBE=1"
    build_lib p2 build/dq16/probe2 "-DBL_BWD_DQ16_PROBE=2"
    build_lib p3 build/dq16/probe3 "-DBL_BWD_DQ16_PROBE=2 -DBL_BWD_DQ16_MAX_X2=33"
    tar -cJf build/pack/dq16.tar.xz -C build/ab la.so p1.so p2.so p3.so
    # p4: the zeros' kind decided on the device (probe 3), the gate at 16.5 entries
    cp -r build/dq16/probe build/dq16/probe4
    build_lib p4 build/dq16/probe4 "-DBL_BWD_DQ16_PROBE=3 -DBL_BWD_DQ16_MAX_X2=33"
    tar -cJf build/pack/dq16b.tar.xz -C build/ab la.so p4.so
    ls -la build/pack/dq16.tar.xz
    ;;
check)
    mkdir -p "$OUT" build/ab && tar -xJf build/pack/dq16.tar.xz -C build/ab
    export PYTHONPATH=$PWD
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
    BACK_LITE_LIBRARY=$PWD/build/ab/p1.so python3 -m pytest -q tests/gpu -p no:cacheprovider \
        > "$OUT/p1-gpu-pytest.txt" 2>&1 || true
    tail -3 "$OUT/p1-gpu-pytest.txt"
    for n in la p1 p2 p3; do
        gate=4.5
        [ $n = p3 ] && gate=16.5
        BACK_LITE_LIBRARY=$PWD/build/ab/$n.so python3 dev/cuda/dq16_probe_check.py \
            --direct-max $gate > "$OUT/check-$n.txt" 2>&1 || true
        tail -1 "$OUT/check-$n.txt"
    done
    for tool in memcheck racecheck; do
        BACK_LITE_LIBRARY=$PWD/build/ab/p1.so compute-sanitizer --tool $tool \
            python3 dev/cuda/pool_sanitize.py --cases 1,2,6,7 > "$OUT/p1-$tool.txt" 2>&1 || true
        tail -2 "$OUT/p1-$tool.txt"
    done
    ;;
time)
    mkdir -p "$OUT" build/ab && tar -xJf build/pack/dq16.tar.xz -C build/ab
    # 3 % and video negl 0.5 (<= 4.5 entries a row tile: DIRECT in p1-p3), 10 % (12.8 entries
    # without a causal mask, 6.5 with one) and causal 25 % (16): DIRECT in p3 only
    cfg="1,16384,16,128|0.03,0.1,negl:0.5"
    [ "${2:-}" = causal ] && cfg="1,16384,16,128 --causal|0.03,0.1,0.25"
    NEW_LIB=build/ab/p3.so OUT=$OUT bash dev/cuda/lib_timeline_ab.sh \
        la=build/ab/la.so,p1=build/ab/p1.so,p2=build/ab/p2.so "$cfg" x 2
    grep span "$OUT/timelines-offsets.txt" | sort -k3,3 -k4,5 | cut -c1-175 || true
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
