"""Test inputs: plain random ones, and ones whose attention is genuinely local (so the sparse
backward has tiles to skip). Never zeros: zero inputs make every tile equally heavy."""
from __future__ import annotations

import math

import torch


def random_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim, dtype, device="cpu",
               seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_k, head_dim, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def local_qkv(batch, seqlen, heads_q, heads_k, head_dim, dtype, device="cpu", width=24.0,
              sharpness=6.0, seed=0):
    """q and k from positional features, so that q_i . k_j falls off with |i - j| on a scale of
    `width` tokens; a little noise keeps every row distinct. v is random."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(seqlen, dtype=torch.float64)
    half = head_dim // 2
    freqs = torch.linspace(0.0, math.pi / width, half, dtype=torch.float64)
    angle = pos[:, None] * freqs[None, :]
    feat = torch.cat([angle.cos(), angle.sin()], dim=-1)  # (S, 2*half)
    if feat.shape[1] < head_dim:
        feat = torch.cat([feat, torch.zeros(seqlen, head_dim - feat.shape[1], dtype=feat.dtype)],
                         dim=-1)
    # score = scale * q.k with scale 1/sqrt(D): amplitude a gives peak a^2 * half / sqrt(D)
    amp = math.sqrt(sharpness * math.sqrt(head_dim) / half)
    q = amp * feat[None, :, None, :] + 0.05 * torch.randn(batch, seqlen, heads_q, head_dim,
                                                          generator=gen, dtype=torch.float64)
    k = amp * feat[None, :, None, :] + 0.05 * torch.randn(batch, seqlen, heads_k, head_dim,
                                                          generator=gen, dtype=torch.float64)
    v = torch.randn(batch, seqlen, heads_k, head_dim, generator=gen, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype).contiguous() for t in (q, k, v))
