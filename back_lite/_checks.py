"""Argument checks done in Python before the C library is called.

Each failure raises TypeError (not a tensor / not a number) or ValueError (anything else) whose
message names the argument and its bad value. The C library repeats the checks; these exist so
that the message speaks in PyTorch terms (shapes, dtypes, devices). The full list of what is
checked is in DEVELOPERS.md ("Argument errors").
"""
from __future__ import annotations

import math
import numbers

import torch

from . import _lib, ops

# Largest head dim of the API; which head dims a backend implements is the backend's to say (it
# reports BL_ERR_UNSUPPORTED -> NotImplementedError; back_lite.backend_supports asks beforehand).
MAX_HEAD_DIM = _lib.BL_MAX_HEAD_DIM

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _fail(message: str) -> None:
    raise ValueError("BackLite: " + message)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"BackLite: {name} must be a torch.Tensor, got {type(t).__name__}")


def qkv(q, k, v) -> None:
    """q: (B, Sq, Hq, D), k: (B, Sk, Hk, D), v: (B, Sk, Hk, D); same dtype and device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(name, t)
        if t.dim() != 4:
            _fail(f"{name} must be 4-D (B, S, H, D), got shape {_shape(t)}")
        if t.numel() == 0:
            _fail(f"{name} is empty (shape {_shape(t)}); every dimension must be >= 1")
    if q.dtype not in _CPU_DTYPES:
        _fail(f"q has dtype {q.dtype}; supported: torch.bfloat16, torch.float16 "
              "(torch.float32 on CPU only)")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            _fail(f"{name} has dtype {t.dtype} but q has dtype {q.dtype}; they must match")
        if t.device != q.device:
            _fail(f"{name} is on device {t.device} but q is on {q.device}; they must match")
    ops.backend_of(q.device)  # raises for devices other than cpu / cuda
    if q.device.type != "cpu" and q.dtype not in _LOW_PRECISION:
        _fail(f"q has dtype {q.dtype} on {q.device}; the CUDA backend takes torch.bfloat16 or "
              "torch.float16 (torch.float32 is CPU only)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        layout(name, t)
    batch, _, heads_q, head_dim = q.shape
    _, seqlen_k, heads_k, _ = k.shape
    if k.shape[0] != batch:
        _fail(f"k has batch {k.shape[0]} but q has batch {batch} (q {_shape(q)}, k {_shape(k)})")
    if v.shape[0] != batch:
        _fail(f"v has batch {v.shape[0]} but q has batch {batch} (q {_shape(q)}, v {_shape(v)})")
    if k.shape[3] != head_dim:
        _fail(f"k has head dim {k.shape[3]} but q has head dim {head_dim}")
    if v.shape[3] != head_dim:
        _fail(f"v has head dim {v.shape[3]} but q has head dim {head_dim} (a different value "
              "head dim is not supported)")
    if v.shape[1] != seqlen_k:
        _fail(f"v has {v.shape[1]} keys (dim 1) but k has {seqlen_k}; they must match")
    if v.shape[2] != heads_k:
        _fail(f"v has {v.shape[2]} heads but k has {heads_k}; they must match")
    if heads_q % heads_k != 0:
        _fail(f"q has {heads_q} heads, not a multiple of k's {heads_k} heads (GQA/MQA needs "
              "Hq % Hk == 0)")
    if head_dim > MAX_HEAD_DIM or head_dim % 2 != 0:
        _fail(f"q has head dim {head_dim}; the head dim must be even and <= {MAX_HEAD_DIM}")


def layout(name: str, t: torch.Tensor) -> None:
    """(B, S, H, D): D contiguous, and no dim of size > 1 with stride 0 (an expanded tensor
    would make several rows alias one memory row; the library refuses that)."""
    if t.stride(-1) != 1:
        _fail(f"{name} must have its last dim contiguous (stride(-1) == 1), got strides "
              f"{t.stride()}; call .contiguous() on it")
    for dim in range(3):
        if t.shape[dim] > 1 and t.stride(dim) == 0:
            _fail(f"{name} has stride 0 in dim {dim} (an expanded tensor, strides {t.stride()}); "
                  "call .contiguous() on it")


def scale(value, head_dim) -> float:
    """None -> 1/sqrt(D); otherwise a finite real number."""
    if value is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"BackLite: scale must be a real number or None, got "
                        f"{type(value).__name__}")
    value = float(value)
    # written as a comparison (false for NaN) rather than math.isfinite, which torch.compile
    # cannot trace on a symbolic float
    if not abs(value) < math.inf:
        _fail(f"scale must be finite, got {value}")
    return value


def flag(name: str, value) -> bool:
    """A bool argument (an int is taken as one, as C takes it)."""
    if not isinstance(value, (bool, int)):
        raise TypeError(f"BackLite: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def causal(value) -> bool:
    return flag("causal", value)


def negl_prob(value, name: str = "negl_prob") -> float:
    """A real number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"BackLite: {name} must be a real number in [0, 1), got "
                        f"{type(value).__name__}")
    value = float(value)
    if not 0.0 <= value < 1.0:  # also false for NaN
        _fail(f"{name} must be in [0, 1), got {value}")
    return value


def _on_q_device_contiguous(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    """The tail shared by the per-tile and per-row buffers (W, mask, lse): q's device, contiguous
    (the library takes them as plain pointers)."""
    if t.device != q.device:
        _fail(f"{name} is on device {t.device} but q is on {q.device}")
    if not t.is_contiguous():
        _fail(f"{name} must be contiguous, got strides {t.stride()}")


def tile_buffer(name: str, t, q: torch.Tensor, k: torch.Tensor) -> None:
    """A tile-mass tensor W: (B, Hq, Tm, Tn) fp32 contiguous, on q's device."""
    tensor(name, t)
    expected = (q.shape[0], q.shape[2]) + tuple(ops.num_tiles(q.device, q.shape[1], k.shape[1]))
    if _shape(t) != expected:
        _fail(f"{name} has shape {_shape(t)}, expected (B, Hq, Tm, Tn) = {expected}")
    if t.dtype != torch.float32:
        _fail(f"{name} has dtype {t.dtype}, expected torch.float32")
    _on_q_device_contiguous(name, t, q)


def mask(t, q: torch.Tensor, k: torch.Tensor) -> None:
    """An explicit block mask: (B, Hq, Tm, Tn) torch.bool contiguous, on q's device."""
    tensor("mask", t)
    if t.dtype != torch.bool:
        _fail(f"mask has dtype {t.dtype}, expected torch.bool (True = compute the tile)")
    expected = (q.shape[0], q.shape[2]) + tuple(ops.num_tiles(q.device, q.shape[1], k.shape[1]))
    if _shape(t) != expected:
        _fail(f"mask has shape {_shape(t)}, expected (B, Hq, Tm, Tn) = {expected}")
    _on_q_device_contiguous("mask", t, q)


def like(name: str, t, ref: torch.Tensor, ref_name: str) -> None:
    """A (B, S, H, D) tensor with the shape, dtype and device of `ref`, last dim contiguous."""
    tensor(name, t)
    if _shape(t) != _shape(ref):
        _fail(f"{name} has shape {_shape(t)}, expected {_shape(ref)} (the shape of {ref_name})")
    if t.dtype != ref.dtype:
        _fail(f"{name} has dtype {t.dtype}, expected {ref.dtype} (the dtype of {ref_name})")
    if t.device != ref.device:
        _fail(f"{name} is on device {t.device}, expected {ref.device}")
    layout(name, t)


def lse(t, q: torch.Tensor, name: str = "lse") -> None:
    """(B, Hq, Sq) fp32 contiguous on q's device."""
    tensor(name, t)
    expected = (q.shape[0], q.shape[2], q.shape[1])
    if _shape(t) != expected:
        _fail(f"{name} has shape {_shape(t)}, expected (B, Hq, Sq) = {expected}")
    if t.dtype != torch.float32:
        _fail(f"{name} has dtype {t.dtype}, expected torch.float32")
    _on_q_device_contiguous(name, t, q)
