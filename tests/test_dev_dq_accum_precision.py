"""dev/cuda/dq_accum_precision.py: the emulation behind the 16-bit dq accumulator study -- its
parts sum to the reference dq, one entry rounds the same in both accumulators, and the 16-bit one
really rounds after every add (else the study would compare a thing with itself)."""
import math

import torch

import reference as ref
from inputs import random_qkv
from script_loader import load_script


def setup(seqlen_k=512, kept=None, seed=0):
    m = load_script("dev/cuda/dq_accum_precision.py")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = random_qkv(1, 128, seqlen_k, 2, 2, 32, torch.bfloat16, seed=seed)
    dout = torch.randn(q.shape, generator=gen).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(32)
    parts, out = m.kernel_parts(q, k, v, dout, scale)
    tiles_n = -(-seqlen_k // m.TILE_N)
    mask = m.tile_masks(2, 2, tiles_n, kept if kept is not None else tiles_n, gen)
    want = ref.backward(q, k, v, out, dout, scale, False, mask, (m.TILE_M, m.TILE_N))[0]
    acc32, acc16 = m.accumulate(parts, mask, torch.bfloat16, gen)
    return m, mask, want, acc32, acc16


def test_parts_sum_to_the_reference_dq():
    m, _, want, acc32, _ = setup()
    assert acc32.shape == want.shape
    # the kernel's bf16 dS and one final rounding: a few bf16 ulps, far from a wrong sum
    assert m.rel_rms(acc32, want) < 1e-2


def test_one_entry_rounds_once_in_both():
    _, mask, _, acc32, acc16 = setup(kept=1)
    assert int(mask.sum(-1).max()) == 1
    assert torch.equal(acc32, acc16)


def test_the_16_bit_sum_rounds_after_every_add():
    m, _, want, acc32, acc16 = setup(seqlen_k=2048)  # 16 entries a row tile
    assert not torch.equal(acc32, acc16)
    assert m.rel_rms(acc16, want) > 1.2 * m.rel_rms(acc32, want)


def test_tile_masks_keep_exactly_k_tiles_per_row_tile():
    m = load_script("dev/cuda/dq_accum_precision.py")
    mask = m.tile_masks(3, 5, 16, 4, torch.Generator().manual_seed(1))
    assert mask.shape == (1, 3, 5, 16)
    assert torch.equal(mask.sum(-1), torch.full((1, 3, 5), 4))


def test_probe_check_runs_on_the_cpu_backend(monkeypatch, capsys):
    """dev/cuda/dq16_probe_check.py (a device tool) on the CPU backend's small shapes: its masks,
    entry counts and criterion against the reference, with the shipped fp32 accumulation."""
    m = load_script("dev/cuda/dq16_probe_check.py")
    monkeypatch.setattr("sys.argv", ["dq16_probe_check.py", "--device", "cpu", "--small"])
    assert m.main() == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| (")]
    assert len(rows) == 3 and all(row.endswith("| yes |") for row in rows)
