"""bench/sparse_cost_fit.py, the two-number model of a sparse backward's time (kept tiles dearer
by delta, plus a fixed share), on rows made from known numbers: the fit must give them back."""
import pytest

from script_loader import load_script


def load():
    return load_script("bench/sparse_cost_fit.py")


def test_fit_recovers_the_model():
    m = load()
    delta, fixed = 0.044, 0.046
    rows = [(k, k * (1 + delta) + (1 - k) * fixed) for k in (0.5, 0.25, 0.1, 0.03, 0.008)]
    d, f, worst = m.fit(rows)
    assert d == pytest.approx(delta, abs=1e-12)
    assert f == pytest.approx(fixed, abs=1e-12)
    assert worst < 1e-12


def test_fit_reports_what_the_model_misses():
    m = load()
    rows = [(0.5, 0.51), (0.25, 0.27), (0.1, 0.15)]  # not of the model's form
    _, _, worst = m.fit(rows)
    assert worst > 0.001


def test_rows_come_from_random_masks_below_one():
    m = load()
    result = {"sparse": [
        {"source": "random mask", "kept": 1.0, "vs_dense": 1.0},
        {"source": "random mask", "kept": 0.5, "vs_dense": 0.51},
        {"source": "video W, negl_prob=0.05", "kept": 0.7, "vs_dense": 0.72},
        {"source": "random mask", "kept": 0.1, "vs_dense": 0.12},
    ]}
    assert m.shape_rows(result) == [(0.5, 0.51), (0.1, 0.12)]


def test_one_kept_fraction_is_not_enough():
    m = load()
    with pytest.raises(ValueError):
        m.fit([(0.5, 0.51)])
