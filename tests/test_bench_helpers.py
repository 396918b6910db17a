"""The benchmark's interleaving helper (bench/bench_attn.py), on the CPU with a stand-in timer."""
from script_loader import load_script


def load_bench():
    return load_script("bench/bench_attn.py")


class FakeClock:
    """Stands in for CUDA events: each contender advances `now` by its next scripted cost."""

    def __init__(self):
        self.now = 0.0

    def event(self):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def elapsed_time(self, end):
                return end.t - self.t

        return Event()


def test_interleaved_medians_mixes_calls_and_takes_round_medians():
    bench = load_bench()
    clock, calls = FakeClock(), []
    # per name: warm-up cost, then 3 timed costs, for each of 2 rounds
    costs = {"a": iter([9, 1, 2, 3, 9, 5, 5, 7]), "b": iter([9, 10, 30, 20, 9, 40, 40, 40]),
             "c": iter([9, 4, 4, 4, 9, 6, 8, 7])}

    def contender(name):
        def fn():
            calls.append(name)
            clock.now += next(costs[name])
        return fn

    ms = bench.interleaved_medians({n: contender(n) for n in "abc"}, reps=3, rounds=2,
                                   event=clock.event, sync=lambda: None)
    # round medians: a 2 and 5, b 20 and 40, c 4 and 7; the result is their median
    assert ms == {"a": 3.5, "b": 30.0, "c": 5.5}
    # each round: one warm-up call per contender, then every cycle calls each contender once
    rounds = [calls[:12], calls[12:]]
    for r in rounds:
        assert r[:3] == ["a", "b", "c"]
        for cycle in range(3):
            assert sorted(r[3 + 3 * cycle: 6 + 3 * cycle]) == ["a", "b", "c"]
    cycles = [tuple(r[3 + 3 * i: 6 + 3 * i]) for r in rounds for i in range(3)]
    assert len(set(cycles)) > 1  # the order is shuffled, not a fixed rotation


def test_paired_ratios_pair_each_call_with_the_reference_of_its_cycle():
    bench = load_bench()
    clock = FakeClock()
    # warm-up cost, then one cost per cycle (3 cycles, 1 round); "x" is 20 % dearer than the
    # reference in cycle 0, level in cycle 1, 10 % dearer in cycle 2
    costs = {"ref": iter([9, 10, 20, 30]), "x": iter([9, 12, 20, 33])}

    def contender(name):
        def fn():
            clock.now += next(costs[name])
        return fn

    times = bench.interleaved_times({n: contender(n) for n in costs}, reps=3, rounds=1,
                                    event=clock.event, sync=lambda: None)
    assert times == {"ref": [[10, 20, 30]], "x": [[12, 20, 33]]}
    assert bench.medians_of(times) == {"ref": 20, "x": 20}    # ratio of medians: 1.0
    paired = bench.paired_ratios(times, "ref")
    assert paired["ref"] == 1.0
    assert abs(paired["x"] - 1.1) < 1e-12                      # median of 1.2, 1.0, 1.1


def test_bar_counts_count_the_bar_shapes_rows_by_both_ratios():
    bench = load_bench()

    def shape(seqlen, stats, rows):
        return {"shape": [1, seqlen, 8, 128], "backlite": {"stats_overhead": stats},
                "sparse": [{"kept": k, "vs_dense": m, "vs_dense_paired": p} for k, m, p in rows]}

    results = [
        # (kept, ratio of medians, paired ratio)
        shape(16384, 1.02, [(1.0, 1.004, 0.999), (0.1, 0.119, 0.121), (0.1, 0.125, 0.119)]),
        shape(32768, 1.05, [(0.5, 0.61, 0.59), (0.01, 0.02, 0.031)]),
        shape(4096, 1.00, [(0.1, 0.5, 0.5)]),  # below the bars' sequence length: not counted
    ]
    c = bench.bar_counts(results)
    assert c["kept + 2%"] == {"medians": 3, "paired": 2, "of": 5}
    assert c["kept + 10%"] == {"medians": 4, "paired": 5, "of": 5}
    assert c["not slower than dense"] == {"medians": 4, "paired": 5, "of": 5}
    assert c["statistics <= 1.03x"] == {"medians": 1, "paired": None, "of": 2}
    # files from before the paired ratio: no paired counts
    for sp in results[0]["sparse"]:
        sp["vs_dense_paired"] = None
    assert bench.bar_counts(results)["kept + 2%"]["paired"] is None
    # the statistics' paired ratio (files from the thirty-ninth session on), counted where every
    # bar shape has one
    results[0]["backlite"]["stats_overhead_paired"] = 1.031
    assert bench.bar_counts(results)["statistics <= 1.03x"]["paired"] is None
    results[1]["backlite"]["stats_overhead_paired"] = 1.029
    assert bench.bar_counts(results)["statistics <= 1.03x"] == {"medians": 1, "paired": 1, "of": 2}


def test_bar_counts_keep_gqa_shapes_apart():
    """The issue's bars name MHA shapes: a GQA / MQA shape (B, S, Hq, D, Hk) is counted on its
    own (grouped_heads=True), never in the MHA counts; a fifth entry equal to H is MHA."""
    bench = load_bench()

    def shape(dims, rows):
        return {"shape": dims, "backlite": {"stats_overhead": 1.0},
                "sparse": [{"kept": k, "vs_dense": m, "vs_dense_paired": m} for k, m in rows]}

    results = [shape([1, 16384, 16, 128], [(0.1, 0.11)]),
               shape([2, 16384, 8, 128, 1], [(0.1, 0.5), (0.5, 0.51)]),
               shape([1, 16384, 8, 128, 8], [(0.1, 0.5)])]
    mha, gqa = bench.bar_counts(results), bench.bar_counts(results, grouped_heads=True)
    assert mha["kept + 2%"] == {"medians": 1, "paired": 1, "of": 2}
    assert gqa["kept + 2%"] == {"medians": 1, "paired": 1, "of": 2}
    assert gqa["statistics <= 1.03x"]["of"] == 1


def test_grouped_inputs_keep_the_first_kv_heads():
    import torch
    bench = load_bench()
    q, k, v = (torch.randn(1, 5, 4, 8) for _ in range(3))
    assert bench.kv_heads_of((1, 5, 4, 8)) == 4 and bench.kv_heads_of((1, 5, 4, 8, 2)) == 2
    gq, gk, gv = bench.grouped(q, k, v, 2)
    assert gq is q and gk.shape == (1, 5, 2, 8) and gk.is_contiguous()
    assert torch.equal(gk, k[:, :, :2]) and torch.equal(gv, v[:, :, :2])
    assert all(a is b for a, b in zip(bench.grouped(q, k, v, 4), (q, k, v)))


def test_bench_shape_runs_a_gqa_shape(monkeypatch):
    """A GQA shape through every part of bench_shape -- dense comparison, random masks, video W
    -- on the CPU backend with a wall-clock stand-in for CUDA events (the SDPA peers' CUDA
    backends do not run there and are left out, as on a GPU where one refuses a shape)."""
    import time
    import torch
    bench = load_bench()

    class WallEvent:
        def record(self):
            self.t = time.perf_counter()

        def elapsed_time(self, end):
            return 1e3 * (end.t - self.t)

    monkeypatch.setattr(bench.interleaved_times, "__defaults__", (0, WallEvent, lambda: None))
    monkeypatch.setattr(bench, "RANDOM_MASK_KEEP", [1.0, 0.25])
    monkeypatch.setattr(bench, "NEGL_PROBS", [0.05])
    rows = bench.bench_shape((1, 256, 4, 64, 2), torch.float32, True, reps=1, rounds=1,
                             with_flex=False, device="cpu")
    assert rows["shape"] == [1, 256, 4, 64, 2]
    assert rows["backlite"]["bwd_ms"] > 0 and "sdpa_cudnn" not in rows
    assert [sp["source"] for sp in rows["sparse"]] == ["random mask", "random mask",
                                                       "video W, negl_prob=0.05"]
    assert all(0 < sp["kept"] <= 1 and sp["bwd_ms"] > 0 for sp in rows["sparse"])
