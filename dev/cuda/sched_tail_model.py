"""sched_tail_model.py -- how much of a masked backward's main kernel is the last round's tail,
in a model of the persistent head-dim-128 kernel (no GPU needed).

Model: the bench's random tile masks (each 64-row tile of a key tile kept with probability p),
a key tile ("column") of c kept tiles costing A + B * entries (packed 80-row entries:
bl_bwd_packed_count), 132 CTAs each taking the next column of the schedule when free (the dynamic
walk). Schedules: the library's (windows of two rounds, each sorted heaviest first:
bl_bwd_schedule_window_kernel), the same with the last partial window merged into the one
before, and one global heaviest-first sort (what a perfect balance of the end could give; it
loses the windows' L2 locality, bench/results/bwd-s9-schedule.txt). A and B are fitted to the
timeline of bench/results/bwd-s39-prepost.txt run 4 (16k x 16 x 128 non-causal: main kernel
4360 us at 50 % kept, 948 us at 10 %, 2048 columns): A ~6 us, B ~5.4 us per entry.

    python3 dev/cuda/sched_tail_model.py [--reps 20]

Prints per kept share the makespan above total work / CTAs (the tail), in us.
"""
import argparse
import heapq
import random
import statistics

from pick_breakeven import packed_count  # bl_bwd_packed_count

CTAS = 132
COLUMNS = 2048  # 16 heads x 128 key tiles
ROW_TILES = 128  # 64-row tiles per column
WINDOW = 2 * CTAS
COST_COLUMN_US = 6.0
COST_ENTRY_US = 5.37


def makespan(order, times):
    """When the last of CTAS workers ends, each taking the next column of `order` when free."""
    free_at = [0.0] * CTAS
    for col in order:
        t = heapq.heappop(free_at)
        heapq.heappush(free_at, t + times[col])
    return max(free_at)


def windowed(counts, merge_last):
    """The library's order: windows of WINDOW columns, each heaviest first (stable); merge_last
    folds the last partial window into the one before."""
    bounds = list(range(0, len(counts), WINDOW)) + [len(counts)]
    if merge_last and len(bounds) > 2:
        bounds.pop(-2)
    order = []
    for lo, hi in zip(bounds, bounds[1:]):
        order += sorted(range(lo, hi), key=lambda i: (-counts[i], i))
    return order


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20, help="random masks per kept share")
    args = ap.parse_args()
    print("kept   ideal us   tail: library  last merged  global sort")
    for p in (0.5, 0.25, 0.1, 0.03, 0.008):
        tails = {"library": [], "merged": [], "global": []}
        ideal = []
        for rep in range(args.reps):
            rng = random.Random(rep)
            counts = [sum(rng.random() < p for _ in range(ROW_TILES)) for _ in range(COLUMNS)]
            times = [COST_COLUMN_US + COST_ENTRY_US * packed_count(c) for c in counts]
            floor = sum(times) / CTAS
            ideal.append(floor)
            tails["library"].append(makespan(windowed(counts, False), times) - floor)
            tails["merged"].append(makespan(windowed(counts, True), times) - floor)
            tails["global"].append(makespan(sorted(range(COLUMNS), key=lambda i: -counts[i]), times) - floor)
        print("%5.3f  %9.1f  %13.1f  %11.1f  %11.1f" % (
            p, statistics.mean(ideal), statistics.mean(tails["library"]),
            statistics.mean(tails["merged"]), statistics.mean(tails["global"])))


if __name__ == "__main__":
    main()
