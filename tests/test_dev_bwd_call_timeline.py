"""dev/cuda/bwd_call_timeline.py's --shape: the bench's B,S,H,D[,HK] spelling (the seventy-eighth
session's A/B stopped on a five-number shape before this parsed it)."""
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
