"""Sparse backward on the bench's video-grid inputs (W + negl_prob), for A/B runs of two builds of
libbacklite: one process per library (BACK_LITE_LIBRARY picks it), the dense reference and each
negl_prob timed call by call as bench/bench_attn.py does. Prints one line per call kind:

    BACK_LITE_LIBRARY=build/ab/base.so PYTHONPATH=. python3 dev/cuda/video_sparse_ab.py \
        --shape 1,32768,24,128 --shape 1,16384,16,128 [--causal] [--reps 5 --rounds 2]

Alternate the libraries over several processes yourself (the power state drifts between calls).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_attn  # noqa: E402  (video_qkv, interleaved_medians, NEGL_PROBS)
from back_lite import functional as blf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", required=True, metavar="B,S,H,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    lib = os.path.basename(os.environ.get("BACK_LITE_LIBRARY", "?"))
    dev = torch.device("cuda")
    for shape in args.shape:
        b, s, h, d = (int(x) for x in shape.split(","))
        q, k, v = bench_attn.video_qkv(b, s, h, d, torch.bfloat16, dev)
        out, lse, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)
        dout = torch.randn_like(out)
        fns = {"dense": lambda: blf.backward(dout, q, k, v, out, lse, causal=args.causal)}
        for negl in bench_attn.NEGL_PROBS:
            fns[negl] = lambda negl=negl: blf.backward(dout, q, k, v, out, lse, tile_mass=w,
                                                       negl_prob=negl, causal=args.causal)
        ms = bench_attn.interleaved_medians(fns, args.reps, args.rounds)
        for name in fns:
            kept = 1.0
            if name != "dense":
                kept = 1.0 - blf.backward_sparsity(blf.select(w, name), s, s, args.causal)
            print(f"{lib} {shape} causal={int(args.causal)} {name!s:>5}: kept {kept:.3f} "
                  f"{ms[name]:8.3f} ms  {ms[name] / ms['dense']:.3f} x dense")
        del q, k, v, out, lse, w, dout, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
