"""Where a backward call's GPU time goes, kernel by kernel (torch.profiler / CUPTI timestamps).

    python3 dev/cuda/bwd_call_timeline.py [--shape B,S,H,D[,HK]] [--kv-heads HK] [--causal]
                                          [--calls N]
                                          [--keeps dense,1.0,0.5,0.03,0.01,negl:0.05]

For each configuration (the dense call, a random tile mask keeping about `keep` of each row
tile, as bench/bench_attn.py draws them, or `negl:P`: the selection at negl_prob P from the W of
the bench's video-grid inputs, the selection kernel in the call; or `even:K`: as many tiles a
row as keep K, drawn from the even key tiles only; or `rows:K`: the same random K of the row tiles
kept in every column of a head, so that the columns walked side by side read the same Q / dO rows
in the same order, as the dense walk's do) it queues N calls, each behind a
~1 ms sleep kernel so that the host has queued the whole call before the GPU reaches it (as in
the bench's back-to-back calls), and prints per kernel (or memset / copy) of the call: the
median duration, the median gap from the previous one's end, and the call's span (first start
to last end). No ncu: the clocks float as in the bench.

With --nvtx it times nothing: per configuration two warm-up calls, then one call inside an NVTX
range `bl_call`, for ncu to profile alone (its DRAM bytes per kernel: dev/cuda/ncu_dram.py):
    ncu --nvtx --nvtx-include "bl_call/" --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
        dram__bytes_write.sum python3 dev/cuda/bwd_call_timeline.py --nvtx --keeps dense,0.03 > LOG
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from bench_attn import grouped, random_qkv, random_tile_mask, video_qkv  # noqa: E402
from back_lite import functional as blf  # noqa: E402

SLEEP_CYCLES = 2_000_000  # ~1 ms at 1.98 GHz: longer than the host needs to queue one call


# The GPU work a call's span must count: kernels, and the driver's memsets and copies (a memset
# queued in the call was missing from its span while only "kernel" events were read:
# bench/results/bwd-s84-zeros-probe.txt).
GPU_EVENT_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


def kernel_events(prof) -> list:
    """[(name, start us, duration us)] of the GPU kernels, memsets and copies in a finished
    profile, by start."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    ev = [(e["name"], float(e["ts"]), float(e["dur"])) for e in trace["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATS]
    return sorted(ev, key=lambda e: e[1])


def short(name: str) -> str:
    name = name.split("(")[0]
    return name[:60]


def profile_calls(fn, calls: int, sleep_cycles: int = SLEEP_CYCLES) -> list:
    """Kernels of each of `calls` calls of fn: [[(name, start, dur), ...], ...]."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda._sleep(sleep_cycles)
            fn()
        torch.cuda.synchronize()
    per_call, cur = [], None
    for name, ts, dur in kernel_events(prof):
        if "spin" in name.lower() or "sleep" in name.lower():  # torch.cuda._sleep's kernel
            cur = []
            per_call.append(cur)
        elif cur is not None:
            cur.append((name, ts, dur))
    if not per_call:
        raise RuntimeError("no sleep kernel in the profile; kernels seen: "
                           + ", ".join(sorted({short(e[0]) for e in kernel_events(prof)})))
    return per_call


def one_call_in_range(fn) -> None:
    """Two warm-up calls, then one inside the NVTX range `bl_call` (ncu --nvtx-include bl_call/)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("bl_call")
    fn()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def position_stats(per_call: list) -> tuple:
    """Per kernel position of the calls' first n kernels (n: the fewest any call has): (name,
    median duration, median gap from the previous kernel's end, median start after the call's
    first kernel started) -- the start read per call, not summed from the medians (a kernel that
    starts beside the one before it would otherwise carry that one's median duration) -- and
    the calls' spans (first start to the n-th kernel's end). Times in us."""
    n = min(len(c) for c in per_call)
    rows = []
    for pos in range(n):
        durs = [c[pos][2] for c in per_call]
        gaps = [c[pos][1] - (c[pos - 1][1] + c[pos - 1][2]) for c in per_call] if pos else [0.0]
        starts = [c[pos][1] - c[0][1] for c in per_call]
        rows.append((short(per_call[0][pos][0]), statistics.median(durs),
                     statistics.median(gaps), statistics.median(starts)))
    spans = [c[n - 1][1] + c[n - 1][2] - c[0][1] for c in per_call]
    return rows, spans


def report(label: str, per_call: list) -> None:
    rows, spans = position_stats(per_call)
    print(f"\n== {label}: {len(per_call)} calls, {len(rows)} kernels each")
    for name, dur, gap, start in rows:
        print(f"  {name:60s} {dur:10.1f} us  gap {gap:6.1f} us  start {start:7.1f} us")
    print(f"  span median {statistics.median(spans):.1f} us (min {min(spans):.1f}, max {max(spans):.1f})")


def parse_shape(text: str, kv_heads: int = 0) -> tuple:
    """(B, S, H, D, HK) from "B,S,H,D" or the bench's "B,S,H,D,HK" (bench/bench_attn.py); HK
    from --kv-heads where the shape has none, H where neither gives it."""
    dims = [int(x) for x in text.split(",")]
    if len(dims) not in (4, 5):
        raise SystemExit(f"--shape {text!r}: B,S,H,D or B,S,H,D,HK")
    if len(dims) == 5 and kv_heads and kv_heads != dims[4]:
        raise SystemExit(f"--shape {text!r} gives {dims[4]} kv heads, --kv-heads {kv_heads}")
    b, s, h, d = dims[:4]
    hk = dims[4] if len(dims) == 5 else kv_heads or h
    if hk <= 0 or h % hk:
        raise SystemExit(f"{hk} kv heads do not divide the {h} query heads")
    return b, s, h, d, hk


def even_tile_mask(b, h, tm, tn, keep, device):
    """(B, H, Tm, Tn) bool: as many tiles a row tile as random_tile_mask keeps at `keep`, drawn
    from the even key tiles only -- half the columns empty, the others twice as full (what a
    column without entries costs, bench/notes-bwd.md, hundred-and-tenth session)."""
    even = random_tile_mask(b, h, tm, (tn + 1) // 2, keep * tn / ((tn + 1) // 2), device)
    mask = torch.zeros(b, h, tm, tn, dtype=torch.bool, device=device)
    mask[..., 0::2] = even
    return mask


def shared_rows_mask(b, h, tm, tn, keep, device, seed=0):
    """(B, H, Tm, Tn) bool: round(keep x Tm) row tiles of each head, drawn at random, kept whole
    -- every column of the head keeps the same rows. As many tiles in all as random_tile_mask
    keeps at the same keep, laid out so that the columns walked side by side share their Q / dO
    rows and dq adds in L2 (what a random mask's extra DRAM bytes cost the walk,
    bench/results/bwd-s138-shared-rows.txt)."""
    rows = random_tile_mask(b, h, 1, tm, keep, "cpu", seed)  # (B, H, 1, Tm): a head's row tiles
    return rows.transpose(-1, -2).expand(b, h, tm, tn).contiguous().to(device)


# The tile masks a --keeps item names: "K" (the bench's random keep), "even:K", "rows:K".
MASK_DRAWS = {"": random_tile_mask, "even": even_tile_mask, "rows": shared_rows_mask}


def keep_kind(keep: str):
    """The --keeps item `keep` checked: "dense", ("negl", P), or (mask draw, keep fraction)."""
    if keep == "dense":
        return keep
    kind, _, frac = keep.rpartition(":")
    if kind != "negl" and kind not in MASK_DRAWS:
        raise SystemExit(f"--keeps: unknown kind {kind!r} in {keep!r} (dense, K, negl:P, "
                         f"even:K, rows:K)")
    try:
        value = float(frac)
    except ValueError:
        raise SystemExit(f"--keeps: {keep!r} has no number after its kind") from None
    return (kind, value) if kind == "negl" else (MASK_DRAWS[kind], value)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,16384,16,128")
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="K / V heads (GQA / MQA: H a multiple of it); 0: H (random keeps only)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--keeps", default="dense,1.0,0.5,0.03,0.01")
    ap.add_argument("--nvtx", action="store_true",
                    help="one call per configuration inside an NVTX range `bl_call` (for ncu)")
    ap.add_argument("--sleep-ms", type=float, default=SLEEP_CYCLES / 2e6,
                    help="the sleep kernel ahead of each call, ms at ~2 GHz (longer: to show "
                         "that a start offset is not the host's)")
    args = ap.parse_args(argv)
    b, s, h, d, hk = parse_shape(args.shape, args.kv_heads)
    keeps = [(keep, keep_kind(keep)) for keep in args.keeps.split(",")]  # (stops before the GPU)
    dev = torch.device("cuda")
    q, k, v = random_qkv(b, s, h, d, torch.bfloat16, dev)
    k, v = k[:, :, :hk].contiguous(), v[:, :, :hk].contiguous()
    dout = torch.randn_like(q)
    out, lse, w = blf.forward(q, k, v, causal=args.causal, with_stats=True)
    tm, tn = w.shape[-2:]
    computable = blf.computable_tiles(s, s, args.causal, dev)
    print(f"shape {(b, s, h, d)} kv heads {hk} causal={args.causal} {torch.cuda.get_device_name()}")
    video = None
    for keep, kind in keeps:
        if kind == "dense":
            fn = lambda: blf.backward(dout, q, k, v, out, lse, causal=args.causal)
        elif kind[0] == "negl":
            if video is None:  # GQA / MQA: K / V cut to their first hk heads, as the bench does
                qs, ks, vs = grouped(*video_qkv(b, s, h, d, torch.bfloat16, dev), hk)
                outs, lses, ws = blf.forward(qs, ks, vs, causal=args.causal, with_stats=True)
                video = (qs, ks, vs, outs, lses, ws)
            negl = kind[1]
            kept = 1.0 - blf.backward_sparsity(blf.select(video[5], negl), s, s, args.causal)
            print(f"   ({keep} keeps {kept:.3f} of the computable tiles)")
            fn = lambda negl=negl, x=video: blf.backward(dout, *x[:5], tile_mass=x[5],
                                                         negl_prob=negl, causal=args.causal)
        else:
            draw, frac = kind
            mask = draw(b, h, tm, tn, frac, dev) & computable
            fn = lambda mask=mask: blf.backward(dout, q, k, v, out, lse, mask=mask,
                                                causal=args.causal)
        if args.nvtx:
            one_call_in_range(fn)
            print(f"== keep {keep}: one call in NVTX range bl_call")
        else:
            report(f"keep {keep}", profile_calls(fn, args.calls, int(args.sleep_ms * 2e6)))


if __name__ == "__main__":
    main()
