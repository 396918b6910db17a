"""dev/cuda/split_order_model.py: records per part, the orders, the walk and the video W."""
import torch

from script_loader import load_script


def load():
    return load_script("dev/cuda/split_order_model.py")


def test_part_counts_group_heads_by_kv_head_and_part():
    m = load()
    mask = torch.zeros(1, 4, 3, 2, dtype=torch.bool)  # (B, H, Tm, Tn): 4 q heads on 1 kv head
    mask[0, 0, :, 0] = True   # head 0 (part 0): 3 tiles of key tile 0
    mask[0, 3, 1, 1] = True   # head 3 (part 1): 1 tile of key tile 1
    counts = m.part_counts(mask, hk=1, parts=2)
    assert counts.tolist() == [[3, 0], [0, 1]]  # (columns, parts)


def test_every_order_draws_each_record_once():
    m = load()
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (300, 4), generator=gen)
    recs = m.orders(counts, window=2 * m.CTAS)
    reference = sorted(recs["lpt"])
    for name in m.ORDERS:
        assert sorted(recs[name]) == reference, name


def test_library_order_is_part_major_by_whole_column_count():
    m = load()
    counts = torch.tensor([[1, 5], [4, 4], [2, 0]])  # whole counts 6, 8, 2
    cost = lambda c: m.COST_RECORD_US + m.COST_ENTRY_US * c  # noqa: E731
    expected = [cost(x) for x in (4, 1, 2, 4, 5, 0)]  # part 0 of columns 1, 0, 2, then part 1
    assert m.orders(counts, window=3)["library"] == expected


def test_walk_of_equal_records_is_whole_rounds():
    m = load()
    assert m.walk([2.0] * (m.CTAS + 1)) == (4.0, 2.0)  # one record in a second round
    assert m.walk([2.0] * m.CTAS) == (2.0, 0.0)


def test_video_w_rows_carry_their_softmax_mass():
    m = load()
    w = m.video_w(1, 256, 2, 64, 1, causal=True)  # (B, H, Tm, Tn) = (1, 2, 4, 2)
    assert w.shape == (1, 2, 4, 2)
    # every query's probabilities sum to 1: a row tile's W sums to its 64 rows
    assert torch.allclose(w.sum(-1), torch.full((1, 2, 4), 64.0), rtol=1e-4)
    assert w[0, :, 0, 1].abs().max() == 0  # rows 0..63 see no key of tile 1 under the mask
