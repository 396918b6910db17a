"""Tile selection (back_lite.select) against the reference selection of DESIGN §1."""
import math

import pytest
import torch

import back_lite
import reference as ref


@pytest.mark.parametrize("negl_prob", [0.0, 1e-4, 0.05, 0.3, 0.9])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (1, 4, 16, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_select_matches_reference(negl_prob, shape):
    w = torch.rand(shape) ** 4  # skewed, so the cut falls at different places per row tile
    got = back_lite.select(w, negl_prob)
    assert got.dtype == torch.bool and got.shape == w.shape
    want, ambiguous = ref.select(w, negl_prob)
    assert torch.equal(got | ambiguous, want | ambiguous)


def test_select_ties_order_by_tile_index():
    # four equal tiles per row: with negl_prob 0.6 the first two (lowest n) go, the last two stay
    w = torch.full((1, 1, 1, 4), 0.25)
    assert back_lite.select(w, 0.6).tolist() == [[[[False, False, True, True]]]]
    # strictly less: the prefix whose sum reaches exactly negl_prob = 0.5 is not skipped whole
    assert back_lite.select(w, 0.5).tolist() == [[[[False, True, True, True]]]]


def test_select_negl_prob_zero_keeps_everything_with_mass():
    w = torch.rand(2, 2, 3, 5)
    assert torch.all(back_lite.select(w, 0.0))


def test_select_row_tile_without_mass_keeps_nothing():
    w = torch.rand(1, 2, 3, 4)
    w[0, 1, 2] = 0.0
    mask = back_lite.select(w, 0.1)
    assert not mask[0, 1, 2].any()
    assert mask[0, 0].any(dim=-1).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_select_non_finite_row_keeps_every_tile(bad):
    w = torch.rand(1, 1, 2, 6)
    w[0, 0, 1, 3] = bad
    mask = back_lite.select(w, 0.5)
    assert mask[0, 0, 1].all()
    assert not mask[0, 0, 0].all()  # the finite row tile is still selected normally


def test_select_skipped_mass_below_negl_prob():
    w = torch.rand(3, 2, 8, 16) ** 3
    for negl_prob in (0.01, 0.1, 0.5):
        mask = back_lite.select(w, negl_prob)
        share = (w.double() * ~mask).sum(-1) / w.double().sum(-1)
        assert torch.all(share < negl_prob)
