"""Every bad input listed in DEVELOPERS.md ("Argument errors") raises an error naming the argument."""
import math

import pytest
import torch

import back_lite
from back_lite import _lib, ops
from inputs import random_qkv


def qkv(dtype=torch.bfloat16, sq=70, sk=70, hq=4, hk=2, d=64):
    return random_qkv(1, sq, sk, hq, hk, d, dtype)


def attn(q, k, v, **kw):
    return back_lite.BackLite(negl_prob=0.05)(q, k, v, **kw)


def swap(i, value):
    t = list(qkv())
    t[i] = value
    return t


BAD_QKV = {
    "q not a tensor": (lambda: swap(0, [1.0]), TypeError, "q must be a torch.Tensor"),
    "q 3-D": (lambda: swap(0, torch.randn(70, 4, 64, dtype=torch.bfloat16)), ValueError,
              "q must be 4-D"),
    "k empty": (lambda: swap(1, torch.randn(1, 0, 2, 64, dtype=torch.bfloat16)), ValueError,
                "k is empty"),
    "q empty batch": (lambda: [t[:0] for t in qkv()], ValueError, "q is empty"),
    "q float64": (lambda: qkv(torch.float64), ValueError, "q has dtype torch.float64"),
    "q int": (lambda: [t.to(torch.int32) for t in qkv()], ValueError, "q has dtype torch.int32"),
    "k dtype differs": (lambda: swap(1, qkv()[1].half()), ValueError, "k has dtype"),
    "v on another device": (lambda: swap(2, qkv()[2].to("meta")), ValueError, "v is on device"),
    "q last dim strided": (lambda: swap(0, torch.randn(1, 70, 4, 128, dtype=torch.bfloat16)
                                        [..., ::2]), ValueError, "q must have its last dim"),
    "k expanded (stride 0)": (lambda: swap(1, torch.randn(1, 1, 2, 64, dtype=torch.bfloat16)
                                           .expand(1, 70, 2, 64)), ValueError, "k has stride 0"),
    "k batch differs": (lambda: swap(1, torch.randn(2, 70, 2, 64, dtype=torch.bfloat16)),
                        ValueError, "k has batch 2"),
    "k head dim differs": (lambda: swap(1, torch.randn(1, 70, 2, 128, dtype=torch.bfloat16)),
                           ValueError, "k has head dim 128"),
    "v head dim differs": (lambda: swap(2, torch.randn(1, 70, 2, 128, dtype=torch.bfloat16)),
                           ValueError, "v has head dim 128"),
    "v length differs": (lambda: swap(2, torch.randn(1, 71, 2, 64, dtype=torch.bfloat16)),
                         ValueError, "v has 71 keys"),
    "v heads differ": (lambda: swap(2, torch.randn(1, 70, 1, 64, dtype=torch.bfloat16)),
                       ValueError, "v has 1 heads"),
    "Hq not a multiple of Hk": (lambda: qkv(hq=3, hk=2), ValueError, "q has 3 heads"),
    "odd head dim": (lambda: qkv(d=63), ValueError, "head dim 63"),
    "head dim too large": (lambda: qkv(d=258), ValueError, "head dim 258"),
}


@pytest.mark.parametrize("case", list(BAD_QKV), ids=list(BAD_QKV))
def test_bad_qkv(case):
    make, exc, text = BAD_QKV[case]
    q, k, v = make()
    with pytest.raises(exc, match=text):
        attn(q, k, v)
    with pytest.raises(exc, match=text):
        back_lite.forward(q, k, v)


@pytest.mark.parametrize("scale,exc,text", [
    (math.nan, ValueError, "scale must be finite, got nan"),
    (math.inf, ValueError, "scale must be finite, got inf"),
    ("0.1", TypeError, "scale must be a real number"),
])
def test_bad_scale(scale, exc, text):
    with pytest.raises(exc, match=text):
        attn(*qkv(), scale=scale)


@pytest.mark.parametrize("negl_prob", [-0.1, 1.0, 1.5, math.nan])
def test_bad_negl_prob(negl_prob):
    with pytest.raises(ValueError, match=r"negl_prob must be in \[0, 1\)"):
        back_lite.BackLite(negl_prob=negl_prob)
    with pytest.raises(ValueError, match=r"negl_prob must be in \[0, 1\)"):
        back_lite.attention(*qkv(), negl_prob=negl_prob)
    with pytest.raises(ValueError, match=r"negl_prob must be in \[0, 1\)"):
        back_lite.select(torch.rand(1, 1, 2, 2), negl_prob)


def test_bad_causal():
    with pytest.raises(TypeError, match="causal must be a bool"):
        attn(*qkv(), causal="yes")


@pytest.mark.parametrize("make,text", [
    (lambda: torch.empty(1, 4, 2, 2), r"tile_stats has shape \(1, 4, 2, 2\), expected"),
    (lambda: torch.empty(1, 4, 2, 1, dtype=torch.float16), "tile_stats has dtype torch.float16"),
    (lambda: torch.empty(1, 4, 2, 2)[..., :1], "tile_stats must be contiguous"),
    (lambda: torch.empty(1, 4, 2, 1, device="meta"), "tile_stats is on device meta"),
])
def test_bad_tile_stats(make, text):
    with pytest.raises(ValueError, match=text):
        attn(*qkv(), tile_stats=make())
    with pytest.raises(ValueError, match=text):
        back_lite.forward(*qkv(), tile_stats=make())


def backward_args():
    q, k, v = qkv()
    out, lse, w = back_lite.forward(q, k, v, with_stats=True)
    return dict(dout=torch.randn_like(out), q=q, k=k, v=v, out=out, lse=lse, tile_mass=w)


@pytest.mark.parametrize("change,text", [
    (dict(dout=torch.randn(1, 70, 4, 32, dtype=torch.bfloat16)), "dout has shape"),
    (dict(dout=torch.randn(1, 70, 4, 64)), "dout has dtype torch.float32"),
    (dict(out=torch.randn(1, 69, 4, 64, dtype=torch.bfloat16)), "out has shape"),
    (dict(lse=torch.randn(1, 70, 4)), "lse has shape"),
    (dict(lse=torch.randn(1, 4, 70, dtype=torch.float64)), "lse has dtype torch.float64"),
    (dict(lse=torch.randn(1, 70, 4).transpose(1, 2)),
     "lse must be contiguous"),
    (dict(negl_prob=0.1, tile_mass=None), "tile_mass is None but negl_prob=0.1"),
    (dict(negl_prob=0.1, tile_mass=torch.rand(1, 4, 3, 1)), "tile_mass has shape"),
    (dict(mask=torch.ones(1, 4, 2, 1)), "mask has dtype torch.float32"),
    (dict(mask=torch.ones(1, 4, 2, 2, dtype=torch.bool)), "mask has shape"),
    (dict(mask=torch.ones(1, 4, 2, 1, dtype=torch.bool), negl_prob=0.1),
     "give either mask or negl_prob"),
    (dict(dq=torch.empty(1, 70, 2, 64, dtype=torch.bfloat16)), "dq has shape"),
    (dict(dk=torch.empty(1, 70, 2, 64)), "dk has dtype torch.float32"),
    (dict(dv=torch.empty(1, 70, 2, 128, dtype=torch.bfloat16)[..., ::2]),
     "dv must have its last dim contiguous"),
    (dict(negl_prob=-1.0), r"negl_prob must be in \[0, 1\)"),
])
def test_bad_backward_arguments(change, text):
    args = backward_args()
    args.update(change)
    with pytest.raises(ValueError, match=text):
        back_lite.backward(**args)


@pytest.mark.parametrize("w,exc,text", [
    (None, TypeError, "tile_mass must be a torch.Tensor"),
    (torch.rand(4, 2, 2), ValueError, "tile_mass must be a non-empty 4-D"),
    (torch.rand(1, 1, 0, 2), ValueError, "tile_mass must be a non-empty 4-D"),
    (torch.rand(1, 1, 2, 2, dtype=torch.float64), ValueError, "tile_mass has dtype"),
    (torch.rand(1, 1, 2, 3).transpose(2, 3), ValueError, "tile_mass must be contiguous"),
])
def test_bad_select_arguments(w, exc, text):
    with pytest.raises(exc, match=text):
        back_lite.select(w, 0.1)


def test_library_errors_surface_with_their_message():
    """Errors the C library finds (here: the raw op called without the Python checks) become
    ValueError carrying bl_status_string and bl_last_error, which names the argument."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="invalid.*scale"):
        torch.ops.back_lite.forward(q, k, v, math.nan, False, False)
    bad_heads = torch.randn(1, 70, 3, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="heads"):
        torch.ops.back_lite.forward(bad_heads, k, v, 0.125, False, False)


def test_status_to_exception_mapping():
    with pytest.raises(ValueError, match="^ctx: "):
        _lib.check(_lib.BL_ERR_INVALID_ARGUMENT, "ctx")
    with pytest.raises(NotImplementedError):
        _lib.check(_lib.BL_ERR_UNSUPPORTED, "ctx")
    with pytest.raises(RuntimeError):
        _lib.check(_lib.BL_ERR_NO_BACKEND, "ctx")
    with pytest.raises(RuntimeError):
        _lib.check(_lib.BL_ERR_CUDA, "ctx")
    _lib.check(_lib.BL_OK, "ctx")


@pytest.mark.skipif(back_lite.backend_available("cuda"),
                    reason="a CUDA backend is usable here; the no-backend path cannot be shown")
def test_missing_cuda_backend_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match="the CUDA backend is not usable"):
        ops.require_backend(_lib.BL_BACKEND_CUDA)
    ops.require_backend(_lib.BL_BACKEND_CPU)
