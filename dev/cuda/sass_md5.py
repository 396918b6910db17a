"""sass_md5.py -- whether two builds compile a kernel to the same SASS, kernel by kernel.

Usage (repository root; nvdisasm on PATH, in the CUDA toolkit or from `pip install
nvidia-cuda-nvdisasm`, as for sass_loops.py):
  python3 dev/cuda/sass_md5.py base.cubin new.cubin [more.cubin ...] [--only NAME_SUBSTRING]
with each cubin made as sass_loops.py's docstring shows (one source tree each, e.g. trees from
`git archive` with a patch applied).

Prints one row per kernel: a short hash of its instructions in every cubin and, per cubin after
the first, "=" where its SASS is the first one's instruction for instruction, else "DIFF"
(or "-" where the kernel is missing). The hash covers the instruction texts only -- no
addresses, no line information -- and branch targets as the address of their label, because
nvdisasm numbers labels across the whole cubin (a change in one kernel renumbers the labels of
the ones after it); ptxas's internal helpers' numbers and comment padding do not count
either. How the thirty-second session showed that a refactored source compiles to the measured
variants (bench/results/bwd-s36-early-dv.txt), and that a comment-only change is one.
"""
import argparse
import hashlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_loops import disassemble, parse  # noqa: E402  (the sibling tool's disassembler)

LABEL_REF = re.compile(r"\.L_x_\d+")
# ptxas's internal helpers (64-bit division and the like) are numbered across the cubin, like
# the labels: `$__internal_25_$__cuda_sm20_div_s64` in one build is `$__internal_19_$...` in
# another where an earlier kernel changed. So are the blanks nvdisasm pads its comments with.
HELPER_REF = re.compile(r"\$__internal_\d+_\$")
BLANKS = re.compile(r"\s+")


def normalised(text, labels):
    """One instruction's text without what a change elsewhere in the cubin renumbers."""
    text = LABEL_REF.sub(lambda m: hex(labels.get(m.group(0), -1)), text)
    return BLANKS.sub(" ", HELPER_REF.sub("$__internal_$", text)).strip()


def sass_hashes(sass):
    """{kernel: 10-hex-digit hash of its instructions} from nvdisasm's text of one cubin"""
    hashes = {}
    for name, (instrs, labels) in parse(sass).items():
        text = "\n".join(normalised(t, labels) for _, t, _ in instrs)
        hashes[name] = hashlib.md5(text.encode()).hexdigest()[:10]
    return hashes


def kernel_hashes(cubin):
    return sass_hashes(disassemble(cubin))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cubins", nargs="+", help="cubins to compare; the first is the reference")
    ap.add_argument("--only", default="", help="kernels whose mangled name contains this")
    args = ap.parse_args()
    if len(args.cubins) < 2:
        ap.error("give at least two cubins")
    tables = [kernel_hashes(c) for c in args.cubins]
    names = sorted(n for n in set().union(*tables) if args.only in n)
    if not names:
        sys.exit(f"no kernel name contains {args.only!r} in {args.cubins[0]}")
    same = 0
    for name in names:
        ref = tables[0].get(name)
        cells = [ref or "-"]
        for table in tables[1:]:
            h = table.get(name)
            cells.append(f"{h or '-'} {'=' if h is not None and h == ref else 'DIFF'}")
        same += all(t.get(name) == ref for t in tables[1:])
        print("  ".join(cells), name)
    print(f"{same} of {len(names)} kernels identical in all {len(args.cubins)} cubins")


if __name__ == "__main__":
    main()
