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
on the CPU backend: ~30 s at 16k x 16) at negl 0.2 and 0.5, and uniform random tile masks.

    python3 dev/cuda/ws64p_walk_model.py [--seqlen 16384 --heads 16 --sms 132 --a 1.5 --b 2.56]

The defaults: 132 SMs (H100 / H200), b from the dense 16k x 16 x 64 main kernel on an H100
(~5.1 ms over 3971 entries a CTA, two entries a pair), a from the persistent form's remaining
per-column cost (bench/results/bwd-s110-ws64p-kv-ring.txt: a rough fit, not a measurement).
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


def walks(counts, g, a, b, zero):
    costs = [a + b * ((c + 1) // 2) if c else zero for c in schedule(counts, SCHED_WINDOW_ROUNDS * g)]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--a", type=float, default=1.5, help="us a column with entries, besides pairs")
    ap.add_argument("--b", type=float, default=2.56, help="us a pair")
    ap.add_argument("--zero", type=float, default=0.5, help="us a column without entries")
    args = ap.parse_args()
    s, h = args.seqlen, args.heads
    masks = {}
    q, k, v = bench_attn.video_qkv(1, s, h, 64, torch.bfloat16, "cpu")
    _, _, w = blf.forward(q, k, v, causal=False, with_stats=True)  # (1, H, S/64, S/128)
    for negl in (0.2, 0.5):
        masks[f"video negl {negl}"] = blf.select(w, negl)[0]
    gen = torch.Generator().manual_seed(0)
    for keep in (0.25, 0.1, 0.03, 0.008):
        masks[f"random {keep}"] = torch.rand(w.shape[1:], generator=gen) < keep
    print(f"{s} x {h} x 64, {args.sms} CTAs, a {args.a} b {args.b} zero {args.zero} us: "
          "largest CTA load (us)")
    for name, mask in masks.items():
        counts = mask.sum(1).reshape(-1).tolist()  # entries per (head, key tile)
        r = walks(counts, args.sms, args.a, args.b, args.zero)
        print(f"  {name:16s} mean {r['mean']:7.0f}  greedy {r['greedy']:7.0f}  "
              f"snake {r['snake']:7.0f}  rotated {r['rotated']:7.0f}")


if __name__ == "__main__":
    main()
