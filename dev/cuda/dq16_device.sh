#!/usr/bin/env bash
# dq16_device.sh -- dev/cuda/wip/bwd-dq16-light-tiles.patch (version 10's DIRECT form with 16-bit
# dq for its light row tiles, bl_bwd_dq16_tile, and the preprocess's zero CTAs) and on top of it
# bwd-dq16-light-tiles-hd64.patch (the same for version 6, head dim 64) against the library they
# apply to, checked and timed in device calls; with the default patches also `pick`, the two and
# bwd-dq16-light-tiles-hd64-picked.patch (version 6's 16-bit form only where the device picks it).
#
# Here (no GPU needed; ~4-5 min on 2 cores): the libraries, packed for one carry (~15 MB):
#   bash dev/cuda/dq16_device.sh pack [PATCH...]  # la = HEAD's library, new = HEAD + the
#                                                 # patches in order (default the two above;
#                                                 # the first form, v1, is in git history), and with
#                                                 # their dev switches f3k / f12k (the first zero
#                                                 # CTA after 3072 / 12288 row CTAs) and cnt (the
#                                                 # zero CTAs counted by kind); and pick;
#                                                 # EXTRA="v2=P.patch ..." builds HEAD + P as v2;
#                                                 # v3c (BL_PP_DQ16Z_MIN_CTAS): c6 too;
#                                                 # v4 (PP_ZERO_TILES): mid, z16 and cnt
# On the device (carry ["build/pack/dq16.tar.xz"]), each step well under 600 s:
#   bash dev/cuda/dq16_device.sh check [PATCH...] # tests/gpu with the patches' tests on new;
#                                                 # dq16_probe_check on la and new; memcheck and
#                                                 # racecheck on new (pool_sanitize cases 1, 2, 4,
#                                                 # 6, 7, 9: head dim 128 and 64, masked);
#                                                 # LIB=pick: the same on pick
#   bash dev/cuda/dq16_device.sh time             # timelines at 16k x 16 x 128, causal and not, 2
#                                                 # rounds, la / new and the pack's others (f3k /
#                                                 # f12k, EXTRA's); cnt's counts
#   bash dev/cuda/dq16_device.sh time64           # the same at 16k x 16 x 64, la / new / pick;
#                                                 # dev/cuda/return_ctas_probe.cu
#   bash dev/cuda/dq16_device.sh bench            # bench/bench_attn.py --no-flex on la, new, pick
# v4 is the library's since the hundred-and-sixth session (la = HEAD has it; the patch is in git
# history: git show e2be510:dev/cuda/wip/bwd-dq16-light-tiles-v4.patch), so the default patches and
# v2 / v3* apply to their own base commits only.
# Results go to $OUT (default out/). Measured this way: bench/results/bwd-s98-dq16.txt (v1;
# la and new only, check and time).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
step=${1:?usage: dq16_device.sh pack|check|time|time64|bench [PATCH...]}
shift
PATCHES=("$@")
PICK_PATCH=
if [ ${#PATCHES[@]} -eq 0 ]; then
    PATCHES=(dev/cuda/wip/bwd-dq16-light-tiles.patch dev/cuda/wip/bwd-dq16-light-tiles-hd64.patch)
    PICK_PATCH=dev/cuda/wip/bwd-dq16-light-tiles-hd64-picked.patch
fi
LIB=${LIB:-new}  # the library `check` tests

build_lib() {  # NAME TREE [CUDA_FLAGS]: TREE's library (release flags) into build/ab/NAME.so
    local args=(-S "$2" -B "$2/b" -DCMAKE_BUILD_TYPE=Release -DBL_BUILD_TESTS=OFF)
    [ -n "${3:-}" ] && args+=("-DCMAKE_CUDA_FLAGS=$3")
    cmake "${args[@]}" > "$2/cmake.log" 2>&1
    cmake --build "$2/b" -j "$(nproc)" > "$2/build.log" 2>&1
    cp "$(find "$2/b" -name libbacklite.so | head -1)" "build/ab/$1.so"
}
unpack() {  # (build/ab emptied first: a warm machine keeps the last call's libraries)
    rm -rf build/ab && mkdir -p "$OUT" build/ab && tar -xJf build/pack/dq16.tar.xz -C build/ab
    export PYTHONPATH=$PWD
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
}

# The zero CTAs (v2; v3: the preprocess's CTAs) by the kind of zeros they found (unknown: the
# pick not yet published), from the cnt build: zero_counts SHAPE FILE "[--causal ]--keeps K,K" ...
zero_counts() {
    local shape=$1 file=$2 c keep
    shift 2
    [ -f build/ab/cnt.so ] || return 0
    for c in "$@"; do
        for keep in $(echo "${c##*--keeps }" | tr , ' '); do
            echo "== $shape ${c%%--keeps*}keep $keep"
            BACK_LITE_LIBRARY=$PWD/build/ab/cnt.so timeout -k 5 25 \
                python3 dev/cuda/bwd_call_timeline.py \
                --shape "$shape" ${c%%--keeps*} --keeps "$keep" --calls 2 2>&1 |
                grep -E "bl (zero|preprocess) CTAs" | sort | uniq -c
        done
    done > "$OUT/$file" 2>&1 || true
    cat "$OUT/$file"
}

case $step in
pack)
    rm -rf build/dq16 && mkdir -p build/dq16/base build/dq16/new build/ab build/pack
    git archive HEAD CMakeLists.txt pyproject.toml src include | tar -x -C build/dq16/base
    cp -r build/dq16/base/. build/dq16/new/
    for p in "${PATCHES[@]}"; do
        git apply --directory=build/dq16/new --include='build/dq16/new/src/*' "$p"
    done
    if [ -n "$PICK_PATCH" ]; then  # (copied before new's build: no build tree in it)
        cp -r build/dq16/new build/dq16/pick
        git apply --directory=build/dq16/pick --include='build/dq16/pick/src/*' "$PICK_PATCH"
    fi
    build_lib la build/dq16/base
    build_lib new build/dq16/new
    libs=(la.so new.so)
    if [ -n "$PICK_PATCH" ]; then
        build_lib pick build/dq16/pick
        libs+=(pick.so)
    fi
    variants=()
    if grep -q PP_ZERO_TILES "${PATCHES[0]}"; then  # v4: zero CTAs at the end; mid = v2's place
        variants=(mid:-DBL_PP_ZERO_FIRST_ROWS=6144 z16:-DBL_PP_ZERO_TILES=16 cnt:-DBL_PP_ZERO_COUNTS)
    elif grep -q BL_PP_ZERO_COUNTS "${PATCHES[0]}"; then  # v2 (not in the first form, v1)
        variants=(f3k:-DBL_PP_ZERO_FIRST_ROWS=3072 f12k:-DBL_PP_ZERO_FIRST_ROWS=12288
                  cnt:-DBL_PP_ZERO_COUNTS)
    elif grep -q BL_PP_PICK_COUNTS "${PATCHES[0]}"; then  # v3: no zero CTAs
        variants=(cnt:-DBL_PP_PICK_COUNTS)
        # v3c: its preprocess at 6 CTAs an SM (no spills) as c6
        grep -q BL_PP_DQ16Z_MIN_CTAS "${PATCHES[0]}" && variants+=(c6:-DBL_PP_DQ16Z_MIN_CTAS=6)
    fi
    # EXTRA="NAME=PATCH ...": HEAD + PATCH built beside new as NAME (timed by `time`)
    for x in ${EXTRA:-}; do
        cp -r build/dq16/base "build/dq16/${x%%=*}" && rm -rf "build/dq16/${x%%=*}/b"
        git apply --directory="build/dq16/${x%%=*}" --include="build/dq16/${x%%=*}/src/*" "${x#*=}"
        build_lib "${x%%=*}" "build/dq16/${x%%=*}"
        libs+=("${x%%=*}.so")
    done
    if [ ${#variants[@]} -gt 0 ]; then
        for v in "${variants[@]}"; do
            cp -r build/dq16/new "build/dq16/${v%%:*}" && rm -rf "build/dq16/${v%%:*}/b"
            build_lib "${v%%:*}" "build/dq16/${v%%:*}" "${v#*:}"
            libs+=("${v%%:*}.so")
        done
    fi
    tar -cJf build/pack/dq16.tar.xz -C build/ab "${libs[@]}"
    ls -la build/pack/dq16.tar.xz
    ;;
check)
    unpack
    for p in "${PATCHES[@]}"; do  # the patches' tests (this copy of the tree only)
        git apply --include='tests/*' "$p"
    done
    # Each command under a time limit (tests/gpu took 65 s in s98, the whole step ~115 s; 580 s
    # in all, under the device call's 600; racecheck the most, case 9's 2520 columns being new to
    # it here): a kernel that hangs then costs its own step, and what the others wrote to $OUT
    # still comes back.
    BACK_LITE_LIBRARY=$PWD/build/ab/$LIB.so timeout -k 5 160 \
        python3 -m pytest -q tests/gpu -p no:cacheprovider > "$OUT/$LIB-gpu-pytest.txt" 2>&1 || true
    tail -3 "$OUT/$LIB-gpu-pytest.txt"
    for n in la $LIB; do
        BACK_LITE_LIBRARY=$PWD/build/ab/$n.so timeout -k 5 60 python3 dev/cuda/dq16_probe_check.py \
            --direct-max 16.5 > "$OUT/check-$n.txt" 2>&1 || true
        tail -1 "$OUT/check-$n.txt"
    done
    for tool in memcheck:90 racecheck:210; do
        BACK_LITE_LIBRARY=$PWD/build/ab/$LIB.so timeout -k 5 "${tool#*:}" \
            compute-sanitizer --tool "${tool%:*}" \
            python3 dev/cuda/pool_sanitize.py --cases 1,2,4,6,7,9 > "$OUT/$LIB-${tool%:*}.txt" 2>&1 || true
        tail -2 "$OUT/$LIB-${tool%:*}.txt"
    done
    ;;
time)
    unpack
    # 3 % (~1 entry a row tile) and video negl 0.5: DIRECT before and after; 10 % (12.8 entries
    # without a causal mask, 6.5 with one) and causal 25 % (16): DIRECT only after (16.5);
    # causal 50 %: an 80-row kernel in both, where the zeros' pick must cost nothing
    cfg="1,16384,16,128|0.03,0.1,negl:0.5;1,16384,16,128 --causal|0.03,0.1,0.25,0.5"
    others=la=build/ab/la.so
    for v in build/ab/*.so; do  # every library of the pack but new and cnt
        v=$(basename "$v" .so)
        case $v in la|new|cnt|pick) ;; *) others+=",$v=build/ab/$v.so" ;; esac
    done
    # (time limits as in check: the counts below still run if a library hangs here)
    NEW_LIB=build/ab/new.so OUT=$OUT timeout -k 5 380 \
        bash dev/cuda/lib_timeline_ab.sh "$others" "$cfg" x 2 || true
    grep span "$OUT/timelines-offsets.txt" | sort -k3,3 -k4,5 | cut -c1-175 || true
    zero_counts 1,16384,16,128 zero-counts.txt "--keeps 0.03,0.1,negl:0.5" \
        "--causal --keeps 0.03,0.1,0.25,0.5"
    ;;
time64)
    unpack
    # head dim 64 (bwd-dq16-light-tiles-hd64.patch): version 6's light tiles in 16-bit at every
    # keep (no device pick); 10 % non-causal is ~13 entries a row tile, causal 25 / 50 % mostly
    # heavy tiles, where the zero CTAs' spread must cost nothing
    cfg="1,16384,16,64|0.03,0.1,negl:0.5;1,16384,16,64 --causal|0.03,0.1,0.25,0.5"
    others=la=build/ab/la.so
    [ -f build/ab/pick.so ] && others+=",pick=build/ab/pick.so"
    NEW_LIB=build/ab/new.so OUT=$OUT/t64 timeout -k 5 380 \
        bash dev/cuda/lib_timeline_ab.sh "$others" "$cfg" x 2 || true
    grep span "$OUT/t64/timelines-offsets.txt" | sort -k3,3 -k4,5 | cut -c1-175 || true
    zero_counts 1,16384,16,64 zero-counts64.txt "--keeps 0.03,negl:0.5" "--causal --keeps 0.03,0.5"
    # what returning CTAs of version 6's launch shape cost a grid (a picked persistent version 6
    # would launch beside a form that returns; bench/notes-bwd.md s99 item 5), ~20 s with the build
    mkdir -p build/probe
    { nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -o build/probe/return_ctas_probe \
        dev/cuda/return_ctas_probe.cu && timeout -k 5 60 build/probe/return_ctas_probe; } \
        > "$OUT/return-ctas.txt" 2>&1 || true
    cat "$OUT/return-ctas.txt"
    ;;
bench)
    unpack
    for n in la new pick; do  # (~135 s each in s98)
        [ -f build/ab/$n.so ] || continue
        # (BENCH_ARGS: e.g. the head-dim-128 shapes only, "--shape 1,16384,16,128 ...")
        BACK_LITE_LIBRARY=$PWD/build/ab/$n.so timeout -k 5 190 python3 bench/bench_attn.py --no-flex \
            ${BENCH_ARGS:-} --out "$OUT/bench-$n.json" > "$OUT/bench-$n.txt" 2>&1 || true
        tail -4 "$OUT/bench-$n.txt"
    done
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
