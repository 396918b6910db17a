"""How a sequence is split over the ranks of a context-parallel group.

Two layouts, both along the sequence dim (dim 1 of a (B, S, H, D) tensor):

  "contiguous"  rank r holds chunk r of P equal chunks. Natural for non-causal attention and
                for Ulysses (whose all-to-all puts the chunks back in order).
  "zigzag"      the sequence is cut into 2P equal chunks and rank r holds chunks r and 2P-1-r,
                concatenated. Under a causal mask every rank then owns one early and one late
                chunk, so each rank has the same amount of unmasked work at every ring step
                (with "contiguous", rank 0 would idle while rank P-1 does P times its work).

Everything here is plain indexing; no communication.
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"BackLite: layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def default_layout(causal: bool) -> str:
    """zigzag for causal attention (load balance), contiguous otherwise."""
    return "zigzag" if causal else "contiguous"


def chunks_per_rank(layout: str) -> int:
    return 2 if check_layout(layout) == "zigzag" else 1


def chunk_ids(rank: int, world_size: int, layout: str) -> list[int]:
    """Global chunk indices held by `rank`, in local order (chunks have S / (P * chunks_per_rank)
    tokens each)."""
    if check_layout(layout) == "zigzag":
        return [rank, 2 * world_size - 1 - rank]
    return [rank]


def shard(x: torch.Tensor, rank: int, world_size: int, layout: str, dim: int = 1) -> torch.Tensor:
    """The part of the full-sequence tensor `x` that `rank` holds (a new contiguous tensor).
    x: (B, S, H, D) (or any tensor with the sequence in `dim`); S must split into
    world_size * chunks_per_rank equal chunks."""
    parts = world_size * chunks_per_rank(layout)
    if x.shape[dim] % parts != 0:
        raise ValueError(f"BackLite: sequence length {x.shape[dim]} (dim {dim}) does not split "
                         f"into {parts} equal chunks for layout {layout!r} on {world_size} ranks")
    chunks = x.chunk(parts, dim=dim)
    return torch.cat([chunks[c] for c in chunk_ids(rank, world_size, layout)],
                     dim=dim).contiguous()


def unshard(shards: list[torch.Tensor], layout: str, dim: int = 1) -> torch.Tensor:
    """Inverse of `shard`: the per-rank shards (index = rank) -> the full-sequence tensor."""
    world_size = len(shards)
    per_rank = chunks_per_rank(layout)
    ordered: list = [None] * (world_size * per_rank)
    for rank, part in enumerate(shards):
        for piece, chunk in zip(part.chunk(per_rank, dim=dim),
                                chunk_ids(rank, world_size, layout)):
            ordered[chunk] = piece
    return torch.cat(ordered, dim=dim)


def positions(seqlen: int, rank: int, world_size: int, layout: str) -> torch.Tensor:
    """Global token positions (int64, local order) of the seqlen-token sequence held by `rank`."""
    return shard(torch.arange(seqlen)[None], rank, world_size, layout, dim=1)[0]
