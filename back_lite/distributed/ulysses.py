"""Ulysses-style sequence parallelism: all-to-all over heads.

Every rank holds a contiguous sequence shard of all heads, (B, S/P, H, D). One all-to-all turns
that into the whole sequence of H/P heads, (B, S, H/P, D): rank r gets heads
[r*H/P, (r+1)*H/P). Attention then runs unsharded on those heads (so BackLite's statistics and
tile selection are exactly those of a single-device run), and the inverse all-to-all brings the
output back to sequence shards. Both directions are differentiable: the gradient of one is the
other applied to the gradient.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _checks, functional


def _group_size(group) -> int:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("BackLite: Ulysses attention needs an initialized torch.distributed "
                           "process group (torch.distributed.init_process_group)")
    return dist.get_world_size(group)


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """x: (P, ...) contiguous; block j goes to rank j, block j of the result came from rank j."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    # x: (B, S/P, H, D) -> (B, S, H/P, D)
    world = _group_size(group)
    batch, seqlen, heads, dim = x.shape
    if heads % world != 0:
        raise ValueError(f"BackLite: Ulysses splits heads over {world} ranks, but the tensor has "
                         f"{heads} heads (shape {tuple(x.shape)})")
    # (B, s, P, H/P, D) -> (P, B, s, H/P, D): block j holds head group j of the local tokens
    blocks = x.reshape(batch, seqlen, world, heads // world, dim).permute(2, 0, 1, 3, 4)
    got = _all_to_all(blocks.contiguous(), group)  # block j: rank j's tokens, my head group
    return got.permute(1, 0, 2, 3, 4).reshape(batch, world * seqlen, heads // world, dim)


def _heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    # x: (B, S, H/P, D) -> (B, S/P, H, D)
    world = _group_size(group)
    batch, seqlen, heads, dim = x.shape
    if seqlen % world != 0:
        raise ValueError(f"BackLite: Ulysses splits the sequence over {world} ranks, but the "
                         f"tensor has {seqlen} tokens (shape {tuple(x.shape)})")
    # (B, P, s, H/P, D) -> (P, B, s, H/P, D): block j holds rank j's tokens of my head group
    blocks = x.reshape(batch, world, seqlen // world, heads, dim).permute(1, 0, 2, 3, 4)
    got = _all_to_all(blocks.contiguous(), group)  # block j: head group j of my tokens
    return got.permute(1, 2, 0, 3, 4).reshape(batch, seqlen // world, world * heads, dim)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad.contiguous(), ctx.group), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad.contiguous(), ctx.group), None


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, S/P, H, D) sequence shard of all heads -> (B, S, H/P, D) whole sequence of this
    rank's head group. Differentiable."""
    return _SeqToHeads.apply(x, group)


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, S, H/P, D) whole sequence of this rank's head group -> (B, S/P, H, D) sequence shard
    of all heads. Differentiable; the inverse of seq_to_heads."""
    return _HeadsToSeq.apply(x, group)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                      negl_prob: float = 0.0, scale: Optional[float] = None,
                      causal: bool = False, return_lse: bool = False):
    """Differentiable head-parallel attention on contiguous sequence shards.

    q: (B, S/P, Hq, D), k, v: (B, S/P, Hk, D) with Hq and Hk divisible by P (GQA groups stay on
    one rank). Returns out (B, S/P, Hq, D), or (out, lse) where lse is (B, Hq/P, S) fp32 for this
    rank's head group over the whole sequence. The attention itself is back_lite's, with the
    same negl_prob semantics as a single-device run.
    """
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    heads_q, heads_k = q.shape[2], k.shape[2]
    world = _group_size(group)
    if heads_q % world != 0 or heads_k % world != 0:
        raise ValueError(f"BackLite: Ulysses needs Hq and Hk divisible by the group size "
                         f"{world}, got Hq={heads_q}, Hk={heads_k}")
    q_h, k_h, v_h = (seq_to_heads(t, group) for t in (q, k, v))
    out_h, lse_h, _ = functional.attention(q_h, k_h, v_h, negl_prob=negl_prob, scale=scale,
                                           causal=causal)
    out = heads_to_seq(out_h, group)
    return (out, lse_h) if return_lse else out
