"""FlashAttention-3's flash_attn_func (the `flash_attn_interface` module of its Hopper build)
computed by BackLite: exact forward, block-sparse backward.

    # was: from flash_attn_interface import flash_attn_func
    from back_lite.integrations.flash_attn3 import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)                  # negl_prob=0.05
    out, lse = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, negl_prob=0.1)

The layout and the causal alignment are FlashAttention's and BackLite's alike (q (B, Sq, Hq, D),
k and v (B, Sk, Hk, D), bottom right): back_lite.integrations.flash_attn says what is computed and
what is refused; FlashAttention-3's own arguments add to that: qv, the fp8 descales and
attention_chunk are refused unless left at their defaults, and num_splits, pack_gqa and sm_margin
(how FlashAttention-3 schedules its kernels) are accepted and have no effect. With
return_attn_probs=True the result is (out, softmax_lse), as FlashAttention-3 returns it. The
varlen and KV-cache functions have no BackLite form.
"""
from __future__ import annotations

from typing import Optional

import torch

from .flash_attn import _attention, _described, _refuse_unless
from .sdpa import DEFAULT_NEGL_PROB


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    qv: Optional[torch.Tensor] = None, q_descale: Optional[torch.Tensor] = None,
                    k_descale: Optional[torch.Tensor] = None,
                    v_descale: Optional[torch.Tensor] = None, window_size=(-1, -1),
                    attention_chunk: int = 0, softcap: float = 0.0, num_splits: int = 1,
                    pack_gqa: Optional[bool] = None, deterministic: bool = False,
                    sm_margin: int = 0, return_attn_probs: bool = False, *,
                    negl_prob: float = DEFAULT_NEGL_PROB):
    """flash_attn_interface.flash_attn_func computed by BackLite (module doc).

    q: (B, Sq, Hq, D), k and v: (B, Sk, Hk, D) -> out (B, Sq, Hq, D), or (out, softmax_lse
    (B, Hq, Sq) fp32) with return_attn_probs. negl_prob: the share of each 64-row query tile's
    softmax mass whose key tiles the backward may skip (0 = the dense backward)."""
    del num_splits, pack_gqa, sm_margin  # FlashAttention-3's scheduling: nothing to compute
    _refuse_unless(qv is None, "qv", _described(qv), "is not supported (must be None)")
    for name, descale in (("q_descale", q_descale), ("k_descale", k_descale),
                          ("v_descale", v_descale)):
        _refuse_unless(descale is None, name, _described(descale),
                       "is not supported (BackLite takes bf16 / fp16 / fp32 inputs, no fp8)")
    _refuse_unless(attention_chunk == 0, "attention_chunk", attention_chunk,
                   "is not supported (chunked attention must be 0)")
    out, lse = _attention(q, k, v, softmax_scale, causal, window_size, softcap, deterministic,
                         negl_prob)
    return (out, lse) if return_attn_probs else out


__all__ = ["flash_attn_func"]
