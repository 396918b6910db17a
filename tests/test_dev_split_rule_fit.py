"""dev/cuda/split_rule_fit.py: the host's part count, and the scores recorded from the sweeps."""
from types import SimpleNamespace

import pytest
from script_loader import ROOT, load_script

S78 = "bench/results/bwd-s78-split-sweep.txt:new=0,f1=1,f2=2,f3=3"
S79 = ("bench/results/bwd-s79-split-sweep.txt:new=0,f1=1,f2=2:1,8192,32,128=8;1,16384,16,128=4;"
       "1,16384,32,128=4;1,32768,16,128=2;1,8192,48,128=6")


def load():
    return load_script("dev/cuda/split_rule_fit.py", siblings=True)


def test_host_parts_follow_the_host_rule():
    m = load()
    # bl_bwd_head_split at head dim 128 with a causal mask: 8 parts below ~172 columns, 4 from
    # there to 4 rounds of the SMs, none past them or without a group to split
    assert m.host_parts(128, 8) == 8
    assert m.host_parts(256, 8) == 4
    assert m.host_parts(512, 4) == 4
    assert m.host_parts(4 * m.SMS, 8) == 1
    assert m.host_parts(128, 1) == 1
    assert m.host_parts(128, 2) == 2  # at most G parts


def test_fewer_parts_win_as_the_kept_share_falls():
    m = load()
    kw = dict(C=512, E=512, G=4, te=1.93, tail=0.5, head=0.2, part=0.08)
    cost = {f: {p: m.model(f, p, **kw) for p in (1, 2, 4)} for f in (1.0, 0.01)}
    assert min(cost[1.0], key=cost[1.0].get) == 2
    assert min(cost[0.01], key=cost[0.01].get) == 1


def test_recorded_sweeps_score_as_noted():
    """The losses quoted in bwd_prepost_sm90.cu and bwd-s79-split-sweep.txt, from the committed
    summary lines."""
    m = load()
    rows = m.load(SimpleNamespace(sweeps=[str(ROOT / S78), str(ROOT / S79)]))
    assert len(rows) == 85
    shipped = dict(te=1.93, tail=0.5, head=0.2, part=0.08, max_cols=4 * m.SMS)
    s78 = dict(shipped, tail=0.4, max_cols=2 * m.SMS)
    host = dict(te=1.0, tail=0.0, head=0.0, part=0.0, max_cols=-1)
    assert m.score(rows, **shipped) == pytest.approx((343.7, 48.2, 20), abs=0.05)
    assert m.score(rows, **s78)[0] == pytest.approx(2295.8, abs=0.05)
    assert m.score(rows, **host)[0] == pytest.approx(3656.1, abs=0.05)
