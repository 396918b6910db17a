"""FlashAttention's Python functions (flash_attn 2.x: flash_attn_func and its packed forms)
computed by BackLite: exact forward, block-sparse backward.

    # was: from flash_attn import flash_attn_func
    from back_lite.integrations.flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)                  # negl_prob=0.05
    out = flash_attn_func(q, k, v, causal=True, negl_prob=0.1)   # keyword only

The layout is FlashAttention's, which is BackLite's own: q (B, Sq, Hq, D), k and v (B, Sk, Hk, D)
with Hq % Hk == 0, out (B, Sq, Hq, D); nothing is transposed or copied. `causal` is aligned at the
bottom right in both (query i sees keys j <= i + Sk - Sq, FlashAttention >= 2.1). The packed
forms take qkv (B, S, 3, H, D) and kv (B, Sk, 2, Hk, D) and pass views of them.

Refused with NotImplementedError naming the argument, never ignored: dropout_p > 0, softcap,
alibi_slopes, and a window_size that restricts attention other than as the causal band (sliding
windows). deterministic=True runs the CUDA backward's deterministic form (dq summed by row tiles
in key order: README, Reproducibility; ~1.4-1.7x the default's time), and raises RuntimeError
on a call that has none (millions of keys); the CPU backend is deterministic anyway. With
return_attn_probs=True the result is (out, softmax_lse, None): softmax_lse is BackLite's lse,
(B, Hq, Sq) fp32 without gradient, and no probability matrix is formed (flash_attn's third
result is only meaningful with dropout). Rows with no allowed key (causal with Sq > Sk) give
out = 0 and lse = -inf. The variable-length functions (flash_attn_varlen_*) have no BackLite form.
"""
from __future__ import annotations

import numbers
from typing import Optional

import torch

from .. import _checks, functional
from .sdpa import DEFAULT_NEGL_PROB


def _fail(argument: str, value, why: str) -> None:
    raise NotImplementedError(f"BackLite flash_attn_func: {argument}={value!r} {why}")


def _refuse_unless(condition: bool, argument: str, value, why: str) -> None:
    if not condition:
        _fail(argument, value, why)


def _causal_band(causal: bool, window_size, seqlen_q: int, seqlen_k: int) -> bool:
    """flash_attn's (causal, window_size) as BackLite's causal flag. Query i sees the keys in
    [i + Sk - Sq - left, i + Sk - Sq + right] (a negative bound: unbounded); causal=True sets
    right = 0. A left bound no row reaches (left >= Sk - 1) and a right one none reaches
    (right >= Sq - 1) restrict nothing; right = 0 is the causal band."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(w is None or isinstance(w, numbers.Integral) for w in window_size)):
        raise ValueError(f"BackLite flash_attn_func: window_size must be a pair of ints, got "
                         f"{window_size!r}")
    # (None, None) is how newer FlashAttention-3 builds spell (-1, -1)
    left, right = (-1 if w is None else int(w) for w in window_size)
    if causal:
        right = 0
    if 0 <= left < seqlen_k - 1:
        _fail("window_size", tuple(window_size), f"is a sliding window of {left} keys to the "
              "left, which BackLite does not compute (full and causal attention only)")
    if right == 0:
        return True
    if right < 0 or right >= seqlen_q - 1:
        return False
    _fail("window_size", tuple(window_size), f"limits each query to {right} keys to its right, "
          "which BackLite does not compute (full and causal attention only)")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size=(-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, negl_prob: float = DEFAULT_NEGL_PROB):
    """flash_attn.flash_attn_func computed by BackLite (module doc).

    q: (B, Sq, Hq, D), k and v: (B, Sk, Hk, D) -> out (B, Sq, Hq, D), or (out, softmax_lse,
    None) with return_attn_probs. negl_prob: the share of each 64-row query tile's softmax mass
    whose key tiles the backward may skip (0 = the dense backward)."""
    _refuse_unless(dropout_p == 0.0, "dropout_p", dropout_p,
                   "is not supported (attention dropout must be 0.0)")
    _refuse_unless(alibi_slopes is None, "alibi_slopes", _described(alibi_slopes),
                   "is not supported (ALiBi biases must be None)")
    out, lse = _attention(q, k, v, softmax_scale, causal, window_size, softcap, deterministic,
                         negl_prob)
    return (out, lse, None) if return_attn_probs else out


class _TensorShape:
    """How a refused tensor argument is shown in the message: its shape, not its values."""

    def __init__(self, tensor: torch.Tensor):
        self.shape = tuple(tensor.shape)

    def __repr__(self) -> str:
        return f"<tensor of shape {self.shape}>"


def _described(value):
    return _TensorShape(value) if isinstance(value, torch.Tensor) else value


def _attention(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, negl_prob):
    """What FlashAttention 2 and 3's flash_attn_func have in common, on BackLite: (out, lse)."""
    _refuse_unless(softcap == 0.0, "softcap", softcap,
                   "is not supported (logit soft-capping must be 0.0)")
    _checks.qkv(q, k, v)
    causal = _causal_band(_checks.causal(causal), window_size, q.shape[1], k.shape[1])
    out, lse, _ = functional.attention(q, k, v, negl_prob=negl_prob, scale=softmax_scale,
                                       causal=causal, deterministic=deterministic)
    return out, lse


def _unpack(name: str, packed: torch.Tensor, parts: int, layout: str):
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"BackLite flash_attn: {name} must be a torch.Tensor, got "
                        f"{type(packed).__name__}")
    if packed.dim() != 5 or packed.shape[2] != parts:
        raise ValueError(f"BackLite flash_attn: {name} must be {layout}, got shape "
                         f"{tuple(packed.shape)}")
    return packed.unbind(2)  # views: the head dim stays contiguous, nothing is copied


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0,
                              softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size=(-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[torch.Tensor] = None,
                              deterministic: bool = False, return_attn_probs: bool = False, *,
                              negl_prob: float = DEFAULT_NEGL_PROB):
    """flash_attn.flash_attn_qkvpacked_func: qkv (B, S, 3, H, D) -> out (B, S, H, D)."""
    q, k, v = _unpack("qkv", qkv, 3, "(B, S, 3, H, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, negl_prob=negl_prob)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size=(-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[torch.Tensor] = None,
                             deterministic: bool = False, return_attn_probs: bool = False, *,
                             negl_prob: float = DEFAULT_NEGL_PROB):
    """flash_attn.flash_attn_kvpacked_func: q (B, Sq, Hq, D), kv (B, Sk, 2, Hk, D) ->
    out (B, Sq, Hq, D)."""
    k, v = _unpack("kv", kv, 2, "(B, Sk, 2, Hk, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, negl_prob=negl_prob)


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"]
