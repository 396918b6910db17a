#!/usr/bin/env bash
# timeline_summary.sh -- the summary of a lib_timeline_ab.sh log (its $OUT/timelines.txt), whole or
# cut short: per build, round and keep, each kernel's median duration and the call's span (us),
# then the last kernel's tail: its end (median start + median duration) past the latest end of the
# kernels before it -- what it adds to the span. Read a late kernel's cost from the tail, not from
# its duration: a programmatic dependent starts under the kernels before it, so its duration
# overlaps them (the hundred-and-thirty-first session read a head-dim-64 conversion's ~19 us
# duration as its cost; its tail was ~3 us).
# Usage: bash dev/cuda/timeline_summary.sh OUT/timelines.txt > OUT/timelines-summary.txt
# (lib_timeline_ab.sh writes it at its end; pw_check_ab.sh from what a timed-out run left.)
set -euo pipefail
awk '/^== [A-Za-z0-9_]+ round/ {lib = $2; rnd = $4; shape = $6 ($7 == "--causal" ? " causal" : "")}
     /^== keep/ {printf "\n%-4s r%s %-22s keep %-9s", lib, rnd, shape, $3; latest = 0; before = 0}
     /^  [a-z_: ]*[a-zA-Z]/ && / us  gap/ {
         printf " %s", $(NF-7)
         end = $(NF-1) + $(NF-7)  # start + duration
         before = latest; last = end
         if (end > latest) latest = end
     }
     /span median/ {printf " | span %s | tail %.1f", $3, last - before}
     END {print ""}' "$1"
