"""Small backward calls through the compressible workspace pool, for compute-sanitizer.

    compute-sanitizer --tool memcheck python3 dev/cuda/pool_sanitize.py
    compute-sanitizer --tool racecheck python3 dev/cuda/pool_sanitize.py --quick
    compute-sanitizer --tool racecheck python3 dev/cuda/pool_sanitize.py --cases 6
    compute-sanitizer --tool racecheck python3 dev/cuda/pool_sanitize.py --deterministic

The dev checker (dev/cuda/attn_bwd.cu) allocates its workspace with cudaMalloc; this runs the
library's own path: back_lite.backward with its workspace from back_lite/workspace_pool.py
(cuMemCreate memory with compute data compression), over dense, masked and selected calls,
both head dims, GQA, Sq != Sk and lengths that are not a tile multiple. Each call's gradients
are compared with the same call on a plain workspace, so a sanitizer run also says the pool
changed nothing. Exits 1 on a mismatch. --deterministic: the cases under
torch.use_deterministic_algorithms(True) (the deterministic form: the dq-rows kernel, and at head
dim 128 version 10 without its dQ), where dq too must be the same bits on both workspaces.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import back_lite  # noqa: E402
from back_lite import workspace_pool  # noqa: E402
from inputs import random_qkv  # noqa: E402

# (B, Sq, Sk, H, Hk, D, causal, tiles)
CASES = [
    (1, 256, 256, 2, 2, 128, False, "dense"),
    (1, 333, 517, 4, 2, 128, True, "mask"),
    (2, 200, 200, 2, 1, 128, False, "select"),
    (1, 300, 450, 2, 2, 64, True, "dense"),
    (1, 513, 257, 4, 4, 64, False, "mask"),
    (1, 1, 129, 2, 2, 128, False, "dense"),
    # non-causal head dim 128 keeping 3 %: the low-keep records (sched_rec_low) of 576 columns,
    # two whole schedule windows and a part of one on 132 SMs
    (1, 1100, 1100, 64, 64, 128, False, "mask:0.03"),
    # split calls (bl_bwd_head_split) at both head dims: each column's dK / dV summed by the CTA
    # that counts its last part (bwd_split_sum_sm90.cuh)
    (1, 700, 520, 8, 1, 128, True, "mask:0.5"),
    (2, 300, 400, 4, 1, 64, False, "mask"),
    # head dim 64 causal with 2520 columns: several schedule windows (before the
    # hundred-and-thirteenth session, the global schedule's counts past the 2048 its threads held
    # in registers)
    (1, 130, 2600, 120, 120, 64, True, "mask"),
    # head dim 64 keeping 10 %, 656 columns of 0-3 pairs: where the persistent version 6 runs
    # (every unsplit call, causal or not) ~5 a CTA, on its rotated snake
    (1, 640, 5200, 16, 16, 64, False, "mask:0.1"),
    (1, 640, 5200, 16, 16, 64, True, "mask:0.1"),
    # head dim 64 keeping half of 41 key tiles: ~20 entries a row tile, past the DQ16 form's gate
    # (bl_bwd_ws64p_dq16_chosen), so that its plain form is the one picked
    (1, 256, 5200, 4, 4, 64, False, "mask:0.5"),
    # the same at head dim 128: past version 10's DIRECT gate, so that the kernel picked (its
    # plain form or an 80-row one) runs behind returning grids
    (1, 256, 5200, 4, 4, 128, False, "mask:0.5"),
    # version 10's DIRECT form with ~5 entries a row tile: most light tiles have several, whose
    # first entry stores and the others add once it has (bl_bwd_workspace::dq_claims)
    (1, 1024, 4096, 8, 8, 128, False, "mask:0.15"),
    # the same shape at head dim 64: the persistent kernel's DQ16 form (bl_bwd_ws64p_dq16_chosen),
    # whose light tiles of several entries add onto the zero CTAs' zeros (no claims there)
    (1, 1024, 4096, 8, 8, 64, False, "mask:0.15"),
    # ~14 entries a row tile, under both forms' gates, with a share of heavy tiles (> 16
    # entries), whose rows alone add into the fp32 accumulator there (at head dim 128 only those
    # rows are zeroed since the hundred-and-thirty-first session: bwd_prepost_sm90.cu)
    (1, 1024, 4096, 8, 8, 128, False, "mask:0.45"),
    (1, 1024, 4096, 8, 8, 64, False, "mask:0.45"),
    # causal packed 80-row entries over 1536 columns, about three schedule windows on 132 SMs:
    # the first windows' kv heads are done while the last window is still being drawn
    (1, 4000, 4096, 48, 48, 128, True, "mask:0.8"),
]


def call(case, compressible: bool):
    b, sq, sk, h, hk, d, causal, tiles = case
    os.environ[workspace_pool.ENV_VAR] = "1" if compressible else "0"
    torch.manual_seed(0)
    q, k, v = random_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda")
    dout = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    kw = {}
    if tiles.startswith("mask"):
        keep = float(tiles.partition(":")[2] or 0.3)
        tm, tn = back_lite.num_tiles(sq, sk, "cuda")
        gen = torch.Generator(device="cuda").manual_seed(1)
        kw["mask"] = torch.rand(b, h, tm, tn, device="cuda", generator=gen) < keep
    elif tiles == "select":
        kw.update(tile_mass=w, negl_prob=0.05)
    grads = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
    torch.cuda.synchronize()
    return grads


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the first three cases only")
    ap.add_argument("--cases", help="these cases only: indices into CASES, comma-separated")
    ap.add_argument("--deterministic", action="store_true",
                    help="the deterministic form (dq compared bitwise)")
    args = ap.parse_args()
    assert workspace_pool.pool_for(torch.device("cuda")) is not None, "no compressible pool here"
    cases = CASES[:3] if args.quick else CASES
    if args.cases:
        cases = [CASES[int(i)] for i in args.cases.split(",")]
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    # the deterministic form's dq is the same bits whatever the workspace; the fastest form's
    # is summed in completion order, and its light row tiles (version 10's DIRECT form, the
    # head-dim-64 DQ16 form: up to 16 entries) in 16-bit, each reduce-add rounding, so two runs
    # differ by a few bf16 ulps (one is at most 2^-7 of the value): a difference of up to 4 ulps
    # of the largest |dq| passes (case 9 differed by 1.5 under racecheck in the
    # hundred-and-nineteenth session); a workspace fault shows as errors the size of the values
    dq_tol = 0.0 if args.deterministic else 4 * 2.0**-7
    bad = 0
    for case in cases:
        pooled, plain = call(case, True), call(case, False)
        same_kv = torch.equal(pooled[1], plain[1]) and torch.equal(pooled[2], plain[2])
        dq_err = (pooled[0].float() - plain[0].float()).abs().max().item()
        dq_max = plain[0].float().abs().max().item()
        ok = same_kv and dq_err <= dq_tol * max(dq_max, 1e-6)
        bad += not ok
        verdict = "PASS" if ok else "FAIL"
        print(f"{case}: dK/dV identical {same_kv}, dq max diff {dq_err:.3g} (max |dq| "
              f"{dq_max:.3g}) -> {verdict}")
    print(f"pool_sanitize: {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
