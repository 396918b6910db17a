"""An independent PyTorch implementation of DESIGN.md §1, used as the tests' ground truth.

Everything here is written straight from the definitions with dense (B, H, Sq, Sk) matrices:
slow, simple and, with compute_dtype=torch.float64, accurate. With a low-precision compute_dtype
the same code is "PyTorch's own low-precision computation", whose error against the float64
result sets the tolerance of each compared output (the FlashAttention-3 test convention).
"""
from __future__ import annotations

import math

import torch

F64 = torch.float64
# Every comparison also allows this absolute error: the fp32 error of a D-long dot product of
# values ~1 summed in another order (online softmax, blocked sums, tensor-core accumulation).
# PyTorch's own error can be far smaller -- ~1e-7 in fp32, or exactly 0 where the exact result is
# 0 and its low-precision path hits 0 too (a single key: P = 1, dS = P (dO.v - dO.out) = 0) --
# and for bf16 / fp16 outputs this floor is below half an ulp of any value above 0.005.
ABS_FLOOR = 1e-5


def allowed_keys(seqlen_q: int, seqlen_k: int, causal: bool, device="cpu") -> torch.Tensor:
    """(Sq, Sk) bool: query i sees key j (causal: j <= i + Sk - Sq, bottom-right aligned)."""
    if not causal:
        return torch.ones((seqlen_q, seqlen_k), dtype=torch.bool, device=device)
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def _heads_first(t: torch.Tensor, dtype, repeat: int = 1) -> torch.Tensor:
    # (B, S, H, D) -> (B, H*repeat, S, D); repeat maps kv heads onto their query heads (GQA)
    t = t.to(dtype).transpose(1, 2)
    return t.repeat_interleave(repeat, dim=1) if repeat > 1 else t


def probabilities(q, k, scale, causal, compute_dtype=F64):
    """P (B, Hq, Sq, Sk) and lse (B, Hq, Sq) (-inf for rows with no allowed key; float64 for the
    float64 reference, fp32 otherwise).

    In a low-precision compute_dtype the scores are a low-precision matmul and the softmax runs
    in fp32 and is rounded back, as PyTorch's math attention does. Differentiable."""
    group = q.shape[2] // k.shape[2]
    qh, kh = _heads_first(q, compute_dtype), _heads_first(k, compute_dtype, group)
    scores = (qh @ kh.transpose(-1, -2)) * scale
    softmax_dtype = F64 if compute_dtype == F64 else torch.float32
    scores = scores.to(softmax_dtype)
    allowed = allowed_keys(q.shape[1], k.shape[1], causal, q.device)
    empty_row = ~allowed.any(dim=1)  # (Sq,)
    scores = scores.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf on empty rows
    # Empty rows get finite dummy scores so that neither softmax nor its gradient makes NaN;
    # their probabilities are then zeroed (no allowed key: out = 0, no gradient).
    safe = scores.masked_fill(empty_row[:, None], 0.0)
    p = torch.softmax(safe, dim=-1).masked_fill(empty_row[:, None], 0.0)
    return p.to(compute_dtype), lse


def attention(q, k, v, scale, causal, compute_dtype=F64):
    """-> out (B, Sq, Hq, D) in compute_dtype, lse (B, Hq, Sq), P (B, Hq, Sq, Sk)."""
    group = q.shape[2] // k.shape[2]
    p, lse = probabilities(q, k, scale, causal, compute_dtype)
    out = p @ _heads_first(v, compute_dtype, group)
    return out.transpose(1, 2), lse, p


def tile_mass(p: torch.Tensor, tile_m: int, tile_n: int) -> torch.Tensor:
    """P (B, H, Sq, Sk) -> W (B, H, Tm, Tn): the probability mass in each tile."""
    batch, heads, seqlen_q, seqlen_k = p.shape
    tm, tn = -(-seqlen_q // tile_m), -(-seqlen_k // tile_n)
    padded = torch.zeros((batch, heads, tm * tile_m, tn * tile_n), dtype=p.dtype, device=p.device)
    padded[:, :, :seqlen_q, :seqlen_k] = p
    return padded.view(batch, heads, tm, tile_m, tn, tile_n).sum(dim=(3, 5))


def select(w: torch.Tensor, negl_prob: float):
    """W (B, H, Tm, Tn) -> (keep mask bool, ambiguous bool).

    Per (b, h, m) with total T > 0: p_n = W/T, tiles ordered by (p_n asc, n asc), the longest
    prefix whose cumulative sum is < negl_prob is skipped. T == 0 keeps nothing, a non-finite T
    keeps everything. `ambiguous` marks tiles whose fate turns on a cumulative sum within 1e-9 of
    negl_prob, where a float summation order may legitimately decide either way."""
    w = w.to(F64)
    total = w.sum(dim=-1, keepdim=True)
    share = w / total
    order = torch.sort(share, dim=-1, stable=True)  # ties keep ascending n
    cum = torch.cumsum(order.values, dim=-1)
    skip_sorted = cum < negl_prob
    near = (cum - negl_prob).abs() < 1e-9
    keep = torch.ones_like(w, dtype=torch.bool)
    keep.scatter_(-1, order.indices, ~skip_sorted)
    ambiguous = torch.zeros_like(keep)
    ambiguous.scatter_(-1, order.indices, near)
    keep = torch.where(total == 0, torch.zeros_like(keep), keep)
    keep = torch.where(torch.isfinite(total), keep, torch.ones_like(keep))
    ambiguous &= torch.isfinite(total) & (total > 0)
    return keep, ambiguous


def expand_tile_mask(mask: torch.Tensor, seqlen_q: int, seqlen_k: int, tile_m: int,
                     tile_n: int) -> torch.Tensor:
    """(B, H, Tm, Tn) -> (B, H, Sq, Sk) element mask."""
    full = mask.repeat_interleave(tile_m, dim=2).repeat_interleave(tile_n, dim=3)
    return full[:, :, :seqlen_q, :seqlen_k]


def backward(q, k, v, out, dout, scale, causal, mask=None, tile=(64, 128), compute_dtype=F64):
    """The backward of §1 over the tiles that `mask` keeps (all of them when mask is None).

    out is used as given for Dlt = rowsum(dout * out). Returns dq (B, Sq, Hq, D) and
    dk, dv (B, Sk, Hk, D) in compute_dtype (dk, dv summed over each GQA group)."""
    batch, seqlen_q, heads_q, _ = q.shape
    _, seqlen_k, heads_k, head_dim = k.shape
    group = heads_q // heads_k
    p, _ = probabilities(q, k, scale, causal, compute_dtype)
    qh = _heads_first(q, compute_dtype)
    kh, vh = _heads_first(k, compute_dtype, group), _heads_first(v, compute_dtype, group)
    do, oh = _heads_first(dout, compute_dtype), _heads_first(out, compute_dtype)
    dlt = (do.to(torch.float32 if compute_dtype != F64 else F64)
           * oh.to(torch.float32 if compute_dtype != F64 else F64)).sum(-1).to(compute_dtype)
    if mask is not None:
        keep = expand_tile_mask(mask, seqlen_q, seqlen_k, *tile)
        p = p * keep.to(p.dtype)
    dp = do @ vh.transpose(-1, -2)
    ds = p * (dp - dlt[..., None])
    dv = p.transpose(-1, -2) @ do
    dk = (ds.transpose(-1, -2) @ qh) * scale
    dq = (ds @ kh) * scale

    def per_kv_head(t):  # (B, Hq, Sk, D) -> (B, Sk, Hk, D), summed over the group
        return t.view(batch, heads_k, group, seqlen_k, head_dim).sum(2).transpose(1, 2)

    return dq.transpose(1, 2), per_kv_head(dk), per_kv_head(dv)


def dense_autograd(q, k, v, dout, scale, causal):
    """Gradients by torch.autograd.grad through the float64 reference forward."""
    q64, k64, v64 = (t.detach().to(F64).requires_grad_() for t in (q, k, v))
    out, _, _ = attention(q64, k64, v64, scale, causal, F64)
    return torch.autograd.grad(out, (q64, k64, v64), dout.to(F64))


def max_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |got - ref| over finite entries; entries infinite in ref must match exactly."""
    got, ref = got.to(F64), ref.to(F64)
    inf = torch.isinf(ref)
    if inf.any():
        assert torch.equal(got[inf], ref[inf]), "infinite entries differ"
    diff = (got - ref).abs()[~inf]
    return float(diff.max()) if diff.numel() else 0.0


def rounding_atol(ref64, dtype, floor: float = 0.0) -> float:
    """check_close's atol: twice the error of rounding ref64's finite entries to dtype, plus
    `floor` and ABS_FLOOR."""
    finite = torch.isfinite(ref64)
    rounding = max_err(ref64[finite].to(dtype), ref64[finite]) if finite.any() else 0.0
    return 2.0 * rounding + floor + ABS_FLOOR


def allowance(ref64, baseline, mult: float = 2.0, floor: float = 0.0) -> float:
    """The largest max error check_close accepts for a result in baseline's dtype."""
    return mult * max_err(baseline, ref64) + rounding_atol(ref64, baseline.dtype, floor)


def check_close(name: str, got, ref64, baseline, mult: float = 2.0, floor: float = 0.0):
    """FlashAttention-3 style: |got - ref64| <= mult * |baseline - ref64| + atol, where baseline is
    PyTorch's own low-precision result and atol the error of rounding ref64 to got's dtype
    (plus `floor` for outputs whose baseline is exact)."""
    assert got.shape == ref64.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref64.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN in the result"
    err = max_err(got, ref64)
    base = max_err(baseline, ref64)
    atol = rounding_atol(ref64, got.dtype, floor)
    assert err <= mult * base + atol, (
        f"{name}: max error {err:.3e} > {mult} x PyTorch low-precision error {base:.3e} + "
        f"{atol:.3e}")
