"""A drop-in for torch.nn.functional.scaled_dot_product_attention that runs BackLite.

    from back_lite.integrations.sdpa import scaled_dot_product_attention
    out = scaled_dot_product_attention(q, k, v, is_causal=True, negl_prob=0.05)

    # or route every F.scaled_dot_product_attention call of existing code through BackLite:
    from back_lite.integrations.sdpa import sdpa_through_back_lite
    with sdpa_through_back_lite(negl_prob=0.05):
        loss = model(x).loss
        loss.backward()          # the backward may run outside the block: the graph keeps BackLite

The calling convention is PyTorch's: q (B, Hq, Sq, D), k and v (B, Hk, Sk, D), out (B, Hq, Sq, D).
BackLite works in the (B, S, H, D) layout; the inputs are passed as transposed views, so nothing
is copied when the head dim is contiguous (the usual case: q/k/v made by `.view(B, S, H, D)
.transpose(1, 2)` are (B, S, H, D) tensors underneath), and the output is returned as a
(B, Hq, Sq, D) view of BackLite's (B, Sq, Hq, D) result, which the usual `out.transpose(1, 2)
.reshape(B, S, H * D)` that follows then reads without a copy.

Not supported (a clear error, or with the patch helper a fall-back to PyTorch, see below):
attn_mask, dropout_p > 0, inputs that are not 4-D, a value head dim different from the query's,
and causal attention with more queries than keys. PyTorch's is_causal is aligned at the top
left (query i sees keys j <= i) while BackLite's is aligned at the bottom right; when Sq < Sk
the top-left form is computed exactly by giving BackLite only the first Sq keys (the others get
no attention and a zero gradient, as in PyTorch).
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Optional

import torch

from .. import _checks, functional

# The default share of softmax mass the backward may skip (DESIGN: a typical starting point).
DEFAULT_NEGL_PROB = 0.05


class UnsupportedSDPACall(NotImplementedError):
    """The call uses a feature of scaled_dot_product_attention that BackLite does not have."""


def _unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal,
                        enable_gqa) -> Optional[str]:
    """None if BackLite can compute this call exactly as PyTorch would, else why not."""
    if attn_mask is not None:
        return ("attn_mask is not supported (BackLite computes full or causal attention; "
                f"got a mask of shape {tuple(attn_mask.shape)})")
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p} is not supported (attention dropout must be 0.0)"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() != 4:
            return f"{name} must be 4-D (B, H, S, D), got shape {tuple(t.shape)}"
    if value.shape[-1] != query.shape[-1]:
        return (f"value has head dim {value.shape[-1]} but query has {query.shape[-1]} "
                "(a different value head dim is not supported)")
    head_dim = int(query.shape[-1])
    backend_says = functional.unsupported_reason(query.device, query.dtype, head_dim)
    if backend_says is not None:
        hint = " (use autocast, or cast q, k, v)" if query.dtype == torch.float32 else ""
        return f"query has dtype {query.dtype}, head dim {head_dim} on {query.device}: " \
               f"{backend_says}{hint}"
    heads_q, heads_k = query.shape[1], key.shape[1]
    if heads_q != heads_k and not enable_gqa:
        return (f"query has {heads_q} heads and key {heads_k}: pass enable_gqa=True for "
                "grouped-query attention (as torch's scaled_dot_product_attention requires)")
    if is_causal and query.shape[2] > key.shape[2]:
        return (f"is_causal with more queries ({query.shape[2]}) than keys ({key.shape[2]}) "
                "is not supported (PyTorch aligns the causal mask at the top left)")
    return None


def _bshd(t: torch.Tensor) -> torch.Tensor:
    # (B, H, S, D) -> a (B, S, H, D) view; copied only if the head dim is not contiguous
    t = t.transpose(1, 2)
    return t if t.stride(-1) == 1 else t.contiguous()


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False,
                                 negl_prob: float = DEFAULT_NEGL_PROB) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention computed by BackLite.

    query: (B, Hq, Sq, D), key: (B, Hk, Sk, D), value: (B, Hk, Sk, D) -> (B, Hq, Sq, D).
    negl_prob: share of each 64-row query tile's softmax mass whose key tiles the backward may
    skip (0 = dense backward). The forward is exact. Raises UnsupportedSDPACall (a
    NotImplementedError) for attn_mask, dropout_p > 0 and the other cases in the module doc."""
    reason = _unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if reason is not None:
        raise UnsupportedSDPACall("BackLite scaled_dot_product_attention: " + reason)
    negl_prob = _checks.negl_prob(negl_prob)
    if is_causal and query.shape[2] < key.shape[2]:
        # top-left causal: no query sees a key at position >= Sq
        key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
    out, _, _ = functional.attention(_bshd(query), _bshd(key), _bshd(value),
                                     negl_prob=negl_prob, scale=scale, causal=bool(is_causal))
    return out.transpose(1, 2)  # (B, Sq, Hq, D) -> (B, Hq, Sq, D) view


# ---------------------------------------------------------------------------- patching

_TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention
_state = threading.local()
_patch_lock = threading.Lock()
_patch_depth = 0


def _has_backend(device: torch.device) -> bool:
    try:
        return functional.backend_available(device)
    except ValueError:  # a device type BackLite has no backend for at all (mps, xpu, ...)
        return False


def unusable_backend_reason(device: torch.device) -> Optional[str]:
    """None if BackLite has a usable backend for `device` on this machine, else that it has not."""
    if _has_backend(device):
        return None
    return f"BackLite has no usable backend for tensors on {device}"


def backend_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> Optional[str]:
    """None if BackLite computes q / k / v of this dtype and head dim on `device` here, else why
    not: a kind the device's backend lacks, or no usable backend."""
    reason = functional.unsupported_reason(device, dtype, head_dim)
    return reason if reason is not None else unusable_backend_reason(device)


class _Router:
    """The function installed as torch.nn.functional.scaled_dot_product_attention while patched:
    calls BackLite with the innermost active settings of this thread, else PyTorch."""

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None, enable_gqa=False, **kwargs):
        settings = getattr(_state, "stack", None)
        if not settings or kwargs:
            return _TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                               is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kwargs)
        negl_prob, fallback, counts = settings[-1]
        reason = _unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal,
                                     enable_gqa)
        if reason is None:
            reason = unusable_backend_reason(query.device)
        if reason is None:
            counts["back_lite"] += 1
            return scaled_dot_product_attention(query, key, value, is_causal=is_causal,
                                                scale=scale, enable_gqa=enable_gqa,
                                                negl_prob=negl_prob)
        report_fallback("sdpa_through_back_lite", reason, fallback, stacklevel=2)
        counts["torch"] += 1
        return _TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                           is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


_ROUTER = _Router()
_FALLBACKS = ("warn", "silent", "error")


def check_fallback(fallback: str) -> str:
    if fallback not in _FALLBACKS:
        raise ValueError(f"BackLite: fallback must be one of {_FALLBACKS}, got {fallback!r}")
    return fallback


def report_fallback(where: str, reason: str, fallback: str, stacklevel: int = 2) -> None:
    """What a call BackLite cannot compute does before PyTorch computes it: raise
    UnsupportedSDPACall ("error"), warn ("warn") or nothing ("silent"). stacklevel: as
    warnings.warn's, counted from the function that calls this one."""
    if fallback == "error":
        raise UnsupportedSDPACall(f"BackLite ({where}): {reason}")
    if fallback == "warn":
        warnings.warn(f"BackLite ({where}): {reason}; this call runs PyTorch's "
                      "scaled_dot_product_attention instead", stacklevel=stacklevel + 1)


@contextlib.contextmanager
def sdpa_through_back_lite(negl_prob: float = DEFAULT_NEGL_PROB, fallback: str = "warn"):
    """Within the block, torch.nn.functional.scaled_dot_product_attention runs BackLite.

    Code that calls `F.scaled_dot_product_attention` / `torch.nn.functional.
    scaled_dot_product_attention` at call time is routed (transformers' "sdpa" attention,
    diffusers' processors, most model code); a reference taken before the block (`from
    torch.nn.functional import scaled_dot_product_attention` at import) is not, and neither is
    torch.compile'd code compiled outside the block.

    fallback: what a call BackLite cannot compute does (attn_mask, dropout > 0, a dtype or head dim
    the device's backend lacks -- on CUDA head dims other than 64 and 128 --, no backend for the
    device): "warn" (PyTorch computes it, with a warning), "silent" (PyTorch, no warning) or
    "error" (raise UnsupportedSDPACall). Yields a dict counting the calls that went to
    "back_lite" and to "torch". Blocks nest (the innermost settings apply) and are per thread.
    """
    global _patch_depth
    negl_prob = _checks.negl_prob(negl_prob)
    check_fallback(fallback)
    counts = {"back_lite": 0, "torch": 0}
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    with _patch_lock:
        if _patch_depth == 0:
            torch.nn.functional.scaled_dot_product_attention = _ROUTER
        _patch_depth += 1
    stack.append((negl_prob, fallback, counts))
    try:
        yield counts
    finally:
        stack.pop()
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                torch.nn.functional.scaled_dot_product_attention = _TORCH_SDPA


def is_patched() -> bool:
    """True while some thread is inside sdpa_through_back_lite."""
    return torch.nn.functional.scaled_dot_product_attention is _ROUTER
