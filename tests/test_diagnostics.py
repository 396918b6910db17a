"""back_lite.diagnostics: per-(batch, head) figures from W, checked against a float64 recount from
tests/reference.py; the sparsity curve; BACK_LITE_VERBOSE logging with its rate limit; watch()."""
import logging

import pytest
import torch

import back_lite
import reference as ref
from back_lite import diagnostics
from inputs import local_qkv, random_qkv

TILE = (64, 128)
# A cumulative share closer than this to negl_prob could be cut differently by the fp32 W of the
# library and the float64 W of the recount; the cases below are checked to stay clear of it.
CUT_CLEARANCE = 1e-5


def _recount(q, k, causal, negl_prob):
    """Every figure of diagnostics.tile_stats, from float64 probabilities (tests/reference.py)."""
    seqlen_q, seqlen_k, head_dim = q.shape[1], k.shape[1], q.shape[3]
    scale = head_dim ** -0.5
    p, _ = ref.probabilities(q, k, scale, causal)
    w = ref.tile_mass(p, *TILE)  # (B, H, Tm, Tn) float64
    allowed = ref.allowed_keys(seqlen_q, seqlen_k, causal)
    padded = torch.zeros(w.shape[2] * TILE[0], w.shape[3] * TILE[1], dtype=torch.bool)
    padded[:seqlen_q, :seqlen_k] = allowed
    computable = padded.view(w.shape[2], TILE[0], w.shape[3], TILE[1]).any(dim=3).any(dim=1)
    if negl_prob > 0:
        keep, _ = ref.select(w, negl_prob)
        total = w.sum(-1, keepdim=True)
        cum = torch.sort(w / total, dim=-1).values.cumsum(-1)
        gap = (cum - negl_prob).abs()[(total > 0).expand_as(cum)]
        assert float(gap.min()) > CUT_CLEARANCE, "test case too close to a selection cut"
    else:
        keep = computable.expand_as(w).clone()
    keep &= computable
    total = w.sum(-1)
    share = w / total.clamp(min=1e-300)[..., None]
    has = total > 0
    dropped = (share * (~keep)).sum(-1)
    rows = has.sum(-1).clamp(min=1)
    # FLOPs: element count of the kept tiles (clipped at the sequence ends) x 10 x D
    elems = ref.expand_tile_mask(keep, seqlen_q, seqlen_k, *TILE).sum(dim=(-1, -2))
    elems_dense = ref.expand_tile_mask(computable[None, None], seqlen_q, seqlen_k,
                                       *TILE).sum()
    ent = torch.where(share > 0, -share * share.clamp(min=1e-300).log(), torch.zeros_like(share))
    return dict(
        kept=keep.sum(dim=(-1, -2)),
        dropped_mean=torch.where(has, dropped, 0.0).sum(-1) / rows,
        dropped_worst=torch.where(has, dropped, 0.0).max(-1).values,
        top=torch.where(has, share.max(-1).values, 0.0).sum(-1) / rows,
        eff=torch.where(has, ent.sum(-1).exp(), 0.0).sum(-1) / rows,
        flops_kept=10.0 * head_dim * elems.to(torch.float64),
        flops_dense=10.0 * head_dim * float(elems_dense),
        computable=int(computable.sum()))


CASES = [  # (name, make q k v, causal)
    ("local", lambda: local_qkv(2, 300, 3, 3, 64, torch.float32, sharpness=8.0), False),
    ("local-causal-gqa", lambda: local_qkv(1, 333, 4, 2, 64, torch.float32, sharpness=6.0),
     True),
    ("random-sq-ne-sk", lambda: random_qkv(1, 130, 390, 2, 1, 32, torch.float32), True),
]


@pytest.mark.parametrize("negl_prob", [0.0, 0.013, 0.07, 0.31])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_tile_stats_agree_with_float64_recount(case, negl_prob):
    _, make, causal = case
    q, k, v = make()
    _, _, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    got = diagnostics.tile_stats(w, negl_prob, q.shape[1], k.shape[1], q.shape[3], causal)
    want = _recount(q, k, causal, negl_prob)
    assert got.kept_tiles.shape == (q.shape[0], q.shape[2])
    assert torch.equal(got.kept_tiles, want["kept"])
    assert got.computable_tiles == want["computable"]
    tol = dict(rtol=0, atol=2e-6)
    torch.testing.assert_close(got.dropped_mass_mean, want["dropped_mean"], **tol)
    torch.testing.assert_close(got.dropped_mass_worst, want["dropped_worst"], **tol)
    torch.testing.assert_close(got.top_tile_share, want["top"], **tol)
    torch.testing.assert_close(got.effective_tiles, want["eff"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.flops_kept, want["flops_kept"], rtol=0, atol=0)
    assert got.flops_dense == want["flops_dense"]
    # the aggregate sparsity is the one the functional helper reports for the library's mask
    mask = back_lite.select(w, negl_prob) if negl_prob > 0 else torch.ones_like(w, dtype=bool)
    assert got.total_sparsity == pytest.approx(
        back_lite.backward_sparsity(mask, q.shape[1], k.shape[1], causal))
    if negl_prob == 0.0:
        assert got.total_sparsity == 0.0 and got.flops_saved == 0.0
        assert got.estimated_speedup() == pytest.approx(1.0)
    else:
        # selection drops strictly less than negl_prob of every row tile's mass
        assert got.worst_dropped_mass < negl_prob


def test_sparsity_curve_is_monotone_and_matches_tile_stats():
    q, k, v = local_qkv(1, 512, 2, 2, 64, torch.float32, sharpness=8.0)
    _, _, w = back_lite.forward(q, k, v, with_stats=True)
    grid = [0.0, 1e-4, 1e-3, 1e-2, 0.05, 0.2, 0.5, 0.9]
    curve = diagnostics.sparsity_curve(w, grid, 512, 512, 64)
    for key in ("sparsity", "mean_dropped_mass", "flops_saved_share", "estimated_speedup"):
        values = getattr(curve, key)
        assert all(a <= b + 1e-12 for a, b in zip(values, values[1:])), (key, values)
    assert curve.sparsity[-1] > 0.5  # local attention: most tiles carry almost nothing
    single = diagnostics.tile_stats(w, 0.05, 512, 512, 64)
    assert curve.sparsity[4] == single.total_sparsity
    assert "negl_prob" in curve.table() and len(curve.table().splitlines()) == len(grid) + 1


def test_estimated_speedup_model():
    assert diagnostics.estimated_speedup(1.0) == pytest.approx(1.0)
    assert diagnostics.estimated_speedup(0.0, fixed_share=0.05) == pytest.approx(20.0)
    assert diagnostics.estimated_speedup(0.5, fixed_share=0.0) == pytest.approx(2.0)


def test_tile_stats_rejects_a_missing_or_mismatched_tile_mass():
    with pytest.raises(ValueError, match="tile_mass"):
        diagnostics.tile_stats(torch.empty(1, 2, 0, 0), 0.1, 64, 128, 64)
    with pytest.raises(ValueError, match="seqlen_q"):
        diagnostics.tile_stats(torch.rand(1, 2, 3, 1), 0.1, 64, 128, 64)


def test_verbose_rate_limit_and_last_call(monkeypatch, caplog):
    q, k, v = local_qkv(1, 256, 2, 2, 64, torch.float32, sharpness=8.0)
    monkeypatch.setenv("BACK_LITE_VERBOSE", "1")
    monkeypatch.setenv("BACK_LITE_VERBOSE_EVERY", "3")
    monkeypatch.setattr(diagnostics, "_calls_seen", 0)
    attn = back_lite.BackLite(negl_prob=0.05)
    with caplog.at_level(logging.INFO, logger="back_lite"):
        for _ in range(7):
            attn(q, k, v, causal=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "back_lite"]
    assert len(lines) == 3  # calls 1, 4 and 7
    assert "[call 7, 1 in 3 logged]" in lines[-1]
    for part in ("q=(1, 256, 2, 64)", "backend=cpu", "kept tiles", "backward sparsity=",
                 "dropped mass=", "worst row tile", "FLOPs saved", "tile mass: top tile"):
        assert part in lines[0], part
    # the last call's figures are those of its W, per (batch, head)
    _, _, w = back_lite.forward(q, k, v, causal=True, with_stats=True)
    stats = diagnostics.last_call()
    want = diagnostics.tile_stats(w, 0.05, 256, 256, 64, causal=True)
    assert torch.equal(stats.kept_tiles, want.kept_tiles)
    assert torch.equal(stats.dropped_mass_worst, want.dropped_mass_worst)
    assert diagnostics.last_call(0.2).total_sparsity >= stats.total_sparsity
    # an unparsable rate falls back to every call
    monkeypatch.setenv("BACK_LITE_VERBOSE_EVERY", "often")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="back_lite"):
        attn(q, k, v)
        attn(q, k, v)
    assert len([r for r in caplog.records if r.name == "back_lite"]) == 2


class _TwoAttn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = back_lite.BackLite(0.0)
        self.b = back_lite.BackLite(0.1)

    def forward(self, q, k, v):
        return self.b(self.a(q, k, v), k, v, causal=True)


def test_watch_records_every_module_call_without_changing_results():
    model = _TwoAttn()
    q, k, v = local_qkv(1, 200, 2, 2, 64, torch.float32, sharpness=8.0)
    plain = model(q, k, v)
    with diagnostics.watch(model) as rec:
        watched = model(q, k, v)
    assert torch.equal(plain, watched)
    assert [r.name for r in rec.calls] == ["a", "b"]
    assert [r.negl_prob for r in rec.calls] == [0.0, 0.1]
    _, _, w_a = back_lite.forward(q, k, v, with_stats=True)
    assert torch.equal(rec.calls[0].tile_mass, w_a)  # recorded although negl_prob == 0
    assert rec.calls[1].causal and not rec.calls[0].causal
    assert diagnostics.last_call_record() is rec.calls[1]
    assert set(rec.by_module()) == {"a", "b"}
    table = rec.table()
    assert "a q=(1, 200, 2, 64) negl_prob=0.0: dense backward" in table
    assert "b q=(1, 200, 2, 64) negl_prob=0.1: tile mass" in table
    # the hooks are gone afterwards
    n = len(rec.calls)
    model(q, k, v)
    assert len(rec.calls) == n
