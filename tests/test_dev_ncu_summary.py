"""dev/cuda/ncu_ab_summary.py, the per-kernel A/B of dev-checker builds under ncu, on synthetic
ncu logs: a mode that runs two shapes, fewer calls of the larger one, where the two builds pick
different main kernels for the smaller shape (the case an equal split of each kernel's launches
got wrong: bench/results/bwd-s31-causal-packed.txt run 4)."""
import contextlib
import io

from script_loader import load_script


def load(name):
    return load_script(f"dev/cuda/{name}.py")


def record(kernel, grid, us):
    """One launch as `ncu --metrics gpu__time_duration.sum` prints it."""
    return (f"  void {kernel}(bl_bwd::bwd_params) {grid}x(384, 1, 1), Context 1, Stream 7, "
            "Device 0, CC 9.0\n    Section: Command line profiler metrics\n"
            f"    gpu__time_duration.sum          us        {us:.2f}\n\n")


def call(grid, main_kernel, main_us, post_us):
    return (record("bl_bwd_list_kernel", grid, 10.0)
            + record("bwd_ws128_kernel<T>", "(132, 1, 1)", 2.0)  # returns unpicked
            + record(main_kernel, "(132, 1, 1)", main_us) + record("postprocess", grid, post_us))


def write_log(path, small_kernel, small_us):
    # 3 calls of the small shape, then 2 of the large one (grid of the lists kernel differs)
    text = "==PROF== Connected to process 1\n"
    text += "".join(call("(128, 1, 1)", small_kernel, small_us, 50.0) for _ in range(3))
    text += "".join(call("(384, 1, 1)", "packed", 8000.0, 160.0) for _ in range(2))
    path.write_text(text)


def test_shapes_follow_the_calls_grids(tmp_path):
    write_log(tmp_path / "ncu__a__sparsec_0.25__1.txt", "v10", 1500.0)
    write_log(tmp_path / "ncu__b__sparsec_0.25__1.txt", "packed", 1400.0)
    summary = load("ncu_ab_summary")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary.main(["--split", "2", "a,b"] + sorted(str(p) for p in tmp_path.iterdir()))
    lines = out.getvalue().splitlines()

    def row(shape, kernel):
        return next(line for line in lines if line.strip().startswith(f"shape {shape} {kernel}"))

    # the small shape's main kernels stay in shape 0, each in the build that ran it
    assert "a    1500.0 (n=3)" in row(0, "v10") and "b -" in row(0, "v10")
    assert "a -" in row(0, "packed") and "b    1400.0 (n=3)" in row(0, "packed")
    assert "a    8000.0 (n=2)" in row(1, "packed")
    assert not any(line.strip().startswith("shape 1 v10") for line in lines)
    # per shape, the call: the kernels' medians summed (the 2-us launch left out as unpicked)
    assert "a    1560.0" in row(0, "call") and "b    1460.0 (-6.4 %)" in row(0, "call")
    assert "a    8170.0" in row(1, "call") and "b    8170.0 (+0.0 %)" in row(1, "call")


def test_kernel_times_parser_reads_names_grids_and_units(tmp_path):
    log = tmp_path / "one.txt"
    log.write_text(record("bl_bwd::bwd_ws128r80_kernel<__nv_bfloat16, 1, 3>", "(132, 1, 1)", 7.5)
                   .replace("us        7.50", "ms         1.25"))
    times = load("ncu_kernel_times")
    assert times.launch_records(str(log)) == [
        ("bwd_ws128r80_kernel<__nv_bfloat16, 1, 3>", "(132, 1, 1)", 1250.0)]
    assert times.launches(str(log)) == [("bwd_ws128r80_kernel<__nv_bfloat16, 1, 3>", 1250.0)]
