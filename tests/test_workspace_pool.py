"""The workspace allocator's entry points where no GPU is usable (CI, the CPU backend): they
report no compressible memory and allocate nothing, without raising or crashing; the pool code
is then never reached (back_lite/workspace_pool.py). The GPU side: tests/gpu/test_gpu_workspace_pool.py."""
import ctypes

import pytest
import torch

from back_lite import _lib

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the GPU tests cover it")


def test_no_compressible_memory_without_a_gpu():
    assert _lib.lib.bl_workspace_compressible(0) == 0


def test_alloc_returns_null_and_free_ignores_it_without_a_gpu():
    alloc = _lib.lib.bl_workspace_alloc
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert alloc(1 << 20, 0, None) is None
    free = _lib.lib.bl_workspace_free
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    free(None, 1 << 20, 0, None)


def test_empty_workspace_pool_without_a_gpu_is_a_no_op():
    import back_lite
    from back_lite import workspace_pool
    workspace_pool._pools[0] = None  # what pool_for caches where no pool can be made
    back_lite.empty_workspace_pool()
    assert workspace_pool._pools == {}
