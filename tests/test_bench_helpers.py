"""The benchmark's interleaving helper (bench/bench_attn.py), on the CPU with a stand-in timer."""
import importlib.util
import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench" / "bench_attn.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_attn", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interleaved_medians_alternates_and_takes_round_medians():
    bench = load_bench()
    order, per_name = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([10.0, 30.0, 20.0])}

    def timer(fn, reps):
        assert reps == 7
        name = fn()
        order.append(name)
        return next(per_name[name])

    ms = bench.interleaved_medians({"a": lambda: "a", "b": lambda: "b"}, 7, 3, timer=timer)
    assert order == ["a", "b", "a", "b", "a", "b"]  # every contender once per round
    assert ms == {"a": 2.0, "b": 20.0}
