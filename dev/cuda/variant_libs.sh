#!/usr/bin/env bash
# variant_libs.sh -- release libraries that differ from build/final in a few translation units,
# built here in a minute each, packed as one build/pw.tar.xz for a device call's carry (the
# libraries are ~14 MB each and the carry holds 64 MB with the tree; packed, four take ~10 MB).
# Each spec NAME=[PATCH[+PATCH...]][:DEFINES] builds build/pw/NAME.so: the tracked sources with the
# patches applied in order (none: HEAD's), the objects that they touch (their dependency files in
# build/final say which) and src/cuda/attn_bwd_sm90.cu recompiled with build/final's CUDA flags
# plus DEFINES (space-separated), linked with build/final's other objects. Run from the repository
# root after `cmake -S . -B build/final -DCMAKE_BUILD_TYPE=Release -DBL_BUILD_TESTS=OFF && cmake
# --build build/final`, e.g. (head dim 64: version 6 with a CTA a column on every call, the
# persistent form on three CTAs, and a patch of the working tree's):
#   bash dev/cuda/variant_libs.sh base= percol=:-DBL_BWD_WS64_PER_COLUMN \
#       p3=:-DBL_BWD_WS64P_MAX_CTAS=3 fix=build/fix.patch
# then on the device (carry ["build/pw.tar.xz"]): tar -xJf build/pw.tar.xz -C build, and
# BACK_LITE_LIBRARY=build/pw/NAME.so or `lib_timeline_ab.sh base=build/pw/base.so ...`.
# The same name with an empty spec (base=) is HEAD's release library rebuilt the same way, the
# fair base for an A/B. Each library's SASS can be compared with dev/cuda/sass_md5.py.
set -euo pipefail
FINAL=build/final
OBJDIR=$FINAL/CMakeFiles/backlite.dir
if [ ! -f "$OBJDIR/objects1" ]; then
    echo "variant_libs.sh: build $FINAL first (see the header)" >&2
    exit 2
fi
# build/final's objects must be the tree's: the libraries link the ones no patch touches. (The
# hundred-and-nineteenth session's libraries linked a stale lists kernel, with the DQ16 gate
# before a committed change to bwd_common.cuh, and failed two GPU tests for it.)
cmake --build "$FINAL" -j "$(nproc)" > /dev/null
flag() { sed -n "s/^$1 = //p" "$OBJDIR/flags.make"; }
CUDA_DEFINES=$(flag CUDA_DEFINES) CUDA_FLAGS=$(flag CUDA_FLAGS)
NVCC=$(sed -n 's/^# compile CUDA with //p' "$OBJDIR/flags.make")
ROOT=$PWD
mkdir -p build/pw
names=()
for spec in "$@"; do
    name=${spec%%=*} rest=${spec#*=}
    patch=${rest%%:*} defines=""
    [[ $rest == *:* ]] && defines=${rest#*:}
    tree=$(mktemp -d /tmp/variant_lib.XXXXXX)
    # (tests and CMakeLists.txt too: a patch may touch them beside the sources)
    git ls-files -z src include tests CMakeLists.txt | tar --null -T - -c | tar -x -C "$tree"
    touched=()
    IFS='+' read -r -a patches <<< "$patch"
    for pf in "${patches[@]}"; do  # in order: a later patch may need an earlier one
        (cd "$tree" && git apply "$ROOT/$pf")  # (a plain directory: git apply as patch(1))
        mapfile -t -O "${#touched[@]}" touched < <(git apply --numstat "$pf" | cut -f3)
    done
    objects=(src/cuda/attn_bwd_sm90.cu)
    for dep in "$OBJDIR"/src/*/*.o.d "$OBJDIR"/src/*.o.d; do
        [ -f "$dep" ] || continue
        for f in "${touched[@]}"; do
            if grep -q "$ROOT/$f" "$dep"; then
                src=${dep#"$OBJDIR"/}; objects+=("${src%.o.d}"); break
            fi
        done
    done
    mapfile -t objects < <(printf '%s\n' "${objects[@]}" | sort -u)
    cp "$OBJDIR/objects1" "$tree/objects"
    for src in "${objects[@]}"; do
        if [[ $src != *.cu ]]; then
            echo "variant_libs.sh: $name touches $src (only .cu objects)" >&2
            exit 2
        fi
        obj="$tree/$(basename "$src").o"
        # the tree's headers in place of the checkout's (build/final's include paths, rebased)
        includes=$(sed "s#$ROOT/#$tree/#g" "$OBJDIR/includes_CUDA.rsp")
        # shellcheck disable=SC2086  # the flags are words
        (cd "$FINAL" && "$NVCC" -forward-unknown-to-host-compiler $CUDA_DEFINES $includes \
            $CUDA_FLAGS $defines -x cu -c "$tree/$src" -o "$obj")
        sed -i "s#CMakeFiles/backlite.dir/$src.o#$obj#" "$tree/objects"
    done
    link=$(sed -e "s#@CMakeFiles/backlite.dir/objects1#@$tree/objects#" \
               -e "s#-o libbacklite.so#-o $ROOT/build/pw/$name.so#" "$OBJDIR/link.txt")
    (cd "$FINAL" && eval "$link")
    msg="build/pw/$name.so: ${objects[*]} recompiled"
    [ -n "$defines" ] && msg+=" with $defines"
    [ -n "$patch" ] && msg+=", $patch applied"
    echo "$msg"
    rm -rf "$tree"
    names+=("pw/$name.so")
done
(cd build && tar -cJf pw.tar.xz "${names[@]}")
ls -la build/pw.tar.xz
