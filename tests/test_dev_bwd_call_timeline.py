"""dev/cuda/bwd_call_timeline.py's --shape: the bench's B,S,H,D[,HK] spelling (the seventy-eighth
session's A/B stopped on a five-number shape before this parsed it); its per-position statistics."""
import pytest

from script_loader import load_script


def parse():
    return load_script("dev/cuda/bwd_call_timeline.py").parse_shape


def test_four_numbers_take_kv_heads_from_the_option_or_h():
    assert parse()("1,16384,16,128") == (1, 16384, 16, 128, 16)
    assert parse()("2,16384,8,128", 1) == (2, 16384, 8, 128, 1)


def test_the_bench_five_number_shape_gives_the_kv_heads():
    assert parse()("2,16384,8,128,1") == (2, 16384, 8, 128, 1)
    assert parse()("2,16384,8,128,2", 2) == (2, 16384, 8, 128, 2)


@pytest.mark.parametrize("shape, kv, says", [
    ("2,16384,8,128,1", 2, "gives 1 kv heads, --kv-heads 2"),
    ("1,16384,6,128,4", 0, "4 kv heads do not divide the 6 query heads"),
    ("1,16384,16", 0, "'1,16384,16'"),
    ("1,16384,16,128,1,1", 0, "'1,16384,16,128,1,1'"),
])
def test_bad_shapes_stop_with_the_value(shape, kv, says):
    with pytest.raises(SystemExit) as e:
        parse()(shape, kv)
    assert says in str(e.value)


def test_position_stats_reads_starts_per_call():
    """Starts are read per call (the schedule at 3, 5 and 4 us after the lists kernel: median 4),
    gaps from the previous kernel's end; a call's extra kernels are left out."""
    stats = load_script("dev/cuda/bwd_call_timeline.py").position_stats
    calls = [[("lists", 100.0, 10.0), ("schedule", 103.0, 40.0), ("main", 143.0, 200.0)],
             [("lists", 500.0, 12.0), ("schedule", 505.0, 44.0), ("main", 549.0, 210.0),
              ("extra", 760.0, 1.0)],
             [("lists", 900.0, 11.0), ("schedule", 904.0, 42.0), ("main", 946.0, 205.0)]]
    rows, spans = stats(calls)
    assert [r[0] for r in rows] == ["lists", "schedule", "main"]  # the fewest kernels any call has
    assert rows[1] == ("schedule", 42.0, -7.0, 4.0)
    assert rows[2][3] == 46.0
    assert spans == [243.0, 259.0, 251.0]


def test_timeline_offsets_reads_the_start_column_or_chains_the_medians(tmp_path, capsys):
    """dev/cuda/timeline_offsets.py: a log with the start column takes it as printed (5.2, not
    the chained 11.3 - 6.3 = 5.0); a log without it chains duration and gap."""
    log = tmp_path / "timelines.txt"
    kernel = "  void bl_bwd_{}  {:.1f} us  gap {:.1f} us"
    log.write_text("\n".join([
        "== new round 1: shape 1,16384,16,128 --causal",
        "== keep 0.03: 9 calls, 2 kernels each",
        kernel.format("list_kernel<256>", 11.3, 0.0) + "  start 0.0 us",
        kernel.format("schedule_window_kernel<4>", 42.4, -6.3) + "  start 5.2 us",
        "  span median 50.0 us (min 50.0, max 50.0)",
        "== keep 0.5: 9 calls, 2 kernels each",
        kernel.format("list_kernel<256>", 11.3, 0.0),
        kernel.format("schedule_window_kernel<4>", 42.4, -6.3),
        "  span median 50.0 us (min 50.0, max 50.0)"]) + "\n")
    load_script("dev/cuda/timeline_offsets.py").main(str(log))
    lines = capsys.readouterr().out.splitlines()
    assert "schedule_win @  5.2" in lines[0]
    assert "schedule_win @  5.0" in lines[1]


@pytest.mark.parametrize("keep", [0.008, 0.03, 0.25])
def test_even_keeps_draw_the_plain_row_counts_from_even_key_tiles(keep):
    script = load_script("dev/cuda/bwd_call_timeline.py")
    even = script.even_tile_mask(1, 2, 16, 128, keep, "cpu")
    plain = script.random_tile_mask(1, 2, 16, 128, keep, "cpu")
    assert even.shape == plain.shape
    assert not even[..., 1::2].any()  # the odd key tiles (half the columns) empty
    assert (even.sum(-1) == plain.sum(-1)).all()  # the same tiles a row as the plain keep


@pytest.mark.parametrize("keep", [0.03, 0.25, 0.5])
def test_shared_rows_keep_whole_row_tiles_the_same_in_every_column(keep):
    script = load_script("dev/cuda/bwd_call_timeline.py")
    rows = script.shared_rows_mask(2, 3, 64, 32, keep, "cpu")
    assert rows.shape == (2, 3, 64, 32)
    assert (rows == rows[..., :1]).all()  # each row tile kept whole or not at all
    assert (rows[..., 0].sum(-1) == round(keep * 64)).all()  # round(keep x Tm) rows a head
    assert rows[0, 0, :, 0].tolist() != rows[0, 1, :, 0].tolist()  # drawn per head


def test_keeps_name_their_draw_and_bad_ones_stop_with_the_value():
    script = load_script("dev/cuda/bwd_call_timeline.py")
    assert script.keep_kind("dense") == "dense"
    assert script.keep_kind("negl:0.2") == ("negl", 0.2)
    assert script.keep_kind("0.25") == (script.random_tile_mask, 0.25)
    assert script.keep_kind("rows:0.5") == (script.shared_rows_mask, 0.5)
    assert script.keep_kind("even:0.03") == (script.even_tile_mask, 0.03)
    for bad, says in [("cols:0.5", "unknown kind 'cols' in 'cols:0.5'"),
                      ("rows:x", "'rows:x' has no number")]:
        with pytest.raises(SystemExit) as e:
            script.keep_kind(bad)
        assert says in str(e.value)
