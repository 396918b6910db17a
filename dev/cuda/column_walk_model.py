"""column_walk_model.py -- a CPU model of how the masked backward's main kernel spreads a call's
key-tile columns over its CTAs, for the head-dim-64 kernels (version 6, its persistent form
src/cuda/bwd_ws64p_sm90.cuh) and head dim 128's 64-row version 10 (bwd_ws128_sm90.cuh).

No GPU needed. Each column (key tile of one head) costs `a + b x units` microseconds where it has
entries and `zero` where it has none; a unit is a pair of 64-row entries at head dim 64 (the
kernels' step, pairs = ceil(entries / 2)) and one 64-row entry at head dim 128. The columns are
ordered as the library's schedule orders them (bl_bwd_schedule_window: windows of rounds x G
columns in their natural (b, head, key tile) order, each sorted heaviest first, stable -- two
rounds, four for causal calls; before the hundred-and-thirteenth session causal calls at head
dim 64 took one global sort, which `--global-causal64` models), then walked four ways:
  greedy   each CTA takes the next column as it frees: version 6's CTA a column (one an SM),
           and version 10's dynamic walk;
  snake    the persistent head-dim-64 form's static walk: round k takes positions kG..kG+G-1,
           forward in even rounds, backward in odd ones (ws64p_position);
  rotated  the snake with the CTAs turned by an odd stride of ~2/5 G every two rounds
           (ws64p_position: without a causal mask since the hundred-and-eleventh session,
           bwd-s111-ws64p-rotate.txt, and with one since the hundred-and-fifteenth,
           bwd-s115-causal-rotate.txt); --rotate NUM/DEN sets another stride (~NUM/DEN G);
  matched  not in the library: a static walk that keeps one column a CTA a round, as the snake
           does, but gives each round's heaviest columns to the CTAs with the least load so far
           (by the model's costs, as a schedule kernel could compute them beforehand).
It prints each walk's largest CTA load (the kernel's time, in the model) beside the mean load.
The masks: the bench's video-grid W (bench/bench_attn.py video_qkv, the forward with statistics
on the CPU backend: ~30 s at 16k x 16) at negl 0.2 and 0.5, and the bench's random tile masks
(bench_attn.random_tile_mask: round(keep x Tn) tiles of each row tile), under the causal mask
with --causal. A batch of B calls of H heads walks as one call of B x H heads (the schedule's
natural order is (b, head, key tile)): 4 x 4k x 16 is --seqlen 4096 --heads 64. (Non-causal
head-dim-128 calls that keep little walk one-round windows, and their dense calls the 80-row
kernel: not modelled.)

    python3 dev/cuda/column_walk_model.py [--seqlen 16384 --heads 16 --sms 132 --head-dim 64]
        [--causal] [--a A --b B --zero Z] [--fit NAME=US,... [--fit-walk rotated|greedy]]
        [--rotate NUM/DEN]
    python3 dev/cuda/column_walk_model.py --fit dense=5110,r0.1=576,r0.03=234,r0.008=148,negl0.2=1293,negl0.5=207
    python3 dev/cuda/column_walk_model.py --head-dim 128 --causal --fit-walk greedy \
        --fit r0.1=501.1,r0.03=230.2,r0.008=122.7

The default costs (head dim 64) are the first fit (the K / V ring's snake walk on an H100,
main-kernel times of bench/results/bwd-s110-ws64p-kv-ring.txt): a 3.0 us a column with entries,
b 2.47 a pair, zero 6.5 a column without. --fit first fits a, b and zero to the given times of
one walk (the snake, --fit-walk rotated the rotated one, greedy the dynamic one; b from the dense call where it is
given at head dim 64 without a causal mask -- every column full -- else over a grid too), then
prints the walks with them.
"""
import argparse
import heapq
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_attn  # noqa: E402  (the bench's input generators)
import back_lite.functional as blf  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from bwd_call_timeline import even_tile_mask  # noqa: E402  (its `even:K` keep)

# src/cuda/bwd_lists_sm90.cu: rounds a window, and causal calls at head dim 128
SCHED_WINDOW_ROUNDS, SCHED_WINDOW_ROUNDS_CAUSAL = 2, 4
ROTATE_NUM, ROTATE_DEN = 2, 5


def schedule(counts, window):
    """Column entry counts (natural order) -> counts in schedule order."""
    order = []
    for start in range(0, len(counts), window):
        order += sorted(counts[start:start + window], key=lambda c: -c)  # stable
    return order


def snake_cta(k, g, rotate):
    """The CTA that takes schedule position k (ws64p_position, inverted)."""
    rnd, x = divmod(k, g)
    c = x if rnd % 2 == 0 else g - 1 - x
    if rotate:
        stride = (ROTATE_NUM * g // ROTATE_DEN) | 1
        c = (c - (rnd // 2) * stride) % g
    return c


def units(c, head_dim):
    """A column's steps: pairs of 64-row entries at head dim 64, entries at head dim 128."""
    return (c + 1) // 2 if head_dim == 64 else c


# --global-causal64: causal head-dim-64 calls on one global heaviest-first sort (the library's
# schedule for them before the hundred-and-thirteenth session)
GLOBAL_CAUSAL64 = False


def walks(counts, g, a, b, zero, causal=False, head_dim=64):
    if causal and head_dim == 64 and GLOBAL_CAUSAL64:
        window = len(counts)
    else:
        window = (SCHED_WINDOW_ROUNDS_CAUSAL if causal else SCHED_WINDOW_ROUNDS) * g
    costs = [a + b * units(c, head_dim) if c else zero for c in schedule(counts, window)]
    free = [0.0] * g
    for cost in costs:  # greedy: the next column to the first SM free
        heapq.heappush(free, heapq.heappop(free) + cost)
    out = {"greedy": max(free)}
    for name, rotate in (("snake", False), ("rotated", True)):
        load = [0.0] * g
        for k, cost in enumerate(costs):
            load[snake_cta(k, g, rotate)] += cost
        out[name] = max(load)
    out["matched"] = max(matched_loads(costs, g))
    out["mean"] = sum(costs) / g
    return out


def matched_loads(costs, g):
    """The matched walk's CTA loads: round by round (G columns of the schedule, heaviest first
    within their window), the i-th heaviest column of the round to the CTA with the i-th least
    load so far (ties: the lower CTA)."""
    load = [0.0] * g
    for start in range(0, len(costs), g):
        rnd = costs[start:start + g]
        ctas = sorted(range(g), key=lambda c: (load[c], c))
        for i, cta in zip(sorted(range(len(rnd)), key=lambda i: -rnd[i]), ctas):
            load[cta] += rnd[i]
    return load


def fit(counts_by_mask, measured, g, causal=False, walk="snake", head_dim=64):
    """(a, b, zero) that make the walk's largest CTA load match `measured` (us per mask name)
    best, by relative squared error. Where the dense call is measured at head dim 64 without a
    causal mask (every column full: its largest CTA walks ceil(columns / g) columns of Tm / 2
    pairs), b follows from it and a and zero go over a grid; else b goes over a grid too."""
    full = counts_by_mask["dense"]
    from_dense = "dense" in measured and head_dim == 64 and not causal
    cols, pairs = -(-len(full) // g), (full[0] + 1) // 2
    a_grid = [x * 0.25 for x in range(0, 41)] if from_dense else [x * 0.5 for x in range(0, 25)]
    b_grid = [None] if from_dense else [x * 0.05 for x in range(20, 61)]
    best = None
    for a in a_grid:
        for b in b_grid:
            if b is None:
                b = (measured["dense"] / cols - a) / pairs
            for zero in [x * 0.5 for x in range(0, 21)]:
                err = sum(((walks(counts_by_mask[k], g, a, b, zero, causal, head_dim)[walk] - t)
                           / t) ** 2 for k, t in measured.items())
                if best is None or err < best[0]:
                    best = (err, a, b, zero)
    err, a, b, zero = best
    return a, b, zero, (err / len(measured)) ** 0.5


def main():
    global GLOBAL_CAUSAL64, ROTATE_NUM, ROTATE_DEN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--head-dim", type=int, default=64, choices=[64, 128])
    ap.add_argument("--a", type=float, default=3.0, help="us a column with entries, besides units")
    ap.add_argument("--b", type=float, default=2.47, help="us a unit (a pair at head dim 64)")
    ap.add_argument("--zero", type=float, default=6.5, help="us a column without entries")
    ap.add_argument("--causal", action="store_true", help="causal masks and their schedule")
    ap.add_argument("--global-causal64", action="store_true",
                    help="causal head-dim-64 calls on one global sort (the schedule before s113)")
    ap.add_argument("--fit-walk", default="snake", choices=["snake", "rotated", "greedy"],
                    help="the walk the --fit times are of: the persistent head-dim-64 form's "
                         "snake (rotated: the library's since the hundred-and-eleventh session "
                         "without a causal mask, the hundred-and-fifteenth with one), or the "
                         "dynamic one (version 6's CTA a column, version 10)")
    ap.add_argument("--rotate", default=f"{ROTATE_NUM}/{ROTATE_DEN}", metavar="NUM/DEN",
                    help="the rotated walk's stride, ~NUM/DEN of the CTAs (made odd), default "
                         "the library's")
    ap.add_argument("--fit", default=None, metavar="NAME=US,...",
                    help="fit a, b and zero to measured main-kernel times first (names: dense, "
                         "negl0.2, negl0.5, r0.25, r0.1, r0.03, r0.008, even0.008)")
    args = ap.parse_args()
    GLOBAL_CAUSAL64 = args.global_causal64
    ROTATE_NUM, ROTATE_DEN = (int(x) for x in args.rotate.split("/"))
    s, h, d = args.seqlen, args.heads, args.head_dim
    allowed = blf.computable_tiles(s, s, args.causal, "cpu")  # (S/64, S/128)
    masks = {"dense": allowed.expand(h, -1, -1)}
    q, k, v = bench_attn.video_qkv(1, s, h, d, torch.bfloat16, "cpu")
    _, _, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)  # (1, H, S/64, S/128)
    for negl in (0.2, 0.5):
        masks[f"negl{negl}"] = blf.select(w, negl)[0] & allowed
    tm, tn = w.shape[-2:]
    for keep in (0.25, 0.1, 0.03, 0.008):  # the bench's and bwd_call_timeline.py's masks
        masks[f"r{keep}"] = bench_attn.random_tile_mask(1, h, tm, tn, keep, "cpu")[0] & allowed
    # half the columns empty, the others twice as full: pins a column without entries
    masks["even0.008"] = even_tile_mask(1, h, tm, tn, 0.008, "cpu")[0] & allowed
    # entries per (head, key tile)
    counts = {name: mask.sum(1).reshape(-1).tolist() for name, mask in masks.items()}
    if args.fit:
        measured = {k: float(t) for k, t in (x.split("=") for x in args.fit.split(","))}
        unknown = sorted(set(measured) - set(masks))
        if unknown:
            ap.error(f"--fit: no mask named {', '.join(unknown)} (the names: {', '.join(masks)})")
        args.a, args.b, args.zero, rms = fit(counts, measured, args.sms, args.causal, args.fit_walk,
                                             d)
        print(f"fitted ({args.fit_walk}) to {args.fit}: relative error rms {rms:.3f}")
    print(f"{s} x {h} x {d}{' causal' if args.causal else ''}, {args.sms} CTAs, a {args.a} "
          f"b {args.b:.3f} zero {args.zero} us, rotated by ~{ROTATE_NUM}/{ROTATE_DEN} G: "
          "largest CTA load (us)")
    for name in masks:
        r = walks(counts[name], args.sms, args.a, args.b, args.zero, args.causal, d)
        print(f"  {name:8s} mean {r['mean']:7.0f}  greedy {r['greedy']:7.0f}  "
              f"snake {r['snake']:7.0f}  rotated {r['rotated']:7.0f}  matched {r['matched']:7.0f}")


if __name__ == "__main__":
    main()
