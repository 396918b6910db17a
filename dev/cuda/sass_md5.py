"""sass_md5.py -- whether two builds compile a kernel to the same SASS, kernel by kernel.

Usage (repository root; nvdisasm on PATH, in the CUDA toolkit or from `pip install
nvidia-cuda-nvdisasm`, as for sass_loops.py):
  python3 dev/cuda/sass_md5.py base.cubin new.cubin [more.cubin ...] [--only NAME_SUBSTRING] [--regs]
with each cubin made as sass_loops.py's docstring shows (one source tree each, e.g. trees from
`git archive` with a patch applied).

Prints one row per kernel: a short hash of its instructions in every cubin and, per cubin after
the first, "=" where its SASS is the first one's instruction for instruction, else "DIFF n"
with n the instructions that differ (or "-" where the kernel is missing). The hash covers the
instruction texts only -- no addresses, no line information -- and branch targets as the
address of their label, because nvdisasm numbers labels across the whole cubin (a change in one
kernel renumbers the labels of the ones after it); ptxas's internal helpers' numbers and comment
padding do not count either. How the thirty-second session showed that a refactored source
compiles to the measured variants (bench/results/bwd-s36-early-dv.txt), and that a comment-only
change is one.
--regs: register numbers do not count either ("the same up to register names": a schedule
that only renamed registers, as after a refactor that changed what ptxas allocates first).
"""
import argparse
import difflib
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
# Vector, uniform and predicate registers by number (RZ, URZ, PT, UPT have none).
REGISTER = re.compile(r"\b(U?R|U?P)\d+\b")


def normalised(text, labels, regs=False):
    """One instruction's text without what a change elsewhere in the cubin renumbers (and, with
    regs, without register numbers)."""
    text = LABEL_REF.sub(lambda m: hex(labels.get(m.group(0), -1)), text)
    if regs:
        text = REGISTER.sub(lambda m: m.group(1) + "#", text)
    return BLANKS.sub(" ", HELPER_REF.sub("$__internal_$", text)).strip()


def sass_texts(sass, regs=False):
    """{kernel: [normalised instruction]} from nvdisasm's text of one cubin"""
    return {name: [normalised(t, labels, regs) for _, t, _ in instrs]
            for name, (instrs, labels) in parse(sass).items()}


def text_hash(lines):
    return hashlib.md5("\n".join(lines).encode()).hexdigest()[:10]


def sass_hashes(sass, regs=False):
    """{kernel: 10-hex-digit hash of its instructions} from nvdisasm's text of one cubin"""
    return {name: text_hash(lines) for name, lines in sass_texts(sass, regs).items()}


def changed(a, b):
    """How many instructions differ between two kernels' normalised texts (the longer side of
    each replaced, inserted or deleted run)."""
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cubins", nargs="+", help="cubins to compare; the first is the reference")
    ap.add_argument("--only", default="", help="kernels whose mangled name contains this")
    ap.add_argument("--regs", action="store_true", help="register numbers do not count")
    args = ap.parse_args()
    if len(args.cubins) < 2:
        ap.error("give at least two cubins")
    texts = [sass_texts(disassemble(c), args.regs) for c in args.cubins]
    tables = [{n: text_hash(lines) for n, lines in t.items()} for t in texts]
    names = sorted(n for n in set().union(*tables) if args.only in n)
    if not names:
        sys.exit(f"no kernel name contains {args.only!r} in {args.cubins[0]}")
    same = 0
    for name in names:
        ref = tables[0].get(name)
        cells = [ref or "-"]
        for text, table in zip(texts[1:], tables[1:]):
            h = table.get(name)
            if h is None or ref is None:
                cells.append(f"{h or '-'} DIFF")
            elif h == ref:
                cells.append(f"{h} =")
            else:
                cells.append(f"{h} DIFF {changed(texts[0][name], text[name])}")
        same += all(t.get(name) == ref for t in tables[1:])
        print("  ".join(cells), name)
    print(f"{same} of {len(names)} kernels identical in all {len(args.cubins)} cubins")


if __name__ == "__main__":
    main()
