"""The BackLite module, the package surface, BACK_LITE_VERBOSE and the library loader."""
import logging
import os
import subprocess
import sys

import pytest
import torch

import back_lite
from back_lite import BackLite
from inputs import local_qkv, random_qkv


def test_package_surface():
    assert back_lite.version == back_lite.__version__ == "0.1.0"
    assert back_lite.library_version == back_lite.version
    assert back_lite.tile_shape() == (64, 128)
    assert back_lite.num_tiles(65, 129) == (2, 2)
    assert back_lite.backend_available("cpu")
    assert isinstance(back_lite.backend_available("cuda"), bool)
    assert "negl_prob=0.05" in repr(BackLite())


def test_module_outputs_and_lse():
    q, k, v = random_qkv(2, 90, 100, 4, 2, 64, torch.bfloat16)
    attn = BackLite(negl_prob=0.1)
    out = attn(q, k, v, causal=True)
    out2, lse = attn(q, k, v, causal=True, return_softmax_lse=True)
    f_out, f_lse, _ = back_lite.forward(q, k, v, causal=True)
    assert torch.equal(out, f_out) and torch.equal(out2, f_out) and torch.equal(lse, f_lse)
    assert not lse.requires_grad


def test_module_fills_tile_stats_even_when_dense():
    q, k, v = random_qkv(1, 130, 300, 2, 2, 64, torch.float16)
    tm, tn = back_lite.num_tiles(130, 300)
    stats = torch.full((1, 2, tm, tn), -1.0)
    for negl_prob in (0.0, 0.2):
        stats.fill_(-1.0)
        BackLite(negl_prob)(q, k, v, tile_stats=stats)
        _, _, w = back_lite.forward(q, k, v, with_stats=True)
        assert torch.equal(stats, w)


def test_attention_tile_mass_output():
    q, k, v = random_qkv(1, 65, 65, 2, 2, 64, torch.float32)
    _, _, w_dense = back_lite.attention(q, k, v, negl_prob=0.0)
    assert w_dense.shape == (1, 2, 0, 0)
    _, _, w = back_lite.attention(q, k, v, negl_prob=0.1)
    assert w.shape == (1, 2, 2, 1) and not w.requires_grad


def test_sparsity_helpers():
    # causal, Sq = Sk = 256: row tile m (64 rows) reaches key tile n (128 keys) iff n*128 <= 64m+63
    comp = back_lite.computable_tiles(256, 256, causal=True)
    assert comp.tolist() == [[True, False], [True, False], [True, True], [True, True]]
    mask = torch.zeros(1, 1, 4, 2, dtype=torch.bool)
    mask[..., 0] = True
    assert back_lite.backward_sparsity(mask, 256, 256, causal=True) == pytest.approx(2 / 6)
    assert back_lite.backward_sparsity(mask, 256, 256, causal=False) == pytest.approx(0.5)


def test_verbose_logs_one_line_per_call(monkeypatch, caplog):
    q, k, v = local_qkv(1, 512, 2, 2, 64, torch.float32, sharpness=8.0)
    monkeypatch.setenv("BACK_LITE_VERBOSE", "1")
    with caplog.at_level(logging.INFO, logger="back_lite"):
        BackLite(negl_prob=0.1)(q, k, v)
        BackLite(negl_prob=0.0)(q, k, v)
    lines = [r.getMessage() for r in caplog.records if r.name == "back_lite"]
    assert len(lines) == 2
    assert "q=(1, 512, 2, 64)" in lines[0] and "backend=cpu" in lines[0]
    assert "backward sparsity=" in lines[0] and "dropped mass=" in lines[0]
    assert "dense backward" in lines[1]
    monkeypatch.delenv("BACK_LITE_VERBOSE")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="back_lite"):
        BackLite(negl_prob=0.1)(q, k, v)
    assert not [r for r in caplog.records if r.name == "back_lite"]


def _import_in_subprocess(env_lib):
    env = dict(os.environ, BACK_LITE_LIBRARY=env_lib)
    return subprocess.run([sys.executable, "-c", "import back_lite"], env=env,
                          capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(back_lite.__file__)))


def test_loader_reports_a_missing_library(tmp_path):
    missing = str(tmp_path / "nowhere" / "libbacklite.so")
    res = _import_in_subprocess(missing)
    assert res.returncode != 0
    assert "BackLiteLibraryError" in res.stderr and missing in res.stderr
    assert "pip install ." in res.stderr


def test_loader_rejects_a_file_that_is_not_the_library(tmp_path):
    bogus = tmp_path / "libbacklite.so"
    bogus.write_bytes(b"not a shared object")
    res = _import_in_subprocess(str(bogus))
    assert res.returncode != 0
    assert "could not load it" in res.stderr and str(bogus) in res.stderr
