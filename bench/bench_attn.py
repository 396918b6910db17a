"""BackLite benchmark on one GPU (method: DESIGN.md §3).

For each shape: dense forward / backward TFLOP/s of BackLite against PyTorch SDPA with the cuDNN and the
FLASH (FlashAttention-2) backends, measured in the same run; forward with and without tile statistics;
the sparse backward against its kept fraction on structured (video-grid, local) inputs, both from
W + negl_prob and from explicit random masks of set densities; FlexAttention with a block mask of the
same density; the bytes of saved statistics.

    python bench/bench_attn.py --out bench/results/<name>.json      # full run (GPU)
    python bench/bench_attn.py --quick                              # one small shape

TFLOP/s by the FlashAttention convention: forward 4*B*Hq*Sq*Sk*D (half for causal), backward 2.5x.
Timing: CUDA events around each call after warm-up, median of `--reps` runs. The dense
comparisons (BackLite forward with and without statistics, backward; each SDPA backend's forward
and backward) run interleaved call by call: in each of `--rounds` rounds, `--reps` cycles that call
every contender once in a shuffled order; each figure is the median of its round medians. A
kernel near the GPU's power cap runs faster right after a lighter one, so blocks of one
contender's calls would favour whichever block followed a light one (interleaved_times). The
sparse rows' ratio to the dense backward (and the bars' verdicts) is that of the two medians;
beside it, "paired", the median of each sparse call's time over the dense call of the same cycle
(paired_ratios), which varies less between runs (bench/results/bench-yardstick-s37.txt run 3).
The run ends with how many rows of the shapes with S >= 16384 meet each bar, by both ratios
(bar_counts): the MHA shapes (the issue's bars), then apart the GQA / MQA ones (shapes with a
fifth entry, the K / V heads).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import statistics
import sys

import torch
import torch.nn.functional as F

import back_lite
from back_lite import functional as blf

SHAPES_FULL = [  # (B, S, H, D) or, for GQA / MQA, (B, S, Hq, D, Hk)
    (1, 16384, 16, 128),
    (1, 32768, 24, 128),
    (1, 16384, 16, 64),
    (4, 4096, 16, 64),
    # an LLM's attention after tensor parallelism: 64 query / 8 K/V heads (Llama-3-70B's) on 8
    # GPUs leave each 8 query heads and one K/V head -- the FLOPs of the first shape, in 256
    # (b, kv head, key tile) columns (the head split's case); not among the bar shapes
    (2, 16384, 8, 128, 1),
]
SHAPES_QUICK = [(1, 4096, 8, 128)]
NEGL_PROBS = [0.01, 0.05, 0.2, 0.5]
RANDOM_MASK_KEEP = [1.0, 0.5, 0.25, 0.1, 0.03, 0.01]
FLEX_KEEP = (1.0, 0.1)  # FlexAttention compiles per shape: time it at a few densities only


def per_call_ms(calls, warmup: int = 3) -> list:
    """[ms] of each call in `calls` (zero-argument callables), each between its own two CUDA
    events, after the first `warmup` of them run untimed.

    The calls are queued back to back with one host sync at the end (as triton.testing.do_bench
    does), so a call's time is what the GPU spends on it: the host work of the next call (Python
    checks, allocation, the ctypes call) overlaps the GPU work of the previous one whenever it is
    shorter. With a sync after every call the idle GPU waited for that host work inside the timed
    interval (the statistics call, which allocates W and a workspace, paid most)."""
    for fn in (list(calls) * warmup)[:warmup]:  # the first `warmup` calls, cycling if fewer
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in calls]
    for fn, (start, end) in zip(calls, events):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def time_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median GPU milliseconds of fn() over `reps` back-to-back runs (per_call_ms)."""
    return statistics.median(per_call_ms([fn] * reps, warmup))


def fwd_flops(b, s, h, d, causal):
    return 4.0 * b * h * s * s * d / (2.0 if causal else 1.0)


def video_qkv(batch, seqlen, heads, head_dim, dtype, device, width=3.0, sharpness=8.0, seed=0):
    """Tokens on a (T, Y, X) video grid in raster order; q . k falls off with the 3-D distance
    between tokens (random Fourier features of a Gaussian kernel of `width` grid cells), so each
    query attends to a local neighbourhood, as in video diffusion transformers. v is random."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    side = round((seqlen / 4) ** (1 / 3))                 # T = side, Y = X = 2*side, about
    y = x = max(1, 2 * side)
    t = math.ceil(seqlen / (y * x))
    grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(y), torch.arange(x),
                                      indexing="ij"), -1).reshape(-1, 3)[:seqlen].double()
    freqs = torch.randn(3, head_dim // 2, generator=gen, dtype=torch.float64) / width
    angle = grid @ freqs                                   # (S, D/2)
    feat = torch.cat([angle.cos(), angle.sin()], -1) / math.sqrt(head_dim // 2)
    # score = scale * amp^2 * kernel; amp^2 = sharpness * sqrt(D) makes the peak `sharpness`
    amp = math.sqrt(sharpness * math.sqrt(head_dim))
    noise = lambda: 0.3 * torch.randn(batch, seqlen, heads, head_dim, generator=gen,
                                      dtype=torch.float64) / math.sqrt(head_dim)
    q = amp * feat[None, :, None, :] + noise()
    k = amp * feat[None, :, None, :] + noise()
    v = torch.randn(batch, seqlen, heads, head_dim, generator=gen, dtype=torch.float64)
    return [z.to(device=device, dtype=dtype).contiguous() for z in (q, k, v)]


def random_qkv(batch, seqlen, heads, head_dim, dtype, device):
    return [torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype)
            for _ in range(3)]


def kv_heads_of(shape) -> int:
    """K / V heads of a (B, S, H, D[, Hk]) shape: H where none is given (MHA)."""
    return shape[4] if len(shape) > 4 else shape[2]


def grouped(q, k, v, kv_heads):
    """(q, k, v) with K / V cut to their first `kv_heads` heads (GQA / MQA inputs from MHA ones:
    query head h then attends K / V head h // (H / kv_heads))."""
    if kv_heads == q.shape[2]:
        return q, k, v
    return q, k[:, :, :kv_heads].contiguous(), v[:, :, :kv_heads].contiguous()


def cuda_event():
    return torch.cuda.Event(enable_timing=True)


def interleaved_times(fns: dict, reps: int, rounds: int, seed: int = 0,
                      event=cuda_event, sync=torch.cuda.synchronize) -> dict:
    """{name: [[ms of each cycle] for each round]}. A round runs every contender once as warm-up,
    then `reps` cycles that call every contender once each, in a fresh random order per cycle;
    each call sits between its own two CUDA events and the round syncs once at its end.

    Call-by-call interleaving, not one block of calls per contender: on the H200 the dense
    forward at 1x16384x16x128 runs into the 700 W power cap after ~10 back-to-back calls (SM clock
    1980 -> ~1670 MHz, 3.16 -> 3.47 ms a call; bench/results/order-2026-11-29.txt), so a block
    that followed a lighter contender's block ran ~10% faster than the next block did. Mixed
    calls see the same power state; the shuffled order gives no contender a fixed predecessor."""
    rng = random.Random(seed)
    names = list(fns)
    per_round = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            fns[name]()
        sync()
        timed = []  # (name, start event, end event) in queue order
        for _ in range(reps):
            for name in rng.sample(names, len(names)):
                start, end = event(), event()
                start.record()
                fns[name]()
                end.record()
                timed.append((name, start, end))
        sync()
        for name in names:
            per_round[name].append([s.elapsed_time(e) for n, s, e in timed if n == name])
    return per_round


def interleaved_medians(fns: dict, reps: int, rounds: int, seed: int = 0,
                        event=cuda_event, sync=torch.cuda.synchronize) -> dict:
    """{name: ms}: the median of each name's per-round medians over `rounds` rounds of
    interleaved_times."""
    return medians_of(interleaved_times(fns, reps, rounds, seed, event, sync))


def medians_of(times: dict) -> dict:
    """{name: the median of its per-round medians} of interleaved_times."""
    return {name: statistics.median(statistics.median(cycles) for cycles in per_round)
            for name, per_round in times.items()}


def paired_ratios(times: dict, ref: str) -> dict:
    """{name: ratio} from interleaved_times: each call's time over the `ref` call's of the same
    cycle (the two a few calls apart, so in one power state), the median over a round's cycles,
    then over the rounds. Reported beside the ratio of medians (bench/results/
    bench-yardstick-s37.txt: the dense reference alone moves by several percent between blocks
    and runs with what ran before it)."""
    return {name: statistics.median(
                statistics.median(t / r for t, r in zip(cycles, ref_cycles))
                for cycles, ref_cycles in zip(per_round, times[ref]))
            for name, per_round in times.items()}


def block_medians(fns: dict, reps: int, rounds: int) -> dict:
    """{name: ms} the way runs before 2026-11-29 (session 4) timed: per round, each contender's
    `reps` calls as one block (time_ms); the median of each name's round medians. Kept to compare
    with older result files (--timing blocks); see interleaved_medians for why it is not the
    default."""
    per_round = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per_round[name].append(time_ms(fn, reps))
    return {name: statistics.median(ms) for name, ms in per_round.items()}


def sdpa_callables(q, k, v, causal):
    """{backend name: (fwd, bwd, how)} zero-argument callables for each SDPA backend that runs on
    this input ((B, S, H, D) -> SDPA's (B, H, S, D)); the backward replays one forward's graph.
    GQA / MQA (fewer K / V heads): SDPA's enable_gqa where the backend takes it, else K / V
    repeated to the query heads before the call (the same FLOPs; the peer then reads G times the
    K / V bytes and does not sum dK / dV over the group) -- `how` says which."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res = {}
    qt, kt, vt = (z.transpose(1, 2).detach().requires_grad_() for z in (q, k, v))
    group = q.shape[2] // k.shape[2]
    ways = [("mha", kt, vt, {})] if group == 1 else [
        ("enable_gqa", kt, vt, {"enable_gqa": True}),
        ("kv repeated", *(z.detach().repeat_interleave(group, dim=1).requires_grad_()
                          for z in (kt, vt)), {})]
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        for how, kw, vw, extra in ways:
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(qt, kw, vw, is_causal=causal, **extra)
                    dout = torch.randn_like(out)
                    torch.autograd.grad(out, (qt, kw, vw), dout, retain_graph=True)

                def fwd(backend=backend, kw=kw, vw=vw, extra=extra):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, kw, vw, is_causal=causal, **extra)

                def bwd(out=out, dout=dout, kw=kw, vw=vw):
                    return torch.autograd.grad(out, (qt, kw, vw), dout, retain_graph=True)

                res[name] = (fwd, bwd, how)
                break
            except Exception as exc:  # a backend that does not support this shape/dtype
                print(f"  {name} ({how}): not run ({type(exc).__name__}: {str(exc)[:120]})",
                      file=sys.stderr)
    return res


def flex_time(q, k, v, mask, reps):
    """fwd+bwd ms of FlexAttention whose mask skips the same (64 x 128) tiles as `mask`. Unlike
    BackLite, FlexAttention applies the mask to the forward too; this is the cost of a block-sparse
    fwd+bwd of the same density, the peer DESIGN.md §3 asks for."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    tm, tn = blf.tile_shape(q.device)
    b, s, h, _ = q.shape
    tiles = mask.contiguous()

    def mask_mod(bi, hi, qi, ki):
        return tiles[bi, hi, qi // tm, ki // tn]

    # FlexAttention's kernels need blocks of 128 x 128; mask_mod keeps our 64 x 128 granularity
    # inside them (a block with one kept 64-row half is computed with the other half masked).
    block_mask = create_block_mask(mask_mod, b, h, s, s, device=q.device, BLOCK_SIZE=128)
    flex = torch.compile(flex_attention)
    qt, kt, vt = (z.transpose(1, 2).detach().requires_grad_() for z in (q, k, v))
    dout = torch.randn_like(qt)

    def step():
        out = flex(qt, kt, vt, block_mask=block_mask, enable_gqa=kt.shape[1] != qt.shape[1])
        torch.autograd.grad(out, (qt, kt, vt), dout)

    return time_ms(step, reps)


def random_tile_mask(b, h, tm, tn, keep, device, seed=0):
    """(B, H, Tm, Tn) bool with about `keep` of each row tile kept (at least one tile)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(b, h, tm, tn, generator=gen)
    kth = max(1, round(keep * tn))
    thresh = scores.topk(kth, dim=-1).values[..., -1:]
    return (scores >= thresh).to(device)


def bench_shape(shape, dtype, causal, reps, rounds, with_flex, timing="calls", device="cuda"):
    """One shape's rows (device: "cpu" only for the tests' smoke run, with a stand-in timer)."""
    b, s, h, d = shape[:4]
    hk = kv_heads_of(shape)
    dev = torch.device(device)
    rows = {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "causal": causal}
    fl = fwd_flops(b, s, h, d, causal)
    q, k, v = grouped(*random_qkv(b, s, h, d, dtype, dev), hk)
    dout = torch.randn_like(q)

    def timer(fns, ref):
        """(medians, paired ratios against `ref`, or None under --timing blocks)"""
        if timing != "calls":
            return block_medians(fns, reps, rounds), None
        times = interleaved_times(fns, reps, rounds)
        return medians_of(times), paired_ratios(times, ref)

    # dense forward (with and without statistics) and backward, SDPA peers interleaved
    out, lse, w = blf.forward(q, k, v, causal=causal, with_stats=True)
    fns = {"bl_fwd": lambda: blf.forward(q, k, v, causal=causal),
           "bl_fwd_stats": lambda: blf.forward(q, k, v, causal=causal, with_stats=True),
           "bl_bwd": lambda: blf.backward(dout, q, k, v, out, lse, causal=causal)}
    peers = sdpa_callables(q, k, v, causal)
    for name, (fwd, bwd, _) in peers.items():
        fns[name + "_fwd"], fns[name + "_bwd"] = fwd, bwd
    # The statistics' cost also as each call's ratio to the plain forward of its own cycle: the
    # ratio of medians moved by up to 4 points per shape between two runs of one build
    # (bench/results/bench-2026-12-01-s43.txt / -s43r.txt), as the backward's did.
    ms, paired = timer(fns, "bl_fwd")
    stats_paired = paired["bl_fwd_stats"] if paired else None
    f_plain, f_stats, b_dense = ms["bl_fwd"], ms["bl_fwd_stats"], ms["bl_bwd"]
    rows["backlite"] = {"fwd_ms": f_plain, "fwd_stats_ms": f_stats, "bwd_ms": b_dense,
                        "fwd_tflops": fl / f_plain / 1e9, "bwd_tflops": 2.5 * fl / b_dense / 1e9,
                        "stats_overhead": f_stats / f_plain, "stats_overhead_paired": stats_paired}
    rows["stats_bytes"] = w.numel() * 4
    rows["per_row_stats_bytes"] = b * h * s * w.shape[-1] * 4  # the seed design's (B,H,Sq,Tn) fp32
    for name in peers:
        fw, bw = ms[name + "_fwd"], ms[name + "_bwd"]
        rows[name] = {"fwd_ms": fw, "bwd_ms": bw, "fwd_tflops": fl / fw / 1e9,
                      "bwd_tflops": 2.5 * fl / bw / 1e9, "heads": peers[name][2]}
    del peers, fns

    # Sparse backward against the dense one, each set timed with its own dense reference in the
    # same interleaving as the dense comparison (a sparse call is lighter on power than a dense
    # one: timed in separate blocks, the ratio would carry the power state, not the work).
    tm, tn = w.shape[-2:]
    computable = blf.computable_tiles(s, s, causal, dev)
    sparse = []

    # from random explicit masks: time against kept fraction
    masks = {keep: random_tile_mask(b, h, tm, tn, keep, dev) & computable for keep in RANDOM_MASK_KEEP}
    fns = {"dense": lambda: blf.backward(dout, q, k, v, out, lse, causal=causal)}
    for keep, mask in masks.items():
        fns[keep] = lambda mask=mask: blf.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
    ms, paired = timer(fns, "dense")
    for keep, mask in masks.items():
        kept = 1.0 - blf.backward_sparsity(mask, s, s, causal)
        t, ref = ms[keep], ms["dense"]
        row = {"source": "random mask", "kept": kept, "bwd_ms": t, "dense_ms": ref, "vs_dense": t / ref,
               "vs_dense_paired": paired[keep] if paired else None,
               "bar_10pct": t <= (kept + 0.10) * ref, "bar_2pct": t <= (kept + 0.02) * ref}
        if with_flex and keep in FLEX_KEEP:
            try:
                row["flex_fwd_bwd_ms"] = flex_time(q, k, v, mask, reps)
            except Exception as exc:
                row["flex_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        sparse.append(row)

    # from W + negl_prob on structured (video-grid) inputs
    qs, ks, vs = grouped(*video_qkv(b, s, h, d, dtype, dev), hk)
    outs, lses, ws = blf.forward(qs, ks, vs, causal=causal, with_stats=True)
    fns = {"dense": lambda: blf.backward(dout, qs, ks, vs, outs, lses, causal=causal)}
    for negl in NEGL_PROBS:
        fns[negl] = lambda negl=negl: blf.backward(dout, qs, ks, vs, outs, lses, tile_mass=ws,
                                                   negl_prob=negl, causal=causal)
    ms, paired = timer(fns, "dense")
    for negl in NEGL_PROBS:
        mask = blf.select(ws, negl)
        kept = 1.0 - blf.backward_sparsity(mask, s, s, causal)
        t, ref = ms[negl], ms["dense"]
        sparse.append({"source": f"video W, negl_prob={negl}", "kept": kept, "bwd_ms": t,
                       "dense_ms": ref, "vs_dense": t / ref,
                       "vs_dense_paired": paired[negl] if paired else None,
                       "bar_10pct": t <= (kept + 0.10) * ref, "bar_2pct": t <= (kept + 0.02) * ref})
    rows["sparse"] = sparse
    return rows


def print_table(results):
    # "stats overhead": ratio of medians, then (files from the thirty-ninth session on) the paired
    # ratio
    print("\n| shape (B,S,H,D[,Hk]) | causal | BackLite fwd / bwd TFLOP/s | cuDNN fwd / bwd | FLASH fwd / bwd "
          "| stats overhead (paired) | W bytes (per-row design) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        bl = r["backlite"]
        # a GQA / MQA peer that ran on K / V repeated to the query heads says so
        cell = lambda k: (f"{r[k]['fwd_tflops']:.0f} / {r[k]['bwd_tflops']:.0f}"
                          + (" (K/V repeated)" if r[k].get("heads") == "kv repeated" else "")
                          if k in r else "n/a")
        paired = bl.get("stats_overhead_paired")
        paired = f" ({paired:.3f}x)" if paired is not None else ""
        print(f"| {tuple(r['shape'])} | {r['causal']} | {cell('backlite')} | {cell('sdpa_cudnn')} "
              f"| {cell('sdpa_flash')} | {bl['stats_overhead']:.3f}x{paired} | {r['stats_bytes']:,} "
              f"({r['per_row_stats_bytes']:,}) |")
    # "/ dense (paired)": paired_ratios, the ratio of calls of one cycle (files before the
    # thirty-third session's have none)
    print("\n| shape | causal | source | kept | sparse bwd ms | / dense | <= kept+10% | <= kept+2% "
          "| flex fwd+bwd ms | / dense (paired) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for sp in r["sparse"]:
            flex = f"{sp['flex_fwd_bwd_ms']:.2f}" if "flex_fwd_bwd_ms" in sp else sp.get("flex_error", "")[:40]
            paired = sp.get("vs_dense_paired")
            paired = f"{paired:.3f}" if paired is not None else ""
            print(f"| {tuple(r['shape'])} | {r['causal']} | {sp['source']} | {sp['kept']:.3f} "
                  f"| {sp['bwd_ms']:.3f} | {sp['vs_dense']:.3f} | {sp['bar_10pct']} | {sp['bar_2pct']} "
                  f"| {flex} | {paired} |")


BARS_MIN_SEQLEN = 16384  # the bars are stated at S = 16384 and 32768 (MHA shapes)
STATS_BAR = 1.03  # forward with statistics over forward without


def is_bar_shape(shape, grouped_heads=False) -> bool:
    """S >= BARS_MIN_SEQLEN and MHA (grouped_heads: GQA / MQA instead, counted apart)."""
    return shape[1] >= BARS_MIN_SEQLEN and (kv_heads_of(shape) != shape[2]) == grouped_heads


def bar_counts(results, grouped_heads=False) -> dict:
    """How many of the bar shapes' rows (S >= BARS_MIN_SEQLEN, MHA; with grouped_heads the GQA /
    MQA shapes instead) meet each bar, by the ratio of medians ("medians") and by the paired
    ratio ("paired", None where a row has none): {bar: {"medians": n, "paired": n or None,
    "of": rows}}."""
    results = [r for r in results if is_bar_shape(r["shape"], grouped_heads)]
    rows = [sp for r in results for sp in r["sparse"]]
    have_paired = bool(rows) and all(sp.get("vs_dense_paired") is not None for sp in rows)
    tests = {"kept + 2%": lambda sp, x: x <= sp["kept"] + 0.02,
             "kept + 10%": lambda sp, x: x <= sp["kept"] + 0.10,
             "not slower than dense": lambda sp, x: x <= 1.0}
    counts = {}
    for bar, ok in tests.items():
        counts[bar] = {"medians": sum(ok(sp, sp["vs_dense"]) for sp in rows),
                       "paired": sum(ok(sp, sp["vs_dense_paired"]) for sp in rows)
                       if have_paired else None,
                       "of": len(rows)}
    shapes = results
    stats_paired = [r["backlite"].get("stats_overhead_paired") for r in shapes]
    counts[f"statistics <= {STATS_BAR}x"] = {
        "medians": sum(r["backlite"]["stats_overhead"] <= STATS_BAR for r in shapes),
        "paired": sum(x <= STATS_BAR for x in stats_paired)
        if shapes and all(x is not None for x in stats_paired) else None,
        "of": len(shapes)}
    return counts


def print_bar_counts(results):
    for grouped_heads, which in ((False, "MHA shapes"), (True, "GQA / MQA shapes")):
        counts = bar_counts(results, grouped_heads)
        if grouped_heads and not counts["kept + 2%"]["of"]:
            continue
        print(f"\nBars over the {which} with S >= {BARS_MIN_SEQLEN} "
              "(ratio of medians / paired ratio):")
        for bar, c in counts.items():
            paired = f" / {c['paired']}" if c["paired"] is not None else ""
            print(f"- {bar}: {c['medians']}{paired} of {c['of']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small shape, few repetitions")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per measurement (median)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds of the dense comparison (median of round medians)")
    ap.add_argument("--timing", default="calls", choices=["calls", "blocks"],
                    help="dense comparison: calls interleaved one by one (default) or in blocks")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--causal", default="both", choices=["no", "yes", "both"])
    ap.add_argument("--shape", action="append", default=None, metavar="B,S,H,D[,Hk]",
                    help="time only this shape, Hk K / V heads where given (repeatable; default: "
                         "the full set)")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile is slow)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--table", default=None, metavar="JSON",
                    help="only print the tables of an earlier run's JSON file")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            saved = json.load(f)
        print(json.dumps(saved["meta"]))
        print_table(saved["results"])
        print_bar_counts(saved["results"])
        return
    if not torch.cuda.is_available() or not blf.backend_available("cuda"):
        sys.exit("bench_attn.py needs a CUDA device and the BackLite CUDA backend "
                 f"(torch.cuda.is_available()={torch.cuda.is_available()})")
    dtype = getattr(torch, args.dtype)
    shapes = SHAPES_QUICK if args.quick else SHAPES_FULL
    if args.shape:
        try:
            shapes = [tuple(int(x) for x in sh.split(",")) for sh in args.shape]
        except ValueError:
            ap.error(f"--shape wants B,S,H,D[,Hk] integers, got {args.shape}")
        if any(len(sh) not in (4, 5) or (len(sh) == 5 and (sh[4] < 1 or sh[2] % sh[4]))
               for sh in shapes):
            ap.error(f"--shape wants B,S,H,D or B,S,H,D,Hk with Hk dividing H, got {args.shape}")
    reps = args.reps or (5 if args.quick else 15)
    rounds = args.rounds or (2 if args.quick else 3)
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "back_lite": back_lite.version, "library": back_lite.library_path,
            "command": " ".join(["python"] + sys.argv), "dtype": args.dtype, "reps": reps,
            "rounds": rounds, "timing": args.timing}
    results = []
    for shape in shapes:
        for causal in causals:
            print(f"shape {shape} causal={causal} ...", file=sys.stderr, flush=True)
            # FlexAttention only on the first shape: its compile takes tens of seconds per shape
            with_flex = not args.no_flex and shape == shapes[0]
            results.append(bench_shape(shape, dtype, causal, reps, rounds, with_flex, args.timing))
            if args.out:  # after every shape, so a run cut short still leaves its results
                with open(args.out, "w") as f:
                    json.dump({"meta": meta, "results": results}, f, indent=1)
    print(json.dumps(meta))
    print_table(results)
    print_bar_counts(results)


if __name__ == "__main__":
    main()
