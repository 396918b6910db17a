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
    if not enabled() or torch.compiler.is_compiling():
        return
    _ensure_handler()
    from . import functional  # late: functional imports this module

    backend = q.device.type
    parts = [f"attention q={tuple(q.shape)} k={tuple(k.shape)} {q.dtype} backend={backend} "
             f"causal={causal} negl_prob={negl_prob}"]
    if tile_mass.numel() > 0 and negl_prob > 0.0:
        with torch.no_grad():
            mask = functional.select(tile_mass, negl_prob)
            sparsity = functional.backward_sparsity(mask, q.shape[1], k.shape[1], causal)
            total = tile_mass.double().sum()
            dropped = tile_mass.double().masked_fill(mask, 0.0).sum()
            dropped_share = float(dropped / total) if float(total) > 0 else 0.0
        parts.append(f"mask density={float(mask.float().mean()):.4f} "
                     f"backward sparsity={sparsity:.4f} dropped mass={dropped_share:.3e}")
    else:
        parts.append("dense backward")
    logger.info(" ".join(parts))
