"""BackLite as an attention implementation of Hugging Face transformers.

    import back_lite.integrations.transformers as bl_hf
    bl_hf.register(negl_prob=0.05)                      # adds "back_lite" to AttentionInterface
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="back_lite")
    # or, on a model already built: model.set_attn_implementation("back_lite")

Models whose attention goes through transformers' AttentionInterface (Llama, Mistral, Qwen2/3,
Gemma, ... : those with `_supports_attention_backend = True`) then run their attention through
BackLite: exact forward, block-sparse backward.

What the attention function receives and does: query (B, Hq, Sq, D), key and value (B, Hk, Sk, D)
(after RoPE and the KV cache), passed to BackLite as (B, S, H, D) views without copies; GQA runs
natively (no repeat_kv). The result is (B, Sq, Hq, D), transformers' convention for attention
implementations. Causal attention is BackLite's bottom-right aligned form, which is what a decoder
with a KV cache needs (query i of the new chunk sees the cached keys and the new keys up to its
own position).

Masks: "back_lite" is also registered in AttentionMaskInterface with transformers' sdpa mask
builder, which returns no mask at all when the attention is plainly causal (or full) and no token
is padded. A real mask (padding in a batch, sliding windows, packed sequences with a mask) reaches
this function as a tensor, and it raises NotImplementedError saying so rather than ignoring it:
BackLite computes full and causal attention only. Train on unpadded or packed-without-mask
batches, or register(fallback="warn") (or "silent") to have such calls computed by transformers'
SDPA attention instead. Dropout on the attention probabilities (set attention_dropout to 0, the
default of most configs) and a dtype or head dim the device's backend lacks (on CUDA, head dims
other than 64 and 128) are treated the same way.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import _checks, functional
from .sdpa import DEFAULT_NEGL_PROB, backend_reason, check_fallback, report_fallback

try:
    import transformers  # noqa: F401 (the check that it is installed)
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("back_lite.integrations.transformers needs Hugging Face transformers "
                      "(>= 4.54, with AttentionInterface): pip install transformers") from exc

NAME = "back_lite"


def _fall_back_reason(query, key, attention_mask, dropout, kwargs) -> Optional[str]:
    """Why this call is one for PyTorch's SDPA (transformers' "sdpa" function computes it
    exactly), or None if BackLite computes it."""
    if attention_mask is not None:
        return (f"got an attention_mask of shape {tuple(attention_mask.shape)} (padding, a "
                "sliding window or another custom mask); BackLite computes full or causal "
                "attention only. Use batches without padding, another attn_implementation, or "
                "register(fallback='warn')")
    if dropout != 0.0:
        return (f"attention dropout {dropout} is not supported; set the config's "
                "attention_dropout to 0.0")
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[2] > window:
        return (f"sliding_window={window} with {key.shape[2]} keys is not supported (BackLite "
                "computes full or causal attention)")
    return backend_reason(query.device, query.dtype, int(query.shape[-1]))


def back_lite_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                dropout: float = 0.0, scaling: Optional[float] = None,
                                is_causal: Optional[bool] = None,
                                negl_prob: Optional[float] = None, **kwargs):
    """An AttentionInterface function: query (B, Hq, Sq, D), key/value (B, Hk, Sk, D) ->
    (attn_output (B, Sq, Hq, D), None).

    negl_prob: if None, the module's `back_lite_negl_prob` attribute if it has one (set per
    layer), else the value given to register(). The causal flag is `is_causal` when transformers
    passes it, else the module's own `is_causal` (True for decoders). A call BackLite cannot
    compute (a mask, dropout, a sliding window that binds, a dtype or head dim the device's
    backend lacks) raises, or with register(fallback="warn" / "silent") runs transformers' SDPA
    attention; soft-capping, attention sinks and returned weights always raise (SDPA has none of
    them either)."""
    for unsupported in ("softcap", "s_aux", "sinks"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(
                f"BackLite attention ({type(module).__name__}): {unsupported}="
                f"{kwargs[unsupported]!r} is not supported")
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("BackLite attention does not return attention weights "
                                  "(output_attentions=True); use attn_implementation='eager'")
    reason = _fall_back_reason(query, key, attention_mask, dropout, kwargs)
    if reason is not None:
        report_fallback(f"attention of {type(module).__name__}", reason, _registered_fallback)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if negl_prob is None:
        negl_prob = getattr(module, "back_lite_negl_prob", _registered_negl_prob)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # BackLite's causal form is bottom-right aligned; a single query token (decoding) sees every
    # cached key either way.
    out, _, _ = functional.attention(query.transpose(1, 2), key.transpose(1, 2),
                                     value.transpose(1, 2), negl_prob=negl_prob, scale=scaling,
                                     causal=bool(causal))
    return out, None


_registered_negl_prob = DEFAULT_NEGL_PROB
_registered_fallback = "error"


def register(negl_prob: float = DEFAULT_NEGL_PROB, name: str = NAME,
             fallback: str = "error") -> str:
    """Registers BackLite under `name` in transformers' AttentionInterface (the attention) and
    AttentionMaskInterface (the sdpa mask builder, so that plain causal attention gets no mask).
    negl_prob becomes the default of every layer (a module's `back_lite_negl_prob` attribute
    overrides it). fallback: what a call BackLite cannot compute does -- "error" (raise
    NotImplementedError), "warn" or "silent" (transformers' SDPA attention computes it, with or
    without a warning); see back_lite_attention_forward. Returns the name to pass as
    attn_implementation."""
    global _registered_negl_prob, _registered_fallback
    negl_prob, fallback = _checks.negl_prob(negl_prob), check_fallback(fallback)  # both, first
    _registered_negl_prob, _registered_fallback = negl_prob, fallback
    AttentionInterface.register(name, back_lite_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def set_negl_prob(model: torch.nn.Module, negl_prob: float) -> int:
    """Sets `back_lite_negl_prob` on every attention module of `model` that has a `layer_idx`
    (how transformers marks them); returns how many were set."""
    negl_prob = _checks.negl_prob(negl_prob)
    count = 0
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "is_causal"):
            module.back_lite_negl_prob = negl_prob
            count += 1
    return count


__all__ = ["NAME", "register", "back_lite_attention_forward", "set_negl_prob"]
