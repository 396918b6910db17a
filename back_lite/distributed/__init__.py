"""Context parallelism for BackLite on torch.distributed (gloo on CPU, NCCL on GPU).

    from back_lite.distributed import ring_attention, shard
    q_local = shard(q, rank, world_size, "zigzag")          # same for k, v
    out_local = ring_attention(q_local, k_local, v_local, group, negl_prob=0.05, causal=True)

ring_attention: ring (context-parallel) attention, k/v shards passed around the ring with P2P ops;
causal runs use the zigzag layout for load balance; the sparse backward selects tiles over the
whole row with the global lse (docs/distributed.md). ulysses_attention: all-to-all over heads.
"""
from .ring import RingForward, ring_attention, ring_backward, ring_forward
from .sharding import LAYOUTS, chunk_ids, positions, shard, unshard
from .ulysses import heads_to_seq, seq_to_heads, ulysses_attention

__all__ = ["ring_attention", "ring_forward", "ring_backward", "RingForward", "ulysses_attention",
           "seq_to_heads", "heads_to_seq", "shard", "unshard", "positions", "chunk_ids",
           "LAYOUTS"]
