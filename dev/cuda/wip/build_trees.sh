#!/usr/bin/env bash
# build_trees.sh -- build the backward dev checker from the working tree ("base") and from the
# working tree with each given wip patch applied (NAME=PATCH), here, into build/sedvar/NAME, for
# one device call of dev/cuda/bwd_compare.sh. Run from the repository root:
#   bash dev/cuda/wip/build_trees.sh stg=/tmp/stage.patch v6=/tmp/v6.patch
# (how bench/results/bwd-s12-wip.txt was made, with two patches since deleted)
# then on the device (carry ["build/sedvar"]), e.g.
#   bash dev/cuda/bwd_compare.sh "stg base" "one;dense128;sparse1 0.1;sparsec 0.1" 3
#   bash dev/cuda/bwd_compare.sh "v6 base" "one64;sparse64 0.1" 3
set -euo pipefail
rm -rf build/sedvar
tree() {  # DIR [PATCH]: the tracked sources, the dev checker, and the patch applied
    rm -rf "$1" && mkdir -p "$1"
    git ls-files -z src include dev | tar --null -T - -c | tar -x -C "$1"
    if [ -n "${2:-}" ]; then (cd "$1" && patch -s -p1 < "$OLDPWD/$2"); fi
}
tree /tmp/bl_tree_base
bash dev/cuda/bwd_build_tree.sh base /tmp/bl_tree_base
for arg in "$@"; do
    name=${arg%%=*} patch=${arg#*=}
    tree "/tmp/bl_tree_$name" "$patch"
    bash dev/cuda/bwd_build_tree.sh "$name" "/tmp/bl_tree_$name"
done
du -sh build/sedvar
