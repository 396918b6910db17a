"""Which backward kernel the device's rule (bl_bwd_rows80_chosen) picks for the bench's video-grid
inputs at each negl_prob, computed on the CPU backend for one head: entries of 64 rows (the kept
tiles) against entries of 80 rows (every 80-row tile that overlaps a kept 64-row tile), at costs
64 and 75 per entry, and the mean run of kept 64-row tiles down a key tile's column.

    PYTHONPATH=. python3 dev/cuda/video_choice.py 16384 [causal]      (about 10 s at 16k)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_attn  # noqa: E402  (video_qkv, NEGL_PROBS)
from back_lite import functional as blf  # noqa: E402

TM, TM80, COST64, COST80 = 64, 80, 64, 75


def main():
    s = int(sys.argv[1])
    causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
    q, k, v = bench_attn.video_qkv(1, s, 1, 128, torch.bfloat16, "cpu")
    _, _, w = blf.forward(q, k, v, causal=causal, with_stats=True)
    for negl in bench_attn.NEGL_PROBS:
        m = blf.select(w, negl)[0, 0].bool()  # (Tm, Tn)
        tm, tn = m.shape
        t64 = int(m.sum())
        t80 = 0
        for a in range((s + TM80 - 1) // TM80):
            lo, hi = (TM80 * a) // TM, min((TM80 * a + TM80 - 1) // TM, tm - 1)
            t80 += int(m[lo:hi + 1].any(0).sum())
        runs = []
        for c in range(tn):
            length = 0
            for x in m[:, c].tolist() + [False]:
                if x:
                    length += 1
                elif length:
                    runs.append(length)
                    length = 0
        ratio = t80 * COST80 / max(1, t64 * COST64)
        print(f"negl {negl}: kept {t64 / (tm * tn):.3f}, 80-row / 64-row cost {ratio:.3f} -> "
              f"{80 if ratio < 1 else 64} rows; mean run {sum(runs) / max(1, len(runs)):.1f} tiles")


if __name__ == "__main__":
    main()
