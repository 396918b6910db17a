"""sass_loops.py -- what the hot loops of each kernel in a cubin execute, from its SASS.

Usage (repository root; nvdisasm, and for a library cuobjdump, on PATH or in the CUDA toolkit --
where the toolkit lacks them: `pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump`):
  python3 dev/cuda/sass_loops.py build/libbacklite.so [NAME_SUBSTRING]
or on one file's cubin:
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math \
       --expt-relaxed-constexpr -I include -I src -I src/cuda -cubin src/cuda/attn_bwd_sm90.cu \
       -o bwd.cubin
  python3 dev/cuda/sass_loops.py bwd.cubin [NAME_SUBSTRING] [--shape]

For every kernel (optionally only those whose mangled name contains NAME_SUBSTRING) it prints
  - the innermost loops (a backward branch and its target) that hold HGMMA instructions, with
    their instruction count and how many of them are LDC (constant-bank reloads), STL / LDL
    (local memory: spills) and MUFU;
  - for warp-specialized kernels (setmaxnreg), the spills between the consumers' register
    increase and the producer's decrease, with the source line ptxas attributes each to;
  - with --shape, each hot loop's instructions in order, as mnemonics with runs counted
    ("MUFU FADD FMULx64"; waits and barriers with their first modifier: WARPGROUP.DEPBAR,
    BAR.SYNC, SYNCS.PHASECHK): where ptxas put the exponentials relative to the waits
    (bench/results/fwd-s45-park-form-later.txt run 0).
How the twenty-sixth session found the 80-row kernels' per-entry spill and their 40 constant
reloads per entry (bench/notes-bwd.md); tests/gpu/test_gpu_sass.py holds the library to it.
"""
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

INSTR = re.compile(r"/\*([0-9a-f]{4,6})\*/\s*(.*?)\s*;")
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
SECTION = re.compile(r"^\s*\.text\.(\S+):")
BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")


def find_tool(name):
    """A CUDA binary tool on PATH, else in $CUDA_HOME/bin or /usr/local/cuda/bin, else from its
    PyPI package (nvidia-cuda-cuobjdump / -nvdisasm: nvidia/cu*/bin); None if absent."""
    found = shutil.which(name)
    if found:
        return found
    places = [os.path.join(root, "bin") for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
              if root]
    try:
        import nvidia  # the namespace package of NVIDIA's PyPI wheels
        places += [os.path.join(base, sub, "bin") for base in nvidia.__path__
                   for sub in sorted(os.listdir(base))]
    except ImportError:
        pass
    for place in places:
        if os.access(os.path.join(place, name), os.X_OK):
            return os.path.join(place, name)
    return None


def disassemble(cubin, nvdisasm=None):
    tool = nvdisasm or os.environ.get("NVDISASM") or find_tool("nvdisasm") or "nvdisasm"
    return subprocess.run([tool, "-g", cubin], check=True, capture_output=True, text=True).stdout


def extract_cubins(binary, workdir, cuobjdump=None):
    """The cubins inside a host binary (a .so or .o built with nvcc), written into workdir."""
    tool = cuobjdump or find_tool("cuobjdump") or "cuobjdump"
    subprocess.run([tool, "-xelf", "all", os.path.abspath(binary)], cwd=workdir,
                   capture_output=True, text=True)
    return sorted(os.path.join(workdir, f) for f in os.listdir(workdir) if f.endswith(".cubin"))


def parse(sass):
    """{kernel: (instructions [(address, text, (file, line))], labels {name: address})}"""
    kernels, name, where, pending = {}, None, None, []
    for line in sass.splitlines():
        m = SECTION.match(line)
        if m:
            name, pending = m.group(1), []
            kernels[name] = ([], {})
            continue
        if name is None:
            continue
        m = LINE.search(line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
        m = LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = INSTR.search(line)
        if m:
            address = int(m.group(1), 16)
            for label in pending:
                kernels[name][1][label] = address
            pending = []
            kernels[name][0].append((address, m.group(2), where))
    return kernels


PREDICATE = re.compile(r"^@!?U?P[T\d]+\s+")


def mnemonic(text):
    """The instruction's mnemonic with its modifiers: '@!P0 LDC.64 R2, ...' -> 'LDC.64'."""
    return PREDICATE.sub("", text).split()[0]


def opcode(text):
    """The mnemonic without its predicate and modifiers: '@!P0 LDC.64 R2, ...' -> 'LDC'."""
    return mnemonic(text).split(".")[0]


# Mnemonics whose first modifier says which wait or barrier it is.
KEEP_MODIFIER = ("WARPGROUP", "BAR", "SYNCS")


def loop_shape(instrs, start, end):
    """The instructions in [start, end] as mnemonics in order, runs counted: 'HGMMAx7 UIADD3'."""
    names = []
    for address, text, _ in instrs:
        if start <= address <= end:
            parts = mnemonic(text).split(".")
            names.append(".".join(parts[:2]) if parts[0] in KEEP_MODIFIER else parts[0])
    runs = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return " ".join(n if k == 1 else f"{n}x{k}" for n, k in runs)


def hot_loops(instrs, labels):
    if not instrs:
        return []
    # Past the last EXIT ptxas puts the out-of-line blocks (mbarrier try-wait retries), whose
    # branches back into the body are not loops.
    body_end = max((a for a, t, _ in instrs if opcode(t) == "EXIT"), default=instrs[-1][0])
    loops = []
    for address, text, _ in instrs:
        m = BRANCH.search(text)
        if m and address <= body_end and labels.get(m.group(1), address) < address:
            loops.append((labels[m.group(1)], address))
    with_mma = [(s, e) for s, e in loops
                if any(s <= a <= e and opcode(t) == "HGMMA" for a, t, _ in instrs)]
    # innermost: no other such loop strictly inside it
    return sorted((s, e) for s, e in with_mma
                  if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in with_mma))


def report(name, instrs, labels, shape=False):
    print(name)
    for s, e in hot_loops(instrs, labels):
        ops = collections.Counter(opcode(t) for a, t, _ in instrs if s <= a <= e)
        print(f"  loop [{s:#x}, {e:#x}]: {sum(ops.values())} instructions, HGMMA {ops['HGMMA']}, "
              f"LDC {ops['LDC']}, STL {ops['STL']}, LDL {ops['LDL']}, MUFU {ops['MUFU']}")
        if shape:
            print(f"    {loop_shape(instrs, s, e)}")
    inc = [a for a, t, _ in instrs if "USETMAXREG" in t and "TRY_ALLOC" in t]
    dec = [a for a, t, _ in instrs if "USETMAXREG" in t and "DEALLOC" in t]
    if inc:
        lo = inc[0]
        hi = min([a for a in dec if a > lo], default=instrs[-1][0] + 1)
        spills = [(a, t, w) for a, t, w in instrs if lo < a < hi and opcode(t) in ("STL", "LDL")]
        print(f"  consumer code [{lo:#x}, {hi:#x}): {len(spills)} spill instructions")
        for a, t, w in spills:
            text = t.split(" (")[0].rstrip()
            print(f"    {a:#x} {text}  ({w[0]}:{w[1]})" if w else f"    {a:#x} {text}")


def main():
    shape = "--shape" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--shape"]
    if not args:
        sys.exit(__doc__)
    only = args[1] if len(args) > 1 else ""
    with tempfile.TemporaryDirectory() as work:
        cubins = [args[0]] if args[0].endswith(".cubin") else extract_cubins(args[0], work)
        for cubin in cubins:
            for name, (instrs, labels) in parse(disassemble(cubin)).items():
                if only in name and instrs:
                    report(name, instrs, labels, shape)


if __name__ == "__main__":
    main()
