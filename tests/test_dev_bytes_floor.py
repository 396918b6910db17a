"""dev/cuda/bytes_floor.py: the memory floor of a sparse backward call -- outputs in full, the
rows and columns of kept tiles read once."""
import torch

from script_loader import load_script


def load():
    return load_script("dev/cuda/bytes_floor.py")


def test_empty_mask_leaves_only_the_outputs():
    m = load()
    mask = torch.zeros(1, 4, 8, 4, dtype=torch.bool)
    f = m.floor_bytes(mask, 1, 512, 4, 2, 128)
    assert f["rows"] == 0 and f["cols"] == 0
    assert f["out"] == 512 * 4 * 128 * 2 + 2 * 512 * 2 * 128 * 2  # dq (4 heads) + dk, dv (2)


def test_one_tile_reads_its_row_tile_and_its_column():
    m = load()
    b, s, hq, hk, d = 1, 512, 4, 2, 64
    mask = torch.zeros(b, hq, 8, 4, dtype=torch.bool)
    mask[0, 3, 5, 2] = True  # query head 3 (kv head 1), row tile 5, key tile 2
    f = m.floor_bytes(mask, b, s, hq, hk, d)
    assert f["row_share"] == 1 / (hq * 8) and f["col_share"] == 1 / (hk * 4)
    row_tile = 64 * d * 2
    assert f["rows"] == 3 * row_tile + 64 * 4              # q, dO, out and lse of 64 rows
    assert f["cols"] == 2 * 128 * d * 2                     # K and V of 128 keys
