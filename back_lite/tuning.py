"""Online tuning: keep a gradient-fidelity target while training, by nudging negl_prob.

    controller = FidelityController(model, target_cosine=0.99, every=200, loss_fn=loss_fn)
    for batch in loader:
        loss = loss_fn(model, batch); loss.backward(); optimizer.step(); optimizer.zero_grad()
        controller.step(batch)        # every 200th call: one dense and one sparse backward

Attention drifts during training (it usually sharpens), so a negl_prob calibrated at the start
can become too cautious or too loose. Every `every` steps the controller takes the step's batch,
computes the loss's gradients with every BackLite module dense (the reference) and at the current
negl_prob, measures their fidelity exactly as calibrate() does (back_lite/calibrate.py: cosine
and/or relative L2 of the attention-input and parameter gradients, as a normalized margin:
0 = at the target, 1 = identical to dense) and then
  - margin < 0 (target missed):           negl_prob *= decrease (below min_negl: 0, dense);
  - margin > raise_margin (comfortably in): negl_prob *= increase (from 0: min_negl), up to
                                            max_negl;
  - otherwise:                             unchanged.
Multiplicative steps because the useful range of negl_prob spans decades; the decrease is larger
than the increase so that a miss is corrected faster than slack is taken.

The check uses torch.autograd.grad, so it does not touch the parameters' .grad, and it reseeds the
RNG identically for its two runs (dropout masks match). It costs two forward+backward passes per
check. With per_layer=True every module is nudged by the margin of its own input gradients (and
the parameter gradients), measured with all modules at their current values.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from . import _checks
# (`from . import calibrate` would give the function back_lite.calibrate, not the module)
from .calibrate import KINDS, Target, _Session

DEFAULT_EVERY = 100
DEFAULT_INCREASE = 1.25
DEFAULT_DECREASE = 0.5
# Raise negl_prob only when the measured margin is above this: at least half of the allowed
# error is still unused.
DEFAULT_RAISE_MARGIN = 0.5
DEFAULT_MIN_NEGL = 1e-4
DEFAULT_MAX_NEGL = 0.5


@dataclasses.dataclass
class Check:
    """One fidelity check: the step, the values before and after, the margins and fidelity."""

    step: int
    before: dict
    after: dict
    margins: dict
    fidelity: dict


class FidelityController:
    """Re-checks gradient fidelity every `every` steps on one batch and nudges negl_prob.

    model, loss_fn, modules, parameters: as for back_lite.calibrate (an nn.Module with
    loss_fn(model, batch), or a loss function of a batch with modules=).
    negl_prob: starting value for every module (None: keep the modules' current values).
    """

    def __init__(self, model, target_cosine: Optional[float] = 0.99,
                 target_rel_l2: Optional[float] = None, *, on: Sequence[str] = KINDS,
                 every: int = DEFAULT_EVERY, loss_fn: Optional[Callable] = None, modules=None,
                 parameters=None, negl_prob: Optional[float] = None, per_layer: bool = False,
                 increase: float = DEFAULT_INCREASE, decrease: float = DEFAULT_DECREASE,
                 raise_margin: float = DEFAULT_RAISE_MARGIN, min_negl: float = DEFAULT_MIN_NEGL,
                 max_negl: float = DEFAULT_MAX_NEGL, seed: int = 0):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"BackLite: every must be an int >= 1, got {every!r}")
        if not increase > 1.0:
            raise ValueError(f"BackLite: increase must be > 1, got {increase}")
        if not 0.0 < decrease < 1.0:
            raise ValueError(f"BackLite: decrease must be in (0, 1), got {decrease}")
        if not 0.0 < min_negl <= max_negl < 1.0:
            raise ValueError(f"BackLite: need 0 < min_negl <= max_negl < 1, got min_negl="
                             f"{min_negl}, max_negl={max_negl}")
        self.target = Target(target_cosine, target_rel_l2, on)
        self.model, self.loss_fn = model, loss_fn
        self.modules_arg, self.parameters = modules, parameters
        self.every, self.per_layer = every, per_layer
        self.increase, self.decrease, self.raise_margin = increase, decrease, raise_margin
        self.min_negl, self.max_negl = min_negl, max_negl
        self.seed = seed
        self.steps = 0
        self.history: list[Check] = []
        # the modules, found once (a throw-away session does the finding and the checks)
        self.modules = self._session([None]).modules
        if negl_prob is not None:
            value = _checks.negl_prob(negl_prob)
            for m in self.modules.values():
                m.negl_prob = value

    def _session(self, batches) -> _Session:
        return _Session(self.model, batches, self.loss_fn, self.modules_arg,
                                   self.parameters, self.target, self.seed)

    @property
    def negl_prob(self) -> dict:
        """layer name -> current negl_prob."""
        return {name: m.negl_prob for name, m in self.modules.items()}

    def step(self, batch) -> Optional[Check]:
        """Counts one training step; on every `every`-th, checks `batch` and nudges negl_prob.
        Returns the Check when one ran."""
        self.steps += 1
        if self.steps % self.every != 0:
            return None
        return self.check(batch)

    def check(self, batch) -> Check:
        """One dense and one sparse backward on `batch`, then the nudge."""
        session = self._session([batch])
        before = self.negl_prob
        fidelity = session.measure(0, before)
        names = list(self.modules)
        if self.per_layer:
            margins = {name: session.margin(fidelity, [name]) for name in names}
        else:
            overall = session.margin(fidelity)
            margins = {name: overall for name in names}
        after = {name: self._nudge(before[name], margins[name]) for name in names}
        for name, m in self.modules.items():
            m.negl_prob = after[name]
        record = Check(step=self.steps, before=before, after=after, margins=margins,
                       fidelity=fidelity)
        self.history.append(record)
        return record

    def _nudge(self, value: float, margin: float) -> float:
        if margin < 0.0:
            value *= self.decrease
            return value if value >= self.min_negl else 0.0
        if margin > self.raise_margin:
            value = self.min_negl if value == 0.0 else value * self.increase
            return min(value, self.max_negl)
        return value

    def state_dict(self) -> dict:
        return {"steps": self.steps, "negl_prob": self.negl_prob}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        for name, value in state["negl_prob"].items():
            if name in self.modules:
                self.modules[name].negl_prob = _checks.negl_prob(value)


__all__ = ["FidelityController", "Check"]
