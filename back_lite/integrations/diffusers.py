"""BackLite as an attention processor for diffusers.

    from back_lite.integrations.diffusers import BackLiteAttnProcessor, use_back_lite
    unet.set_attn_processor(BackLiteAttnProcessor(negl_prob=0.05))   # UNet, DiT, PixArt, ...
    use_back_lite(transformer, negl_prob=0.05)                         # any diffusers model

Two processors:
  BackLiteAttnProcessor     for diffusers' classic `Attention` module (UNet2DConditionModel,
                            Transformer2DModel, DiTTransformer2DModel, PixArt, Latte, ...): the
                            computation of AttnProcessor2_0, with the attention itself done by
                            BackLite in its native (B, S, H, D) layout -- the projections are
                            viewed as (B, S, H, D) directly, no transposes, no copies.
  BackLiteSDPAProcessor     wraps any other processor (the model-specific ones of Wan,
                            CogVideoX, HunyuanVideo, Flux, ...) and runs it with
                            torch.nn.functional.scaled_dot_product_attention routed through
                            BackLite (back_lite.integrations.sdpa.sdpa_through_back_lite), which
                            is what diffusers' default "native" attention backend calls.
use_back_lite(model) puts the first on the modules that use the default processor and the second
on all others.

Calls BackLite cannot compute -- an attention mask, attention dropout, a dtype or head dim the
device's backend lacks (on CUDA, head dims other than 64 and 128: the 40 / 80 / 160 of Stable
Diffusion 1.x's UNet), a device without a usable backend (a GPU that is not an H100 / H200) --
run PyTorch's attention instead, or raise, as `fallback` says: "error" (raise
NotImplementedError; BackLiteAttnProcessor's default), "warn" (PyTorch computes the call, with a
warning; use_back_lite's and BackLiteSDPAProcessor's default) or "silent". Diffusion
transformers rarely mask their self-attention; text-conditioning cross-attention with a padding
mask is the usual exception.
"""
from __future__ import annotations

import inspect

import torch

from .. import _checks, functional
from .sdpa import (DEFAULT_NEGL_PROB, backend_reason, check_fallback, report_fallback,
                   sdpa_through_back_lite)

try:
    import diffusers  # noqa: F401 (the check that it is installed)
    from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("back_lite.integrations.diffusers needs diffusers: "
                      "pip install diffusers") from exc


class BackLiteAttnProcessor:
    """Attention processor for `diffusers.models.attention_processor.Attention` (self- and
    cross-attention) that computes the attention with BackLite: exact forward, block-sparse
    backward skipping key tiles with < negl_prob of each query tile's softmax mass.

    Uses attn.scale (AttnProcessor2_0 uses the default 1/sqrt(head_dim), which equals attn.scale
    unless the module was built with scale_qk=False).

    fallback: what a call BackLite cannot compute does (module doc): "error", "warn" or
    "silent". A masked call then runs AttnProcessor2_0 whole; a call whose q / k / v the backend
    cannot take runs PyTorch's scaled_dot_product_attention on them, with attn.scale."""

    fallback = "error"  # (also what a processor pickled before it had the attribute gets)

    def __init__(self, negl_prob: float = DEFAULT_NEGL_PROB, fallback: str = "error"):
        self.negl_prob = _checks.negl_prob(negl_prob)
        self.fallback = check_fallback(fallback)

    def __call__(self, attn: Attention, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None,
                 *args, **kwargs) -> torch.Tensor:
        if attention_mask is not None:
            report_fallback("BackLiteAttnProcessor",
                            f"got an attention_mask of shape {tuple(attention_mask.shape)}; "
                            "BackLite computes unmasked attention only", self.fallback)
            return AttnProcessor2_0()(attn, hidden_states, encoder_hidden_states, attention_mask,
                                      temb, *args, **kwargs)
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            # (B, C, H, W) feature map -> (B, H*W, C) tokens
            batch, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channels, height * width).transpose(1, 2)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        batch = hidden_states.shape[0]

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)

        head_dim = key.shape[-1] // attn.heads
        # (B, S, heads * head_dim) -> (B, S, heads, head_dim): BackLite's layout, a free view
        query = query.view(batch, -1, attn.heads, head_dim)
        key = key.view(batch, -1, attn.heads, head_dim)
        value = value.view(batch, -1, attn.heads, head_dim)
        if attn.norm_q is not None:  # per-head norms act on the head dim: layout-independent
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        reason = backend_reason(query.device, query.dtype, head_dim)
        if reason is None:
            out, _, _ = functional.attention(query, key, value, negl_prob=self.negl_prob,
                                             scale=attn.scale)
        else:
            report_fallback("BackLiteAttnProcessor", f"q / k / v of dtype {query.dtype} and head "
                            f"dim {head_dim} on {query.device}: {reason}", self.fallback)
            # (B, S, H, D) views -> PyTorch's (B, H, S, D) and back
            out = torch.nn.functional.scaled_dot_product_attention(
                query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                scale=attn.scale).transpose(1, 2)
        hidden_states = out.reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)  # linear projection
        hidden_states = attn.to_out[1](hidden_states)  # dropout
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channels, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


class BackLiteSDPAProcessor:
    """Wraps any diffusers attention processor so that the
    torch.nn.functional.scaled_dot_product_attention calls it makes (directly, or through
    diffusers' "native" attention backend) run BackLite. fallback: "warn", "silent" or "error"
    for calls BackLite cannot compute (module doc), see sdpa_through_back_lite."""

    def __init__(self, inner, negl_prob: float = DEFAULT_NEGL_PROB, fallback: str = "warn"):
        if isinstance(inner, BackLiteSDPAProcessor):
            inner = inner.inner
        self.inner = inner
        self.negl_prob = _checks.negl_prob(negl_prob)
        self.fallback = check_fallback(fallback)
        # diffusers' Attention.forward drops the keyword arguments that the processor's
        # __call__ does not name; an instance attribute with the inner signature makes
        # inspect.signature(processor.__call__) report the inner processor's parameters.
        call = self._run
        call_with_signature = lambda *args, **kwargs: call(*args, **kwargs)  # noqa: E731
        call_with_signature.__signature__ = inspect.signature(inner.__call__)
        self.__dict__["__call__"] = call_with_signature

    def __reduce__(self):
        # copy.deepcopy / pickle rebuild the wrapper around a copy of the inner processor (the
        # per-instance __call__ above must not be copied: it is bound to this instance)
        return (BackLiteSDPAProcessor, (self.inner, self.negl_prob, self.fallback))

    def _run(self, *args, **kwargs):
        with sdpa_through_back_lite(self.negl_prob, self.fallback):
            return self.inner(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._run(*args, **kwargs)

    def __getattr__(self, name):
        # attributes diffusers reads from processors (_attention_backend, _parallel_config, ...)
        # are the inner processor's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in ("inner", "negl_prob", "fallback"):
            object.__setattr__(self, name, value)
        else:  # e.g. set_attention_backend writes processor._attention_backend
            setattr(self.inner, name, value)


_DEFAULT_PROCESSORS = (AttnProcessor, AttnProcessor2_0)


def use_back_lite(model: torch.nn.Module, negl_prob: float = DEFAULT_NEGL_PROB,
                  fallback: str = "warn") -> dict:
    """Makes every attention module of a diffusers model run BackLite: BackLiteAttnProcessor
    where the module is a classic `Attention` with the default processor, BackLiteSDPAProcessor
    around the processor everywhere else; `fallback` (module doc) goes to both. Returns
    {"attn_processor": n, "sdpa_wrapped": m}."""
    negl_prob = _checks.negl_prob(negl_prob)
    check_fallback(fallback)
    counts = {"attn_processor": 0, "sdpa_wrapped": 0}
    for module in model.modules():
        if not (hasattr(module, "set_processor") and hasattr(module, "processor")):
            continue
        processor = module.processor
        if isinstance(module, Attention) and isinstance(
                processor, _DEFAULT_PROCESSORS + (BackLiteAttnProcessor,)):
            module.set_processor(BackLiteAttnProcessor(negl_prob, fallback))
            counts["attn_processor"] += 1
        else:
            module.set_processor(BackLiteSDPAProcessor(processor, negl_prob, fallback))
            counts["sdpa_wrapped"] += 1
    return counts


__all__ = ["BackLiteAttnProcessor", "BackLiteSDPAProcessor", "use_back_lite"]
