"""back_lite.tuning.FidelityController: moves negl_prob in the right direction, checks only every
K steps, leaves .grad alone (CPU backend, small toy model)."""
import sys

import pytest

import back_lite
from back_lite.tuning import FidelityController

cal = sys.modules["back_lite.calibrate"]
TOY_GRID = (4, 4, 16)  # 256 tokens: 4 row tiles x 2 key tiles


@pytest.fixture(scope="module")
def toy():
    model, batches, loss = cal.synthetic_problem(2, grid_shape=TOY_GRID, seed=2)
    return model, batches, loss


def _values(model):
    return [m.negl_prob for m in model.modules() if isinstance(m, back_lite.BackLite)]


def test_missed_target_lowers_negl_prob(toy):
    model, batches, loss = toy
    # at 0.3 whole key tiles are skipped, so a near-exact target is missed
    ctl = FidelityController(model, target_cosine=0.999999, every=1, loss_fn=loss,
                             negl_prob=0.3)
    check = ctl.step(batches[0])
    assert check is not None and min(check.margins.values()) < 0.0
    assert _values(model) == [0.15, 0.15]
    assert check.before == {"blocks.0.attn": 0.3, "blocks.1.attn": 0.3}
    # every later check moves the value the way its own margin says
    for _ in range(3):
        check = ctl.check(batches[0])
        name = "blocks.0.attn"
        margin, before, after = check.margins[name], check.before[name], check.after[name]
        if margin < 0:
            assert after == pytest.approx(before * ctl.decrease)
        elif margin > ctl.raise_margin:
            assert after == pytest.approx(before * ctl.increase)
        else:
            assert after == before
    assert max(_values(model)) < 0.3


def test_floor_and_dense_restart(toy):
    model, batches, loss = toy
    # a miss below min_negl falls back to the dense backward ...
    ctl = FidelityController(model, target_cosine=0.999999, every=1, loss_fn=loss,
                             negl_prob=0.3, min_negl=0.2)
    ctl.check(batches[0])
    assert _values(model) == [0.0, 0.0]
    # ... which meets any target exactly, so the next check steps back up to min_negl
    check = ctl.check(batches[0])
    assert min(check.margins.values()) == pytest.approx(1.0)
    assert _values(model) == [0.2, 0.2]


def test_comfortable_margin_raises_negl_prob_up_to_the_cap(toy):
    model, batches, loss = toy
    ctl = FidelityController(model, target_cosine=0.5, every=1, loss_fn=loss, negl_prob=0.01,
                             max_negl=0.014)
    check = ctl.step(batches[1])
    assert min(check.margins.values()) > ctl.raise_margin
    assert _values(model) == [pytest.approx(0.0125)] * 2
    ctl.step(batches[1])  # 0.0125 * 1.25 is past the cap
    assert _values(model) == [0.014, 0.014]


def test_margin_inside_the_band_holds(toy):
    model, batches, loss = toy
    # first measure the fidelity at 0.05, then set the target just below it: margin in (0, 0.5]
    probe = FidelityController(model, target_cosine=0.5, every=1, loss_fn=loss, negl_prob=0.05,
                               on=("inputs",))
    fid = probe.check(batches[0]).fidelity
    worst = min(f["cosine"] for f in fid["inputs"].values())
    assert worst < 1.0
    target = worst - 0.2 * (1.0 - worst)  # margin (worst - t) / (1 - t) = 1/6
    ctl = FidelityController(model, target_cosine=target, every=1, loss_fn=loss,
                             negl_prob=0.05, on=("inputs",))
    check = ctl.check(batches[0])
    assert 0.0 <= min(check.margins.values()) <= ctl.raise_margin
    assert _values(model) == [0.05, 0.05]


def test_checks_every_k_steps_without_touching_grad(toy):
    model, batches, loss = toy
    ctl = FidelityController(model, target_cosine=0.5, every=3, loss_fn=loss, negl_prob=0.01)
    ran = [ctl.step(batches[0]) is not None for _ in range(7)]
    assert ran == [False, False, True, False, False, True, False]
    assert len(ctl.history) == 2 and [c.step for c in ctl.history] == [3, 6]
    assert all(p.grad is None for p in model.parameters())
    state = ctl.state_dict()
    other = FidelityController(model, target_cosine=0.5, every=3, loss_fn=loss)
    other.load_state_dict(state)
    assert other.steps == 7 and other.negl_prob == state["negl_prob"]


def test_per_layer_nudges_each_layer_by_its_own_margin(toy):
    model, batches, loss = toy
    ctl = FidelityController(model, target_cosine=0.999999, every=1, loss_fn=loss,
                             per_layer=True, on=("inputs",), negl_prob=0.3)
    check = ctl.check(batches[0])
    assert set(check.margins) == {"blocks.0.attn", "blocks.1.attn"}
    for name, margin in check.margins.items():
        assert check.after[name] == (0.15 if margin < 0 else check.before[name] * 1.25
                                     if margin > ctl.raise_margin else 0.3)


def test_argument_errors(toy):
    model, _, loss = toy
    with pytest.raises(ValueError, match="every"):
        FidelityController(model, every=0, loss_fn=loss)
    with pytest.raises(ValueError, match="decrease"):
        FidelityController(model, decrease=1.5, loss_fn=loss)
    with pytest.raises(ValueError, match="min_negl"):
        FidelityController(model, min_negl=0.6, max_negl=0.5, loss_fn=loss)
