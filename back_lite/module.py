"""BackLite: the nn.Module front end."""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks, functional


class BackLite(torch.nn.Module):
    """Attention with an exact forward and a block-sparse backward.

    `BackLite(negl_prob=0.05)(q, k, v)` -- q: (B, Sq, Hq, D), k, v: (B, Sk, Hk, D), last dim
    contiguous, bf16/fp16 (fp32 on CPU). The backward skips, per 64-row query tile, the key tiles
    that together carry < negl_prob of its softmax mass; negl_prob=0 is the dense backward.
    """

    def __init__(self, negl_prob: float = 0.05):
        super().__init__()
        self.negl_prob = _checks.negl_prob(negl_prob)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: Optional[float] = None, causal: bool = False,
                return_softmax_lse: bool = False, tile_stats: Optional[torch.Tensor] = None):
        """Returns out (B, Sq, Hq, D), or (out, lse) with lse (B, Hq, Sq) fp32 when
        return_softmax_lse. tile_stats: an optional (B, Hq, Tm, Tn) fp32 buffer that receives the
        tile mass W of this call."""
        out, lse, _ = functional.attention(q, k, v, negl_prob=self.negl_prob, scale=scale,
                                           causal=causal, tile_stats=tile_stats)
        return (out, lse) if return_softmax_lse else out

    def extra_repr(self) -> str:
        return f"negl_prob={self.negl_prob}"
