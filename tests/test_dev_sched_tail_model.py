"""dev/cuda/sched_tail_model.py: the dynamic walk's makespan and the windowed order."""
from script_loader import load_script


def load():
    return load_script("dev/cuda/sched_tail_model.py", siblings=True)


def test_makespan_of_equal_columns_is_whole_rounds():
    m = load()
    times = [2.0] * (m.CTAS + 1)  # one column more than CTAs: a second round of one column
    assert m.makespan(range(len(times)), times) == 4.0
    assert m.makespan(range(m.CTAS), times) == 2.0


def test_a_heavy_column_first_shortens_the_tail():
    m = load()
    times = [1.0] * (2 * m.CTAS - 1) + [10.0]
    last = m.makespan(range(len(times)), times)
    first = m.makespan([len(times) - 1] + list(range(len(times) - 1)), times)
    assert last == 11.0 and first == 10.0  # started at t = 1 behind the first round, or at 0


def test_windows_sort_heaviest_first_inside_each_window():
    m = load()
    counts = list(range(m.WINDOW + 5))  # ascending: each window must come out reversed
    order = m.windowed(counts, merge_last=False)
    assert order[:m.WINDOW] == list(range(m.WINDOW - 1, -1, -1))
    assert order[m.WINDOW:] == list(range(len(counts) - 1, m.WINDOW - 1, -1))
    merged = m.windowed(counts, merge_last=True)
    assert merged == list(range(len(counts) - 1, -1, -1))
