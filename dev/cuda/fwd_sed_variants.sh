#!/usr/bin/env bash
# fwd_sed_variants.sh -- quick variants of the sm_90a forward: each variant is src/cuda with one
# sed expression applied to one file, built into its own dev checker (dev/cuda/attn_fwd.cu) here
# (no GPU needed); on the device each variant is checked against the float64 reference
# (`check`) and all are timed with `benchstats` (with and without statistics, eight shapes),
# interleaved round by round in a rotating order so that clock and power drift hit them alike. "base" (no edit) is
# always built. The forward counterpart of bwd_sed_variants.sh.
#
#   here:   bash dev/cuda/fwd_sed_variants.sh build NAME FILE 'SED' [NAME FILE 'SED' ...]
#           e.g. ... build s3 attn_fwd_sm90.cu 's/kStages = D == 128 ? 3 : 4/kStages = D == 128 ? 3 : 3/'
#           bash dev/cuda/fwd_sed_variants.sh addrev NAME REV   (after build: one more variant, a
#           commit's src/cuda and checker as they were, e.g. `addrev old HEAD` to time a change
#           against the last commit)
#   device: bash dev/cuda/fwd_sed_variants.sh run [ROUNDS]     (run with carry=["build/fwdvar"])
#           bash dev/cuda/fwd_sed_variants.sh ncu [ROUNDS] > LOG; python3 dev/cuda/fwd_ncu_times.py LOG
#           (NCU_SHAPES=REGEX: only the shapes "B S H D causal" it matches, e.g. ' 128 ' for head
#           dim 128 or ' 1$' for the causal ones: ~45 s per variant and round for all eight)
#   `run` also puts every variant but base through compute-sanitizer memcheck / racecheck on
#   `small`. `ncu` times each kernel under Nsight Compute (locked clocks: the event medians of
#   `benchstats` wander by 1-2 % between identical kernels, bench/results/fwd-s23-park.txt): every
#   variant's plain and statistics kernels at the eight shapes, two launches each, one profiler
#   process per variant and round, variants rotated round by round.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=build/fwdvar
NV="nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp -Xptxas=-v"

build_one() {  # NAME FILE SED
    local d=$DIR/$1
    rm -rf "$d" && mkdir -p "$d/src" "$d/dev/cuda"
    cp -r src/cuda "$d/src/cuda" && cp dev/cuda/attn_fwd.cu "$d/dev/cuda/"
    sed -i "$3" "$d/src/cuda/$2"
    diff "src/cuda/$2" "$d/src/cuda/$2" > "$d/diff.txt" || true
    if [ "$1" != base ] && [ ! -s "$d/diff.txt" ]; then echo "$1: the sed expression changed nothing" >&2; exit 1; fi
    # attn_fwd.cu includes ../../src/cuda/attn_fwd_sm90.cu: the variant's copy.
    $NV -I include -I src "$d/dev/cuda/attn_fwd.cu" -o "$d/attn_fwd" > "$d/ptxas.log" 2>&1
    rm -rf "$d/src" "$d/dev"
    echo "$1: $(wc -l < "$d/diff.txt") diff lines, $(grep -c C75 "$d/ptxas.log" || true) ptxas C75xx notes," \
         "spills: $(grep -o '[0-9]* bytes spill stores' "$d/ptxas.log" | sort -u | tr '\n' ' ')"
}

if [ "${1:-}" = build ]; then
    shift
    rm -rf $DIR && mkdir -p $DIR
    build_one base attn_fwd_sm90.cu 's/^$//'
    names=(base)
    while [ $# -ge 3 ]; do build_one "$1" "$2" "$3"; names+=("$1"); shift 3; done
    echo "${names[*]}" > $DIR/names.txt
elif [ "${1:-}" = addrev ]; then
    name=$2 rev=$3
    [ -f $DIR/names.txt ] || { echo "addrev: run 'build' first" >&2; exit 1; }
    d=$DIR/$name
    rm -rf "$d" && mkdir -p "$d"
    git archive "$rev" src/cuda dev/cuda/attn_fwd.cu | tar -x -C "$d"
    # The checker includes ../../src/cuda/attn_fwd_sm90.cu: REV's copy, beside it.
    $NV -I include -I src "$d/dev/cuda/attn_fwd.cu" -o "$d/attn_fwd" > "$d/ptxas.log" 2>&1
    rm -rf "$d/src" "$d/dev"
    git rev-parse --short "$rev" > "$d/rev.txt"
    grep -qw "$name" $DIR/names.txt || echo "$(cat $DIR/names.txt) $name" > $DIR/names.txt
    echo "$name: $rev ($(cat "$d/rev.txt")), spills: $(grep -o '[0-9]* bytes spill stores' "$d/ptxas.log" | sort -u | tr '\n' ' ')"
elif [ "${1:-}" = run ]; then
    rounds=${2:-2}
    export OMP_NUM_THREADS=16
    for v in $(cat $DIR/names.txt); do
        echo "== $v check: $(timeout 120 $DIR/$v/attn_fwd check 2>&1 | tail -1)"
        [ "$v" = base ] && continue
        echo "== $v memcheck: $(timeout 90 compute-sanitizer --tool memcheck $DIR/$v/attn_fwd small 2>&1 \
            | grep 'ERROR SUMMARY')"
        echo "== $v racecheck: $(timeout 120 compute-sanitizer --tool racecheck $DIR/$v/attn_fwd small 2>&1 \
            | grep 'RACECHECK SUMMARY')"
    done
    read -r -a names < $DIR/names.txt
    for r in $(seq 1 "$rounds"); do
        # Rotated each round: the build timed right after a lighter run reads a few percent fast
        # (bench/results/bwd-s10-noncausal-walk.txt), so no build may always be first.
        k=$(( (r - 1) % ${#names[@]} ))
        for v in "${names[@]:k}" "${names[@]:0:k}"; do
            echo "== $v round $r"
            timeout 100 $DIR/$v/attn_fwd benchstats 2>&1
        done
    done
elif [ "${1:-}" = ncu ]; then
    rounds=${2:-1}
    read -r -a names < $DIR/names.txt
    shapes=("1 16384 16 128 0" "1 16384 16 128 1" "1 32768 24 128 0" "1 32768 24 128 1"
            "1 16384 16 64 0" "1 16384 16 64 1" "4 4096 16 64 0" "4 4096 16 64 1")
    if [ -n "${NCU_SHAPES:-}" ]; then
        mapfile -t shapes < <(printf '%s\n' "${shapes[@]}" | grep -E -- "$NCU_SHAPES")
        [ ${#shapes[@]} -gt 0 ] || { echo "ncu: NCU_SHAPES='$NCU_SHAPES' matches no shape" >&2; exit 1; }
    fi
    # The labels fwd_ncu_times.py gives the log's rows ("BxSxHxD[ causal]", in the order run).
    labels=()
    for sh in "${shapes[@]}"; do
        read -r b s h d c <<< "$sh"
        label="${b}x${s}x${h}x${d}"
        if [ "$c" = 1 ]; then label+=" causal"; fi
        labels+=("$label")
    done
    (IFS=';'; echo "# shapes: ${labels[*]}")
    for r in $(seq 1 "$rounds"); do
        k=$(( (r - 1) % ${#names[@]} ))
        for v in "${names[@]:k}" "${names[@]:0:k}"; do
            echo "== $v round $r"
            # One profiler process per variant: `one B S H D causal stats 2` per shape and mode.
            script=""
            for sh in "${shapes[@]}"; do
                script+="$DIR/$v/attn_fwd one $sh 0 2 >/dev/null; $DIR/$v/attn_fwd one $sh 1 2 >/dev/null; "
            done
            timeout 300 ncu --target-processes all -k regex:attn_fwd_sm90_ws_kernel --csv \
                --print-units base --metrics gpu__time_duration.sum bash -c "$script" 2>&1 | grep '^"'
        done
    done
else
    sed -n '2,/^set /{/^set /!p}' "$0"; exit 1  # the header comment, whatever its length
fi
