"""ws64p_walk_model.py -- a CPU model of how the persistent head-dim-64 backward (version 6
persistent, src/cuda/bwd_ws64p_sm90.cuh) spreads a call's columns over its CTAs.

No GPU needed. Each column (key tile of one head) costs `a + b x pairs` microseconds where it has
entries (pairs = ceil(entries / 2), the kernel's unit) and `zero` where it has none. The columns
are ordered as the window schedule orders them for an unsplit non-causal head-dim-64 call
(bl_bwd_schedule_window: windows of SCHED_WINDOW_ROUNDS x G columns in their natural order, each
sorted heaviest first, stable), then walked three ways:
  greedy   a CTA a column, each taking the next column as an SM frees (version 6, one CTA an SM);
  snake    the persistent form's static walk: round k takes positions kG..kG+G-1, forward in
           even rounds, backward in odd ones (ws64p_position);
  rotated  the snake with the CTAs turned by an odd stride of ~2/5 G every window of two rounds
           (dev/cuda/wip/bwd-ws64p-rotate.patch).
It prints each walk's largest CTA load (the kernel's time, in the model) beside the mean load.
The masks: the bench's video-grid W (bench/bench_attn.py video_qkv, the forward with statistics
on the CPU backend: ~30 s at 16k x 16) at negl 0.2 and 0.5, and the bench's random tile masks
(bench_attn.random_tile_mask: round(keep x Tn) tiles of each row tile).

    python3 dev/cuda/ws64p_walk_model.py [--seqlen 16384 --heads 16 --sms 132 --a A --b B --zero Z]
    python3 dev/cuda/ws64p_walk_model.py --fit dense=5110,r0.1=576,r0.03=234,r0.008=148,negl0.2=1293,negl0.5=207

The default costs are that fit (the K / V ring's snake walk on an H100, main-kernel times of
bench/results/bwd-s110-ws64p-kv-ring.txt): a 3.0 us a column with entries, b 2.47 a pair, zero 6.5
a column without. --fit first fits a, b and zero to the given times of the snake walk (or, with
--fit-walk greedy, of version 6's CTA a column; b from the dense call, a and zero over a grid),
then prints the walks with them.
"""
import argparse
import heapq
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_attn  # noqa: E402  (the bench's input generators)
import back_lite.functional as blf  # noqa: E402

SCHED_WINDOW_ROUNDS = 2  # src/cuda/bwd_lists_sm90.cu: non-causal calls outside head dim 128
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


def walks(counts, g, a, b, zero, causal=False):
    # causal calls at head dim 64: one global heaviest-first sort (bl_bwd_schedule_kernel)
    window = len(counts) if causal else SCHED_WINDOW_ROUNDS * g
    costs = [a + b * ((c + 1) // 2) if c else zero for c in schedule(counts, window)]
    free = [0.0] * g
    for cost in costs:  # greedy: the next column to the first SM free
        heapq.heappush(free, heapq.heappop(free) + cost)
    out = {"greedy": max(free)}
    for name, rotate in (("snake", False), ("rotated", True)):
        load = [0.0] * g
        for k, cost in enumerate(costs):
            load[snake_cta(k, g, rotate)] += cost
        out[name] = max(load)
    out["mean"] = sum(costs) / g
    return out


def fit(counts_by_mask, measured, g, causal=False, walk="snake"):
    """(a, b, zero) that make the walk's largest CTA load match `measured` (us per mask name)
    best, on calls without a causal mask (every column of the dense call full), by relative
    squared error: b from the dense call (its largest CTA walks ceil(columns / g) columns of Tm /
    2 pairs), a and zero over a grid."""
    full = counts_by_mask["dense"]
    cols, pairs = -(-len(full) // g), (full[0] + 1) // 2
    best = None
    for a in [x * 0.25 for x in range(0, 41)]:
        b = (measured["dense"] / cols - a) / pairs
        for zero in [x * 0.5 for x in range(0, 21)]:
            err = sum(((walks(counts_by_mask[k], g, a, b, zero, causal)[walk] - t) / t) ** 2
                      for k, t in measured.items())
            if best is None or err < best[0]:
                best = (err, a, b, zero)
    err, a, b, zero = best
    return a, b, zero, (err / len(measured)) ** 0.5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--a", type=float, default=3.0, help="us a column with entries, besides pairs")
    ap.add_argument("--b", type=float, default=2.47, help="us a pair")
    ap.add_argument("--zero", type=float, default=6.5, help="us a column without entries")
    ap.add_argument("--causal", action="store_true", help="causal masks and the global sort")
    ap.add_argument("--fit-walk", default="snake", choices=["snake", "greedy"],
                    help="the walk the --fit times are of: the persistent form's snake, or version "
                         "6's CTA a column (greedy)")
    ap.add_argument("--fit", default=None, metavar="NAME=US,...",
                    help="fit a, b and zero to measured main-kernel times of the snake walk "
                         "(names: dense, negl0.2, negl0.5, r0.25, r0.1, r0.03, r0.008) first")
    args = ap.parse_args()
    if args.fit and args.causal:
        ap.error("--fit: calls without a causal mask only (b comes from the dense call's full columns)")
    s, h = args.seqlen, args.heads
    allowed = blf.computable_tiles(s, s, args.causal, "cpu")  # (S/64, S/128)
    masks = {"dense": allowed.expand(h, -1, -1)}
    q, k, v = bench_attn.video_qkv(1, s, h, 64, torch.bfloat16, "cpu")
    _, _, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)  # (1, H, S/64, S/128)
    for negl in (0.2, 0.5):
        masks[f"negl{negl}"] = blf.select(w, negl)[0] & allowed
    tm, tn = w.shape[-2:]
    for keep in (0.25, 0.1, 0.03, 0.008):  # the bench's and bwd_call_timeline.py's masks
        masks[f"r{keep}"] = bench_attn.random_tile_mask(1, h, tm, tn, keep, "cpu")[0] & allowed
    counts = {name: mask.sum(1).reshape(-1).tolist() for name, mask in masks.items()}
    if args.fit:  # entries per (head, key tile) above
        measured = {k: float(t) for k, t in (x.split("=") for x in args.fit.split(","))}
        args.a, args.b, args.zero, rms = fit(counts, measured, args.sms, args.causal, args.fit_walk)
        print(f"fitted ({args.fit_walk}) to {args.fit}: relative error rms {rms:.3f}")
    print(f"{s} x {h} x 64{' causal' if args.causal else ''}, {args.sms} CTAs, a {args.a} b {args.b:.3f} zero {args.zero} us: "
          "largest CTA load (us)")
    for name in masks:
        r = walks(counts[name], args.sms, args.a, args.b, args.zero, args.causal)
        print(f"  {name:8s} mean {r['mean']:7.0f}  greedy {r['greedy']:7.0f}  "
              f"snake {r['snake']:7.0f}  rotated {r['rotated']:7.0f}")


if __name__ == "__main__":
    main()
