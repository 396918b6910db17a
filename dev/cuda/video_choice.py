"""Which backward kernel the device's rules pick for the bench's video-grid inputs at each
negl_prob: entries of 64 rows (the kept tiles) against aligned entries of 80 rows (every 80-row
tile that overlaps a kept 64-row tile) and packed ones (a column's kept tiles end to end:
ceil(4 c / 5)), summed over all heads as the lists kernel sums its totals and weighed by
bench_picks.pick at the constants read from src/cuda/bwd_common.cuh; and the mean run of kept
64-row tiles down a key tile's column. Q / K / V heads are one to one (the bench's video inputs).

    PYTHONPATH=. python3 dev/cuda/video_choice.py 16384 [--heads 1] [--causal] [--device cpu]
    (about 10 s at 16k with one head on the CPU; the bench's 16 / 24 heads want --device cuda)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attn  # noqa: E402  (video_qkv, NEGL_PROBS)
from bench_picks import TN, allowed_tiles, entry_totals, header_constants, pick  # noqa: E402
from back_lite import functional as blf  # noqa: E402

HEAD_DIM = 128  # the rules compared here are head dim 128's


def mean_run(m):
    """Mean length of the runs of kept 64-row tiles down the columns."""
    col = torch.cat([m, torch.zeros_like(m[:, :1])], 1).to(torch.int8)  # (H, Tm + 1, Tn)
    starts = (col[:, 1:] > col[:, :-1]).sum() + col[:, 0].sum()
    return float(m.sum()) / max(1, int(starts))


def choices(s, heads, causal, device="cpu"):
    """(negl_prob, kept share, packed / aligned entries, pick(), mean run) for each of the bench's
    negl_probs on its video inputs (1, s, heads, 128)."""
    c = header_constants()
    q, k, v = bench_attn.video_qkv(1, s, heads, HEAD_DIM, torch.bfloat16, device)
    _, _, w = blf.forward(q, k, v, causal=causal, with_stats=True)
    allowed = int(allowed_tiles(s, causal).sum()) * heads  # (head, 64-row tile, key tile) pairs
    for negl in bench_attn.NEGL_PROBS:
        m = blf.select(w, negl)[0].bool().cpu()  # (H, Tm, Tn)
        t64, t80, packed = entry_totals(m, s)
        p = pick((t64, t80, allowed - t64, packed), heads * m.shape[1], HEAD_DIM, causal,
                 s % TN == 0, c)
        yield negl, t64 / m.numel(), packed / max(1, t80), p, mean_run(m)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seqlen", type=int)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    for negl, kept, packed_share, p, run in choices(args.seqlen, args.heads, args.causal,
                                                      args.device):
        print(f"negl {negl}: kept {kept:.3f}, packed / aligned entries {packed_share:.3f}, "
              f"80-row / 64-row cost {p['ratio']:.3f} -> {p['pick']}; mean run {run:.1f} tiles")


if __name__ == "__main__":
    main()
