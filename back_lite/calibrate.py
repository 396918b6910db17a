"""Calibration: the largest negl_prob whose sparse backward still meets a gradient fidelity target.

    result = back_lite.calibrate(model, batches, target_cosine=0.99)
    print(result)                     # a table: chosen negl_prob, sparsity, fidelity, confidence
    result.apply(model)               # sets negl_prob on the model's BackLite modules
    result.save("calib.json"); CalibrationResult.load("calib.json").apply(model)
    result.plot("calib.png")          # sparsity, speed-up estimate, gradient error vs negl_prob

How the attention of a model is found: every `back_lite.BackLite` module of the model, by
isinstance over `model.named_modules()`; a layer is one such module, named by its module name
(`result.per_layer["blocks.3.attn"]`). Calibration sets their `negl_prob` attribute between runs
and restores it afterwards. Attention called through `back_lite.attention` directly (not through a
module) is not seen; wrap it in a BackLite module to calibrate it.

What is compared: for each batch, the loss's gradients with every BackLite module dense
(negl_prob = 0, the reference) and with the candidate negl_prob, for
  "inputs"  the attention-input gradients dq, dk, dv of every call of each module (each of the
            three compared on its own; a layer scores its worst of them),
  "params"  the gradient of all trainable parameters (one vector).
Fidelity is cosine similarity (>= target_cosine) and/or relative L2 error
||g - g_dense|| / ||g_dense|| (<= target_rel_l2). A batch passes when every compared gradient
meets every target; a negl_prob passes when every batch passes.

The search: the forward is exact for every negl_prob and the tiles skipped at a smaller negl_prob
are a subset of those skipped at a larger one, so the gradient error grows (in practice
monotonically) with negl_prob. The candidates form a grid in log-space and the search bisects it:
about log2(len(grid)) probes, each one backward per batch. A probe whose kept tiles (computed
from the dense runs' W with the library's select op) equal an earlier probe's has the same
gradients and costs no backward. Per layer (per_layer=True), each layer
is searched with the other layers dense and judged on its own input gradients (and the parameter
gradients); then all layers are checked together and, if the combination misses the target,
every layer steps down the grid together until it meets it.

Confidence: per batch, a normalized margin at the chosen value (0 = exactly at the target,
1 = identical to the dense gradient; (cos - t)/(1 - t) for cosine, (t - err)/t for relative L2,
the smaller over all compared gradients), its worst and mean over batches, how many batches would
still pass one grid step higher, and how often a larger negl_prob passed where a smaller one had
failed on the same batch (a monotonicity violation: the bisection's assumption did not hold).

Runs use the model as it is (train or eval mode): each run of a batch reseeds the RNG the same way,
so dropout masks are identical in the dense and in the sparse run.

`python -m back_lite.calibrate` runs this on a built-in synthetic problem (tokens on a small video
grid attending locally) or on a user script, and writes the table, the JSON and the PNG.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import sys
from typing import Callable, Iterable, Optional, Sequence, Union

import warnings

import torch

from . import _checks, diagnostics
from .module import BackLite

# `import back_lite` imports this module (for back_lite.calibrate(...)), so `python -m
# back_lite.calibrate` finds it already loaded and runpy warns; running it as __main__ is still
# what is wanted, so that one warning is silenced.
warnings.filterwarnings("ignore", message="'back_lite.calibrate' found in sys.modules",
                        category=RuntimeWarning)

# Default candidates: negl_prob from 1e-4 to 0.5, log-spaced.
GRID_LOW = 1e-4
GRID_HIGH = 0.5
GRID_POINTS_PER_DECADE = 6
# Gradient kinds that can be compared.
KINDS = ("inputs", "params")
# Squared norm at or below which a dense reference gradient counts as zero (an input the loss
# does not depend on): only an all-zero gradient then matches it.
_ZERO_NORM = 0.0
# Confidence labels: "high" needs this many batches and a worst normalized margin of at least
# HIGH_MARGIN (and twice the spread of the margins across batches).
HIGH_MIN_BATCHES = 3
HIGH_MARGIN = 0.1
ALL_LAYERS = "*"  # the layer name of figures over all layers together


def default_grid(low: float = GRID_LOW, high: float = GRID_HIGH,
                 per_decade: int = GRID_POINTS_PER_DECADE) -> list[float]:
    """negl_prob candidates from `low` to `high`, evenly spaced in log10."""
    if not 0.0 < low < high < 1.0:
        raise ValueError(f"BackLite: the grid needs 0 < low < high < 1, got low={low}, "
                         f"high={high}")
    steps = max(1, round(math.log10(high / low) * per_decade))
    return [float(low * (high / low) ** (i / steps)) for i in range(steps + 1)]


# ------------------------------------------------------------------ the target


@dataclasses.dataclass
class Target:
    """cosine: smallest allowed cosine similarity; rel_l2: largest allowed relative L2 error;
    on: which gradients ("inputs", "params") must meet them."""

    cosine: Optional[float] = 0.99
    rel_l2: Optional[float] = None
    on: tuple = KINDS

    def __post_init__(self):
        if self.cosine is None and self.rel_l2 is None:
            raise ValueError("BackLite: give target_cosine and/or target_rel_l2")
        if self.cosine is not None and not -1.0 < float(self.cosine) < 1.0:
            raise ValueError(f"BackLite: target_cosine must be in (-1, 1), got {self.cosine}")
        if self.rel_l2 is not None and not float(self.rel_l2) > 0.0:
            raise ValueError(f"BackLite: target_rel_l2 must be > 0, got {self.rel_l2}")
        on = (self.on,) if isinstance(self.on, str) else tuple(self.on)
        bad = [k for k in on if k not in KINDS]
        if bad or not on:
            raise ValueError(f"BackLite: on must name some of {KINDS}, got {self.on!r}")
        self.on = on

    def margin(self, fidelity: dict) -> float:
        """Normalized margin of one {"cosine", "rel_l2"} pair: >= 0 iff it meets the target."""
        margins = []
        if self.cosine is not None:
            margins.append((fidelity["cosine"] - self.cosine) / (1.0 - self.cosine))
        if self.rel_l2 is not None:
            margins.append((self.rel_l2 - fidelity["rel_l2"]) / self.rel_l2)
        return min(margins)

    def describe(self) -> str:
        parts = []
        if self.cosine is not None:
            parts.append(f"cosine >= {self.cosine}")
        if self.rel_l2 is not None:
            parts.append(f"rel L2 <= {self.rel_l2}")
        return " and ".join(parts) + " on " + ", ".join(self.on)


def compare(got: Sequence[Optional[torch.Tensor]],
            ref: Sequence[Optional[torch.Tensor]]) -> dict:
    """Cosine similarity and relative L2 error of the concatenation of `got` vs that of `ref`
    (float64; pairs where ref is None are left out). Both zero counts as identical."""
    dot = got_sq = ref_sq = diff_sq = 0.0
    for g, r in zip(got, ref):
        if r is None:
            continue
        r64 = r.detach().to(torch.float64).flatten()
        g64 = torch.zeros_like(r64) if g is None else g.detach().to(torch.float64).flatten()
        dot += float(g64 @ r64)
        got_sq += float(g64 @ g64)
        ref_sq += float(r64 @ r64)
        diff_sq += float((g64 - r64) @ (g64 - r64))
    if ref_sq <= _ZERO_NORM:
        same = got_sq <= _ZERO_NORM
        return {"cosine": 1.0 if same else 0.0, "rel_l2": 0.0 if same else math.inf}
    cosine = dot / math.sqrt(got_sq * ref_sq) if got_sq > 0 else 0.0
    return {"cosine": cosine, "rel_l2": math.sqrt(diff_sq / ref_sq)}


# ------------------------------------------------------------------ running a model


def _default_loss(model: torch.nn.Module, batch, projections: dict, index: int):
    """model(*batch) (a tuple/list batch) or model(batch); a scalar output is the loss, another
    output is reduced by a fixed random projection (the same for every run of this batch), so
    the backward sees a generic upstream gradient."""
    out = model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if out.dim() == 0:
        return out
    proj = projections.get(index)
    if proj is None or proj.shape != out.shape:
        gen = torch.Generator().manual_seed(1_000_003 + index)
        proj = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device,
                                                                             out.dtype)
        projections[index] = proj
    return (out * proj).sum()


@dataclasses.dataclass
class _Run:
    """Gradients of one run: params (list, aligned with the session's parameters) and inputs
    {layer: [(dq, dk, dv) per call]}; stats {layer: [W per call]} (dense reference runs only)."""

    params: list
    inputs: dict
    stats: dict


class _Session:
    """The model, its BackLite modules, its parameters and its batches, with cached dense
    reference gradients per batch."""

    def __init__(self, model, batches, loss_fn, modules, parameters, target: Target, seed: int):
        if isinstance(model, torch.nn.Module):
            found = diagnostics.backlite_modules(model) if modules is None else _as_modules(modules)
            if parameters is None:
                parameters = [p for p in model.parameters() if p.requires_grad]
            self.loss = ((lambda batch, i: loss_fn(model, batch)) if loss_fn is not None else
                         (lambda batch, i: _default_loss(model, batch, self._projections, i)))
        elif callable(model):
            if modules is None:
                raise ValueError("BackLite: calibrating a loss function needs modules= (the "
                                 "nn.Module holding its BackLite modules, or a dict name -> "
                                 "BackLite)")
            found = _as_modules(modules)
            parameters = [] if parameters is None else list(parameters)
            self.loss = lambda batch, i: model(batch)
        else:
            raise TypeError(f"BackLite: model must be an nn.Module or a loss function of a batch, "
                            f"got {type(model).__name__}")
        if not found:
            raise ValueError("BackLite: no BackLite module found in the model; its attention must "
                             "be back_lite.BackLite modules to be calibrated")
        self.modules = found
        self.parameters = list(parameters)
        if "params" in target.on and not self.parameters:
            raise ValueError("BackLite: target on 'params' but there are no trainable parameters; "
                             "pass parameters= or on=('inputs',)")
        self.batches = list(batches)
        if not self.batches:
            raise ValueError("BackLite: batches is empty")
        self.target = target
        self.seed = seed
        self._projections: dict = {}
        self._reference: dict = {}

    @contextlib.contextmanager
    def _negl(self, negl: dict):
        # negl: layer -> negl_prob for this run (absent layers dense); restored afterwards
        saved = {name: m.negl_prob for name, m in self.modules.items()}
        try:
            for name, m in self.modules.items():
                m.negl_prob = _checks.negl_prob(negl.get(name, 0.0))
            yield
        finally:
            for name, m in self.modules.items():
                m.negl_prob = saved[name]

    def run(self, index: int, negl: dict, with_stats: bool = False) -> _Run:
        calls: dict = {name: [] for name in self.modules}
        stats: dict = {name: [] for name in self.modules}
        handles = [m.register_forward_pre_hook(_capture_hook(calls[name], stats[name] if
                                                             with_stats else None),
                                               with_kwargs=True)
                   for name, m in self.modules.items()]
        devices = ([torch.cuda.current_device()]
                   if torch.cuda.is_available() and torch.cuda.is_initialized() else [])
        try:
            with self._negl(negl), torch.random.fork_rng(devices=devices):
                torch.manual_seed(self.seed + index)
                loss = self.loss(self.batches[index], index)
        finally:
            for h in handles:
                h.remove()
        flat_inputs = [t for name in self.modules for call in calls[name] for t in call]
        wanted = self.parameters + [t for t in flat_inputs if t is not None]
        grads = list(torch.autograd.grad(loss, wanted, allow_unused=True)) if wanted else []
        params = grads[:len(self.parameters)]
        rest = iter(grads[len(self.parameters):])
        inputs = {name: [tuple(None if t is None else next(rest) for t in call)
                         for call in calls[name]] for name in self.modules}
        return _Run(params=[None if g is None else g.detach() for g in params], inputs=inputs,
                    stats=stats)

    def reference(self, index: int) -> _Run:
        if index not in self._reference:
            self._reference[index] = self.run(index, {}, with_stats=True)
        return self._reference[index]

    def measure(self, index: int, negl: dict) -> dict:
        """Fidelity of one batch at `negl` (layer -> negl_prob) against the dense reference:
        {"params": {cosine, rel_l2}, "inputs": {layer: {cosine, rel_l2}}}."""
        ref = self.reference(index)
        got = self.run(index, negl)
        out: dict = {}
        if "params" in self.target.on:
            out["params"] = compare(got.params, ref.params)
        if "inputs" in self.target.on:
            out["inputs"] = {}
            for name in self.modules:
                worst = None
                for part in range(3):  # dq, dk, dv each on its own
                    if all(c[part] is None for c in ref.inputs[name]):
                        continue  # no gradient flows into this input
                    fid = compare([c[part] for c in got.inputs[name]],
                                  [c[part] for c in ref.inputs[name]])
                    if worst is None or self.target.margin(fid) < self.target.margin(worst):
                        worst = fid
                if worst is not None:
                    out["inputs"][name] = worst
        return out

    def margin(self, fidelity: dict, layers: Optional[Iterable[str]] = None) -> float:
        """Normalized margin of one batch's fidelity: the smallest over the compared gradients
        (input gradients of `layers` only, all layers if None)."""
        margins = []
        if "params" in fidelity:
            margins.append(self.target.margin(fidelity["params"]))
        for name, fid in fidelity.get("inputs", {}).items():
            if layers is None or name in layers:
                margins.append(self.target.margin(fid))
        return min(margins) if margins else math.inf


def _as_modules(modules) -> dict:
    if isinstance(modules, torch.nn.Module):
        found = diagnostics.backlite_modules(modules)
    elif isinstance(modules, dict):
        found = dict(modules)
    else:
        found = {f"attn{i}": m for i, m in enumerate(modules)}
    for name, m in found.items():
        if not isinstance(m, BackLite):
            raise TypeError(f"BackLite: modules[{name!r}] is a {type(m).__name__}, not a "
                            "back_lite.BackLite")
    return found


def _capture_hook(calls: list, stats: Optional[list]):
    """Pre-hook of a BackLite module: keeps (q, k, v) of each call (None where no gradient flows)
    and, for reference runs, a tile_stats buffer that receives the call's W."""
    def hook(module, args, kwargs):
        call = diagnostics._bind_call(args, kwargs)
        calls.append(tuple(call[n] if call[n].requires_grad else None for n in ("q", "k", "v")))
        if stats is not None:
            q, k = call["q"], call["k"]
            if call.get("tile_stats") is None:
                tm, tn = diagnostics.functional.num_tiles(q.shape[1], k.shape[1], q.device)
                call["tile_stats"] = torch.zeros((q.shape[0], q.shape[2], tm, tn),
                                                 dtype=torch.float32, device=q.device)
            stats.append((call["tile_stats"], tuple(q.shape), tuple(k.shape),
                          bool(call.get("causal", False))))
        return (), call
    return hook


# ------------------------------------------------------------------ the search


def bisect_grid(num: int, passes: Callable[[int], bool]) -> int:
    """The largest index i in [0, num) with passes(i), assuming passes is monotone (True up to
    some index, False after); -1 when passes(0) is False. Calls passes about log2(num+1) times."""
    lo, hi = -1, num  # passes(lo) holds (index -1 stands for negl_prob = 0), hi is unknown/False
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo


class _Progress:
    """tqdm over the batch runs when asked for (progress=True) or when installed (None)."""

    def __init__(self, progress: Optional[bool], total: int, desc: str):
        self.bar = None
        if progress is False:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError as exc:
            if progress:
                raise ImportError("BackLite: progress=True needs tqdm (pip install tqdm, or "
                                  "pip install 'back_lite[calibrate]')") from exc
            return
        self.bar = tqdm(total=total, desc=desc, unit="batch", leave=False)

    def update(self, postfix: Optional[str] = None) -> None:
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)

    def grow(self, extra: int) -> None:
        if self.bar is not None:
            self.bar.total += extra
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Search:
    """Evaluations of (layer, grid index) over all batches, cached and recorded."""

    def __init__(self, session: _Session, grid: list, bar: _Progress):
        self.session = session
        self.grid = grid
        self.bar = bar
        self.evaluations: list = []
        self._cache: dict = {}

    def _tiles_key(self, negl: dict) -> str:
        """A digest of the tiles every call of every batch keeps at `negl`. The forward is exact,
        so the dense runs' W is the W of any run, and two settings that keep the same tiles
        give the same gradients: one backward per distinct set of kept tiles is enough."""
        digest = hashlib.sha1()
        for i in range(len(self.session.batches)):
            for name, calls in self.session.reference(i).stats.items():
                p = negl.get(name, 0.0)
                for w, _, _, _ in calls:
                    if p == 0.0:
                        digest.update(b"dense")
                    else:
                        mask = diagnostics.functional.select(w, p)
                        digest.update(bytes(mask.flatten().to(torch.uint8).cpu().tolist()))
                digest.update(name.encode())
        return digest.hexdigest()

    def evaluate(self, negl: dict, layers: Optional[list], label: str) -> dict:
        """Runs every batch at `negl`; judged on the input gradients of `layers` (None: all)."""
        key = (label, self._tiles_key(negl))
        if key in self._cache:
            # same kept tiles as an earlier probe: same gradients, recorded at this value too
            record = dict(self._cache[key], negl_prob=negl,
                          same_tiles_as=self._cache[key]["negl_prob"])
            self.evaluations.append(record)
            return record
        per_batch, margins = [], []
        for i in range(len(self.session.batches)):
            fid = self.session.measure(i, negl)
            per_batch.append(fid)
            margins.append(self.session.margin(fid, layers))
            self.bar.update(f"{label} negl_prob={max(negl.values(), default=0.0):.3g}")
        record = {"layer": label, "negl_prob": negl, "margins": margins,
                  "passed": all(m >= 0.0 for m in margins), "fidelity": per_batch}
        self.evaluations.append(record)
        self._cache[key] = record
        return record

    def search(self, layer: str, layer_names: list) -> int:
        """Bisection for one layer (others dense) or, with layer == ALL_LAYERS, for all layers
        at one common negl_prob."""
        judged = None if layer == ALL_LAYERS else [layer]

        def passes(idx: int) -> bool:
            negl = {name: self.grid[idx] for name in layer_names}
            return self.evaluate(negl, judged, layer)["passed"]

        return bisect_grid(len(self.grid), passes)


def _confidence(search: _Search, layer: str, index: int, grid: list) -> dict:
    """Margins at the chosen index, batches passing one step higher, monotonicity violations."""
    n = len(search.session.batches)
    chosen = next((e for e in search.evaluations if e["layer"] == layer and index >= 0 and
                   set(e["negl_prob"].values()) == {grid[index]}), None)
    margins = chosen["margins"] if chosen else [1.0] * n  # negl_prob = 0 is the dense gradient
    above = next((e for e in search.evaluations if e["layer"] == layer and index + 1 < len(grid)
                  and set(e["negl_prob"].values()) == {grid[index + 1]}), None)
    # per batch: did a larger probe pass after a smaller one failed?
    probes = sorted((max(e["negl_prob"].values()), e["margins"]) for e in search.evaluations
                    if e["layer"] == layer)
    violations = 0
    for b in range(n):
        failed = False
        for _, ms in probes:
            if ms[b] < 0.0:
                failed = True
            elif failed:
                violations += 1
                break
    worst = min(margins)
    mean = sum(margins) / n
    spread = (sum((m - mean) ** 2 for m in margins) / n) ** 0.5
    if n >= HIGH_MIN_BATCHES and violations == 0 and worst >= max(HIGH_MARGIN, 2.0 * spread):
        label = "high"
    elif n >= 2 and violations == 0 and worst >= 0.0:
        label = "medium"
    else:
        label = "low"
    return {"label": label, "worst_margin": worst, "mean_margin": mean, "margin_spread": spread,
            "batches": n,
            "next_negl_prob": grid[index + 1] if index + 1 < len(grid) else None,
            "batches_passing_next": (sum(m >= 0.0 for m in above["margins"])
                                     if above is not None else None),
            "monotonicity_violations": violations}


# ------------------------------------------------------------------ the result


@dataclasses.dataclass
class CalibrationResult:
    """What calibrate() found. negl_prob: the global value (the smallest over layers in per-layer
    mode); per_layer: layer name -> chosen negl_prob; confidence: layer -> figures (see the module
    doc); curve: layer -> sparsity / FLOPs saved / speed-up estimate at every grid value (from the
    dense runs' tile mass, summed over batches); evaluations: every probe with its per-batch
    fidelity; joint: per-layer mode, the probe of all layers together at their chosen values."""

    mode: str
    target: dict
    grid: list
    negl_prob: float
    per_layer: dict
    confidence: dict
    curve: dict
    evaluations: list
    joint: Optional[dict] = None
    backoff_steps: int = 0

    # ---- using it
    def apply(self, model: torch.nn.Module) -> None:
        """Sets each BackLite module of `model` to its chosen negl_prob (by module name; modules
        the result does not name get the global value)."""
        for name, m in diagnostics.backlite_modules(model).items():
            m.negl_prob = _checks.negl_prob(self.per_layer.get(name, self.negl_prob))

    def check(self, model, batches: Iterable, loss_fn: Optional[Callable] = None,
              **kwargs) -> "FidelityReport":
        """evaluate() at these values against this result's target, e.g. on held-out batches."""
        t = self.target
        return evaluate(model, batches, self, loss_fn, target_cosine=t.get("cosine"),
                        target_rel_l2=t.get("rel_l2"), on=tuple(t["on"]), **kwargs)

    # ---- the table
    def _at(self, layer: str, negl_prob: float, key: str) -> float:
        curve = self.curve.get(layer)
        if not curve or negl_prob == 0.0:
            return 0.0 if key != "estimated_speedup" else 1.0
        i = min(range(len(self.grid)), key=lambda j: abs(self.grid[j] - negl_prob))
        return curve[key][i]

    def _fidelity_at(self, layer: str, negl_prob: float) -> tuple:
        # worst cosine / rel L2 over batches of the input gradients judged and of the params
        ev = self.joint if layer == "joint" else next(
            (e for e in self.evaluations if e["layer"] == layer
             and set(e["negl_prob"].values()) == {negl_prob}), None)
        if ev is None:
            return None, None
        cos_in = cos_p = None
        for fid in ev["fidelity"]:
            inputs = fid.get("inputs", {})
            names = list(inputs) if layer in (ALL_LAYERS, "joint") else [layer]
            for name in names:
                if name in inputs:
                    c = inputs[name]["cosine"]
                    cos_in = c if cos_in is None else min(cos_in, c)
            if "params" in fid:
                c = fid["params"]["cosine"]
                cos_p = c if cos_p is None else min(cos_p, c)
        return cos_in, cos_p

    def table(self) -> str:
        t = self.target
        on = ", ".join(t["on"])
        want = " and ".join(x for x in (
            f"cosine >= {t['cosine']}" if t.get("cosine") is not None else "",
            f"rel L2 <= {t['rel_l2']}" if t.get("rel_l2") is not None else "") if x)
        n = next(iter(self.confidence.values()))["batches"] if self.confidence else 0
        reused = sum("same_tiles_as" in e for e in self.evaluations)
        lines = [f"BackLite calibration ({self.mode}): target {want} on {on}; {n} batches; grid "
                 f"{self.grid[0]:.3g}..{self.grid[-1]:.3g} ({len(self.grid)} values, "
                 f"{len(self.evaluations)} probes, {reused} of them answered by an earlier probe "
                 "that kept the same tiles)",
                 f"{'layer':<24} {'negl_prob':>10} {'sparsity':>9} {'FLOPs saved':>11} "
                 f"{'est.speed-up':>12} {'cos inputs':>11} {'cos params':>11} "
                 f"{'margin worst/mean':>18} {'confidence':>10}"]

        def fmt(x):
            return f"{x:.5f}" if x is not None else "-"

        rows = [ALL_LAYERS] if self.mode == "global" else list(self.per_layer)
        for layer in rows:
            p = self.negl_prob if layer == ALL_LAYERS else self.per_layer[layer]
            conf = self.confidence.get(layer, {})
            cos_in, cos_p = self._fidelity_at(layer, p)
            if p == 0.0:
                cos_in = cos_p = 1.0
            lines.append(
                f"{(layer if layer != ALL_LAYERS else 'all layers'):<24} {p:>10.4g} "
                f"{self._at(layer, p, 'sparsity'):>9.4f} "
                f"{100 * self._at(layer, p, 'flops_saved_share'):>10.1f}% "
                f"{self._at(layer, p, 'estimated_speedup'):>11.2f}x {fmt(cos_in):>11} "
                f"{fmt(cos_p):>11} {conf.get('worst_margin', 0):>8.3f}/"
                f"{conf.get('mean_margin', 0):<9.3f} {conf.get('label', '-'):>10}")
        if self.joint is not None:
            cos_in, cos_p = self._fidelity_at("joint", 0.0)
            ms = self.joint["margins"]
            lines.append(f"{'joint (all layers)':<24} {'':>10} {'':>9} {'':>11} {'':>12} "
                         f"{fmt(cos_in):>11} {fmt(cos_p):>11} {min(ms):>8.3f}/"
                         f"{sum(ms) / len(ms):<9.3f} "
                         f"{'pass' if self.joint['passed'] else 'FAIL':>10}")
            if self.backoff_steps:
                lines.append(f"(the joint check failed at the per-layer values; every layer was "
                             f"stepped {self.backoff_steps} grid step(s) down)")
        for layer, conf in self.confidence.items():
            name = "all layers" if layer == ALL_LAYERS else layer
            nxt = conf.get("next_negl_prob")
            above = ("" if nxt is None or conf.get("batches_passing_next") is None else
                     f"; {conf['batches_passing_next']} of {conf['batches']} batches would also "
                     f"pass at {nxt:.3g}")
            lines.append(f"confidence {name}: {conf['label']} (worst margin "
                         f"{conf['worst_margin']:.3f}, mean {conf['mean_margin']:.3f}{above}; "
                         f"{conf['monotonicity_violations']} monotonicity violations)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    # ---- JSON
    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1, allow_nan=True)
            f.write("\n")

    @classmethod
    def from_dict(cls, data: dict) -> "CalibrationResult":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"BackLite: not a calibration result, unknown keys {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str) -> "CalibrationResult":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    # ---- the plot
    def plot(self, path: str) -> str:
        """Writes a PNG: sparsity, estimated backward speed-up and gradient error (1 - cosine,
        relative L2, worst over batches, at the probed values) against negl_prob. Needs
        matplotlib (imported here, Agg backend). Returns path."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("BackLite: CalibrationResult.plot needs matplotlib (pip install "
                              "matplotlib, or pip install 'back_lite[calibrate]')") from exc
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for layer, curve in self.curve.items():
            label = "all layers" if layer == ALL_LAYERS else layer
            axes[0].plot(self.grid, curve["sparsity"], marker=".", label=label)
            axes[1].plot(self.grid, curve["estimated_speedup"], marker=".", label=label)
        self._plot_errors(axes[2])
        chosen = {self.negl_prob} if self.mode == "global" else set(self.per_layer.values())
        for ax in axes:
            ax.set_xscale("log")
            ax.set_xlim(self.grid[0] / 1.2, self.grid[-1] * 1.2)
            ax.set_xlabel("negl_prob")
            ax.grid(True, which="both", alpha=0.3)
            for p in chosen:
                if p > 0:
                    ax.axvline(p, color="k", linestyle=":", linewidth=1)
        axes[0].set_ylabel("backward tile sparsity")
        axes[0].set_ylim(0, 1)
        axes[1].set_ylabel(f"est. backward speed-up (fixed share "
                           f"{diagnostics.BWD_FIXED_SHARE:.0%})")
        axes[0].legend(fontsize=7)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"BackLite calibration ({self.mode}); dotted: chosen negl_prob")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def _plot_errors(self, ax) -> None:
        t = self.target
        series: dict = {}
        for ev in self.evaluations:
            layer = ev["layer"]
            x = max(ev["negl_prob"].values())
            for fid in ev["fidelity"]:
                items = []
                if "params" in fid:
                    items.append(("params", fid["params"]))
                for name, f in fid.get("inputs", {}).items():
                    if layer in (ALL_LAYERS, "joint", name):
                        items.append((f"inputs {name}", f))
                for what, f in items:
                    key = what if layer == ALL_LAYERS else f"{layer}: {what}"
                    metrics = []
                    if t.get("cosine") is not None:
                        metrics.append(("1 - cos", 1.0 - f["cosine"]))
                    if t.get("rel_l2") is not None:
                        metrics.append(("rel L2", f["rel_l2"]))
                    for metric, value in metrics:
                        cur = series.setdefault((key, metric), {})
                        cur[x] = max(cur.get(x, 0.0), value)
        for (key, metric), pts in sorted(series.items()):
            xs = sorted(p for p in pts if pts[p] > 0 and math.isfinite(pts[p]))
            if xs:
                ax.plot(xs, [pts[x] for x in xs], marker="o", label=f"{key} ({metric})")
        if t.get("cosine") is not None:
            ax.axhline(1.0 - t["cosine"], color="r", linestyle="--", label="target 1 - cos")
        if t.get("rel_l2") is not None:
            ax.axhline(t["rel_l2"], color="m", linestyle="--", label="target rel L2")
        ax.set_yscale("log")
        ax.set_ylabel("gradient error vs dense (worst batch)")
        ax.legend(fontsize=6)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return x


def _curves(session: _Session, grid: list) -> dict:
    """layer -> {sparsity, flops_saved_share, estimated_speedup} at each grid value, from the
    dense runs' W of every batch and every call (kept tiles and FLOPs summed); ALL_LAYERS too."""
    kept = {name: [0.0] * len(grid) for name in list(session.modules) + [ALL_LAYERS]}
    total = {name: 0.0 for name in kept}
    flops_kept = {name: [0.0] * len(grid) for name in kept}
    flops_total = {name: 0.0 for name in kept}
    for i in range(len(session.batches)):
        for name, calls in session.reference(i).stats.items():
            for w, q_shape, k_shape, causal in calls:
                for j, p in enumerate(grid):
                    st = diagnostics.tile_stats(w, p, q_shape[1], k_shape[1], q_shape[3], causal)
                    for key in (name, ALL_LAYERS):
                        kept[key][j] += float(st.kept_tiles.sum())
                        flops_kept[key][j] += float(st.flops_kept.sum())
                        if j == 0:
                            total[key] += st.computable_tiles * st.batch * st.heads
                            flops_total[key] += st.flops_dense * st.batch * st.heads
    out = {}
    for name in kept:
        if total[name] == 0:
            continue
        saved = [1.0 - fk / flops_total[name] for fk in flops_kept[name]]
        out[name] = {"sparsity": [1.0 - k / total[name] for k in kept[name]],
                     "flops_saved_share": saved,
                     "estimated_speedup": [diagnostics.estimated_speedup(1.0 - s) for s in saved]}
    return out


# ------------------------------------------------------------------ the entry points


def calibrate(model: Union[torch.nn.Module, Callable], batches: Iterable,
              loss_fn: Optional[Callable] = None, *, target_cosine: Optional[float] = 0.99,
              target_rel_l2: Optional[float] = None, on: Sequence[str] = KINDS,
              per_layer: bool = False, grid: Optional[Sequence[float]] = None,
              scan: bool = False, modules=None, parameters=None,
              progress: Optional[bool] = None, seed: int = 0) -> CalibrationResult:
    """Finds the largest negl_prob on `grid` whose sparse backward meets the target on every batch.

    model: an nn.Module whose BackLite modules are calibrated, with loss_fn(model, batch) -> scalar
        (default: the module's output, reduced by a fixed random projection if not a scalar);
        or a loss function loss(batch) -> scalar, with modules= (an nn.Module holding the BackLite
        modules, or a dict name -> BackLite) and, to compare parameter gradients, parameters=.
    batches: the batches (materialized to a list; each is run once dense and once per probe).
    target_cosine / target_rel_l2: the fidelity to meet (either or both); on: which gradients.
    per_layer: a negl_prob per BackLite module instead of one for all.
    grid: increasing negl_prob candidates in (0, 1) (default: default_grid()).
    scan: evaluate every grid value instead of bisecting (a complete curve for plot(); slower).
    progress: tqdm bar (None: if tqdm is installed).
    The modules' negl_prob values are restored afterwards; call result.apply(model) to use them.
    """
    target = Target(target_cosine, target_rel_l2, on)
    grid = default_grid() if grid is None else [float(p) for p in grid]
    if not grid or any(not 0.0 < p < 1.0 for p in grid) or sorted(set(grid)) != grid:
        raise ValueError(f"BackLite: grid must be strictly increasing values in (0, 1), got {grid}")
    session = _Session(model, batches, loss_fn, modules, parameters, target, seed)
    names = list(session.modules)
    n = len(session.batches)
    searches = [ALL_LAYERS] if not per_layer else names
    probes = len(grid) if scan else math.ceil(math.log2(len(grid) + 1))
    bar = _Progress(progress, n * (1 + probes * len(searches)), "calibrate")
    try:
        for i in range(n):  # the dense references first (their W gives the curves)
            session.reference(i)
            bar.update("dense reference")
        search = _Search(session, grid, bar)
        chosen: dict = {}
        for layer in searches:
            layer_names = names if layer == ALL_LAYERS else [layer]
            if scan:
                judged = None if layer == ALL_LAYERS else [layer]
                ok = [search.evaluate({nm: p for nm in layer_names}, judged, layer)["passed"]
                      for p in grid]
                # the largest value below the first failure: what the bisection assumes
                first_fail = next((j for j, passed in enumerate(ok) if not passed), len(grid))
                chosen[layer] = first_fail - 1
            else:
                chosen[layer] = search.search(layer, layer_names)
        confidence = {layer: _confidence(search, layer, idx, grid) for layer, idx in
                      chosen.items()}
        joint, backoff = None, 0
        if per_layer:
            while True:
                negl = {nm: (grid[chosen[nm] - backoff] if chosen[nm] - backoff >= 0 else 0.0)
                        for nm in names}
                bar.grow(n)
                joint = search.evaluate(negl, None, "joint")
                if joint["passed"] or all(v == 0.0 for v in negl.values()):
                    break
                backoff += 1
            per = {nm: (grid[chosen[nm] - backoff] if chosen[nm] - backoff >= 0 else 0.0)
                   for nm in names}
            global_p = min(per.values())
        else:
            global_p = grid[chosen[ALL_LAYERS]] if chosen[ALL_LAYERS] >= 0 else 0.0
            per = {nm: global_p for nm in names}
        curve = _curves(session, grid)
    finally:
        bar.close()
    return CalibrationResult(
        mode="per_layer" if per_layer else "global",
        target={"cosine": target.cosine, "rel_l2": target.rel_l2, "on": list(target.on)},
        grid=grid, negl_prob=global_p, per_layer=per, confidence=confidence, curve=curve,
        evaluations=_jsonable(search.evaluations), joint=_jsonable(joint), backoff_steps=backoff)


@dataclasses.dataclass
class FidelityReport:
    """evaluate(): per batch, the fidelity and its normalized margin at the given negl_prob."""

    negl_prob: dict
    fidelity: list
    margins: list

    @property
    def passed(self) -> bool:
        return all(m >= 0.0 for m in self.margins)

    @property
    def worst_cosine(self) -> float:
        values = [f["params"]["cosine"] for f in self.fidelity if "params" in f]
        values += [v["cosine"] for f in self.fidelity for v in f.get("inputs", {}).values()]
        return min(values)


def evaluate(model, batches: Iterable, negl_prob, loss_fn: Optional[Callable] = None, *,
             target_cosine: Optional[float] = 0.99, target_rel_l2: Optional[float] = None,
             on: Sequence[str] = KINDS, modules=None, parameters=None,
             seed: int = 0) -> FidelityReport:
    """Gradient fidelity of every batch at negl_prob (a float for every layer, a dict
    layer -> negl_prob, or a CalibrationResult) against the dense backward; the same arguments
    as calibrate(). For checking a chosen value on held-out batches."""
    session = _Session(model, batches, loss_fn, modules, parameters,
                       Target(target_cosine, target_rel_l2, on), seed)
    if isinstance(negl_prob, CalibrationResult):
        negl = {nm: negl_prob.per_layer.get(nm, negl_prob.negl_prob) for nm in session.modules}
    elif isinstance(negl_prob, dict):
        negl = dict(negl_prob)
    else:
        negl = {nm: float(negl_prob) for nm in session.modules}
    fidelity = [session.measure(i, negl) for i in range(len(session.batches))]
    return FidelityReport(negl_prob=negl, fidelity=fidelity,
                          margins=[session.margin(f) for f in fidelity])


# ------------------------------------------------------------------ the synthetic problem


class ToyVideoAttention(torch.nn.Module):
    """A small transformer over tokens on a (frames x height x width) grid whose attention is
    local in space-time, as in video diffusion transformers: the input carries sin/cos features
    of each token's grid position and q, k start as the same positional projection, so q_i . k_j
    falls off with the grid distance of tokens i and j. Content features and v are random.

    x: (B, S, dim) -> (B, S, dim), S = frames * height * width."""

    def __init__(self, grid_shape=(8, 8, 16), layers: int = 2, heads: int = 2,
                 head_dim: int = 64, content_dim: int = 32, freqs: int = 8,
                 width: float = 2.5, sharpness: float = 16.0, negl_prob: float = 0.0,
                 seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.grid_shape = tuple(grid_shape)
        self.heads, self.head_dim = heads, head_dim
        pos = _grid_features(self.grid_shape, freqs, width)  # (S, P)
        self.register_buffer("pos", pos, persistent=False)
        self.pos_dim = pos.shape[1]
        self.content_dim = content_dim
        dim = self.pos_dim + content_dim
        self.dim = dim
        # score peak = amp^2 * |pos_i|^2 / sqrt(D) with |pos_i|^2 = P / 2 (sin^2 + cos^2 pairs)
        amp = math.sqrt(sharpness * math.sqrt(head_dim) / (self.pos_dim / 2))
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.Module()
            block.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
            block.k = torch.nn.Linear(dim, heads * head_dim, bias=False)
            block.v = torch.nn.Linear(dim, heads * head_dim)
            block.proj = torch.nn.Linear(heads * head_dim, dim)
            with torch.no_grad():
                # q and k share one orthonormal embedding of the positional features, so that
                # q_i . k_j = amp^2 pos_i . pos_j (plus small random terms)
                embed = torch.linalg.qr(torch.randn(head_dim, self.pos_dim, generator=gen))[0]
                for lin in (block.q, block.k):
                    w = 0.02 * torch.randn(lin.weight.shape, generator=gen)
                    for h in range(heads):
                        w[h * head_dim:(h + 1) * head_dim, :self.pos_dim] += amp * embed
                    lin.weight.copy_(w)
                block.v.weight.copy_(torch.randn(block.v.weight.shape, generator=gen)
                                     / math.sqrt(dim))
                # small output projection: the residual stream keeps its positional features
                block.proj.weight.copy_(0.1 * torch.randn(block.proj.weight.shape, generator=gen)
                                        / math.sqrt(heads * head_dim))
            block.attn = BackLite(negl_prob)
            self.blocks.append(block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seqlen, _ = x.shape
        shape = (batch, seqlen, self.heads, self.head_dim)
        for block in self.blocks:
            q = block.q(x).view(shape)
            k = block.k(x).view(shape)
            v = block.v(x).view(shape)
            x = x + block.proj(block.attn(q, k, v).reshape(batch, seqlen, -1))
        return x

    def make_batch(self, batch: int = 1, seed: int = 0):
        """(x, y): x the positional features plus random content (B, S, dim), y a random
        regression target of the same shape; on the model's device, in its dtype."""
        gen = torch.Generator().manual_seed(10_007 * (seed + 1))
        pos = self.pos.float().cpu()
        content = torch.randn(batch, pos.shape[0], self.content_dim, generator=gen)
        x = torch.cat([pos.expand(batch, -1, -1), content], dim=-1)
        y = torch.randn(batch, pos.shape[0], self.dim, generator=gen)
        like = self.blocks[0].q.weight
        return x.to(like.device, like.dtype), y.to(like.device, like.dtype)


def mse_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """The toy problem's loss: mean squared error of model(x) against y."""
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def _grid_features(grid_shape, freqs: int, width: float) -> torch.Tensor:
    """(S, 6 * freqs): cos/sin of each axis coordinate at `freqs` frequencies from 0 to pi/width
    (the lowest wavelength spans ~2*width grid steps), tokens in (frame, row, column) order."""
    axes = [torch.arange(n, dtype=torch.float64) for n in grid_shape]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    f = torch.linspace(0.0, math.pi / width, freqs, dtype=torch.float64)
    angle = coords[:, :, None] * f  # (S, 3, freqs)
    feat = torch.cat([angle.cos(), angle.sin()], dim=-1).reshape(coords.shape[0], -1)
    return feat.to(torch.float32)


def synthetic_problem(num_batches: int = 4, batch: int = 1, seed: int = 0, device="cpu",
                      dtype=torch.float32, **model_kwargs):
    """(model, batches, loss_fn) of the built-in problem: ToyVideoAttention with MSE loss, on
    `device` in `dtype` (the CUDA backend takes bf16/fp16, the CPU backend also fp32)."""
    model = ToyVideoAttention(seed=seed, **model_kwargs).to(device=device, dtype=dtype)
    batches = [model.make_batch(batch, seed=seed * 1000 + i) for i in range(num_batches)]
    return model, batches, mse_loss


# ------------------------------------------------------------------ CLI


def _load_script(path: str):
    """A user script defining calibration_problem() -> (model, batches[, loss_fn])."""
    spec = importlib.util.spec_from_file_location("back_lite_user_problem", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"back_lite.calibrate: cannot load the script {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "calibration_problem"):
        raise SystemExit(f"back_lite.calibrate: {path} defines no calibration_problem() returning "
                         "(model, batches[, loss_fn])")
    problem = mod.calibration_problem()
    model, batches = problem[0], problem[1]
    return model, batches, problem[2] if len(problem) > 2 else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m back_lite.calibrate",
        description="Find the largest negl_prob whose sparse attention backward meets a gradient "
                    "fidelity target, on a built-in synthetic problem (tokens on a small video "
                    "grid with local attention) or on a user script; writes the table, the JSON "
                    "result and a PNG plot.")
    parser.add_argument("--script", help="a Python file defining calibration_problem() -> "
                        "(model, batches[, loss_fn(model, batch)]); default: the synthetic problem")
    parser.add_argument("--out", default="calibration", help="output directory (default "
                        "./calibration): table.txt, calibration.json, calibration.png")
    parser.add_argument("--target-cosine", type=float, default=0.99)
    parser.add_argument("--target-rel-l2", type=float, default=None)
    parser.add_argument("--on", default="inputs,params",
                        help="gradients compared: inputs, params or both (comma-separated)")
    parser.add_argument("--per-layer", action="store_true", help="one negl_prob per layer")
    parser.add_argument("--scan", action="store_true",
                        help="evaluate every grid value (a full curve) instead of bisecting")
    parser.add_argument("--grid", default=None,
                        help="low,high,points_per_decade of the log grid (default "
                             f"{GRID_LOW},{GRID_HIGH},{GRID_POINTS_PER_DECADE})")
    parser.add_argument("--batches", type=int, default=4, help="synthetic problem: batches")
    parser.add_argument("--frames", default="8x8x16",
                        help="synthetic problem: frames x height x width of the token grid")
    parser.add_argument("--device", default="cpu", help="synthetic problem: cpu or cuda")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="synthetic problem: default float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    if args.script:
        model, batches, loss_fn = _load_script(args.script)
    else:
        grid_shape = tuple(int(x) for x in args.frames.lower().split("x"))
        if len(grid_shape) != 3:
            parser.error(f"--frames must be FxHxW, got {args.frames}")
        dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
        model, batches, loss_fn = synthetic_problem(args.batches, seed=args.seed,
                                                    device=args.device,
                                                    dtype=getattr(torch, dtype),
                                                    grid_shape=grid_shape)
    grid = None
    if args.grid:
        low, high, per_decade = args.grid.split(",")
        grid = default_grid(float(low), float(high), int(per_decade))
    result = calibrate(model, batches, loss_fn, target_cosine=args.target_cosine,
                       target_rel_l2=args.target_rel_l2,
                       on=tuple(s.strip() for s in args.on.split(",") if s.strip()),
                       per_layer=args.per_layer, grid=grid, scan=args.scan,
                       progress=None if not args.no_progress else False, seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    table = result.table()
    print(table, flush=True)
    with open(os.path.join(args.out, "table.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    result.save(os.path.join(args.out, "calibration.json"))
    written = [os.path.join(args.out, n) for n in ("table.txt", "calibration.json")]
    if not args.no_plot:
        written.append(result.plot(os.path.join(args.out, "calibration.png")))
    print("wrote " + ", ".join(written), file=sys.stderr)
    return 0


__all__ = ["calibrate", "evaluate", "CalibrationResult", "FidelityReport", "Target", "compare",
           "bisect_grid", "default_grid", "ToyVideoAttention", "synthetic_problem", "mse_loss",
           "main"]

if __name__ == "__main__":
    sys.exit(main())
