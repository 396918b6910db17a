"""Functional API of BackLite.

`attention` is differentiable (autograd through the custom op back_lite::attention, or in eager
calls through ops.EagerAttention, the same forward and backward without the dispatcher). The
low-level `forward`, `backward` and `select` record no autograd; they exist for code that runs its
own backward, such as ring / context-parallel attention: the forward can write into caller-owned
`out`, `lse` and `tile_stats`, and the backward takes a global `out` / `lse` and writes into
caller-owned `dq`, `dk`, `dv`.

Shapes (FlashAttention layout): q (B, Sq, Hq, D), k and v (B, Sk, Hk, D), last dim contiguous
(other strides are passed to the library as they are; nothing is copied); lse (B, Hq, Sq) fp32;
tile mass W and block masks (B, Hq, Tm, Tn) with (Tm, Tn) = (ceil(Sq/TM), ceil(Sk/TN)).
"""
from __future__ import annotations

import numbers
from typing import Optional

import torch

from . import _checks, _lib, _verbose, ops


def tile_shape(device: torch.device | str = "cpu") -> tuple[int, int]:
    """(TM, TN): query rows per row tile and keys per key tile of the backend for `device`."""
    return _lib.tile_shape(ops.backend_of(torch.device(device)))


def num_tiles(seqlen_q: int, seqlen_k: int, device: torch.device | str = "cpu") -> tuple[int, int]:
    """(Tm, Tn) = (ceil(Sq/TM), ceil(Sk/TN)) for the backend of `device`."""
    return ops.num_tiles(torch.device(device), seqlen_q, seqlen_k)


def backend_available(device: torch.device | str) -> bool:
    """True if the library has a usable backend for tensors on `device` (CUDA: compiled in and a
    compute capability 9.0 device visible)."""
    return _lib.backend_available(ops.backend_of(torch.device(device)))


def unsupported_reason(device: torch.device | str, dtype: torch.dtype,
                       head_dim: int) -> Optional[str]:
    """None if the backend for `device` computes attention on q, k, v of `dtype` with head dim
    `head_dim`, else why not, in the library's words. CPU: fp32 / fp16 / bf16 at every even head
    dim up to 256; CUDA: bf16 / fp16 at head dims 64 and 128. Whether the backend is usable on
    this machine is backend_available's to say. Traceable by torch.compile (no library call for
    valid head dims: their answers are read at import)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral):
        raise TypeError(f"BackLite: head_dim must be an int, got {head_dim!r}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"BackLite: dtype must be a torch.dtype, got {dtype!r}")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        return f"BackLite has no backend for tensors on {device} (cpu or cuda only)"
    if dtype not in ops.BL_DTYPES:
        return (f"dtype {dtype} is not supported (BackLite takes torch.float32, torch.float16 "
                "and torch.bfloat16)")
    return _lib.unsupported_reason(ops.backend_of(device), ops.BL_DTYPES[dtype], int(head_dim))


def backend_supports(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> bool:
    """True if BackLite's backend for `device` computes attention in `dtype` at head dim
    `head_dim` (see unsupported_reason for the rule and for why not)."""
    return unsupported_reason(device, dtype, head_dim) is None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, negl_prob: float = 0.0,
              scale: Optional[float] = None, causal: bool = False,
              tile_stats: Optional[torch.Tensor] = None, deterministic: bool = False):
    """Differentiable attention with a block-sparse backward. Returns (out, lse, W).

    out: (B, Sq, Hq, D); lse: (B, Hq, Sq) fp32 (no gradient flows through it); W: the tile mass
    (B, Hq, Tm, Tn) fp32 when negl_prob > 0 or tile_stats is given, else an empty (B, Hq, 0, 0)
    tensor. With tile_stats (a (B, Hq, Tm, Tn) fp32 buffer) the tile mass is also copied into it.
    deterministic=True: the backward's dq, dk and dv are the same bits in every call (on CUDA
    its deterministic form, as under torch.use_deterministic_algorithms(True), but raising
    where a call has none; the CPU backend always is).
    """
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    causal = _checks.causal(causal)
    deterministic = _checks.flag("deterministic", deterministic)
    negl_prob = _checks.negl_prob(negl_prob)
    if tile_stats is not None:
        _checks.tile_buffer("tile_stats", tile_stats, q, k)
    with_stats = negl_prob > 0.0 or tile_stats is not None
    if ops.eager_attention_ok(q, k, v):  # eager: autograd without the op's dispatch
        out, lse, tile_mass = ops.EagerAttention.apply(q, k, v, scale, causal, negl_prob,
                                                       with_stats, deterministic)
    else:
        out, lse, tile_mass = torch.ops.back_lite.attention(q, k, v, scale, causal, negl_prob,
                                                            with_stats, deterministic)
    if tile_stats is not None:
        # The autograd op must be functional (it cannot write into an input), so the caller's
        # buffer receives a copy of W; for a forward straight into a buffer use forward().
        tile_stats.copy_(tile_mass)
    _verbose.after_attention(q, k, causal, negl_prob, tile_mass)
    return out, lse, tile_mass


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
            causal: bool = False, with_stats: bool = False,
            tile_stats: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None):
    """Exact forward, no autograd. Returns (out, lse, W).

    Buffers that are given are written in place and returned: out (B, Sq, Hq, D) like q, lse
    (B, Hq, Sq) fp32 contiguous, tile_stats (B, Hq, Tm, Tn) fp32 contiguous (giving it implies
    with_stats). W is an empty (B, Hq, 0, 0) tensor when no statistics are recorded.
    """
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    causal = _checks.causal(causal)
    if out is not None:
        _checks.like("out", out, q, "q")
    if lse is not None:
        _checks.lse(lse, q)
    if tile_stats is not None:
        _checks.tile_buffer("tile_stats", tile_stats, q, k)
    with_stats = bool(with_stats) or tile_stats is not None
    direct = ops.direct_call_ok(q, k, v, out, lse, tile_stats)  # eager: no op dispatch
    if out is None and lse is None and tile_stats is None:
        if direct:
            return ops.run_forward(q, k, v, scale, causal, with_stats)
        return torch.ops.back_lite.forward(q, k, v, scale, causal, with_stats)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32,
                          device=q.device)
    if tile_stats is None:
        tile_stats = ops._empty_tile_mass(q, k, with_stats)
    run = ops._launch_forward if direct else torch.ops.back_lite.forward_out
    run(q, k, v, scale, causal, out, lse, tile_stats if with_stats else None)
    return out, lse, tile_stats


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, tile_mass: Optional[torch.Tensor] = None,
             negl_prob: float = 0.0, mask: Optional[torch.Tensor] = None,
             scale: Optional[float] = None, causal: bool = False,
             dq: Optional[torch.Tensor] = None, dk: Optional[torch.Tensor] = None,
             dv: Optional[torch.Tensor] = None, deterministic: bool = False):
    """Backward, no autograd. Returns (dq, dk, dv); the ones given are overwritten and returned.

    The tiles computed are, exactly one of: an explicit `mask` ((B, Hq, Tm, Tn) torch.bool,
    True = compute); the selection from `tile_mass` W with negl_prob > 0; everything (dense,
    negl_prob == 0, tile_mass ignored). `out` and `lse` may be global ones (ring attention):
    Dlt = rowsum(dout * out) uses `out` as given. deterministic: as in attention().
    """
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    causal = _checks.causal(causal)
    deterministic = _checks.flag("deterministic", deterministic)
    negl_prob = _checks.negl_prob(negl_prob)
    _checks.like("dout", dout, q, "q")
    _checks.like("out", out, q, "q")
    _checks.lse(lse, q)
    if mask is not None:
        if negl_prob > 0.0:
            raise ValueError(f"BackLite: give either mask or negl_prob > 0, not both "
                             f"(negl_prob={negl_prob} with a mask)")
        _checks.mask(mask, q, k)
    elif negl_prob > 0.0:
        if tile_mass is None:
            raise ValueError(f"BackLite: tile_mass is None but negl_prob={negl_prob} > 0 needs "
                             "the forward's tile mass (run the forward with with_stats=True)")
        _checks.tile_buffer("tile_mass", tile_mass, q, k)
    for name, t, ref, ref_name in (("dq", dq, q, "q"), ("dk", dk, k, "k"), ("dv", dv, v, "v")):
        if t is not None:
            _checks.like(name, t, ref, ref_name)
    if negl_prob == 0.0:
        tile_mass = None
    direct = ops.direct_call_ok(dout, q, k, v, out, lse, tile_mass, mask, dq, dk, dv)
    if dq is None and dk is None and dv is None:
        run = ops.run_backward if direct else torch.ops.back_lite.backward  # eager: no dispatch
        return run(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                   deterministic)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
    run = ops._launch_backward if direct else torch.ops.back_lite.backward_out
    run(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal, dq, dk, dv,
        deterministic)
    return dq, dk, dv


def select(tile_mass: torch.Tensor, negl_prob: float) -> torch.Tensor:
    """The tiles the sparse backward computes: W (B, Hq, Tm, Tn) fp32 -> torch.bool mask
    (True = kept). Per row tile, the lightest tiles carrying < negl_prob of its mass are dropped."""
    _checks.tensor("tile_mass", tile_mass)
    if tile_mass.dim() != 4 or tile_mass.numel() == 0:
        raise ValueError(f"BackLite: tile_mass must be a non-empty 4-D (B, Hq, Tm, Tn) tensor, "
                         f"got shape {tuple(tile_mass.shape)}")
    if tile_mass.dtype != torch.float32:
        raise ValueError(f"BackLite: tile_mass has dtype {tile_mass.dtype}, expected "
                         "torch.float32")
    if not tile_mass.is_contiguous():
        raise ValueError(f"BackLite: tile_mass must be contiguous, got strides "
                         f"{tile_mass.stride()}")
    ops.backend_of(tile_mass.device)
    negl_prob = _checks.negl_prob(negl_prob)
    return torch.ops.back_lite.select_tiles(tile_mass, negl_prob)


def computable_tiles(seqlen_q: int, seqlen_k: int, causal: bool,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """(Tm, Tn) torch.bool: the tiles that hold at least one allowed (query, key) pair. Only
    causal attention has others (above the bottom-right aligned diagonal); the backward never
    computes those, so sparsity figures count only computable tiles."""
    device = torch.device(device)
    tile_m, tile_n = tile_shape(device)
    tm, tn = num_tiles(seqlen_q, seqlen_k, device)
    if not causal:
        return torch.ones((tm, tn), dtype=torch.bool, device=device)
    last_row = torch.clamp((torch.arange(tm, device=device) + 1) * tile_m, max=seqlen_q) - 1
    first_key = torch.arange(tn, device=device) * tile_n
    # query i sees keys j <= i + Sk - Sq: the tile is computable if its first key is visible to
    # its last row
    return first_key[None, :] <= (last_row + seqlen_k - seqlen_q)[:, None]


def backward_sparsity(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, causal: bool) -> float:
    """Fraction of the computable tiles that `mask` ((B, Hq, Tm, Tn) bool) skips."""
    computable = computable_tiles(seqlen_q, seqlen_k, causal, mask.device)
    total = int(computable.sum()) * mask.shape[0] * mask.shape[1]
    kept = int((mask & computable).sum())
    return 1.0 - kept / total if total else 0.0
