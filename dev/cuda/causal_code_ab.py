"""causal_code_ab.py -- does a causal call pay per kept tile for being causal, or for its mask's
shape? Device only (a CUDA build of the library), head dim 128 (the bwd_ws128* kernels).

The bench's causal sparse rows cost ~3-4 % more per kept tile than the dense causal call
(bench/notes-bwd.md, fifty-seventh session). This probe separates the two candidate causes: the
same explicit tile mask -- a random share of the tiles strictly below the diagonal (every key of
the tile visible to every query of it, Sq == Sk) -- run once with causal=True and once with
causal=False. No kept tile crosses the diagonal, so both calls compute the same gradients from the
same inputs (checked: within 1 % of the largest gradient; bf16 runs differ by ~1e-4) on the
same entries; any time between them is the causal code path's own cost (its compares, cuts,
schedule windows, pick costs). A third call, causal with a random mask over all computable
tiles (the bench's kind of mask, diagonal tiles included), shows what the diagonal adds.

Kernel times come from torch.profiler (CUDA activity, summed per kernel name over `reps` calls),
rounds alternating the calls (order rotated); medians over rounds, and the main kernels' time per
kept tile. The profiler times overlapping (programmatically dependent) launches each in full, so
the per-call totals overstate wall time. Usage (repository root, on the device):
    BACK_LITE_LIBRARY=build/libbacklite.so PYTHONPATH=. python3 dev/cuda/causal_code_ab.py \
        --shape 1,16384,16,128 --keeps 0.5,0.1
bench/results/bwd-s63-causal-code-ab.txt holds its runs.
"""
import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import back_lite.functional as blf


def below_diagonal(tm, tn, tile_m, tile_n, device):
    """(Tm, Tn) bool: the tiles whose last key is at or before their first query (Sq == Sk)."""
    m = torch.arange(tm, device=device)[:, None]
    n = torch.arange(tn, device=device)[None, :]
    return tile_n * (n + 1) - 1 <= tile_m * m


def random_share(allowed, b, h, keep, seed):
    """(B, H, Tm, Tn) bool: each allowed tile kept with probability `keep` (a fixed seed)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = torch.rand(b, h, *allowed.shape, generator=gen).to(allowed.device)
    return (r < keep) & allowed


def kernel_us(fn, reps):
    """{kernel name: device microseconds per call}, summed over `reps` profiled calls."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = ev.cuda_time_total
        if t > 0:
            per[ev.key] = per.get(ev.key, 0.0) + t / reps
    return per


def short(name):
    return name.split("(")[0].replace("void ", "")[:70]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="1,16384,16,128", help="B,S,H,D")
    ap.add_argument("--keeps", default="0.5,0.1")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse, _ = blf.forward(q, k, v, causal=True, with_stats=False)
    tile_m, tile_n = blf.tile_shape(dev)
    tm, tn = blf.num_tiles(s, s, dev)
    below = below_diagonal(tm, tn, tile_m, tile_n, dev)
    computable = blf.computable_tiles(s, s, True, dev)
    print(f"shape {args.shape}, tiles {tile_m} x {tile_n}, {tm} x {tn}; "
          f"below-diagonal tiles {int(below.sum())} of {int(computable.sum())} computable")

    def call(mask, causal):
        return lambda: blf.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)

    calls = {"dense causal": lambda: blf.backward(dout, q, k, v, out, lse, causal=True),
             "dense non-causal": lambda: blf.backward(dout, q, k, v, out, lse, causal=False)}
    masks = {}
    for keep in (float(x) for x in args.keeps.split(",")):
        mb = random_share(below, b, h, keep, seed=1)
        mc = random_share(computable, b, h, keep, seed=2)
        masks[keep] = (mb, mc)
        calls[f"{keep} below, causal"] = call(mb, True)
        calls[f"{keep} below, non-causal"] = call(mb, False)
        calls[f"{keep} all, causal"] = call(mc, True)
        # the same gradients with and without the causal flag (no kept tile crosses the diagonal)
        ga, gb = call(mb, True)(), call(mb, False)()
        diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(ga, gb))
        scale = max(float(x.float().abs().max()) for x in ga)
        print(f"keep {keep}: tiles below {int(mb.sum())}, all {int(mc.sum())} "
              f"({int(mb.sum()) / (b * h * int(below.sum())):.3f} / "
              f"{int(mc.sum()) / (b * h * int(computable.sum())):.3f} of their sets); "
              f"causal vs non-causal grads max |diff| {diff:.3g} (max |grad| {scale:.3g})")
        assert diff <= 1e-2 * scale, "causal and non-causal calls disagree on below-diagonal tiles"

    rounds = {name: [] for name in calls}
    for r in range(args.rounds):
        names = list(calls)
        names = names[r % len(names):] + names[:r % len(names)]  # rotate the order per round
        for name in names:
            rounds[name].append(kernel_us(calls[name], args.reps))
    for name, per_round in rounds.items():
        totals = statistics.median(sum(p.values()) for p in per_round)
        kernels = sorted({kk for p in per_round for kk in p})
        parts = []
        for kk in kernels:
            med = statistics.median(p.get(kk, 0.0) for p in per_round)
            if med >= 5.0:
                parts.append(f"{short(kk)} {med:.0f}")
        print(f"{name:28s} total {totals:9.0f} us | " + "; ".join(parts))
    # ns per kept tile of the call's main kernel (its longest bwd_ws128* launch: the others of a
    # masked call return at once, and their profiler times overlap it), compared across calls
    tiles = {"dense causal": b * h * int(computable.sum()), "dense non-causal": b * h * tm * tn}
    for keep, (mb, mc) in masks.items():
        tiles[f"{keep} below, causal"] = tiles[f"{keep} below, non-causal"] = int(mb.sum())
        tiles[f"{keep} all, causal"] = int(mc.sum())
    for name, per_round in rounds.items():
        main_us = [max(t for kk, t in p.items() if "bwd_ws128" in kk) for p in per_round]
        per_tile = sorted(1e3 * t / tiles[name] for t in main_us)
        print(f"{name:28s} main kernel {1e3 * statistics.median(main_us) / tiles[name]:6.2f} ns "
              f"a tile (rounds {', '.join(f'{x:.2f}' for x in per_tile)})")


if __name__ == "__main__":
    main()
