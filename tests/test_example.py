"""examples/train_video_dit.py at its tiny size: it trains, and writes its curves, tables and
gradient-fidelity figures; the attention-backward timer does not change the gradients."""
import csv
import math

import pytest
import torch

from script_loader import load_script

STEPS = 3


@pytest.fixture(scope="module")
def example():
    pytest.importorskip("matplotlib", reason="the example plots with matplotlib")
    return load_script("examples/train_video_dit.py")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_example_runs_and_writes_its_outputs(example, tmp_path):
    example.main(["--device", "cpu", "--size", "tiny", "--steps", str(STEPS), "--negl-probs",
                  "0.2", "--no-noise-run", "--checkpoints", "1.0", "--eval-every", str(STEPS),
                  "--out", str(tmp_path)])
    for name in ("loss.png", "results.md", "results.csv", "history.csv", "fidelity.csv",
                 "results.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = read_csv(tmp_path / "results.csv")
    assert [r["run"] for r in results] == ["dense", "negl_prob=0.2"]
    for r in results:
        for key in ("final_eval_loss", "tail_train_loss", "step_ms", "attn_bwd_ms"):
            assert math.isfinite(float(r[key])) and float(r[key]) > 0, (r["run"], key)

    history = read_csv(tmp_path / "history.csv")
    assert len(history) == 2 * STEPS
    dense = [r for r in history if r["run"] == "dense"]
    sparse = [r for r in history if r["run"] == "negl_prob=0.2"]
    # same seed: the same initial weights and batch, and the forward is exact in both runs
    assert float(dense[0]["loss"]) == float(sparse[0]["loss"])

    fidelity = read_csv(tmp_path / "fidelity.csv")
    assert [int(f["step"]) for f in fidelity] == [STEPS]
    f = fidelity[0]
    assert 0.0 <= float(f["sparsity"]) <= 1.0 and 0.0 <= float(f["dropped_mass"]) < 0.2
    for key in ("grad_cosine", "qkv_grad_cosine"):
        assert 0.5 < float(f[key]) <= 1.0 + 1e-9, key
    table = (tmp_path / "results.md").read_text()
    assert "| dense |" in table and "| negl_prob=0.2 |" in table


def test_timed_attention_keeps_the_gradients(example):
    size = example.SIZES["tiny"]
    torch.manual_seed(0)
    model = example.VideoDiT(**size, attn_dtype=torch.float32)
    for p in model.parameters():  # adaLN-Zero starts with no gradient through the attention
        if p.abs().max() == 0:
            torch.nn.init.normal_(p, std=0.02)
    gen = torch.Generator().manual_seed(0)
    videos, t, noise = example.draw_batch(1, size, gen, torch.device("cpu"))
    runs = []
    for timed in (False, True):
        clock = example.Clock(torch.device("cpu"))
        for attn in model.attentions():
            attn.negl_prob = 0.1
            attn.clock = clock if timed else None
        model.zero_grad(set_to_none=True)
        example.flow_loss(model, videos, t, noise, lambda: torch.autocast("cpu", enabled=False)) \
            .backward()
        runs.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if timed:
            assert clock.total_ms() > 0  # one span per layer was measured
    for name, grad in runs[0].items():
        assert torch.equal(grad, runs[1][name]), name
    assert runs[0]["blocks.0.attn.to_q.weight"].abs().max() > 0  # gradient through attention


def test_videos_move(example):
    gen = torch.Generator().manual_seed(0)
    videos = example.make_videos(4, 6, 32, 32, gen)
    assert videos.shape == (4, example.CHANNELS, 6, 32, 32)
    assert videos.min() >= -1.0 and videos.max() <= 1.0
    # something is drawn, and the frames differ (the shapes move)
    assert (videos != example.BACKGROUND).any()
    assert (videos[:, :, 0] != videos[:, :, -1]).any(dim=(1, 2, 3)).all()
