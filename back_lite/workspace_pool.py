"""The CUDA backward's workspace in compressible device memory.

The backward's workspace holds an fp32 dq accumulator that the preprocess fills with zeros and
the postprocess reads back; on a GPU with compute data compression (H100 / H200) zero lines cost
fewer DRAM bytes there. The C library maps such memory (bl_workspace_alloc / bl_workspace_free,
PyTorch's pluggable-allocator signatures); this module hands it to PyTorch as a
torch.cuda.MemPool per device, so that the caching allocator keeps its usual stream ordering
and reuse. Not used while a CUDA graph is being captured (the graph's private pool keeps its
memory apart from eager calls), nor where the device or this torch lacks what it needs.
BACK_LITE_COMPRESSIBLE_WORKSPACE=0 turns it off (read at every call, for A/B timing).

Cost: the pool's blocks stay reserved for later backward calls (about the largest call's
workspace, 2 x dq's size plus a little), where torch.empty's would go back to the shared cache.
release() gives them back (back_lite.empty_workspace_pool()).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from . import _lib

ENV_VAR = "BACK_LITE_COMPRESSIBLE_WORKSPACE"
_pools: dict[int, Optional["torch.cuda.MemPool"]] = {}


def _make_pool(index: int) -> Optional["torch.cuda.MemPool"]:
    if not _lib.lib.bl_workspace_compressible(index):
        return None
    try:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            _lib.path, "bl_workspace_alloc", "bl_workspace_free")
        return torch.cuda.MemPool(allocator.allocator())
    except (AttributeError, RuntimeError, TypeError):
        return None  # a torch without MemPool / pluggable allocators: plain workspaces


def pool_for(device: torch.device) -> Optional["torch.cuda.MemPool"]:
    """The compressible pool of `device` (current), or None where plain memory is to be used."""
    if os.environ.get(ENV_VAR, "1") == "0" or torch.cuda.is_current_stream_capturing():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _pools:
        _pools[index] = _make_pool(index)
    return _pools[index]


def empty(nbytes: int, device: torch.device, compressible: bool) -> torch.Tensor:
    """A uint8 workspace of `nbytes` on `device`: from the compressible pool where `compressible`
    and the pool exists, else from the caching allocator as usual."""
    pool = pool_for(device) if compressible else None
    if pool is not None:
        try:
            with torch.cuda.use_mem_pool(pool):
                return torch.empty(nbytes, dtype=torch.uint8, device=device)
        except (RuntimeError, AttributeError):
            # an allocator configuration the pool cannot take, or a torch without use_mem_pool:
            # plain memory from now on
            index = device.index if device.index is not None else torch.cuda.current_device()
            _pools[index] = None
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def release() -> None:
    """Give the pools' free blocks back to the device (after a long-sequence phase, say): the
    pools are dropped -- PyTorch releases a MemPool's free blocks when the pool object goes --
    and the next backward call makes a new one. Blocks of workspaces still alive are not touched
    (the caching allocator frees them when they are)."""
    _pools.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
