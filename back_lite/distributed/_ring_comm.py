"""Point-to-point exchange around a ring of ranks, on torch.distributed's P2P ops.

Every rank sends to rank+1 and receives from rank-1 (ranks of the group, modulo its size) in one
`batch_isend_irecv`, so NCCL runs the sends and receives of a step as one group and gloo posts
them asynchronously; the caller computes while the transfer is in flight and waits only when it
needs the data. All ranks must start their exchanges in the same order: receives are matched to
sends in posting order (per peer and tag).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# Tags keep the two streams of a ring (the travelling k/v and the travelling dk/dv accumulators)
# apart on backends that match by tag (gloo); NCCL ignores tags and matches in posting order.
TAG_KV = 0
TAG_DKV = 1


class _Pending:
    """Receive buffers of an exchange in flight; wait() returns them once they are filled."""

    def __init__(self, requests, buffers, sent):
        self._requests = requests
        self._buffers = buffers
        self._sent = sent  # the tensors being sent stay alive until the transfer is done

    def wait(self) -> list[torch.Tensor]:
        for request in self._requests:
            request.wait()
        self._requests = []
        self._sent = []
        return self._buffers


class RingExchange:
    """Sends tensors to the next rank of `group` and receives same-shaped tensors from the
    previous one."""

    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self._next = dist.get_global_rank(self.group, (self.rank + 1) % self.world_size)
        self._prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world_size)

    def start(self, tensors: list[torch.Tensor], tag: int) -> _Pending:
        """Starts sending `tensors` to the next rank; the returned handle's wait() gives the
        previous rank's tensors (new buffers of the same shapes and dtypes). The tensors sent
        must not be modified until then."""
        if self.world_size == 1:
            return _Pending([], list(tensors), [])  # a ring of one: what goes out comes back
        sent = [t.contiguous() for t in tensors]
        buffers = [torch.empty_like(t) for t in sent]
        ops = [dist.P2POp(dist.isend, t, self._next, self.group, tag) for t in sent]
        ops += [dist.P2POp(dist.irecv, b, self._prev, self.group, tag) for b in buffers]
        return _Pending(dist.batch_isend_irecv(ops), buffers, sent)
