"""dev/cuda/bar_whatif.py: which `kept + 2%` rows a fixed saving per sparse call would turn."""
import pytest

from script_loader import load_script


def load():
    return load_script("dev/cuda/bar_whatif.py")


def row(kept, bwd_ms, dense_ms, source="random mask"):
    return {"source": source, "kept": kept, "bwd_ms": bwd_ms, "dense_ms": dense_ms}


def results():
    # bar at kept 0.1: 0.12 x 5.0 ms = 0.600 ms
    return [{"shape": [1, 16384, 16, 64], "causal": False,
             "sparse": [row(0.1, 0.610, 5.0), row(0.1, 0.590, 5.0)]},
            {"shape": [1, 16384, 16, 64], "causal": True,
             "sparse": [row(0.1, 0.610, 5.0)]},
            {"shape": [1, 4096, 16, 64], "causal": False,  # not a bar shape (S < 16384)
             "sparse": [row(0.1, 0.610, 5.0)]}]


def test_parse_saving():
    m = load()
    assert m.parse_saving("1,16384,16,64=17") == ((1, 16384, 16, 64), None, 17.0)
    assert m.parse_saving("2,16384,8,128,1:causal=5.5") == ((2, 16384, 8, 128, 1), True, 5.5)
    assert m.parse_saving("1,16384,16,64:nc=3")[1] is False
    with pytest.raises(ValueError, match="SHAPE"):
        m.parse_saving("1,16384,16,64")
    with pytest.raises(ValueError, match="causal or :nc"):
        m.parse_saving("1,16384,16,64:both=3")


def test_saving_turns_only_the_rows_it_reaches():
    m = load()
    base = m.whatif(results(), [])
    assert (base["before"], base["after"], base["of"]) == (1, 1, 3)  # the 4k shape not counted
    # 11 us off the non-causal rows: 0.599 ms meets the bar; the causal row stays out
    w = m.whatif(results(), [m.parse_saving("1,16384,16,64:nc=11")])
    assert (w["before"], w["after"]) == (1, 2)
    assert w["turned"] == [((1, 16384, 16, 64), False, "random mask", 0.1, False, True)]
    # a saving on both masks turns the causal row too
    assert m.whatif(results(), [m.parse_saving("1,16384,16,64=11")])["after"] == 3


def test_dense_too_tightens_the_bar():
    m = load()
    # 11 us off the call and off the dense reference: 0.599 / 4.989 = 0.12006 > 0.12
    w = m.whatif(results(), [m.parse_saving("1,16384,16,64:nc=11")], dense_too=True)
    assert w["after"] == 1
    # 50 us: 0.560 / 4.950 = 0.1131, inside
    w = m.whatif(results(), [m.parse_saving("1,16384,16,64:nc=50")], dense_too=True)
    assert w["after"] == 2
