"""back_lite.backend_supports / functional.unsupported_reason: which dtypes and head dims each
backend computes, asked before a call (bl_supports); on the CPU the answer must match what the
calls themselves do. The CUDA rule needs no device, only a library built with the CUDA backend."""
import pytest
import torch

import back_lite
from back_lite import functional

CPU_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEAD_DIMS = [2, 40, 64, 80, 96, 128, 160, 256]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_cpu_computes_every_valid_kind(dtype, head_dim):
    assert functional.unsupported_reason("cpu", dtype, head_dim) is None
    assert back_lite.backend_supports(torch.device("cpu"), dtype, head_dim)
    # and the call itself agrees (a tiny forward + backward)
    q, k, v = (torch.randn(1, 3, 2, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
    out, _, _ = back_lite.attention(q, k, v)
    out.sum().backward()
    assert out.shape == q.shape and torch.isfinite(q.grad.float()).all()


@pytest.mark.parametrize("device,dtype,head_dim,needle", [
    ("cpu", torch.float64, 64, "dtype torch.float64 is not supported"),
    ("cpu", torch.int32, 64, "dtype torch.int32 is not supported"),
    ("cpu", torch.float32, 63, "head_dim must be even, >= 2 and <= 256, got 63"),
    ("cpu", torch.float32, 258, "head_dim must be even, >= 2 and <= 256, got 258"),
    ("cpu", torch.float32, 0, "got 0"),
    ("cuda", torch.bfloat16, 300, "got 300"),
    ("meta", torch.float32, 64, "no backend for tensors on meta"),
])
def test_kinds_no_backend_takes(device, dtype, head_dim, needle):
    reason = functional.unsupported_reason(device, dtype, head_dim)
    assert reason is not None and needle in reason
    assert not back_lite.backend_supports(device, dtype, head_dim)


def test_cuda_rule():
    """bf16 / fp16 at head dims 64 and 128 where the library has the CUDA backend; every CUDA
    kind reported absent, with the reason, where it was built without it."""
    compiled_in = functional.unsupported_reason("cuda", torch.bfloat16, 128) is None
    if back_lite.backend_available("cuda"):
        assert compiled_in
    if compiled_in:
        for dtype in (torch.bfloat16, torch.float16):
            for head_dim in HEAD_DIMS:
                reason = functional.unsupported_reason("cuda:0", dtype, head_dim)
                if head_dim in (64, 128):
                    assert reason is None
                else:
                    want = f"head_dim={head_dim} is not supported by the CUDA backend (64 and 128"
                    assert want in reason
        reason = functional.unsupported_reason("cuda", torch.float32, 128)
        assert "dtype=0 is not supported by the CUDA backend" in reason
    else:
        for head_dim in (64, 80, 128):
            reason = functional.unsupported_reason("cuda", torch.bfloat16, head_dim)
            assert "not compiled" in reason


@pytest.mark.parametrize("dtype,head_dim,needle", [
    (torch.float32, 64.5, "head_dim must be an int, got 64.5"),
    (torch.float32, True, "head_dim must be an int, got True"),
    ("float32", 64, "dtype must be a torch.dtype, got 'float32'"),
])
def test_bad_arguments(dtype, head_dim, needle):
    with pytest.raises(TypeError, match=needle):
        back_lite.backend_supports("cpu", dtype, head_dim)
