"""Masked backward gradients on the device against the float64 reference, around version 10's
DIRECT form and its 16-bit dq (BACK_LITE_LIBRARY picks the library: the shipped one, or a build of
dev/cuda/wip/bwd-dq16-light-tiles.patch; written for the ninety-seventh session's dQ16 probe), and
at head dim 64 around version 6's (bwd-dq16-light-tiles-hd64.patch: light row tiles in 16-bit on
every masked call; -picked.patch: where the entries average <= 16.5, as `direct` says).

For each (shape, causal, dtype, keep): a random tile mask keeping each tile with probability
keep, the masked backward, and dq / dk / dv against tests/reference.py's float64 backward over the
same tiles, by the tests' criterion (reference.check_close: ratio = max error / allowance, <= 1
passes) with the relative RMS error beside it. `direct` says whether the mask's entries per row
tile average <= --direct-max (the library's DIRECT gate: 4.5 shipped, 16.5 in the patch), where
version 10's DIRECT form runs (bl_bwd_dq_direct_chosen) unless an 80-row kernel costs less.

    BACK_LITE_LIBRARY=build/ab/new.so PYTHONPATH=. python3 dev/cuda/dq16_probe_check.py --direct-max 16.5
(--device cpu --small: the script's own smoke run on the CPU backend, fp32 accumulation only)
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref  # noqa: E402
from dq_accum_precision import rel_rms  # noqa: E402
from inputs import random_qkv  # noqa: E402

import back_lite  # noqa: E402

DIRECT_MAX_ENTRIES = 4.5  # bwd_common.cuh: BL_DQ_DIRECT_MAX_ENTRIES_X2 / 2
# (B, S, Hq, Hk, D), causal, keeps: DIRECT below ~0.14 kept without a causal mask (32 key tiles a
# row tile) and below ~0.27 with one (16.5 on average)
CASES = [((1, 4096, 8, 8, 128), False, (0.03, 0.1, 0.13, 0.5)),
         ((1, 4096, 8, 8, 128), True, (0.05, 0.2, 0.26, 0.5)),
         ((2, 2000, 8, 2, 128), False, (0.1, 0.14)),
         ((1, 3000, 4, 4, 128), True, (0.1, 0.25)),
         # head dim 64 (the same 32 key tiles a row tile): light tiles only, about a quarter
         # heavy (0.45: 14.4 entries), most heavy (0.6: 19.2, past the gate)
         ((1, 4096, 8, 8, 64), False, (0.03, 0.1, 0.45, 0.6)),
         ((1, 4096, 8, 8, 64), True, (0.05, 0.3, 0.6))]
SMALL_CASES = [((1, 520, 2, 1, 64), False, (0.2, 0.6)), ((1, 520, 2, 2, 64), True, (0.3,))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="small shapes (a smoke run)")
    ap.add_argument("--direct-max", type=float, default=DIRECT_MAX_ENTRIES,
                    help="the library's DIRECT gate in entries a row tile")
    args = ap.parse_args()
    dev = args.device
    gen = torch.Generator(device=dev).manual_seed(0)
    dtypes = (torch.bfloat16, torch.float16) if dev == "cuda" else (torch.bfloat16,)
    print(f"# library {os.environ.get('BACK_LITE_LIBRARY', '(installed)')}, device {dev}")
    print("| shape | causal | dtype | keep | entries / row tile | direct | dq ratio | dk ratio |"
          " dv ratio | dq rms | pass |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for (batch, seqlen, hq, hk, d), causal, keeps in (SMALL_CASES if args.small else CASES):
        for dtype in dtypes:
            q, k, v = random_qkv(batch, seqlen, seqlen, hq, hk, d, dtype, dev)
            dout = torch.randn(q.shape, device=dev, generator=gen).to(dtype)
            scale = 1.0 / math.sqrt(d)
            out, lse, _ = back_lite.forward(q, k, v, causal=causal)
            tm, tn = back_lite.num_tiles(seqlen, seqlen, dev)
            tiles = back_lite.tile_shape(dev)
            allowed = ref.tile_mass(ref.allowed_keys(seqlen, seqlen, causal, dev)[None, None]
                                    .double(), *tiles) > 0  # (1, 1, Tm, Tn)
            for keep in keeps:
                mask = torch.rand(batch, hq, tm, tn, device=dev, generator=gen) < keep
                entries = float((mask & allowed).sum()) / (batch * hq * tm)
                got = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
                want = ref.backward(q, k, v, out, dout, scale, causal, mask, tiles)
                base = ref.backward(q, k, v, out, dout, scale, causal, mask, tiles, dtype)
                ratios = [ref.max_err(g, w) / ref.allowance(w, b)
                          for g, w, b in zip(got, want, base)]
                ok = all(r <= 1.0 for r in ratios) and not any(torch.isnan(g).any() for g in got)
                failed += not ok
                print(f"| {(batch, seqlen, hq, hk, d)} | {causal} | {str(dtype)[6:]} | {keep} | "
                      f"{entries:.2f} | {entries <= args.direct_max} | {ratios[0]:.3f} | "
                      f"{ratios[1]:.3f} | {ratios[2]:.3f} | {rel_rms(got[0], want[0]):.2e} | "
                      f"{'yes' if ok else 'NO'} |", flush=True)
    print(f"# {failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
