"""dev/cuda/column_walk_model.py: the walks' positions, CTA loads and fits (head dims 64 and 128)."""
from script_loader import load_script


def load():
    return load_script("dev/cuda/column_walk_model.py", siblings=True)


def test_each_round_gives_every_cta_one_position():
    m = load()
    for g in (1, 3, 132):
        for rotate in (False, True):
            for rnd in range(6):
                ctas = sorted(m.snake_cta(rnd * g + x, g, rotate) for x in range(g))
                assert ctas == list(range(g)), (g, rotate, rnd)


def test_rotated_walk_inverts_the_kernels_position_at_every_stride():
    """snake_cta(k) is the CTA whose ws64p_position (bwd_ws64p_sm90.cuh, written out here) is k,
    for the library's stride and the others --rotate sets."""
    m = load()
    saved = m.ROTATE_NUM, m.ROTATE_DEN
    try:
        for num, den in ((2, 5), (1, 5), (1, 3), (3, 5)):
            m.ROTATE_NUM, m.ROTATE_DEN = num, den
            for g in (3, 8, 132):
                stride = (num * g // den) | 1
                for cta in range(g):
                    for k in range(7):
                        c = (cta + (k >> 1) * stride) % g
                        position = k * g + (g - 1 - c if k & 1 else c)
                        assert m.snake_cta(position, g, True) == cta, (num, den, g, cta, k)
    finally:
        m.ROTATE_NUM, m.ROTATE_DEN = saved


def test_the_snake_pairs_a_window_heaviest_with_lightest():
    m = load()
    g = 4
    assert [m.snake_cta(k, g, False) for k in range(2 * g)] == [0, 1, 2, 3, 3, 2, 1, 0]


def test_rotation_spreads_the_heavy_pair_sums():
    m = load()
    g = 8
    # every window: one heavy column (sorted first) and equal light ones, so the snake gives
    # CTA 0 the heavy column of every window; rotated, the heavy columns go to different CTAs
    window = [9] + [1] * (2 * g - 1)
    counts = window * 4
    r = m.walks(counts, g, a=0.0, b=1.0, zero=0.0)
    assert r["snake"] == 4 * (5 + 1)  # ceil(9 / 2) pairs + one light pair, each window
    assert r["rotated"] < r["snake"]
    assert r["mean"] == sum((c + 1) // 2 for c in counts) / g


def test_greedy_walk_is_the_dynamic_one():
    m = load()
    r = m.walks([2] * 6, 3, a=1.0, b=1.0, zero=0.0)  # six columns of one pair on three CTAs
    assert r["greedy"] == r["snake"] == r["rotated"] == r["matched"] == 4.0


def test_fit_recovers_the_costs_it_was_given():
    m = load()
    g = 4
    counts = {"dense": [8] * 8,  # two full columns a CTA, four pairs each
              "light": [3, 0, 1, 0, 2, 0, 5, 1, 0, 0, 2, 1], "half": [4, 4, 2, 0, 6, 1, 0, 3]}
    truth = dict(a=1.5, b=2.0, zero=3.0)
    measured = {k: m.walks(c, g, **truth)["snake"] for k, c in counts.items()}
    a, b, zero, rms = m.fit(counts, measured, g)
    assert (a, zero) == (1.5, 3.0) and abs(b - 2.0) < 1e-9 and rms < 1e-9


def test_fit_of_the_rotated_walk_recovers_its_costs():
    m = load()
    g = 4
    counts = {"dense": [8] * 8, "light": [3, 0, 1, 0, 2, 0, 5, 1, 0, 0, 2, 1] * 2,
              "half": [4, 4, 2, 0, 6, 1, 0, 3] * 3}
    truth = dict(a=2.5, b=1.5, zero=4.0)
    measured = {k: m.walks(c, g, **truth)["rotated"] for k, c in counts.items()}
    a, b, zero, rms = m.fit(counts, measured, g, walk="rotated")
    assert (a, zero) == (2.5, 4.0) and abs(b - 1.5) < 1e-9 and rms < 1e-9


def test_causal_head_dim_64_calls_walk_one_global_sort_with_the_flag():
    m = load()
    g = 2
    counts = [1, 1, 1, 1, 9, 9, 9, 9]  # the heavy columns in the second window of 2g
    windowed = m.walks(counts, g, a=0.0, b=1.0, zero=0.0)
    m.GLOBAL_CAUSAL64 = True  # --global-causal64: the schedule before the 113th session
    try:
        global_sort = m.walks(counts, g, a=0.0, b=1.0, zero=0.0, causal=True)
    finally:
        m.GLOBAL_CAUSAL64 = False
    assert windowed["snake"] == global_sort["snake"] == 12  # two light and two heavy columns a CTA
    assert m.schedule(counts, len(counts)) == [9, 9, 9, 9, 1, 1, 1, 1]


def test_head_dim_128_counts_entries_in_four_round_causal_windows():
    m = load()
    assert m.units(5, 64) == 3 and m.units(5, 128) == 5
    g = 1
    counts = [1, 2, 3, 4, 5]  # one CTA: the walk's load is every column's cost
    r = m.walks(counts, g, a=1.0, b=1.0, zero=0.0, causal=True, head_dim=128)
    assert r["greedy"] == r["mean"] == 5 * 1.0 + sum(counts)


def test_matched_walk_gives_the_heavy_columns_to_the_least_loaded_ctas():
    m = load()
    # two CTAs, three rounds of two columns (costs in schedule order): the snake walks forward,
    # back, forward, so CTA 0 takes both 5s (5 + 1 + 5 = 11 against 1 + 1 + 1); the matched walk
    # gives the third round's 5 to the CTA that is behind (7 and 7)
    costs = [5.0, 1.0, 1.0, 1.0, 5.0, 1.0]
    snake = [0.0, 0.0]
    for k, cost in enumerate(costs):
        snake[m.snake_cta(k, 2, False)] += cost
    assert snake == [11.0, 3.0]
    assert m.matched_loads(costs, 2) == [7.0, 7.0]
    # a last round of fewer columns goes to the least loaded CTAs
    assert m.matched_loads([5.0, 1.0, 4.0], 2) == [5.0, 5.0]
    # every round gives each CTA one column: 3 rounds of 3 equal columns load every CTA 3 times
    assert m.matched_loads([1.0] * 9, 3) == [3.0, 3.0, 3.0]
