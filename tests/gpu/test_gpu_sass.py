"""The library's CUDA kernels in SASS: their hot loops -- the innermost loops that hold HGMMA --
exist in every main kernel and spill nothing to local memory (issue 4: "SASS shows HGMMA in the hot
loops and no local-memory spills there").

No GPU needed, but a library built with nvcc and the toolkit's cuobjdump and nvdisasm (skipped,
saying what is missing, without them). The SASS reading is dev/cuda/sass_loops.py's."""
import os
import sys
import tempfile

import pytest

import back_lite

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "dev", "cuda"))
import sass_loops  # noqa: E402  (the repository's SASS reader, not a package)

# One family per main loop the library ships: the forward, the head-dim-128 64-row and 80-row
# backward kernels, the head-dim-64 ones (its persistent form on unsplit calls without a causal
# mask, version 6 on the others), and the deterministic form's dq-rows kernel (with version 10
# without its dQ, a bwd_ws128_kernel).
FAMILIES = ("attn_fwd_sm90_ws_kernel", "bwd_ws128_kernel", "bwd_ws128r80_kernel",
            "bwd_ws64_kernel", "bwd_ws64p_kernel", "bwd_dqrows_kernel")


@pytest.fixture(scope="module")
def kernels():
    tools = {name: sass_loops.find_tool(name) for name in ("cuobjdump", "nvdisasm")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        pytest.skip(f"no {' or '.join(missing)} on PATH or in the CUDA toolkit (CUDA_HOME, "
                    "/usr/local/cuda): needed to read the library's SASS")
    with tempfile.TemporaryDirectory() as work:
        cubins = sass_loops.extract_cubins(back_lite.library_path, work, tools["cuobjdump"])
        if not cubins:
            pytest.skip(f"{back_lite.library_path} holds no device code (built without nvcc)")
        found = {}
        for cubin in cubins:
            found.update(sass_loops.parse(sass_loops.disassemble(cubin, tools["nvdisasm"])))
    return found


def test_every_main_kernel_has_an_hgmma_loop(kernels):
    for family in FAMILIES:
        named = [n for n in kernels if family in n]
        assert named, f"no {family} in the library's SASS"
        for name in named:
            assert sass_loops.hot_loops(*kernels[name]), f"{name}: no loop holds HGMMA"


def test_hot_loops_spill_nothing(kernels):
    spills = []
    for name, (instrs, labels) in kernels.items():
        for start, end in sass_loops.hot_loops(instrs, labels):
            local = [f"{a:#x} {t}" for a, t, _ in instrs
                     if start <= a <= end and sass_loops.opcode(t) in ("STL", "LDL")]
            if local:
                spills.append(f"{name} loop [{start:#x}, {end:#x}]: " + "; ".join(local))
    assert not spills, "local-memory traffic in hot loops:\n" + "\n".join(spills)
