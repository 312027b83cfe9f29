"""The house rules of docs/design.md ("Lab discipline") that a machine can check: kernel comments
state design, not history (no run letters, dates or links into benchmark results); at most four
`LLAMA_BRRR_*` runtime switches are read by csrc/ (the rest of the tuning is constants in
csrc/cuda/tuning.h); nothing includes a `.cu` file (lab programs include headers)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CSRC = REPO / "csrc"
LAB = REPO / "benchmarks" / "lab"
SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".inl"}
MAX_RUNTIME_SWITCHES = 4

STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
# "run CX", "runs BT-BV", "(run A)"; not "runs M = 1 rows" or "run N x K", where the capital is a
# matrix dimension.
RUN_LETTER = re.compile(r"\bruns? [A-Z]{1,2}\b(?!\s*(?:[=<>×*/+]|x\b|-\s*\d))")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
RESULTS_LINK = re.compile(r"benchmarks/results")
HISTORY = {"run letter": RUN_LETTER, "date": DATE, "benchmarks/results link": RESULTS_LINK}
SWITCH_READ = re.compile(r'\b(?:getenv|env_\w+)\s*\(\s*"(LLAMA_BRRR_\w+)"')
SWITCH_NAME = re.compile(r'^"(LLAMA_BRRR_\w+)"$')
CU_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^">]*\.cu)[">]', re.MULTILINE)


def sources(root: Path):
    return sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())


def comments(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every comment, string literals blanked first so that a "//" inside
    one does not start a comment."""
    code = STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', text)
    return [(code.count("\n", 0, m.start()) + 1, m.group()) for m in COMMENT.finditer(code)]


def history_in_comments(text: str) -> list[str]:
    found = []
    for line, comment in comments(text):
        for what, pattern in HISTORY.items():
            found += [f"line {line}: {what} {m.group()!r}" for m in pattern.finditer(comment)]
    return found


def runtime_switches(text: str) -> set[str]:
    """LLAMA_BRRR_* names read from the environment: passed to getenv / env_* by name, or held as
    a string literal that is exactly such a name (read through a constant)."""
    code = COMMENT.sub(" ", text)
    names = set(SWITCH_READ.findall(code))
    names |= {m.group(1) for s in STRING.finditer(code) if (m := SWITCH_NAME.match(s.group()))}
    return names


def test_patterns_catch_what_they_should():
    """The checks below are only as good as their patterns: each against samples."""
    dirty = ('// measured in run CX (2026-11-26), see benchmarks/results/h100-sxm/x.txt\n'
             '/* runs BT-BV agreed; run A was slower */\n')
    found = history_in_comments(dirty)
    assert sum("run letter" in f for f in found) == 3, found
    assert sum("date" in f for f in found) == 1 and sum("benchmarks/results" in f for f in found) == 1
    clean = ('// The kernel runs M = 1 rows on CUDA cores; a warp runs N x K tiles, then K - 1; run it.\n'
             'const char* s = "see benchmarks/results // not a comment";  // Hopper runs TMA stores\n')
    assert history_in_comments(clean) == [], history_in_comments(clean)
    assert runtime_switches('static const bool on = env_flag("LLAMA_BRRR_PDL", true);\n'
                            'const char* v = std::getenv("LLAMA_BRRR_A");\n'
                            'constexpr const char* kName = "LLAMA_BRRR_B";\n'
                            '// env_int("LLAMA_BRRR_COMMENTED", 0)\n') == {"LLAMA_BRRR_PDL", "LLAMA_BRRR_A",
                                                                             "LLAMA_BRRR_B"}
    assert CU_INCLUDE.findall('#include "cuda/attention.cu"\n  #  include <x/gemm.cu>\n'
                              '#include "cuda/hopper.cuh"\n#include "cuda/ops.h"\n') == \
        ["cuda/attention.cu", "x/gemm.cu"]


def test_csrc_comments_state_design_not_history():
    found = [f"{path.relative_to(REPO)} {hit}" for path in sources(CSRC)
             for hit in history_in_comments(path.read_text(errors="replace"))]
    assert not found, ("measured history belongs in docs/kernels/<family>.md or git, not in csrc/ "
                       "comments:\n  " + "\n  ".join(found))


def test_at_most_four_runtime_switches():
    names: dict[str, list[str]] = {}
    for path in sources(CSRC):
        for name in runtime_switches(path.read_text(errors="replace")):
            names.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert len(names) <= MAX_RUNTIME_SWITCHES, (
        f"{len(names)} LLAMA_BRRR_* switches read by csrc/ (at most {MAX_RUNTIME_SWITCHES}; tuning "
        f"belongs in csrc/cuda/tuning.h as constants): "
        + ", ".join(f"{n} ({', '.join(p)})" for n, p in sorted(names.items())))


def test_no_cu_file_is_included():
    found = [f"{path.relative_to(REPO)}: {name}" for root in (CSRC, LAB) for path in sources(root)
             for name in CU_INCLUDE.findall(path.read_text(errors="replace"))]
    assert not found, "include headers (.cuh / .h), never .cu files:\n  " + "\n  ".join(found)
