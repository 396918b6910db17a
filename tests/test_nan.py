"""NaN inputs stay where dense attention would put them: in their own row / head / batch."""
import math

import torch

import back_lite
from inputs import random_qkv


def test_nan_in_query_row_stays_in_that_row():
    q, k, v = random_qkv(2, 130, 130, 4, 2, 64, torch.bfloat16)
    q[0, 5, 1, 3] = math.nan
    out, lse, w = back_lite.forward(q, k, v, with_stats=True)
    assert torch.isnan(out[0, 5, 1]).all() and torch.isnan(lse[0, 1, 5])
    out[0, 5, 1] = 0.0
    lse[0, 1, 5] = 0.0
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    # only the row tile holding row 5, head 1 of batch 0 has a non-finite tile mass
    bad = ~torch.isfinite(w)
    assert bad[0, 1, 0].all() and bad.sum() == bad[0, 1, 0].numel()


def test_nan_gradients_stay_in_their_batch_and_kv_group():
    q, k, v = random_qkv(2, 130, 200, 4, 2, 64, torch.float32)
    q[0, 5, 1, 3] = math.nan  # query head 1 uses kv head 0
    dout = torch.randn(q.shape)
    for negl_prob in (0.0, 0.2):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = back_lite.BackLite(negl_prob=negl_prob)(qg, kg, vg)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
        # other batch: untouched
        assert torch.isfinite(dq[1]).all() and torch.isfinite(dk[1]).all()
        assert torch.isfinite(dv[1]).all()
        # other kv group of the same batch (query heads 2, 3 -> kv head 1): untouched
        assert torch.isfinite(dq[0, :, 2:]).all()
        assert torch.isfinite(dk[0, :, 1]).all() and torch.isfinite(dv[0, :, 1]).all()
        # the NaN row's own gradient is NaN, and it reaches the keys of its group
        assert torch.isnan(dq[0, 5, 1]).any()
        assert torch.isnan(dk[0, :, 0]).any() and torch.isnan(dv[0, :, 0]).any()
        # other rows of the poisoned head keep finite dq (dS of a row needs only that row)
        keep = torch.ones(130, dtype=torch.bool)
        keep[5] = False
        assert torch.isfinite(dq[0, keep, 1]).all()


def test_nan_in_key_stays_in_its_batch():
    q, k, v = random_qkv(2, 70, 70, 2, 2, 64, torch.float16)
    k[1, 10, 0, 0] = math.nan
    out, _, _ = back_lite.forward(q, k, v, causal=True)
    # with causal attention rows before key 10 never see it
    assert torch.isfinite(out[1, :10, 0]).all() and torch.isnan(out[1, 10:, 0]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[1, :, 1]).all()
