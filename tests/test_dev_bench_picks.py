"""dev/cuda/bench_picks.py: the device's kernel pick replayed on the bench's random masks, at the
constants of src/cuda/bwd_common.cuh."""
import re

import pytest

from script_loader import ROOT, load_script


def load():
    return load_script("dev/cuda/bench_picks.py", siblings=True)


def test_every_rule_constant_is_read_from_the_header():
    m = load()
    c = m.header_constants()
    assert set(c) == set(m.RULE_CONSTANTS)
    assert c["BL_R64_ENTRY_COST"] == 64 and c["BL_DQ_DIRECT_MAX_ENTRIES_X2"] == 33


def test_tile_sizes_are_the_headers():
    """The totals count the tiles the library does: BL_TILE_M / BL_TILE_N (include/backlite.h)
    and the 80-row kernel's BL_BWD_TM_DENSE (src/cuda/bwd_common.cuh)."""
    m = load()
    headers = ("include/backlite.h", "src/cuda/bwd_common.cuh")
    text = "".join((ROOT / f).read_text() for f in headers)
    defined = dict(re.findall(r"#define (BL_\w+) (\d+)", text))
    assert (m.TM, m.TN, m.TM80) == (int(defined["BL_TILE_M"]), int(defined["BL_TILE_N"]),
                                    int(defined["BL_BWD_TM_DENSE"]))


def test_a_renamed_constant_stops_the_tool(tmp_path):
    m = load()
    header = tmp_path / "bwd_common.cuh"
    header.write_text("enum { BL_R80_ENTRY_COST = 75 };\n")
    with pytest.raises(KeyError):
        m.header_constants(str(header))


def test_causal_allowed_tiles_are_the_lists_kernels():
    m = load()
    a = m.allowed_tiles(512, True)  # 8 row tiles of 64, 4 key tiles of 128
    assert a.shape == (8, 4)
    # row tile r reaches key tile n where its last row 64 r + 63 >= 128 n
    assert [int(a[r].sum()) for r in range(8)] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert bool(m.allowed_tiles(512, False).all())


def test_pick_follows_each_rule():
    m = load()
    c = m.header_constants()
    rows = 100
    # a mask that drops nothing runs the dense walk
    full = m.pick((3200, 2600, 0, 2600), rows, 128, False, True, c)
    assert full["pick"].startswith("80 rows, the dense")
    # packed 80-row entries cheaper than the 64-row ones: 2000 x 79 < 3200 x 64
    p = m.pick((3200, 4000, 10, 2000), rows, 128, False, True, c)
    assert p["pick"] == "80 rows packed" and p["ratio"] < 1
    # 64-row entries cheaper, 16 a row tile (<= 16.5): the DIRECT form; 17: version 10 plain
    assert m.pick((1600, 2000, 10, 1400), rows, 128, False, True, c)["pick"] == "version 10 DIRECT"
    assert m.pick((1700, 2000, 10, 1500), rows, 128, False, True, c)["pick"] == "version 10"
    # head dim 64: the 16-bit dq form up to 16 entries a row tile
    assert m.pick((1600, 0, 10, 0), rows, 64, True, False, c)["pick"] == "persistent, 16-bit dq"
    assert m.pick((1601, 0, 10, 0), rows, 64, True, False, c)["pick"] == "persistent"


def test_the_two_bench_rows_inside_the_direct_gate():
    """The hundred-and-thirty-fifth session's finding: at 16k x 16 x 128 causal 25 % the bench's
    mask (16.2 entries a row tile) is an 80-row pick inside the DIRECT gate."""
    m = load()
    c = m.header_constants()
    rows = {keep: p for keep, _, p in m.bench_rows((1, 16384, 16, 128), True, c)}
    assert rows[0.25]["pick"] == "80 rows packed" and rows[0.25]["direct_gate"]
    assert rows[0.25]["mean"] == pytest.approx(16.2, abs=0.1)
    assert rows[0.1]["pick"] == "version 10 DIRECT"
    assert rows[1.0]["pick"].startswith("80 rows, the dense")


def test_video_choice_weighs_with_the_same_rules():
    """dev/cuda/video_choice.py picks through bench_picks.pick (no costs of its own): on a small
    video input each negl_prob keeps less and gets one of the rule's names."""
    vc = load_script("dev/cuda/video_choice.py", siblings=True)
    assert not [name for name in vars(vc) if name.startswith("COST")]
    rows = list(vc.choices(1024, 1, True))
    assert [negl for negl, *_ in rows] == [0.01, 0.05, 0.2, 0.5]
    kept = [k for _, k, *_ in rows]
    assert kept == sorted(kept, reverse=True) and 0 < kept[-1] < kept[0] <= 1
    names = {"80 rows packed", "80 rows aligned", "version 10", "version 10 DIRECT"}
    for _, _, packed_share, p, run in rows:
        assert p["pick"] in names or p["pick"].startswith("80 rows, the dense")
        assert 0 < packed_share and run >= 1
