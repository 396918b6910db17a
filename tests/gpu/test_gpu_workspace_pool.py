"""The backward's workspace in compressible memory (back_lite/workspace_pool.py): the device
grants it, calls through the pool give the gradients of calls with a plain workspace, the
pool's blocks are reused rather than mapped again, and the switch turns it off. Skipped
without a device."""
import pytest
import torch

import back_lite
from back_lite import _lib, workspace_pool
from cuda_required import skip_module_without_cuda_backend
from inputs import random_qkv

skip_module_without_cuda_backend()

DEV = "cuda"


def test_gpu_h200_grants_compressible_workspaces():
    """H100 / H200 have compute data compression; the library must see it there, or the pool
    is silently never used."""
    major, minor = torch.cuda.get_device_capability()
    assert (major, minor) == (9, 0)
    assert _lib.lib.bl_workspace_compressible(torch.cuda.current_device()) == 1
    assert workspace_pool.pool_for(torch.device(DEV)) is not None


@pytest.mark.parametrize("causal,tiles", [(False, "dense"), (True, "mask"), (False, "select")])
def test_gpu_backward_same_with_plain_workspace(monkeypatch, causal, tiles):
    """dK / dV the same bits with the workspace in the pool or in plain memory, dq within the
    two ulps its reduce-adds' order allows (as call to call: README, Reproducibility)."""
    dtype = torch.bfloat16
    q, k, v = random_qkv(1, 700, 900, 4, 2, 128, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    kw = {}
    if tiles == "mask":
        tm, tn = back_lite.num_tiles(700, 900, DEV)
        gen = torch.Generator(device=DEV).manual_seed(3)
        kw["mask"] = torch.rand(1, 4, tm, tn, device=DEV, generator=gen) < 0.3
    elif tiles == "select":
        kw.update(tile_mass=w, negl_prob=0.05)
    pooled = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
    monkeypatch.setenv(workspace_pool.ENV_VAR, "0")
    plain = back_lite.backward(dout, q, k, v, out, lse, causal=causal, **kw)
    assert torch.equal(pooled[1], plain[1]), "dk"
    assert torch.equal(pooled[2], plain[2]), "dv"
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(pooled[0], plain[0], rtol=2 * eps, atol=1e-5)
    assert pooled[0].abs().max() > 0


def test_gpu_pool_reuses_its_blocks_and_switch_turns_it_off(monkeypatch):
    dev = torch.device(DEV)
    pool = workspace_pool.pool_for(dev)
    first = workspace_pool.empty(5 << 20, dev, True)
    ptr = first.data_ptr()
    del first
    again = workspace_pool.empty(5 << 20, dev, True)
    assert again.data_ptr() == ptr, "the freed block comes back from the pool"
    assert pool.snapshot(), "the pool holds the block"
    monkeypatch.setenv(workspace_pool.ENV_VAR, "0")
    assert workspace_pool.pool_for(dev) is None
    plain = workspace_pool.empty(5 << 20, dev, True)
    assert plain.data_ptr() != again.data_ptr()


def test_gpu_empty_workspace_pool_gives_the_memory_back():
    """After a backward call the pool keeps its workspace reserved; back_lite.empty_workspace_pool
    returns it to the device, and the next call makes a new pool that works as before."""
    dtype = torch.bfloat16
    q, k, v = random_qkv(1, 4096, 4096, 8, 8, 128, dtype, DEV)
    dout = torch.randn(q.shape, device=DEV).to(dtype)
    out, lse, _ = back_lite.forward(q, k, v)
    first = back_lite.backward(dout, q, k, v, out, lse)
    torch.cuda.synchronize()
    workspace = q.numel() * 4  # the fp32 dq accumulator alone (twice dq's bytes)
    held = torch.cuda.memory_reserved()
    back_lite.empty_workspace_pool()
    freed = held - torch.cuda.memory_reserved()
    assert freed >= workspace, f"freed {freed} bytes, the workspace is >= {workspace}"
    again = back_lite.backward(dout, q, k, v, out, lse)
    assert workspace_pool.pool_for(torch.device(DEV)) is not None
    assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2])
