"""dev/cuda/fwd_ncu_times.py, the forward variants' ncu kernel times, on a synthetic log: builds
from before and after the ws kernel's parking flag became an enum (its fifth template argument
printed as a digit or as an enum value) must both be read, plain and statistics apart."""
import contextlib
import io

import pytest

from script_loader import load_script


def row(pid, kernel, ns):
    """One CSV row as `ncu --csv --print-units base --metrics gpu__time_duration.sum` prints it."""
    return (f'"0","{pid}","attn_fwd","127.0.0.1","void {kernel}(FwdTmaParams)","1","(132, 1, 1)",'
            f'"(384, 1, 1)","9.0","gpu__time_duration.sum","ns","{ns}"\n')


def test_reads_both_template_spellings(tmp_path):
    tool = load_script("dev/cuda/fwd_ncu_times.py")
    old = "attn_fwd_sm90_ws_kernel<128, 1, 0, {s}, 0, 2>"
    new = "attn_fwd_sm90_ws_kernel<128, true, false, {s}, (<unnamed>::Park)2, 2>"
    log = tmp_path / "ncu.log"
    text = "== base round 1\n"
    # shape 0: one process for the plain kernel, one for the statistics kernel, two launches each
    text += row(11, new.format(s="false"), 4000_000) + row(11, new.format(s="false"), 4000_000)
    text += row(12, new.format(s="true"), 4200_000) + row(12, new.format(s="true"), 4200_000)
    text += "== old round 1\n"
    text += row(21, old.format(s=0), 3900_000) + row(21, old.format(s=0), 3900_000)
    text += row(22, old.format(s=1), 4100_000) + row(22, old.format(s=1), 4100_000)
    log.write_text(text)
    times = tool.parse([str(log)])
    assert times[("base", 0, 0)] == [4000.0, 4000.0]
    assert times[("base", 0, 1)] == [4200.0, 4200.0]
    assert times[("old", 0, 0)] == [3900.0, 3900.0]
    assert times[("old", 0, 1)] == [4100.0, 4100.0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tool.main([str(log)])
    lines = [ln.split() for ln in out.getvalue().splitlines()[1:]]
    assert lines[0][:2] == ["base", "1x16384x16x128"] and lines[0][4] == "1.050"
    assert lines[1][:2] == ["old", "1x16384x16x128"] and lines[1][4] == "1.051"


def test_labels_must_match_the_kernels(tmp_path):
    """A log that ran other shapes than the default eight is refused unless --shapes names them,
    and then labelled with them."""
    tool = load_script("dev/cuda/fwd_ncu_times.py")
    k64c = "attn_fwd_sm90_ws_kernel<64, true, true, {s}, true, 3>"
    log = tmp_path / "ncu.log"
    text = "== base round 1\n"
    text += row(11, k64c.format(s="false"), 1300_000) + row(12, k64c.format(s="true"), 1350_000)
    log.write_text(text)
    with pytest.raises(SystemExit, match="head dim 64, causal=1"):
        tool.main([str(log)])  # default label of shape 1: 1x16384x16x128, non-causal
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tool.main([str(log), "--shapes", "1x16384x16x64 causal"])
    line = out.getvalue().splitlines()[1].split()
    assert line[:3] == ["base", "1x16384x16x64", "causal"] and line[5] == "1.038"


def test_labels_from_the_logged_shapes_line(tmp_path):
    """A log of `NCU_SHAPES=... fwd_sed_variants.sh ncu` names its shapes in a "# shapes:" line;
    the rows take those labels without --shapes."""
    tool = load_script("dev/cuda/fwd_ncu_times.py")
    k128c = "attn_fwd_sm90_ws_kernel<128, true, true, {s}, false, 2>"
    log = tmp_path / "ncu.log"
    text = "# shapes: 1x16384x16x128 causal;1x32768x24x128 causal\n== base round 1\n"
    for pid, us in ((11, 1900_000), (12, 1980_000), (13, 11000_000), (14, 11330_000)):
        stats = "true" if pid % 2 == 0 else "false"
        text += row(pid, k128c.format(s=stats), us)
    log.write_text(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tool.main([str(log)])
    lines = [ln.split() for ln in out.getvalue().splitlines()[1:]]
    assert lines[0][:3] == ["base", "1x16384x16x128", "causal"] and lines[0][5] == "1.042"
    assert lines[1][:3] == ["base", "1x32768x24x128", "causal"] and lines[1][5] == "1.030"
