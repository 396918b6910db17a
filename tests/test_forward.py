"""Forward on the CPU backend: out, lse and the tile mass W against the float64 reference."""
import math

import pytest
import torch

import back_lite
import reference as ref
from inputs import random_qkv

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
HEAD_DIMS = [64, 128, 96]
# (Sq, Sk): odd lengths, one-token sequences, Sq != Sk both ways (causal Sq > Sk has empty rows)
LENGTHS = [(1, 1), (63, 63), (65, 65), (130, 130), (63, 130), (130, 63), (1, 130), (130, 1),
           (129, 257)]


def run_forward_and_check(q, k, v, causal, scale=None, with_stats=True):
    scale_v = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse, w = back_lite.forward(q, k, v, scale=scale, causal=causal, with_stats=with_stats)
    out64, lse64, p64 = ref.attention(q, k, v, scale_v, causal, torch.float64)
    out_pt, lse_pt, p_pt = ref.attention(q, k, v, scale_v, causal, q.dtype)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    ref.check_close("out", out, out64, out_pt)
    ref.check_close("lse", lse, lse64, lse_pt)
    # rows with no allowed key: out exactly 0, lse exactly -inf
    empty = ~ref.allowed_keys(q.shape[1], k.shape[1], causal).any(dim=1)
    if empty.any():
        assert torch.all(out[:, empty] == 0)
        assert torch.all(lse[:, :, empty] == -math.inf)
    if with_stats:
        tile_m, tile_n = back_lite.tile_shape("cpu")
        w64 = ref.tile_mass(p64, tile_m, tile_n)
        w_pt = ref.tile_mass(p_pt.to(torch.float32), tile_m, tile_n)
        ref.check_close("W", w, w64, w_pt)
        # each valid row contributes mass 1
        rows_per_tile = ref.tile_mass((~empty).to(torch.float64)[None, None, :, None]
                                      .expand(1, 1, -1, 1), tile_m, 1)[0, 0, :, 0]
        torch.testing.assert_close(w.double().sum(-1), rows_per_tile.expand_as(w.sum(-1)),
                                   rtol=1e-4, atol=1e-4)
    else:
        assert w.shape == (q.shape[0], q.shape[2], 0, 0)
    return out, lse, w


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", LENGTHS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_forward_matches_reference(dtype, head_dim, causal, seqlens):
    q, k, v = random_qkv(2, seqlens[0], seqlens[1], 2, 2, head_dim, dtype)
    run_forward_and_check(q, k, v, causal)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (6, 3)], ids=lambda h: f"Hq{h[0]}Hk{h[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_forward_gqa_mqa(dtype, heads, causal):
    q, k, v = random_qkv(2, 97, 150, heads[0], heads[1], 64, dtype)
    run_forward_and_check(q, k, v, causal)


def test_forward_without_stats_gives_empty_tile_mass():
    q, k, v = random_qkv(1, 65, 65, 2, 2, 64, torch.bfloat16)
    out_a, lse_a, w = run_forward_and_check(q, k, v, False, with_stats=False)
    out_b, lse_b, _ = back_lite.forward(q, k, v, with_stats=True)
    # recording statistics must not change the forward's results
    assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)


@pytest.mark.parametrize("scale", [0.05, 0.3])
def test_forward_explicit_scale(scale):
    q, k, v = random_qkv(1, 70, 70, 2, 2, 64, torch.float32)
    run_forward_and_check(q, k, v, True, scale=scale)


def test_forward_strided_inputs():
    """Non-contiguous q, k, v (last dim contiguous) are read through their strides, not copied."""
    q = torch.randn(2, 2, 80, 64, dtype=torch.bfloat16).transpose(1, 2)  # (B, S, H, D) view
    packed_kv = torch.randn(2, 90, 2, 2, 64, dtype=torch.bfloat16)  # (B, S, {k, v}, H, D)
    k, v = packed_kv[:, :, 0], packed_kv[:, :, 1]
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    run_forward_and_check(q, k, v, False)
    out_strided, lse_strided, _ = back_lite.forward(q, k, v)
    out_contig, lse_contig, _ = back_lite.forward(q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.equal(out_strided, out_contig) and torch.equal(lse_strided, lse_contig)


def test_forward_into_caller_buffers():
    q, k, v = random_qkv(2, 100, 140, 4, 2, 64, torch.float16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 4, 100)
    tm, tn = back_lite.num_tiles(100, 140)
    w = torch.empty(2, 4, tm, tn)
    r_out, r_lse, r_w = back_lite.forward(q, k, v, causal=True, out=out, lse=lse, tile_stats=w)
    assert r_out is out and r_lse is lse and r_w is w
    e_out, e_lse, e_w = back_lite.forward(q, k, v, causal=True, with_stats=True)
    assert torch.equal(out, e_out) and torch.equal(lse, e_lse) and torch.equal(w, e_w)
