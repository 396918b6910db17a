"""dev/cuda/timeline_summary.sh, the summary of a lib_timeline_ab.sh log, on a synthetic log: each
kernel's median duration in launch order, the span, and the last kernel's tail -- its end past
the latest end of the kernels before it, which is what it adds to the span even where its
duration overlaps the kernels it started under."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kernel_line(name, duration, gap, start):
    return f"  {name:<62} {duration:6.1f} us  gap {gap:6.1f} us  start {start:8.1f} us\n"


def summary(tmp_path, kernels, span):
    log = ("== base round 1: shape 1,16384,16,128 --causal\n"
           "shape (1, 16384, 16, 128) kv heads 16 causal=True NVIDIA H100 80GB HBM3\n\n"
           "== keep 0.008: 9 calls, 3 kernels each\n"
           + "".join(kernel_line(*k) for k in kernels)
           + f"  span median {span} us (min {span}, max {span})\n")
    path = tmp_path / "timelines.txt"
    path.write_text(log)
    out = subprocess.run(["bash", str(ROOT / "dev/cuda/timeline_summary.sh"), str(path)],
                         check=True, capture_output=True, text=True).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1
    return lines[0]


def test_tail_of_a_kernel_that_starts_under_the_one_before(tmp_path):
    # main kernel ends at 80 + 120 = 200, a returning one at 198 + 4 = 202; the conversion starts
    # at 199 and lasts 20 us: it ends at 219, 17 us past 202 (not its 20 us duration)
    line = summary(tmp_path, [("void main_kernel", 120.0, 0.0, 80.0),
                              ("void returning_kernel", 4.0, -2.0, 198.0),
                              ("void conversion_kernel", 20.0, -3.0, 199.0)], 219.0)
    assert line.split()[:6] == ["base", "r1:", "1,16384,16,128", "causal", "keep", "0.008:"]
    assert line.split("|")[0].split()[6:] == ["120.0", "4.0", "20.0"]
    assert "| span 219.0 | tail 17.0" in line


def test_tail_is_negative_where_the_last_kernel_ends_first(tmp_path):
    line = summary(tmp_path, [("void long_kernel", 100.0, 0.0, 0.0),
                              ("void short_kernel", 10.0, -95.0, 5.0)], 100.0)
    assert line.endswith("| span 100.0 | tail -85.0")
