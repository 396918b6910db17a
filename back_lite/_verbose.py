"""BACK_LITE_VERBOSE=1: one log line per attention call through `logging` (logger "back_lite").

Kept small on purpose: back_lite/functional.py calls `after_attention` from one place; richer
diagnostics are meant to grow in back_lite/diagnostics.py. Nothing is logged while torch.compile
traces (the summary needs concrete values) and nothing is computed when the variable is unset.
"""
from __future__ import annotations

import logging
import os

import torch

ENV_VAR = "BACK_LITE_VERBOSE"
logger = logging.getLogger("back_lite")


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "") not in ("", "0")


def _ensure_handler() -> None:
    # Users who set only the environment variable still see the line; a logging setup of their
    # own (handlers on "back_lite" or the root logger) takes precedence.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def after_attention(q: torch.Tensor, k: torch.Tensor, causal: bool, negl_prob: float,
                    tile_mass: torch.Tensor) -> None:
    """q: (B, Sq, Hq, D), k: (B, Sk, Hk, D), tile_mass: (B, Hq, Tm, Tn) or (B, Hq, 0, 0)."""
    if torch.compiler.is_compiling() or not enabled():
        return
    _ensure_handler()
    # The figures, the record of the last call and the rate limit (BACK_LITE_VERBOSE_EVERY) live
    # in back_lite/diagnostics.py; imported late because it imports functional, which imports this.
    from . import diagnostics
    diagnostics.after_attention(q, k, causal, negl_prob, tile_mass)
