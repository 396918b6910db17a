"""back_lite.calibrate: the search finds the known answer, meets its target on held-out batches,
round-trips through JSON, plots a PNG, and the CLI runs end to end (CPU backend)."""
import json
import math
import os
import struct
import subprocess
import sys

import pytest
import torch

import back_lite
from inputs import local_qkv, random_qkv

cal = sys.modules["back_lite.calibrate"]  # back_lite.calibrate is the function
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TOY_GRID = (8, 4, 16)  # 512 tokens: 8 row tiles x 4 key tiles


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE, "not a PNG file"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_bisect_grid_finds_every_threshold_in_log_probes():
    for num in (1, 2, 7, 23):
        for threshold in range(-1, num):
            calls = []

            def passes(i):
                calls.append(i)
                return i <= threshold

            assert cal.bisect_grid(num, passes) == threshold
            assert len(calls) <= math.ceil(math.log2(num + 1))


def test_default_grid_is_log_spaced():
    grid = cal.default_grid(1e-4, 0.5, 6)
    assert grid[0] == pytest.approx(1e-4) and grid[-1] == pytest.approx(0.5)
    ratios = [b / a for a, b in zip(grid, grid[1:])]
    assert max(ratios) == pytest.approx(min(ratios))
    with pytest.raises(ValueError, match="high"):
        cal.default_grid(0.1, 1.0)


class _Uniform(torch.nn.Module):
    """q = 0: every query spreads its probability evenly over Sk = 512 keys, so each of the
    Tn = 4 key tiles holds exactly a quarter of every row tile's mass. Selection keeps every tile
    while negl_prob <= 1/4 and drops a whole key tile above it, which costs dv a quarter of its
    rows: the answer of any strict target is the largest grid value below 1/4."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.q = torch.nn.Parameter(torch.zeros(1, 128, 2, 32))
        self.k = torch.nn.Parameter(torch.randn(1, 512, 2, 32, generator=gen))
        self.v = torch.nn.Parameter(torch.randn(1, 512, 2, 32, generator=gen))
        self.attn = back_lite.BackLite(0.0)

    def forward(self, x):
        return self.attn(self.q * x, self.k, self.v)


@pytest.mark.parametrize("scan", [False, True])
def test_search_finds_the_known_answer(scan):
    model = _Uniform()
    grid = [0.05, 0.1, 0.2, 0.24, 0.26, 0.3, 0.45]
    result = back_lite.calibrate(model, [torch.ones(())], grid=grid, target_cosine=0.99,
                                 scan=scan, progress=False)
    assert result.negl_prob == 0.24
    assert result.per_layer == {"attn": 0.24}
    assert model.attn.negl_prob == 0.0  # restored; apply() sets it
    result.apply(model)
    assert model.attn.negl_prob == 0.24
    probed = {max(e["negl_prob"].values()): e for e in result.evaluations}
    assert len(probed) == (len(grid) if scan else len(result.evaluations))
    assert not probed[0.26]["passed"]  # the next value up was probed and failed
    assert result.confidence["*"]["batches_passing_next"] == 0
    # above 1/4 a whole key tile is skipped: the gradient is visibly wrong, not marginally
    assert probed[0.26]["fidelity"][0]["inputs"]["attn"]["cosine"] < 0.95
    if scan:
        # 0.05 .. 0.24 all keep every tile, and 0.26 .. 0.45 all drop one of the four, so those
        # probes reuse the first backward of their group instead of running their own
        reused = [e for e in result.evaluations if "same_tiles_as" in e]
        assert {max(e["negl_prob"].values()) for e in reused} == {0.1, 0.2, 0.24, 0.3, 0.45}
        assert probed[0.24]["margins"] == probed[0.05]["margins"]


def test_search_with_no_passing_value_keeps_the_dense_backward():
    result = back_lite.calibrate(_Uniform(), [torch.ones(())], grid=[0.3, 0.5],
                                 target_cosine=0.99, progress=False)
    assert result.negl_prob == 0.0 and result.per_layer == {"attn": 0.0}


def test_loss_function_mode_matches_module_mode():
    model = _Uniform()
    proj = torch.randn(1, 128, 2, 32, generator=torch.Generator().manual_seed(3))

    def loss(batch):
        return (model(batch) * proj).sum()

    grid = [0.1, 0.24, 0.3]
    by_fn = back_lite.calibrate(loss, [torch.ones(())], modules=model, on=("inputs",),
                                grid=grid, progress=False)
    by_module = back_lite.calibrate(model, [torch.ones(())], lambda m, b: loss(b),
                                    on=("inputs",), grid=grid, progress=False)
    assert by_fn.negl_prob == by_module.negl_prob == 0.24
    with pytest.raises(ValueError, match="modules="):
        back_lite.calibrate(loss, [torch.ones(())], grid=grid)
    with pytest.raises(ValueError, match="params"):
        back_lite.calibrate(loss, [torch.ones(())], modules=model, grid=grid)


def test_argument_errors():
    with pytest.raises(ValueError, match="no BackLite module"):
        back_lite.calibrate(torch.nn.Linear(2, 2), [torch.ones(2)])
    with pytest.raises(ValueError, match="grid"):
        back_lite.calibrate(_Uniform(), [torch.ones(())], grid=[0.3, 0.2])
    with pytest.raises(ValueError, match="target"):
        back_lite.calibrate(_Uniform(), [torch.ones(())], target_cosine=None)
    with pytest.raises(ValueError, match="on must"):
        back_lite.calibrate(_Uniform(), [torch.ones(())], on=("weights",))


def _grads_of(model, batch, negl_prob):
    """Independent of calibrate's own capture: the loss's gradients w.r.t. every BackLite call's
    q, k, v, with every module at negl_prob."""
    inputs, handles = [], []
    modules = [m for m in model.modules() if isinstance(m, back_lite.BackLite)]
    saved = [m.negl_prob for m in modules]
    try:
        for m in modules:
            m.negl_prob = negl_prob
            handles.append(m.register_forward_pre_hook(
                lambda mod, args: inputs.extend(args[:3])))
        loss = cal.mse_loss(model, batch)
    finally:
        for m, value in zip(modules, saved):
            m.negl_prob = value
        for h in handles:
            h.remove()
    return torch.autograd.grad(loss, inputs)


def _worst_cosine(got, ref):
    return min(float(torch.nn.functional.cosine_similarity(g.double().flatten(),
                                                           r.double().flatten(), dim=0))
               for g, r in zip(got, ref))


@pytest.fixture(scope="module")
def toy():
    """A small real model (two attention blocks over a video-like token grid), 2 batches to
    calibrate on and 2 held-out ones, and the global calibration to cosine 0.99."""
    torch.manual_seed(0)
    model, batches, loss = cal.synthetic_problem(4, grid_shape=TOY_GRID, seed=1)
    grid = cal.default_grid(1e-3, 0.5, 3)
    result = back_lite.calibrate(model, batches[:2], loss, target_cosine=0.99, grid=grid,
                                 progress=False)
    return model, batches[:2], batches[2:], loss, result


def test_calibrated_value_meets_the_target_and_the_next_one_does_not(toy):
    model, train, _, _, result = toy
    grid = result.grid
    chosen = result.negl_prob
    assert chosen in grid, "the toy problem should allow some sparsity"
    refs = [_grads_of(model, b, 0.0) for b in train]
    at_chosen = [_worst_cosine(_grads_of(model, b, chosen), r) for b, r in zip(train, refs)]
    assert min(at_chosen) >= 0.99
    nxt = grid[grid.index(chosen) + 1]
    at_next = [_worst_cosine(_grads_of(model, b, nxt), r) for b, r in zip(train, refs)]
    assert min(at_next) < 0.99
    # and the sparsity there is real: the backward skips tiles
    assert result.curve["*"]["sparsity"][grid.index(chosen)] > 0.2


def test_calibrated_value_holds_on_held_out_batches(toy):
    model, _, held_out, loss, result = toy
    report = result.check(model, held_out, loss)
    assert report.passed, report.margins
    assert report.worst_cosine >= 0.99
    # the same through evaluate() with the value itself
    again = cal.evaluate(model, held_out, result.negl_prob, loss, target_cosine=0.99)
    assert again.margins == report.margins
    assert all(m.negl_prob == 0.0 for m in model.modules()
               if isinstance(m, back_lite.BackLite))  # evaluate restores the modules


def test_result_table_json_round_trip_and_apply(toy, tmp_path):
    model, _, _, _, result = toy
    path = tmp_path / "calib.json"
    result.save(str(path))
    loaded = cal.CalibrationResult.load(str(path))
    assert loaded.to_dict() == json.loads(path.read_text())
    assert loaded.negl_prob == result.negl_prob and loaded.per_layer == result.per_layer
    assert loaded.table() == result.table()
    table = str(result)
    assert "BackLite calibration (global)" in table and "confidence all layers:" in table
    assert f"{result.negl_prob:.4g}" in table
    loaded.apply(model)
    try:
        assert [m.negl_prob for m in model.modules() if isinstance(m, back_lite.BackLite)] == \
            [result.negl_prob] * 2
    finally:
        back_lite.CalibrationResult.from_dict(
            dict(loaded.to_dict(), per_layer={}, negl_prob=0.0)).apply(model)
    with pytest.raises(ValueError, match="unknown keys"):
        cal.CalibrationResult.from_dict(dict(result.to_dict(), bogus=1))


def test_plot_writes_a_png(toy, tmp_path):
    pytest.importorskip("matplotlib", reason="plot() needs matplotlib")
    import matplotlib.image
    _, _, _, _, result = toy
    path = result.plot(str(tmp_path / "calib.png"))
    width, height = _png_size(path)
    assert width >= 600 and height >= 200
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert float(pixels[..., :3].std()) > 0.01  # something was drawn


class _LocalAndBroad(torch.nn.Module):
    """Two attention layers on fixed inputs: one whose attention is local (most key tiles carry
    almost nothing), one on random inputs (mass spread over every key tile)."""

    def __init__(self):
        super().__init__()
        local = local_qkv(1, 512, 2, 2, 64, torch.float32, sharpness=8.0)
        broad = random_qkv(1, 512, 512, 2, 2, 64, torch.float32, seed=1)
        self.local_in = torch.nn.ParameterList(torch.nn.Parameter(t) for t in local)
        self.broad_in = torch.nn.ParameterList(torch.nn.Parameter(t) for t in broad)
        self.local = back_lite.BackLite(0.0)
        self.broad = back_lite.BackLite(0.0)

    def forward(self, x):
        return self.local(*self.local_in) * x + self.broad(*self.broad_in)


def test_per_layer_calibrates_each_layer_on_its_own():
    model = _LocalAndBroad()
    grid = cal.default_grid(1e-3, 0.5, 3)
    result = back_lite.calibrate(model, [torch.ones(())], target_cosine=0.99, grid=grid,
                                 per_layer=True, on=("inputs",), progress=False)
    assert result.mode == "per_layer"
    local, broad = result.per_layer["local"], result.per_layer["broad"]
    # The broad layer's mass is spread evenly over its 4 key tiles, so selection drops nothing
    # until negl_prob nears 1/4: it tolerates a large negl_prob but gains no sparsity from it.
    # The local layer skips most tiles at a small negl_prob and must stop there.
    assert broad > 0.2 > local > 0.0
    assert result.curve["broad"]["sparsity"][grid.index(broad)] == 0.0
    assert result.curve["local"]["sparsity"][grid.index(local)] > 0.4
    assert result.negl_prob == min(result.per_layer.values())
    assert result.joint is not None and result.joint["passed"]
    table = result.table()
    assert "local" in table and "broad" in table and "joint (all layers)" in table


def test_cli_runs_end_to_end(tmp_path):
    pytest.importorskip("matplotlib", reason="the CLI plot needs matplotlib")
    out = tmp_path / "out"
    repo = os.path.dirname(os.path.dirname(back_lite.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [repo, os.environ.get("PYTHONPATH", "")]), BACK_LITE_LIBRARY=back_lite.library_path)
    res = subprocess.run(
        [sys.executable, "-m", "back_lite.calibrate", "--out", str(out), "--frames", "4x4x16",
         "--batches", "2", "--grid", "1e-3,0.3,2", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "BackLite calibration (global)" in res.stdout
    assert "RuntimeWarning" not in res.stderr
    table = (out / "table.txt").read_text()
    assert table.strip() == res.stdout.strip()
    data = json.loads((out / "calibration.json").read_text())
    assert data["mode"] == "global" and 0.0 <= data["negl_prob"] < 1.0
    width, height = _png_size(str(out / "calibration.png"))
    assert width > 0 and height > 0


def test_optional_extras_missing_give_a_clear_error(monkeypatch, tmp_path):
    result = back_lite.calibrate(_Uniform(), [torch.ones(())], grid=[0.1, 0.3], progress=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match="needs tqdm"):
        back_lite.calibrate(_Uniform(), [torch.ones(())], grid=[0.1, 0.3], progress=True)
    # progress=None (the default) runs without a bar when tqdm is missing
    assert back_lite.calibrate(_Uniform(), [torch.ones(())], grid=[0.1, 0.3]).negl_prob == 0.1
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="needs matplotlib"):
        result.plot(str(tmp_path / "x.png"))
