"""Drop-in use of BackLite from the frameworks people already train with.

  back_lite.integrations.sdpa          scaled_dot_product_attention with PyTorch's (B, H, S, D)
                                       convention, and sdpa_through_back_lite() that routes
                                       torch.nn.functional.scaled_dot_product_attention through it
  back_lite.integrations.flash_attn    flash_attn_func (and its qkv / kv packed forms) with
                                       flash_attn 2.x's signature: BackLite's own layout
  back_lite.integrations.flash_attn3   flash_attn_func with FlashAttention-3's signature
  back_lite.integrations.transformers  register() adds "back_lite" to Hugging Face transformers'
                                       AttentionInterface (attn_implementation="back_lite")
  back_lite.integrations.diffusers     BackLiteAttnProcessor for diffusers' set_attn_processor

The transformers and diffusers modules import their framework when they are imported, not here,
so `import back_lite.integrations` needs neither.
"""
from . import flash_attn, flash_attn3, sdpa
from .flash_attn import flash_attn_func
from .sdpa import scaled_dot_product_attention, sdpa_through_back_lite

__all__ = ["flash_attn", "flash_attn3", "flash_attn_func", "sdpa", "scaled_dot_product_attention",
           "sdpa_through_back_lite"]
