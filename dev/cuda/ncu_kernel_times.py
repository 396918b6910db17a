"""ncu_kernel_times.py -- per-kernel GPU times from `ncu --metrics gpu__time_duration.sum` text output.

Usage: ncu --metrics gpu__time_duration.sum ./attn_bwd onemask 1.0 > LOG; python3 ncu_kernel_times.py LOG
Prints, in launch order, each kernel's name (template arguments kept, namespace and parameters
dropped) and duration in us, so that the stages of one backward call (preprocess, lists,
schedule, main kernels, postprocess) can be read side by side. `launches` is the parser, also
used by ncu_ab_summary.py.
"""
import re
import sys

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
# "  void ns::name<args>(params) (grid)x(block), ...": the name with its template arguments, the grid
KERNEL = re.compile(r"\s+(?:void )?(?:\w+::)*(\w+(?:<[^>]*>)?)\(.*\) "
                    r"(\(\d+, \d+, \d+\))x\(\d+, \d+, \d+\)")
DURATION = re.compile(r"gpu__time_duration\.sum\s+(\w+)\s+([\d.,]+)")


def launch_records(path):
    """(kernel name, grid as "(x, y, z)", duration in us) of every profiled launch in one ncu log,
    in launch order."""
    out, name, grid = [], None, None
    for line in open(path, errors="replace"):
        m = KERNEL.match(line)
        if m:
            name, grid = m.group(1), m.group(2)
            continue
        m = DURATION.search(line)
        if m and name:
            us = float(m.group(2).replace(",", "")) * UNITS.get(m.group(1), float("nan"))
            out.append((name, grid, us))
            name = None
    return out


def launches(path):
    """(kernel name, duration in us) of every profiled launch in one ncu log, in launch order."""
    return [(name, us) for name, _grid, us in launch_records(path)]


if __name__ == "__main__":
    for name, us in launches(sys.argv[1]):
        print(f"{name:52s} {us:10.1f} us")
