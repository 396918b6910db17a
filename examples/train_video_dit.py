"""Train a tiny video diffusion transformer with dense attention and with BackLite.

    python examples/train_video_dit.py --device cpu --steps 150 --size small
    python examples/train_video_dit.py --device cuda --size large      # H200, bf16

The data are made here: videos of coloured discs and squares that move and bounce on a grey
background (no download). A video (C, T, H, W) is cut into patches of 1 x PATCH x PATCH pixels,
giving a T x H/PATCH x W/PATCH grid of tokens ordered frame by frame. The model is a DiT
(adaLN-Zero blocks, QK RMS-norm) trained with rectified flow: x_t = (1 - t) x0 + t noise, the
network predicts the velocity noise - x0.

Attention in real video diffusion transformers is mostly local in space and time. A tiny model
trained for a few hundred steps does not learn that by itself, so here half of each head's
query/key channels are fixed 3-D positional features (sin/cos of the token's frame, row and
column) scaled by a learnable per-head gain: their dot product peaks at distance 0 and decays
over NEIGHBOURHOOD tokens, which makes every head start local and lets training change how local.
With tokens ordered frame by frame, a 64-row query tile is one or a few frames, and most key tiles
(other frames) carry little of its softmax mass: the block-sparse backward can skip them.

Runs, all from the same initial weights and the same batches (same seed):
  dense         BackLite with negl_prob = 0 (its ordinary dense backward; the forward is exact in
                every run -- the sparse runs also record the tile mass -- so the runs differ only
                in the backward)
  negl_prob=p   BackLite with the block-sparse backward, for each p of --negl-probs
  dense seed+1  (unless --no-noise-run) dense again with other batches and diffusion noise: how far
                two equally good runs land apart, the yardstick for "within noise"
Each run logs its training loss, a validation loss on a fixed held-out batch, the step time and
the attention-backward time (all layers, measured around the attention's own backward). At a few
checkpoints the sparse runs also compute the dense gradient on the same weights and batch and
report the cosine similarity of the two parameter gradients, and the backward sparsity (share of
key tiles skipped). After training, every trained model runs forward + backward on one fixed
batch, the runs taking turns for --timing-rounds rounds: the step and attention-backward times in
the table are those medians, fair on a machine whose load drifts.

Outputs in --out: loss.png (loss curves), results.md and results.csv (one row per run),
history.csv (per-step losses and times), fidelity.csv (per checkpoint), results.json (all of it).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import back_lite

# ---------------------------------------------------------------------------- configuration

# Model and data sizes. Tokens per video = frames * (height / patch) * (width / patch).
SIZES = {
    # for tests: 4 x 8 x 8 = 256 tokens, seconds per run on a CPU
    "tiny": dict(frames=4, height=32, width=32, patch=4, hidden=64, heads=1, depth=2, batch=2,
                 eval_videos=2),
    # CPU: 16 x 8 x 8 = 1024 tokens (8 key tiles of 2 frames each), head dim 64; attention is
    # most of the step, as in long-sequence training
    "small": dict(frames=16, height=32, width=32, patch=4, hidden=64, heads=1, depth=2,
                  batch=2, eval_videos=8),
    # GPU: 16 x 32 x 32 = 16384 tokens, head dim 128, bf16
    "large": dict(frames=16, height=128, width=128, patch=4, hidden=512, heads=4, depth=8,
                  batch=2, eval_videos=4),
}
CHANNELS = 3
MLP_RATIO = 4
# Positional query/key features: sin/cos pairs per grid axis, and the distance (in tokens) over
# which their dot product decays; larger = less local.
NEIGHBOURHOOD = 4.0
# Initial softmax logit the positional features give at distance 0 (far-away tokens get about 0).
LOCALITY_LOGIT = 10.0
# Shapes per video: 1 to MAX_SHAPES discs/squares; radius and speed in pixels (per frame).
MAX_SHAPES = 3
RADIUS_RANGE = (0.08, 0.22)  # as a share of the frame side
SPEED_RANGE = (0.02, 0.06)   # share of the frame side per frame
BACKGROUND = 0.0             # pixel values are in [-1, 1]
WARMUP_STEPS = 10
GRAD_CLIP = 1.0
TIMING_SKIP = 3              # first steps (allocator / thread warm-up) left out of the medians
TIMING_WARMUP = 2            # untimed rounds before the interleaved timing
SMOOTH = 0.9                 # EMA factor of the plotted training loss
LINE_STYLES = ("-", "--", ":", "-.")  # curves that coincide stay visible
# Parameters upstream of the attention only through q, k, v (for the undiluted gradient cosine).
QKV_PARAMS = ("attn.to_q.", "attn.to_k.", "attn.to_v.", "attn.q_norm.", "attn.k_norm.",
              "attn.log_gain")


# ---------------------------------------------------------------------------- data


def make_videos(batch: int, frames: int, height: int, width: int,
                gen: torch.Generator) -> torch.Tensor:
    """-> (batch, CHANNELS, frames, height, width) in [-1, 1]: moving, bouncing shapes."""
    side = min(height, width)
    t = torch.arange(frames, dtype=torch.float32)[:, None, None]        # (T, 1, 1)
    y = torch.arange(height, dtype=torch.float32)[None, :, None]         # (1, H, 1)
    x = torch.arange(width, dtype=torch.float32)[None, None, :]          # (1, 1, W)
    videos = torch.full((batch, CHANNELS, frames, height, width), BACKGROUND)
    for b in range(batch):
        n_shapes = int(torch.randint(1, MAX_SHAPES + 1, (1,), generator=gen))
        for _ in range(n_shapes):
            u = torch.rand(8, generator=gen)
            radius = side * (RADIUS_RANGE[0] + (RADIUS_RANGE[1] - RADIUS_RANGE[0]) * u[0])
            speed = side * (SPEED_RANGE[0] + (SPEED_RANGE[1] - SPEED_RANGE[0]) * u[1])
            angle = 2 * math.pi * u[2]
            y0, x0 = u[3] * (height - 1), u[4] * (width - 1)
            colour = torch.rand(CHANNELS, generator=gen) * 2 - 1              # (C,)
            # Positions bounce between radius and side - radius: a triangle wave.
            cy = _bounce(y0 + speed * math.sin(angle) * t, radius, height)  # (T, 1, 1)
            cx = _bounce(x0 + speed * math.cos(angle) * t, radius, width)
            if u[5] < 0.5:
                inside = (y - cy) ** 2 + (x - cx) ** 2 <= radius ** 2         # disc
            else:
                inside = ((y - cy).abs() <= radius) & ((x - cx).abs() <= radius)  # square
            videos[b] = torch.where(inside[None], colour[:, None, None, None], videos[b])
    return videos


def _bounce(pos: torch.Tensor, radius: float, extent: int) -> torch.Tensor:
    low, high = float(radius), float(extent - 1 - radius)
    span = max(high - low, 1e-6)
    phase = torch.remainder(pos - low, 2 * span)
    return low + torch.where(phase > span, 2 * span - phase, phase)


# ---------------------------------------------------------------------------- model


def grid_features(frames: int, rows: int, cols: int, dim: int) -> torch.Tensor:
    """(frames * rows * cols, dim): sin/cos features of each token's (t, y, x), zero-padded.

    sum over features of f(i) * f(j) = sum over axes and frequencies of cos(w * (c_i - c_j)),
    which is largest at distance 0 and falls off over about NEIGHBOURHOOD tokens per axis."""
    freqs_per_axis = dim // 6
    t, y, x = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(cols),
                             indexing="ij")
    coords = torch.stack([t, y, x], dim=-1).reshape(-1, 3).float()      # (S, 3)
    omega = torch.linspace(0.0, math.pi / NEIGHBOURHOOD, freqs_per_axis)
    angle = coords[:, :, None] * omega                                   # (S, 3, F)
    feat = torch.cat([angle.cos(), angle.sin()], dim=-1).reshape(coords.shape[0], -1)
    return F.pad(feat, (0, dim - feat.shape[1]))


class TimedAttention(torch.autograd.Function):
    """Runs `attend(q, k, v)` and times its backward alone (the attention-backward time).

    The forward builds the attention's own small autograd graph on detached inputs; the backward
    runs exactly that graph (BackLite's backward op) between two clock readings, so nothing else
    of the model's backward is counted."""

    @staticmethod
    def forward(ctx, clock, attend, q, k, v):
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in (q, k, v)]
            out = attend(*inputs)
        ctx.clock, ctx.inputs, ctx.out = clock, inputs, out
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        token = ctx.clock.start()
        grads = torch.autograd.grad(ctx.out, ctx.inputs, dout)
        ctx.clock.stop(token)
        del ctx.out, ctx.inputs
        return (None, None) + tuple(grads)


class Clock:
    """Accumulates the time of marked regions: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans = []

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, token) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((token, end))
        else:
            self.spans.append((time.perf_counter() - token) * 1e3)

    def total_ms(self) -> float:
        """Sum of the spans since the last call (call after synchronizing on the GPU)."""
        total = sum(s.elapsed_time(e) for s, e in self.spans) if self.cuda else sum(self.spans)
        self.spans = []
        return total


class Attention(nn.Module):
    """Multi-head self-attention through BackLite; half of each head's q/k channels are the
    fixed positional features times a learnable per-head gain."""

    def __init__(self, hidden: int, heads: int, pos_feat: torch.Tensor, attn_dtype):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.content_dim = self.head_dim - pos_feat.shape[1]
        self.to_q = nn.Linear(hidden, heads * self.content_dim)
        self.to_k = nn.Linear(hidden, heads * self.content_dim)
        self.to_v = nn.Linear(hidden, heads * self.head_dim)
        self.q_norm = nn.RMSNorm(self.content_dim)
        self.k_norm = nn.RMSNorm(self.content_dim)
        self.proj = nn.Linear(hidden, hidden)
        self.register_buffer("pos_feat", pos_feat, persistent=False)  # (S, Dp)
        # gain^2 * (pos_i . pos_i) * scale = LOCALITY_LOGIT at distance 0
        zero_distance = float(pos_feat[0].pow(2).sum())
        gain = math.sqrt(LOCALITY_LOGIT * math.sqrt(self.head_dim) / zero_distance)
        self.log_gain = nn.Parameter(torch.full((heads,), math.log(gain)))
        self.attn_dtype = attn_dtype
        self.negl_prob = 0.0
        self.clock = None          # a Clock while timing
        self.record_stats = False  # keep the last call's backward sparsity / dropped mass
        self.last_stats = None

    def _attend(self, q, k, v):
        # q: (B, S, H, D), k, v: (B, S, H, D)
        out, _, tile_mass = back_lite.attention(q, k, v, negl_prob=self.negl_prob)
        if self.record_stats and self.negl_prob > 0.0:
            with torch.no_grad():
                mask = back_lite.select(tile_mass, self.negl_prob)
                w = tile_mass.double()
                self.last_stats = dict(
                    sparsity=back_lite.backward_sparsity(mask, q.shape[1], k.shape[1], False),
                    dropped_mass=float(w.masked_fill(mask, 0.0).sum() / w.sum()))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, S, hidden)
        batch, seqlen, _ = x.shape
        q = self.q_norm(self.to_q(x).view(batch, seqlen, self.heads, self.content_dim))
        k = self.k_norm(self.to_k(x).view(batch, seqlen, self.heads, self.content_dim))
        v = self.to_v(x).view(batch, seqlen, self.heads, self.head_dim)
        gain = self.log_gain.exp()[:, None]                              # (H, 1)
        pos = self.pos_feat[None, :, None, :] * gain                     # (1, S, H, Dp)
        pos = pos.expand(batch, -1, -1, -1).to(q.dtype)
        q = torch.cat([q, pos], dim=-1)                                  # (B, S, H, D)
        k = torch.cat([k, pos], dim=-1)
        q, k, v = (t.to(self.attn_dtype).contiguous() for t in (q, k, v))
        if self.clock is not None:
            out = TimedAttention.apply(self.clock, self._attend, q, k, v)
        else:
            out = self._attend(q, k, v)
        return self.proj(out.to(x.dtype).reshape(batch, seqlen, -1))


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


class Block(nn.Module):
    """DiT block with adaLN-Zero conditioning on the diffusion time."""

    def __init__(self, hidden, heads, pos_feat, attn_dtype):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads, pos_feat, attn_dtype)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden, MLP_RATIO * hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(MLP_RATIO * hidden, hidden))
        self.ada = nn.Linear(hidden, 6 * hidden)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(c)).chunk(6, dim=-1)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(modulate(self.norm2(x), shift2, scale2))


class VideoDiT(nn.Module):
    def __init__(self, frames, height, width, patch, hidden, heads, depth, attn_dtype, **_):
        super().__init__()
        self.patch, self.grid = patch, (frames, height // patch, width // patch)
        head_dim = hidden // heads
        pos_feat = grid_features(*self.grid, head_dim // 2)
        patch_dim = CHANNELS * patch * patch
        self.embed = nn.Linear(patch_dim, hidden)
        self.pos_embed = nn.Parameter(0.02 * torch.randn(pos_feat.shape[0], hidden))
        self.time_mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(),
                                      nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, pos_feat, attn_dtype)
                                    for _ in range(depth))
        self.final_norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Linear(hidden, 2 * hidden)
        self.out = nn.Linear(hidden, patch_dim)
        for layer in (self.final_ada, self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def time_embedding(self, t):
        half = self.embed.out_features // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        angle = 1000.0 * t[:, None] * freqs
        return self.time_mlp(torch.cat([angle.cos(), angle.sin()], dim=-1))

    def patchify(self, video):
        # video: (B, C, T, H, W) -> (B, T * H/p * W/p, C * p * p), frame by frame, row-major
        b, c, t, h, w = video.shape
        p = self.patch
        x = video.reshape(b, c, t, h // p, p, w // p, p).permute(0, 2, 3, 5, 1, 4, 6)
        return x.reshape(b, t * (h // p) * (w // p), c * p * p)

    def unpatchify(self, x):
        b = x.shape[0]
        t, gh, gw = self.grid
        p = self.patch
        x = x.reshape(b, t, gh, gw, CHANNELS, p, p).permute(0, 4, 1, 2, 5, 3, 6)
        return x.reshape(b, CHANNELS, t, gh * p, gw * p)

    def forward(self, video, t):
        x = self.embed(self.patchify(video)) + self.pos_embed
        c = self.time_embedding(t)
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_ada(F.silu(c)).chunk(2, dim=-1)
        return self.unpatchify(self.out(modulate(self.final_norm(x), shift, scale)))

    def attentions(self):
        return [block.attn for block in self.blocks]


# ---------------------------------------------------------------------------- training


def flow_loss(model, videos, t, noise, autocast):
    """Rectified flow: x_t = (1 - t) x0 + t noise, target velocity noise - x0."""
    tb = t[:, None, None, None, None]
    xt = (1 - tb) * videos + tb * noise
    with autocast():
        pred = model(xt, t)
    return F.mse_loss(pred.float(), noise - videos)


def draw_batch(batch, size, gen, device):
    videos = make_videos(batch, size["frames"], size["height"], size["width"], gen)
    t = torch.rand(batch, generator=gen)
    noise = torch.randn(videos.shape, generator=gen)
    return videos.to(device), t.to(device), noise.to(device)


def grad_vectors(model):
    """(all parameter gradients, the gradients of the attention's q/k/v projections only),
    flattened. The q/k/v parameters get their gradient only through the attention backward, so
    they show its error undiluted by the MLP and embedding gradients."""
    every, qkv = [], []
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().flatten().double()
        every.append(g)
        if any(part in name for part in QKV_PARAMS):
            qkv.append(g)
    return torch.cat(every), torch.cat(qkv)


def cosine(a, b):
    """Cosine similarity; NaN while a gradient is exactly zero (adaLN-Zero: the first steps give
    the attention no gradient at all)."""
    norms = a.norm() * b.norm()
    return float(torch.dot(a, b) / norms) if norms > 0 else float("nan")


def set_negl_prob(model, negl_prob):
    for attn in model.attentions():
        attn.negl_prob = negl_prob


def autocast_for(device):
    """bf16 autocast on the GPU (BackLite's CUDA backend takes bf16/fp16); fp32 on the CPU."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return lambda: torch.autocast("cpu", enabled=False)


def train_run(name, negl_prob, data_seed, args, size, device, eval_batch):
    """One training run; returns (per-step history, fidelity checkpoints, the trained model)."""
    torch.manual_seed(args.seed)  # the same initial weights in every run
    attn_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = VideoDiT(**size, attn_dtype=attn_dtype).to(device)
    set_negl_prob(model, negl_prob)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
    autocast = autocast_for(device)
    gen = torch.Generator().manual_seed(data_seed)
    clock = Clock(device)
    checkpoints = sorted({max(1, round(f * args.steps)) - 1 for f in args.checkpoints})
    history, fidelity = [], []
    for step in range(args.steps):
        videos, t, noise = draw_batch(size["batch"], size, gen, device)
        check = negl_prob > 0.0 and step in checkpoints
        for attn in model.attentions():
            attn.clock, attn.record_stats = clock, check
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = flow_loss(model, videos, t, noise, autocast)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ms = (time.perf_counter() - t0) * 1e3
        attn_bwd_ms = clock.total_ms()
        for attn in model.attentions():
            attn.clock = None
        if check:
            # The dense gradient at the same weights and batch, for the fidelity of the sparse one.
            sparse_grad, sparse_qkv = grad_vectors(model)
            stats = [attn.last_stats for attn in model.attentions()]
            set_negl_prob(model, 0.0)
            opt.zero_grad(set_to_none=True)
            flow_loss(model, videos, t, noise, autocast).backward()
            dense_grad, dense_qkv = grad_vectors(model)
            set_negl_prob(model, negl_prob)
            opt.zero_grad(set_to_none=True)
            loss = flow_loss(model, videos, t, noise, autocast)
            loss.backward()  # back to the sparse gradient for the update
            fidelity.append(dict(
                run=name, negl_prob=negl_prob, step=step + 1,
                grad_cosine=cosine(sparse_grad, dense_grad),
                grad_rel_err=float((sparse_grad - dense_grad).norm() / dense_grad.norm()),
                qkv_grad_cosine=cosine(sparse_qkv, dense_qkv),
                sparsity=statistics.mean(s["sparsity"] for s in stats),
                dropped_mass=statistics.mean(s["dropped_mass"] for s in stats)))
            for attn in model.attentions():
                attn.record_stats = False
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        sched.step()
        row = dict(run=name, step=step + 1, loss=float(loss.detach()), step_ms=step_ms,
                   attn_bwd_ms=attn_bwd_ms, eval_loss="")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            row["eval_loss"] = evaluate(model, eval_batch, autocast)
        history.append(row)
        if args.verbose and (step + 1) % args.eval_every == 0:
            print(f"  [{name}] step {step + 1:4d} loss {row['loss']:.4f} "
                  f"eval {row['eval_loss']:.4f} step {step_ms:.0f} ms "
                  f"attn bwd {attn_bwd_ms:.0f} ms", flush=True)
    return history, fidelity, model


def timing_phase(models, negl_probs, args, size, device):
    """Step and attention-backward times of every trained model on one fixed batch, the runs
    interleaved (round robin, starting with a different run each round) so that a machine whose
    load drifts -- a shared CPU -- slows all runs alike. Returns [(step ms, attn bwd ms)] medians.
    In-training times are kept too (history.csv), but there each run meets its own load."""
    gen = torch.Generator().manual_seed(args.seed + 2)
    videos, t, noise = draw_batch(size["batch"], size, gen, device)
    autocast = autocast_for(device)
    clock = Clock(device)
    samples = [[] for _ in models]
    for rnd in range(TIMING_WARMUP + args.timing_rounds):
        for i in range(len(models)):
            j = (i + rnd) % len(models)
            model = models[j]
            set_negl_prob(model, negl_probs[j])
            for attn in model.attentions():
                attn.clock = clock
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            flow_loss(model, videos, t, noise, autocast).backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            step_ms = (time.perf_counter() - t0) * 1e3
            attn_ms = clock.total_ms()
            for attn in model.attentions():
                attn.clock = None
            if rnd >= TIMING_WARMUP:
                samples[j].append((step_ms, attn_ms))
    return [(statistics.median(a for a, _ in s), statistics.median(b for _, b in s))
            for s in samples]


@torch.no_grad()
def evaluate(model, eval_batch, autocast):
    videos, t, noise = eval_batch
    return float(flow_loss(model, videos, t, noise, autocast))


def summarize(name, negl_prob, history, fidelity, tail):
    timed = history[TIMING_SKIP:] or history
    last = history[-max(1, int(len(history) * tail)):]
    losses = [r["loss"] for r in last]
    return dict(
        run=name, negl_prob=negl_prob,
        final_eval_loss=history[-1]["eval_loss"],
        tail_train_loss=statistics.mean(losses),
        tail_train_loss_sem=(statistics.stdev(losses) / math.sqrt(len(losses))
                             if len(losses) > 1 else 0.0),
        train_step_ms=statistics.median(r["step_ms"] for r in timed),
        train_attn_bwd_ms=statistics.median(r["attn_bwd_ms"] for r in timed),
        grad_cosines=[f["grad_cosine"] for f in fidelity],
        qkv_grad_cosines=[f["qkv_grad_cosine"] for f in fidelity],
        sparsity=(statistics.mean(f["sparsity"] for f in fidelity) if fidelity else 0.0),
        dropped_mass=(statistics.mean(f["dropped_mass"] for f in fidelity) if fidelity else 0.0))


# ---------------------------------------------------------------------------- outputs


def write_outputs(out_dir, args, size, device, runs, summaries, histories, fidelities, wall_s):
    os.makedirs(out_dir, exist_ok=True)
    dense = summaries[0]
    with open(os.path.join(out_dir, "history.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(histories[0][0].keys()))
        writer.writeheader()
        for h in histories:
            writer.writerows(h)
    with open(os.path.join(out_dir, "fidelity.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run", "negl_prob", "step", "grad_cosine",
                                               "grad_rel_err", "qkv_grad_cosine", "sparsity",
                                               "dropped_mass"])
        writer.writeheader()
        for fl in fidelities:
            writer.writerows(fl)
    columns = ["run", "negl_prob", "final_eval_loss", "tail_train_loss", "tail_train_loss_sem",
               "step_ms", "attn_bwd_ms", "attn_bwd_speedup", "train_step_ms",
               "train_attn_bwd_ms", "sparsity", "dropped_mass",
               "grad_cosines", "qkv_grad_cosines"]
    rows = []
    for s in summaries:
        r = dict(s)
        r["attn_bwd_speedup"] = dense["attn_bwd_ms"] / s["attn_bwd_ms"]
        r["grad_cosines"] = " ".join(f"{c:.5f}" for c in s["grad_cosines"])
        r["qkv_grad_cosines"] = " ".join(f"{c:.4f}" for c in s["qkv_grad_cosines"])
        rows.append(r)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    tokens = size["frames"] * (size["height"] // size["patch"]) * (size["width"] // size["patch"])
    command = "python examples/train_video_dit.py " + shlex.join(args.argv)
    lines = [
        f"# Tiny video DiT: dense vs BackLite ({args.size}, {device.type})",
        "",
        f"- command: `{command}`",
        f"- date (UTC): {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}; device: "
        f"{_device_name(device)}; torch {torch.__version__}; BackLite {back_lite.version} "
        f"({back_lite.library_path})",
        f"- model: {size['depth']} blocks, hidden {size['hidden']}, {size['heads']} heads of "
        f"{size['hidden'] // size['heads']}; videos {size['frames']}x{size['height']}x"
        f"{size['width']}, patch {size['patch']} -> {tokens} tokens; batch {size['batch']}; "
        f"{args.steps} steps, lr {args.lr}; attention in "
        f"{'bf16' if device.type == 'cuda' else 'fp32'}",
        f"- wall time of all runs: {wall_s:.0f} s; load average (1 min) at the start and the "
        f"end: {args.load_start:.1f}, {_load():.1f} (timings on a shared machine move with it)",
        "",
        "| run | negl_prob | val loss (end) | train loss (last "
        f"{int(args.tail * 100)}%) | step ms | attn bwd ms | attn bwd speedup | bwd sparsity | "
        "dropped mass | grad cosine vs dense: all params | q/k/v params |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['negl_prob']:g} | {r['final_eval_loss']:.4f} | "
            f"{r['tail_train_loss']:.4f} ± {r['tail_train_loss_sem']:.4f} | "
            f"{r['step_ms']:.1f} | {r['attn_bwd_ms']:.1f} | {r['attn_bwd_speedup']:.2f}x | "
            f"{r['sparsity']:.1%} | {r['dropped_mass']:.2e} | {r['grad_cosines'] or '-'} | "
            f"{r['qkv_grad_cosines'] or '-'} |")
    lines += [
        "",
        "step ms / attn bwd ms: forward + backward of each trained model on one fixed batch, "
        f"medians of {args.timing_rounds} rounds in which the runs take turns (so that a "
        "drifting machine load hits all runs alike); attn bwd = all layers' attention backward "
        "in one step. The medians measured during training, each run under its own load, are in "
        "results.csv (train_step_ms, train_attn_bwd_ms). "
        "bwd sparsity: share of key tiles the sparse backward skipped; dropped mass: share of "
        "softmax mass in them; both averaged over layers and checkpoints. grad cosine: all "
        "parameter gradients (and those of the attention's q/k/v projections alone) of the sparse "
        "backward vs the dense backward on the same weights and batch, at steps "
        f"{', '.join(str(f['step']) for f in max(fidelities, key=len))}.",
        "± is the standard error of the mean over the last steps' training losses.",
    ]
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(dict(args=vars(args), size=size, device=str(device), runs=runs,
                       summaries=summaries, fidelity=fidelities, wall_s=wall_s), f, indent=1)
    plot(out_dir, args, histories, summaries)
    return "\n".join(lines)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} threads"


def plot(out_dir, args, histories, summaries):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_eval, ax_time) = plt.subplots(1, 3, figsize=(16, 4))
    for history, s in zip(histories, summaries):
        steps = [r["step"] for r in history]
        ema, smooth = None, []
        for r in history:
            ema = r["loss"] if ema is None else SMOOTH * ema + (1 - SMOOTH) * r["loss"]
            smooth.append(ema)
        label = s["run"]
        style = LINE_STYLES[len(ax_train.lines) // 2 % len(LINE_STYLES)]
        (line,) = ax_train.plot(steps, smooth, label=label, linestyle=style)
        ax_train.plot(steps, [r["loss"] for r in history], color=line.get_color(), alpha=0.15)
        evals = [(r["step"], r["eval_loss"]) for r in history if r["eval_loss"] != ""]
        ax_eval.plot([e[0] for e in evals], [e[1] for e in evals], marker="o", label=label,
                     color=line.get_color(), linestyle=style)
        ax_time.plot(steps, [r["attn_bwd_ms"] for r in history], label=label,
                     color=line.get_color(), alpha=0.8)
    ax_train.set(title=f"training loss (EMA {SMOOTH})", xlabel="step", ylabel="flow-matching MSE",
                 yscale="log")
    ax_eval.set(title="validation loss (fixed batch)", xlabel="step", yscale="log")
    ax_time.set(title="attention backward per step (all layers)", xlabel="step", ylabel="ms",
                yscale="log")
    for ax in (ax_train, ax_eval, ax_time):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"tiny video DiT, size {args.size}: dense vs BackLite sparse backward")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "loss.png"), dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", choices=sorted(SIZES), default=None,
                   help="model/data size (default: large on cuda, small on cpu)")
    p.add_argument("--steps", type=int, default=None, help="default: 400 large, 150 small")
    p.add_argument("--negl-probs", type=float, nargs="+", default=[0.05, 0.2])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="initial weights, batches, noise")
    p.add_argument("--eval-every", type=int, default=None, help="default: steps / 10")
    p.add_argument("--checkpoints", type=float, nargs="+", default=[0.1, 0.5, 1.0],
                   help="gradient-fidelity checkpoints as shares of the steps")
    p.add_argument("--timing-rounds", type=int, default=None,
                   help="interleaved timing rounds after training (default 20; tiny 2)")
    p.add_argument("--tail", type=float, default=0.2,
                   help="share of the last steps whose training loss is averaged")
    p.add_argument("--no-noise-run", action="store_true",
                   help="skip the dense run with another data seed")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (the library's OpenMP threads follow OMP_NUM_THREADS)")
    p.add_argument("--out", default=None,
                   help="output folder (default examples/out/<size>-<device>)")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.size = args.size or ("large" if args.device.startswith("cuda") else "small")
    args.steps = args.steps or (400 if args.size == "large" else 150)
    args.eval_every = args.eval_every or max(1, args.steps // 10)
    args.timing_rounds = args.timing_rounds or (2 if args.size == "tiny" else 20)
    args.out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                                        f"{args.size}-{args.device.split(':')[0]}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if not back_lite.backend_available(device):
        raise SystemExit(f"BackLite has no usable backend for {device} (CUDA needs the library "
                         "built with BL_ENABLE_CUDA and an sm_90 GPU); try --device cpu")
    size = SIZES[args.size]
    eval_gen = torch.Generator().manual_seed(args.seed + 1_000_003)
    n_eval = size["eval_videos"]  # the fixed held-out batch
    videos = make_videos(n_eval, size["frames"], size["height"], size["width"], eval_gen)
    eval_t = (torch.arange(n_eval) + 0.5) / n_eval  # spread over (0, 1)
    eval_batch = (videos.to(device), eval_t.to(device),
                  torch.randn(videos.shape, generator=eval_gen).to(device))
    runs = [("dense", 0.0, args.seed)]
    runs += [(f"negl_prob={p:g}", p, args.seed) for p in args.negl_probs]
    if not args.no_noise_run:
        runs.append(("dense seed+1", 0.0, args.seed + 1))
    histories, fidelities, summaries, models = [], [], [], []
    args.load_start = _load()
    start = time.perf_counter()
    for name, negl_prob, data_seed in runs:
        t0 = time.perf_counter()
        history, fidelity, model = train_run(name, negl_prob, data_seed, args, size, device,
                                             eval_batch)
        models.append(model)
        summaries.append(summarize(name, negl_prob, history, fidelity, args.tail))
        histories.append(history)
        fidelities.append(fidelity)
        print(f"{name}: val loss {summaries[-1]['final_eval_loss']:.4f}, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    times = timing_phase(models, [negl_prob for _, negl_prob, _ in runs], args, size, device)
    for summary, (step_ms, attn_bwd_ms) in zip(summaries, times):
        summary["step_ms"], summary["attn_bwd_ms"] = step_ms, attn_bwd_ms
    table = write_outputs(args.out, args, size, device, runs, summaries, histories, fidelities,
                          time.perf_counter() - start)
    print(table)
    print(f"wrote {args.out}/loss.png, results.md, results.csv, history.csv, fidelity.csv, "
          "results.json")


if __name__ == "__main__":
    main()
