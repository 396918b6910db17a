"""Which backward kernel the device's rule (bl_bwd_rows80_chosen) picks for the bench's video-grid
inputs at each negl_prob: entries of 64 rows (the kept tiles) against aligned entries of 80 rows
(every 80-row tile that overlaps a kept 64-row tile) and packed ones (a column's kept tiles end
to end: ceil(4 c / 5)), at the costs of src/cuda/bwd_common.cuh, summed
over all heads as the lists kernel sums its totals; and the mean run of kept 64-row tiles down a
key tile's column. Q / K / V heads are one to one (the bench's video inputs).

    PYTHONPATH=. python3 dev/cuda/video_choice.py 16384 [--heads 1] [--causal] [--device cpu]
    (about 10 s at 16k with one head on the CPU; the bench's 16 / 24 heads want --device cuda)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_attn  # noqa: E402  (video_qkv, NEGL_PROBS)
from back_lite import functional as blf  # noqa: E402

TM, TM80, COST64, COST80 = 64, 80, 64, 75
# packed entries: against version 10's (78; 79 without a causal mask where the keys fill whole
# key tiles, bl_bwd_keys_full; 77 with a causal mask: bl_bwd_rows80_cheaper), and against the
# aligned ones (bl_bwd_packed_chosen: 75, 76 with a causal mask)
COST_PACKED, COST_PACKED_KEYS_FULL, COST_PACKED_CAUSAL = 78, 79, 77
KEY_TILE = 128
COST_PACKED_VS_ALIGNED, COST_PACKED_VS_ALIGNED_CAUSAL = 75, 76


def entry_totals(m, s):
    """(64-row entries, aligned 80-row entries, packed entries) of a mask m (H, Tm, Tn)."""
    tm = m.shape[1]
    t64 = int(m.sum())
    t80 = 0
    for a in range((s + TM80 - 1) // TM80):
        lo, hi = (TM80 * a) // TM, min((TM80 * a + TM80 - 1) // TM, tm - 1)
        t80 += int(m[:, lo:hi + 1].any(1).sum())
    c = m.sum(1)  # (H, Tn): kept 64-row tiles per column
    packed = int(torch.where(c == 0, 1, (4 * c + 4) // 5).sum())
    return t64, t80, packed


def mean_run(m):
    """Mean length of the runs of kept 64-row tiles down the columns."""
    col = torch.cat([m, torch.zeros_like(m[:, :1])], 1).to(torch.int8)  # (H, Tm + 1, Tn)
    starts = (col[:, 1:] > col[:, :-1]).sum() + col[:, 0].sum()
    return float(m.sum()) / max(1, int(starts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seqlen", type=int)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    s = args.seqlen
    q, k, v = bench_attn.video_qkv(1, s, args.heads, 128, torch.bfloat16, args.device)
    _, _, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)
    for negl in bench_attn.NEGL_PROBS:
        m = blf.select(w, negl)[0].bool()  # (H, Tm, Tn)
        t64, t80, packed = entry_totals(m, s)
        vs_aligned = COST_PACKED_VS_ALIGNED_CAUSAL if args.causal else COST_PACKED_VS_ALIGNED
        use_packed = packed * vs_aligned < t80 * COST80
        cost_packed = (COST_PACKED_CAUSAL if args.causal
                       else COST_PACKED_KEYS_FULL if s % KEY_TILE == 0 else COST_PACKED)
        cost80 = packed * cost_packed if use_packed else t80 * COST80
        ratio = cost80 / max(1, t64 * COST64)
        pick = "64 rows" if ratio >= 1 else "80 rows packed" if use_packed else "80 rows aligned"
        print(f"negl {negl}: kept {t64 / m.numel():.3f}, packed / aligned entries "
              f"{packed / max(1, t80):.3f}, 80-row / 64-row cost {ratio:.3f} -> {pick}; "
              f"mean run {mean_run(m):.1f} tiles")


if __name__ == "__main__":
    main()
