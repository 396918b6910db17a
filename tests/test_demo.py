"""python -m back_lite.demo runs end to end (tiny shape) and prints its table."""
import time

import back_lite.demo as demo


def test_demo_small_cpu(capsys):
    demo.main(["--device", "cpu", "--seqlen", "512", "--heads", "2", "--head-dim", "64",
               "--repeats", "1", "--warmup", "0", "--negl-probs", "0.05", "0.2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("BackLite") and "backend CPU" in lines[0]
    rows = [line.split() for line in lines if line.startswith(("video", "peaky"))]
    assert [r[0] for r in rows] == ["video", "video", "peaky", "peaky"]
    for r in rows:
        sparsity = float(r[2].rstrip("%"))
        cosines = [float(x) for x in r[6:9]]
        assert 0.0 <= sparsity <= 100.0
        assert all(0.5 < c <= 1.0 + 1e-9 for c in cosines)
    # the local video input is sparser at the larger negl_prob
    assert float(rows[1][2].rstrip("%")) > float(rows[0][2].rstrip("%"))


def test_timer_pair_alternates():
    # each round swaps which call goes first, so that drift does not favour one of them
    calls = []
    timer = demo.Timer(demo.torch.device("cpu"), repeats=4, warmup=1)
    t_a, t_b, ratio = timer.pair(lambda: (calls.append("a"), time.sleep(0.001)),
                                 lambda: (calls.append("b"), time.sleep(0.001)))
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert t_a > 0 and t_b > 0 and ratio > 0
