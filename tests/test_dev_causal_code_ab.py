"""dev/cuda/causal_code_ab.py: the premise of the probe -- a mask of tiles strictly below the
diagonal gives the same gradients with and without the causal flag -- checked on the CPU backend,
and its tile sets against the library's computable tiles."""
import torch

import back_lite.functional as blf
from script_loader import load_script


def load():
    return load_script("dev/cuda/causal_code_ab.py")


def test_below_diagonal_tiles_are_computable_and_see_every_key():
    m = load()
    s = 1000  # not a multiple of either tile size
    tile_m, tile_n = blf.tile_shape("cpu")
    tm, tn = blf.num_tiles(s, s, "cpu")
    below = m.below_diagonal(tm, tn, tile_m, tile_n, "cpu")
    computable = blf.computable_tiles(s, s, True, "cpu")
    assert below.shape == computable.shape
    assert not (below & ~computable).any()
    assert below.any() and (computable & ~below).any()  # the diagonal tiles are left out
    for i, j in below.nonzero().tolist():
        # every key of tile j is visible to the first query of tile i (j <= i with Sq == Sk)
        assert tile_n * (j + 1) - 1 <= tile_m * i


def test_random_share_keeps_only_allowed_tiles_at_about_the_share():
    m = load()
    allowed = torch.zeros(40, 30, dtype=torch.bool)
    allowed[10:, :20] = True
    mask = m.random_share(allowed, 2, 3, 0.3, seed=5)
    assert mask.shape == (2, 3, 40, 30)
    assert not (mask & ~allowed).any()
    share = float(mask.sum()) / (6 * int(allowed.sum()))
    assert 0.25 < share < 0.35
    assert torch.equal(mask, m.random_share(allowed, 2, 3, 0.3, seed=5))  # seeded


def test_causal_flag_changes_nothing_on_below_diagonal_tiles():
    m = load()
    torch.manual_seed(0)
    b, s, h, d = 1, 700, 2, 64
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse, _ = blf.forward(q, k, v, causal=True, with_stats=False)
    tile_m, tile_n = blf.tile_shape("cpu")
    tm, tn = blf.num_tiles(s, s, "cpu")
    mask = m.random_share(m.below_diagonal(tm, tn, tile_m, tile_n, "cpu"), b, h, 0.6, seed=1)
    assert mask.any()
    ga = blf.backward(dout, q, k, v, out, lse, mask=mask, causal=True)
    gb = blf.backward(dout, q, k, v, out, lse, mask=mask, causal=False)
    for x, y in zip(ga, gb):
        assert x.abs().max() > 0
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    # and a mask with a diagonal tile does change the gradients (the check can fail)
    diag = mask.clone()
    diag[..., tm - 1, tn - 1] = True
    gc = blf.backward(dout, q, k, v, out, lse, mask=diag, causal=True)
    gd = blf.backward(dout, q, k, v, out, lse, mask=diag, causal=False)
    assert any((x - y).abs().max() > 1e-3 for x, y in zip(gc, gd))
