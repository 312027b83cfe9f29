"""sass_diff.py — the SASS of two builds of one CUDA file, kernel by kernel: which kernels are
identical (immediates masked, so moved constants and branch targets do not count), which differ,
which are new or gone, with each kernel's instruction count, the instructions of its largest loop
(the span of its longest backward branch: a GEMV's walk), registers and spill stores (STL).
The check behind "SASS unchanged" in a commit or a docs/kernels row, and the quick look at what a
variant did to registers before it spends device time.

    python3 benchmarks/lab/sass_diff.py BASE.o NEW.o [--match gemv_quant_kernel] [--all]
    python3 benchmarks/lab/sass_diff.py BASE.o NEW.o --rename ', 1>\(' '>('   # a template argument added

BASE / NEW: object files or shared libraries (build/temp.*/cuda/gemv_quant.cu.o after
`python3 setup.py build_ext --inplace` in two trees). Needs cuobjdump (CUDA toolkit) on PATH or
in $CUOBJDUMP, and c++filt.
"""
import argparse
import os
import re
import subprocess
import sys

IMMEDIATE = re.compile(r"0x[0-9a-f]+")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)\s*$")
RESOURCES = re.compile(r"REG:(\d+).*?STACK:(\d+)")


def cuobjdump(args):
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    return subprocess.run([tool, *args], capture_output=True, text=True, check=True).stdout


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    # the anonymous namespace's tag differs between builds; drop it so that kernels pair up
    return [re.sub(r"\(anonymous namespace\)::", "", n) for n in out.splitlines()]


def largest_loop(code):
    """Instructions from the target of the longest backward branch to the branch, of (address, text)."""
    best = 0
    for at, ins in code:
        m = BRANCH_TARGET.search(ins)
        if m and int(m.group(1), 16) < at:
            target = int(m.group(1), 16)
            best = max(best, sum(1 for a, _ in code if target <= a <= at))
    return best


def kernels(path):
    """{demangled name: (masked instructions, registers, stack bytes, largest loop)}"""
    sass, loops, res = {}, {}, {}
    for block in re.split(r"\n\s+Function : ", cuobjdump(["-sass", path]))[1:]:
        name = block.split("\n", 1)[0].strip()
        code = [(int(at, 16), ins) for at, ins in INSTRUCTION.findall(block)]
        sass[name] = [IMMEDIATE.sub("X", ins) for _, ins in code]
        loops[name] = largest_loop(code)
    lines = cuobjdump(["--dump-resource-usage", path]).splitlines()
    for i, line in enumerate(lines[:-1]):
        m = re.search(r"Function (\S+):", line)
        r = RESOURCES.search(lines[i + 1])
        if m and r:
            res[m.group(1)] = (int(r.group(1)), int(r.group(2)))
    names = list(sass)
    return {d: (sass[n], *res.get(n, (-1, -1)), loops[n]) for n, d in zip(names, demangle(names))}


def describe(k):
    ins, regs, stack, loop = k
    spills = sum(1 for i in ins if i.split()[0].startswith("STL") or (i.startswith("@") and "STL" in i))
    return f"{len(ins)} instr (loop {loop}), {regs} regs, {stack} B stack, {spills} STL"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--match", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--all", action="store_true", help="list identical kernels too")
    ap.add_argument("--rename", nargs=2, metavar=("REGEX", "REPL"),
                    help="rewrite NEW's names before pairing (a template argument added or renamed)")
    a = ap.parse_args()
    base, new = kernels(a.base), kernels(a.new)
    if a.rename:
        new = {re.sub(a.rename[0], a.rename[1], n): k for n, k in new.items()}
    pick = [n for n in sorted(set(base) | set(new)) if a.match in n]
    counts = {"identical": 0, "differs": 0, "new": 0, "gone": 0}
    for n in pick:
        if n not in base:
            state = "new"
        elif n not in new:
            state = "gone"
        else:
            state = "identical" if base[n][0] == new[n][0] else "differs"
        counts[state] += 1
        if state != "identical" or a.all:
            was = describe(base[n]) if n in base else "-"
            now = describe(new[n]) if n in new else "-"
            print(f"{state:9s} {n}\n          {was}  ->  {now}")
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
