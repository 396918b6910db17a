#!/usr/bin/env bash
# timeline_summary.sh -- the summary of a lib_timeline_ab.sh log (its $OUT/timelines.txt), whole or
# cut short: per build, round and keep, each kernel's median duration and the call's span (us).
# Usage: bash dev/cuda/timeline_summary.sh OUT/timelines.txt > OUT/timelines-summary.txt
# (lib_timeline_ab.sh writes it at its end; pw_check_ab.sh from what a timed-out run left.)
set -euo pipefail
awk '/^== [A-Za-z0-9_]+ round/ {lib = $2; rnd = $4; shape = $6 ($7 == "--causal" ? " causal" : "")}
     /^== keep/ {printf "\n%-4s r%s %-22s keep %-9s", lib, rnd, shape, $3}
     /^  [a-z_: ]*[a-zA-Z]/ && / us  gap/ {printf " %s", $(NF-7)}
     /span median/ {printf " | span %s", $3}
     END {print ""}' "$1"
