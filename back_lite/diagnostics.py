"""Diagnostics: what the sparse backward keeps, drops and saves, per (batch, head).

Everything here is computed from the forward's tile mass W alone (the selection itself goes
through the library's select op, so the figures are those of the tiles the backward really
computes). One forward therefore gives the whole sparsity-vs-negl_prob curve without running a
backward.

    stats = diagnostics.tile_stats(W, 0.05, seqlen_q, seqlen_k, head_dim, causal)
    print(stats.summary())                         # one line, all (b, h) together
    stats.sparsity                                 # (B, Hq) float64, per (batch, head)
    curve = diagnostics.sparsity_curve(W, [1e-3, 1e-2, 0.1], seqlen_q, seqlen_k, head_dim)

The last attention call: with BACK_LITE_VERBOSE=1 every call is recorded (and logged, one line
per call or per BACK_LITE_VERBOSE_EVERY calls); inside `with diagnostics.watch(model):` every call
of a BackLite module of `model` is recorded, with its tile mass even when negl_prob == 0.
`diagnostics.last_call()` returns the figures of the most recent recorded call.

FLOPs are counted per tile as the tile kernel does them: 5 GEMMs of (rows x keys x D) per tile
(FlashAttention's convention of backward = 2.5 x forward), with the tile clipped at the sequence
ends; causal tiles that straddle the diagonal count whole (the kernel computes them whole).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from typing import Optional, Sequence

import torch

from . import _verbose, functional
from .module import BackLite

logger = _verbose.logger
EVERY_ENV_VAR = "BACK_LITE_VERBOSE_EVERY"

# Backward FLOPs per (query row, key, head-dim element) of a computed tile: the five GEMMs
# S = q k^T, dP = dO v^T, dV += P^T dO, dK += dS^T q, dQ += dS k, 2 FLOPs (multiply-add) each.
BWD_FLOPS_PER_ELEMENT = 10
# Share of the dense backward's time that does not shrink with the kept tiles (Dlt preprocess,
# dQ conversion, selection, launch gaps). An assumption for the speed-up estimate, not a
# measurement; pass fixed_share= to use a figure measured on your GPU.
BWD_FIXED_SHARE = 0.05


@dataclasses.dataclass
class TileStats:
    """Figures of one attention call at one negl_prob. Per-(batch, head) tensors are (B, Hq).

    kept_tiles         computable tiles the backward computes
    computable_tiles   tiles holding at least one allowed (query, key) pair, per head (an int)
    sparsity           1 - kept / computable
    dropped_mass_mean  share of a row tile's probability mass in skipped tiles, mean over the
                       row tiles that have mass
    dropped_mass_worst the same, largest over row tiles
    top_tile_share     mean over row tiles of the heaviest tile's share of the row tile's mass
    effective_tiles    mean over row tiles of exp(entropy of the tile shares): 1 when one tile
                       holds everything, Tn when the mass is spread evenly
    flops_dense        backward FLOPs of the dense backward, per (batch, head) (a float)
    flops_kept         backward FLOPs of the kept tiles
    """

    negl_prob: float
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    num_tiles: tuple
    kept_tiles: torch.Tensor
    computable_tiles: int
    sparsity: torch.Tensor
    dropped_mass_mean: torch.Tensor
    dropped_mass_worst: torch.Tensor
    top_tile_share: torch.Tensor
    effective_tiles: torch.Tensor
    flops_dense: float
    flops_kept: torch.Tensor
    # internal: per-(b, h) number of row tiles with mass, to weight the overall mean
    _rows_with_mass: torch.Tensor = dataclasses.field(repr=False, default=None)

    # ---- figures over all (batch, head) together
    @property
    def total_sparsity(self) -> float:
        total = self.computable_tiles * self.batch * self.heads
        return 1.0 - float(self.kept_tiles.sum()) / total if total else 0.0

    @property
    def mean_dropped_mass(self) -> float:
        rows = self._rows_with_mass.to(torch.float64)
        n = float(rows.sum())
        return float((self.dropped_mass_mean * rows).sum()) / n if n else 0.0

    @property
    def worst_dropped_mass(self) -> float:
        return float(self.dropped_mass_worst.max())

    @property
    def flops_saved(self) -> float:
        return self.flops_dense * self.batch * self.heads - float(self.flops_kept.sum())

    @property
    def flops_saved_share(self) -> float:
        dense = self.flops_dense * self.batch * self.heads
        return self.flops_saved / dense if dense else 0.0

    def estimated_speedup(self, fixed_share: float = BWD_FIXED_SHARE) -> float:
        """Dense over sparse backward time if time were fixed_share + (1 - fixed_share) x the
        kept share of the tile FLOPs. An estimate; measure on the GPU for real figures."""
        return estimated_speedup(1.0 - self.flops_saved_share, fixed_share)

    def summary(self) -> str:
        tm, tn = self.num_tiles
        kept = int(self.kept_tiles.sum())
        total = self.computable_tiles * self.batch * self.heads
        return (f"tile mass: top tile {float(self.top_tile_share.mean()):.3f}, effective tiles "
                f"{float(self.effective_tiles.mean()):.2f} of {tn} per row tile | kept tiles "
                f"{kept}/{total} backward sparsity={self.total_sparsity:.4f} | dropped mass="
                f"{self.mean_dropped_mass:.3e} mean, {self.worst_dropped_mass:.3e} worst row "
                f"tile | FLOPs saved {100.0 * self.flops_saved_share:.1f}% "
                f"({self.flops_saved / 1e9:.3g} GFLOP), est. backward speed-up "
                f"{self.estimated_speedup():.2f}x")

    def as_dict(self) -> dict:
        """Plain Python values (per-(b, h) tensors as nested lists), for JSON or printing."""
        out = {}
        for field in dataclasses.fields(self):
            if field.name.startswith("_"):
                continue
            value = getattr(self, field.name)
            out[field.name] = value.tolist() if isinstance(value, torch.Tensor) else value
        out.update(total_sparsity=self.total_sparsity, mean_dropped_mass=self.mean_dropped_mass,
                   worst_dropped_mass=self.worst_dropped_mass, flops_saved=self.flops_saved,
                   flops_saved_share=self.flops_saved_share,
                   estimated_speedup=self.estimated_speedup())
        return out


def estimated_speedup(kept_flops_share: float, fixed_share: float = BWD_FIXED_SHARE) -> float:
    """1 / (fixed_share + (1 - fixed_share) * kept_flops_share)."""
    return 1.0 / (fixed_share + (1.0 - fixed_share) * kept_flops_share)


def _tile_extents(seqlen: int, tile: int, count: int) -> torch.Tensor:
    # rows (or keys) in each of `count` tiles of `tile`, the last one clipped at `seqlen`
    start = torch.arange(count, dtype=torch.float64) * tile
    return torch.clamp(seqlen - start, min=0, max=tile)


def tile_stats(tile_mass: torch.Tensor, negl_prob: float, seqlen_q: int, seqlen_k: int,
               head_dim: int, causal: bool = False,
               mask: Optional[torch.Tensor] = None) -> TileStats:
    """Figures of the sparse backward at `negl_prob` from the tile mass alone.

    tile_mass: (B, Hq, Tm, Tn) fp32, the W of a forward with statistics.
    mask: optional (B, Hq, Tm, Tn) bool of the tiles kept; by default the library's selection at
    negl_prob (negl_prob == 0: the dense backward, every computable tile).
    """
    if tile_mass.dim() != 4 or tile_mass.numel() == 0:
        raise ValueError(f"BackLite: tile_mass must be a non-empty (B, Hq, Tm, Tn) tensor, got "
                         f"shape {tuple(tile_mass.shape)} (run the forward with statistics)")
    batch, heads, tm, tn = tile_mass.shape
    device = tile_mass.device
    expected = tuple(functional.num_tiles(seqlen_q, seqlen_k, device))
    if (tm, tn) != expected:
        raise ValueError(f"BackLite: tile_mass has (Tm, Tn) = {(tm, tn)} but seqlen_q={seqlen_q}, "
                         f"seqlen_k={seqlen_k} give {expected}")
    computable = functional.computable_tiles(seqlen_q, seqlen_k, causal, device)
    if mask is None:
        if negl_prob > 0.0:
            mask = functional.select(tile_mass, negl_prob)
        else:
            mask = computable.expand(batch, heads, tm, tn)
    kept = mask & computable

    w = tile_mass.detach().to(torch.float64).cpu()
    kept = kept.cpu()
    computable = computable.cpu()
    total = w.sum(dim=-1)  # (B, H, Tm)
    has_mass = total > 0
    safe_total = torch.where(has_mass, total, torch.ones_like(total))
    share = w / safe_total[..., None]
    dropped = (share * (~kept).to(torch.float64)).sum(dim=-1)  # (B, H, Tm)
    dropped = torch.where(has_mass, dropped, torch.zeros_like(dropped))
    rows = has_mass.sum(dim=-1)  # (B, H)
    rows_f = torch.clamp(rows, min=1).to(torch.float64)
    dropped_mean = dropped.sum(dim=-1) / rows_f
    dropped_worst = dropped.max(dim=-1).values
    top = torch.where(has_mass, share.max(dim=-1).values, torch.zeros_like(total))
    plogp = torch.where(share > 0, share * torch.log(share.clamp(min=1e-300)),
                        torch.zeros_like(share))
    eff = torch.where(has_mass, torch.exp(-plogp.sum(dim=-1)), torch.zeros_like(total))

    tile_m, tile_n = functional.tile_shape(device)
    rows_in = _tile_extents(seqlen_q, tile_m, tm)
    keys_in = _tile_extents(seqlen_k, tile_n, tn)
    tile_flops = BWD_FLOPS_PER_ELEMENT * head_dim * rows_in[:, None] * keys_in[None, :]
    flops_dense = float((tile_flops * computable).sum())
    flops_kept = (tile_flops * kept.to(torch.float64)).sum(dim=(-1, -2))
    kept_count = kept.sum(dim=(-1, -2))
    n_computable = int(computable.sum())
    sparsity = 1.0 - kept_count.to(torch.float64) / max(n_computable, 1)
    return TileStats(
        negl_prob=float(negl_prob), batch=batch, heads=heads, seqlen_q=int(seqlen_q),
        seqlen_k=int(seqlen_k), head_dim=int(head_dim), causal=bool(causal), num_tiles=(tm, tn),
        kept_tiles=kept_count, computable_tiles=n_computable, sparsity=sparsity,
        dropped_mass_mean=dropped_mean, dropped_mass_worst=dropped_worst,
        top_tile_share=top.sum(dim=-1) / rows_f, effective_tiles=eff.sum(dim=-1) / rows_f,
        flops_dense=flops_dense, flops_kept=flops_kept, _rows_with_mass=rows)


@dataclasses.dataclass
class Curve:
    """The trade-off over negl_prob for one tile mass: one entry per value of negl_probs."""

    negl_probs: list
    sparsity: list
    mean_dropped_mass: list
    worst_dropped_mass: list
    flops_saved_share: list
    estimated_speedup: list
    stats: list = dataclasses.field(repr=False, default_factory=list)  # the TileStats

    def table(self) -> str:
        lines = [f"{'negl_prob':>10} {'sparsity':>9} {'dropped mean':>13} {'dropped worst':>14} "
                 f"{'FLOPs saved':>12} {'est. speed-up':>14}"]
        for i, p in enumerate(self.negl_probs):
            lines.append(f"{p:>10.3g} {self.sparsity[i]:>9.4f} {self.mean_dropped_mass[i]:>13.3e} "
                         f"{self.worst_dropped_mass[i]:>14.3e} "
                         f"{100 * self.flops_saved_share[i]:>11.1f}% "
                         f"{self.estimated_speedup[i]:>13.2f}x")
        return "\n".join(lines)


def sparsity_curve(tile_mass: torch.Tensor, negl_probs: Sequence[float], seqlen_q: int,
                   seqlen_k: int, head_dim: int, causal: bool = False,
                   fixed_share: float = BWD_FIXED_SHARE) -> Curve:
    """tile_stats at every negl_prob of `negl_probs`, from one W (B, Hq, Tm, Tn): no backward
    runs. Sparsity and dropped mass never decrease along increasing negl_prob, because the
    tiles skipped at a smaller negl_prob are a prefix of those skipped at a larger one."""
    stats = [tile_stats(tile_mass, p, seqlen_q, seqlen_k, head_dim, causal) for p in negl_probs]
    return Curve(negl_probs=[float(p) for p in negl_probs],
                 sparsity=[s.total_sparsity for s in stats],
                 mean_dropped_mass=[s.mean_dropped_mass for s in stats],
                 worst_dropped_mass=[s.worst_dropped_mass for s in stats],
                 flops_saved_share=[s.flops_saved_share for s in stats],
                 estimated_speedup=[s.estimated_speedup(fixed_share) for s in stats],
                 stats=stats)


# ------------------------------------------------------------------ the last call


@dataclasses.dataclass
class CallRecord:
    """One attention call as recorded: its problem and its tile mass (B, Hq, Tm, Tn), empty when
    the call recorded no statistics. `name` is the module name under watch(), else ''."""

    name: str
    q_shape: tuple
    k_shape: tuple
    dtype: str
    backend: str
    causal: bool
    negl_prob: float
    tile_mass: torch.Tensor

    def stats(self, negl_prob: Optional[float] = None) -> TileStats:
        """The figures at the call's negl_prob, or at another one (from the same W)."""
        if self.tile_mass.numel() == 0:
            raise ValueError("BackLite: this call recorded no tile mass (negl_prob=0 without "
                             "tile_stats); record it with diagnostics.watch(model), which asks "
                             "every BackLite call for its tile mass")
        p = self.negl_prob if negl_prob is None else float(negl_prob)
        return tile_stats(self.tile_mass, p, self.q_shape[1], self.k_shape[1], self.q_shape[3],
                          self.causal)


_last_call: Optional[CallRecord] = None
_calls_seen = 0


def last_call(negl_prob: Optional[float] = None) -> TileStats:
    """Per-(batch, head) figures of the most recent recorded attention call (BACK_LITE_VERBOSE
    set, or inside watch()), at its own negl_prob or at the one given."""
    if _last_call is None:
        raise RuntimeError("BackLite: no attention call was recorded; set BACK_LITE_VERBOSE=1 or "
                           "run the model inside `with back_lite.diagnostics.watch(model):`")
    return _last_call.stats(negl_prob)


def last_call_record() -> Optional[CallRecord]:
    """The raw record of the most recent recorded call (None if there is none)."""
    return _last_call


def _record(record: CallRecord) -> None:
    global _last_call
    _last_call = record


def _log_every() -> int:
    raw = os.environ.get(EVERY_ENV_VAR, "1")
    try:
        every = int(raw)
    except ValueError:
        every = 1
    return max(every, 1)


def describe(record: CallRecord) -> str:
    """The verbose log line of one call."""
    head = (f"attention q={record.q_shape} k={record.k_shape} {record.dtype} "
            f"backend={record.backend} causal={record.causal} negl_prob={record.negl_prob}")
    if record.negl_prob > 0.0 and record.tile_mass.numel() > 0:
        return head + " | " + record.stats().summary()
    return head + " | dense backward"


def after_attention(q: torch.Tensor, k: torch.Tensor, causal: bool, negl_prob: float,
                    tile_mass: torch.Tensor) -> None:
    """Called by back_lite._verbose for every attention call while BACK_LITE_VERBOSE is set:
    records the call and logs one line every BACK_LITE_VERBOSE_EVERY calls (default 1)."""
    global _calls_seen
    record = CallRecord(name="", q_shape=tuple(q.shape), k_shape=tuple(k.shape),
                        dtype=str(q.dtype), backend=q.device.type, causal=bool(causal),
                        negl_prob=float(negl_prob), tile_mass=tile_mass.detach())
    _record(record)
    _calls_seen += 1
    every = _log_every()
    if (_calls_seen - 1) % every != 0:
        return
    with torch.no_grad():
        line = describe(record)
    if every > 1:
        line += f" [call {_calls_seen}, 1 in {every} logged]"
    logger.info(line)


# ------------------------------------------------------------------ watch(model)

_FORWARD_PARAMS = inspect.signature(BackLite.forward).parameters


def backlite_modules(model: torch.nn.Module) -> dict:
    """name -> module for every BackLite module of `model` (by isinstance), in definition order.
    A bare BackLite module is named ''."""
    return {name: m for name, m in model.named_modules() if isinstance(m, BackLite)}


def _bind_call(args, kwargs) -> dict:
    # BackLite.forward(self, q, k, v, scale=None, causal=False, ...): positional args past
    # `self` are turned into keywords, so a hook can inspect and add arguments uniformly.
    names = [n for n in _FORWARD_PARAMS if n != "self"]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


class Recorder:
    """What watch() collected: `calls`, a list of CallRecord in call order."""

    def __init__(self):
        self.calls: list[CallRecord] = []

    def by_module(self) -> dict:
        """module name -> list of its CallRecord."""
        out: dict = {}
        for rec in self.calls:
            out.setdefault(rec.name, []).append(rec)
        return out

    def table(self) -> str:
        """One line per recorded call with its figures at its own negl_prob."""
        lines = []
        for rec in self.calls:
            if rec.negl_prob > 0.0:
                body = rec.stats().summary()
            else:
                st = rec.stats(0.0)
                top = float(st.top_tile_share.mean())
                eff = float(st.effective_tiles.mean())
                body = (f"dense backward | tile mass: top tile {top:.3f}, effective tiles "
                        f"{eff:.2f} of {st.num_tiles[1]}")
            lines.append(f"{rec.name or '<module>'} q={rec.q_shape} negl_prob={rec.negl_prob}: "
                         + body)
        return "\n".join(lines)


def _stats_hook(name: str, recorder: Recorder):
    def hook(module, args, kwargs):
        call = _bind_call(args, kwargs)
        q, k = call["q"], call["k"]
        buffer = call.get("tile_stats")
        if buffer is None:
            tm, tn = functional.num_tiles(q.shape[1], k.shape[1], q.device)
            buffer = torch.zeros((q.shape[0], q.shape[2], tm, tn), dtype=torch.float32,
                                 device=q.device)
            call["tile_stats"] = buffer
        record = CallRecord(name=name, q_shape=tuple(q.shape), k_shape=tuple(k.shape),
                            dtype=str(q.dtype), backend=q.device.type,
                            causal=bool(call.get("causal", False)),
                            negl_prob=float(module.negl_prob), tile_mass=buffer)
        recorder.calls.append(record)
        _record(record)
        return (), call
    return hook


@contextlib.contextmanager
def watch(model: torch.nn.Module):
    """Within the block, every call of a BackLite module of `model` (found by isinstance) is
    recorded with its tile mass (a tile_stats buffer is passed when the caller gave none, so W is
    recorded even at negl_prob == 0; the forward's results are unchanged). Yields a Recorder."""
    recorder = Recorder()
    handles = [m.register_forward_pre_hook(_stats_hook(name, recorder), with_kwargs=True)
               for name, m in backlite_modules(model).items()]
    try:
        yield recorder
    finally:
        for h in handles:
            h.remove()


__all__ = ["TileStats", "Curve", "CallRecord", "Recorder", "tile_stats", "sparsity_curve",
           "estimated_speedup", "last_call", "last_call_record", "watch", "backlite_modules",
           "describe", "after_attention", "BWD_FIXED_SHARE", "BWD_FLOPS_PER_ELEMENT"]
