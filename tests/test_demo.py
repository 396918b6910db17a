"""python -m back_lite.demo runs end to end (tiny shape) and prints its table."""
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
