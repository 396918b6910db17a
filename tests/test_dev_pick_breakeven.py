"""dev/cuda/pick_breakeven.py: the expected entry totals of the dev checker's random masks and
the packed entry's cost constant from two call times."""
import math

import pytest

from script_loader import load_script


def load():
    return load_script("dev/cuda/pick_breakeven.py")


def test_packed_count_matches_the_device_rule():
    m = load()
    # bl_bwd_packed_count: ceil(64 c / 80), one padding entry for an empty column
    assert [m.packed_count(c) for c in range(7)] == [1, 1, 2, 3, 4, 4, 5]
    for c in range(1, 300):
        assert m.packed_count(c) == math.ceil(64 * c / 80)


def test_totals_of_a_full_mask_are_exact():
    m = load()
    kept, packed = m.expected_totals(1024, 3, False, 1.0)
    assert kept == 3 * 16 * 8            # every (head, row tile, key tile)
    assert packed == 3 * 8 * math.ceil(16 * 64 / 80)
    kept_c, _ = m.expected_totals(1024, 3, True, 1.0)
    assert kept_c == 3 * sum(16 - 2 * n for n in range(8))  # the causal mask's allowed tiles


def test_binomial_mean():
    m = load()
    kept, _ = m.expected_totals(16384, 2, False, 0.1)
    assert kept == pytest.approx(2 * 256 * 128 * 0.1, rel=1e-9)


def test_breakeven_is_the_measured_ratio():
    m = load()
    kept, packed = m.expected_totals(4096, 4, True, 0.2)
    # times proportional to the totals at 64 and 80 per entry give back 80
    _, _, cost = m.breakeven(4096, 4, True, 0.2, 64 * kept / 1000, 80 * packed / 1000)
    assert cost == pytest.approx(80.0)

