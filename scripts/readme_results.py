#!/usr/bin/env python3
"""Rewrites the generated results blocks (between `<!-- results:begin -->` and
`<!-- results:end -->`) from the JSON files in benchmarks/results/<machine>/, so no number in them
is typed by hand: the root README.md gets a short table of headline ratios, each
benchmarks/results/<machine>/README.md every figure of that machine's files with the command that
reproduces it.

    python scripts/readme_results.py            # rewrite the READMEs in place
    python scripts/readme_results.py --check    # exit 1 when one of them is out of date

Understood files: compare*.json and bench.json / sweep.json / prefill_*.json (llama-brrr compare /
bench), decode.json (the older benchmarks/bench_decode.py) and decode_smollm2.json
(benchmarks/bench_cpu.py). Others (kernels*.json, logs) are listed with their command, not tabulated.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


# Until then the compare harness built one torch.compile model per batch size, its static cache
# sized for the group's longest workload, which its attention reads in full every token; newer
# files name the cache length in the contestant's note.
SHARED_COMPILED_CACHE_UNTIL = "2026-11-25T23:40"


def _longer_cache(data: dict, run: dict, entry: dict) -> str:
    """The flag of a torch.compile figure measured on a cache sized for a longer workload."""
    if "positions" in entry.get("note", "") or data.get("date_utc", "") >= SHARED_COMPILED_CACHE_UNTIL:
        return ""
    def length(r):
        return r["workload"]["prompt"] + r["workload"]["generate"]
    longest = max((r for r in data["runs"] if r["model"] == run["model"]), key=length)
    return f" (cache sized for {longest['name'].split(' ', 1)[1]})" if length(longest) > length(run) else ""


def rows_compare(data: dict, source: str) -> list[list[str]]:
    rows = []
    for run in data["runs"]:
        ours = run["contestants"]["llama_brrr"]
        for key, entry in run["contestants"].items():
            if key == "llama_brrr" or "skipped" in entry:
                continue
            agrees = entry.get("check", {}).get("agrees")
            flag = "" if agrees else " (outputs disagree)" if agrees is False else " (unchecked)"
            if key == "torch-compile":
                flag += _longer_cache(data, run, entry)
            for phase, metric in (("decode", "decode_tok_s"), ("prefill", "prefill_tok_s")):
                if metric in entry and metric in ours:
                    rows.append([source, f"{run['model']} {run['dtype']}", f"{run['name']} {phase}",
                                 f"{ours[metric]['median']:.1f}", key + flag,
                                 f"{entry[metric]['median']:.1f}",
                                 _x(ours[metric]["median"] / entry[metric]["median"])])
    return rows


def rows_decode(data: dict, source: str) -> list[list[str]]:
    rows = []
    for shape, result in data["shapes"].items():
        if "ours" not in result:
            continue
        ours = result["ours"]["tok_s_median"]
        workload = f"b1 pp{result['prompt_tokens']} decode"
        # That script's "hf-eager" ran transformers with sdpa attention.
        for key, label in (("torch-eager", "torch-eager"), ("hf-eager", "hf-sdpa"),
                           ("torch-compile", "torch-compile")):
            theirs = result.get(key, {})
            if "tok_s_median" in theirs:
                rows.append([source, f"{shape} bf16", workload, f"{ours:.1f}", label,
                             f"{theirs['tok_s_median']:.1f}", _x(ours / theirs["tok_s_median"])])
    return rows


def rows_cpu(data: dict, source: str) -> list[list[str]]:
    rows = []
    contestants = data["contestants"]
    for name in data.get("ratios", {}):
        ours, theirs = (part.strip() for part in name.split("/"))
        a = contestants[ours]["summary"]["decode_tok_s"]["median"]
        b = contestants[theirs]["summary"]["decode_tok_s"]["median"]
        rows.append([source, f"SmolLM2-135M ({contestants[ours]['label']})",
                     f"b1 pp{data['prompt']['tokens']} decode, {data['threads']} threads", f"{a:.1f}",
                     contestants[theirs]["label"], f"{b:.1f}", _x(a / b)])
    return rows


def rows_bench(data: dict, source: str) -> list[list[str]]:
    rows = []
    for run in data["runs"]:
        for phase, metric in (("prefill", "prefill_tok_s"), ("decode", "decode_tok_s")):
            if metric in run:
                mbu = run[phase].get("mbu")
                rows.append([source, f"{run['model']} {run['dtype']}", f"{run['name']} {phase}",
                             f"{run[metric]['median']:.1f}", "-", "-",
                             f"MBU {100 * mbu:.0f}%" if mbu else "-"])
    return rows


def file_rows(data: dict, source: str) -> list[list[str]] | None:
    """The rows of one results file (source first), or None for a file of another kind."""
    if data.get("benchmark") == "compare":
        return rows_compare(data, source)
    if data.get("benchmark") == "bench":
        return rows_bench(data, source)
    if "shapes" in data:
        return rows_decode(data, source)
    if "contestants" in data and "ratios" in data:
        return rows_cpu(data, source)
    return None


def table_rows(results: Path) -> list[list[str]]:
    """Every tabulated row of every machine's files, the results file and machine first."""
    rows = []
    for path in sorted(results.glob("*/*.json")):
        data = json.loads(path.read_text())
        machine = data.get("device_name") or data.get("gpu") or (data.get("machine") or {}).get("cpu", "")
        source = f"[{path.parent.name}]({path.relative_to(REPO).as_posix()}) {machine}".strip()
        rows += file_rows(data, source) or []
    return rows


# ---- the root README: headline ratios ------------------------------------------------------------

OPPONENTS = [("torch-eager", "torch eager"), ("hf-eager", "HF eager"), ("hf-sdpa", "HF sdpa"),
             ("torch-compile", "torch.compile"), ("llama.cpp", "llama.cpp")]

# (machine/file, model, workload name, phase): one row each, every ratio in a row from one run.
GPU_HEADLINES = [
    ("h100-sxm/compare_decode_1b.json", "llama3.2-1b", "b1 pp128 tg128", "decode"),
    ("h100-sxm/compare_decode_1b.json", "llama3.2-1b", "b1 pp2048 tg128", "decode"),
    ("h100-sxm/compare_decode_8b.json", "llama3-8b", "b1 pp128 tg256", "decode"),
    ("h100-sxm/compare_prefill_2048.json", "llama3.2-1b", "b1 pp2048", "prefill"),
    ("h100-sxm/compare_prefill_2048.json", "llama3-8b", "b1 pp2048", "prefill"),
    ("h100-sxm/compare_prefill.json", "llama3.2-1b", "b1 pp8192", "prefill"),
    ("h100-sxm/compare_prefill.json", "llama3-8b", "b1 pp8192", "prefill"),
]
CPU_HEADLINES = "cpu/decode_smollm2.json"
CPU_QUANT_HEADLINES = "cpu/compare_quant.json"
BENCH_HEADLINE = "h100-sxm/bench.json"


def _machine_link(results: Path, rel: str, label: str) -> str:
    readme = (results / rel).parent / "README.md"
    return f"[{label}]({readme.relative_to(REPO).as_posix()})" if readme.is_relative_to(REPO) else label


def _load(results: Path, rel: str) -> dict | None:
    path = results / rel
    return json.loads(path.read_text()) if path.exists() else None


def headline_gpu(results: Path) -> list[list[str]]:
    rows = []
    for rel, model, name, phase in GPU_HEADLINES:
        data = _load(results, rel)
        run = next((r for r in (data or {}).get("runs", []) if r["model"] == model and r["name"] == name), None)
        if run is None:
            continue
        metric = f"{phase}_tok_s"
        ours = run["contestants"]["llama_brrr"][metric]["median"]
        cells = []
        for key, _ in OPPONENTS:
            entry = run["contestants"].get(key, {})
            if "skipped" in entry or metric not in entry:
                cells.append("-")
                continue
            agrees = entry.get("check", {}).get("agrees")
            flag = "" if agrees else " (outputs disagree)" if agrees is False else " (unchecked)"
            if key == "torch-compile":
                flag += _longer_cache(data, run, entry)
            cells.append(_x(ours / entry[metric]["median"]) + flag)
        machine = _machine_link(results, rel, data.get("device_name", rel.split("/")[0]))
        rows.append([machine, f"{model} {run['dtype']}", f"{name} {phase}", f"{ours:.1f}", *cells])
    return rows


def headline_cpu(results: Path) -> list[list[str]]:
    data = _load(results, CPU_HEADLINES)
    if data is None:
        return []
    contestants = data["contestants"]
    machine = _machine_link(results, CPU_HEADLINES, f"CPU, {data['threads']} threads")
    rows = []
    for metric, phase in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
        for ours_key in [k for k in contestants if k.startswith("llama_brrr")]:
            ours = contestants[ours_key]["summary"][metric]["median"]
            cells = []
            for key, _ in OPPONENTS:
                # The ratios the file pairs up: f32 with llama.cpp's F32 file, bf16 with its F16 one.
                pair = next((name.split("/")[1].strip() for name in data["ratios"]
                             if name.split("/")[0].strip() == ours_key
                             and name.split("/")[1].strip().startswith(key)), None)
                if pair is None:
                    cells.append("-")
                    continue
                theirs = contestants[pair]["summary"][metric]["median"]
                label = contestants[pair]["label"].split()[-1] if key == "llama.cpp" else ""
                cells.append(_x(ours / theirs) + (f" ({label})" if label else ""))
            rows.append([machine, f"SmolLM2-135M {contestants[ours_key]['label'].split()[-1]}",
                         f"b1 pp{data['prompt']['tokens']} {phase}", f"{ours:.1f}", *cells])
    return rows


def headline_cpu_quant(results: Path) -> list[list[str]]:
    """The quantized files as stored against llama.cpp on the same file (compare --quant-twins)."""
    data = _load(results, CPU_QUANT_HEADLINES)
    if data is None:
        return []
    machine = _machine_link(results, CPU_QUANT_HEADLINES, "CPU, 2 threads")
    rows = []
    for run in data["runs"]:
        ours = run["contestants"]["llama_brrr"]
        theirs = run["contestants"].get("llama.cpp", {})
        agrees = theirs.get("check", {}).get("agrees")
        for metric, phase in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
            if metric not in ours or metric not in theirs or (phase == "decode" and not run["workload"]["generate"]):
                continue
            if phase == "prefill" and run["workload"]["generate"]:
                continue  # the prefill row is the long-prompt workload's
            ratio = ours[metric]["median"] / theirs[metric]["median"]
            flag = "" if agrees else " (outputs disagree)" if agrees is False else " (unchecked)"
            cells = ["-"] * (len(OPPONENTS) - 1) + [_x(ratio) + f" ({run['file_type']})" + flag]
            rows.append([machine, f"SmolLM2-135M {run['file_type']} as stored",
                         f"{run['name']} {phase}", f"{ours[metric]['median']:.1f}", *cells])
    return rows


def headline_bench(results: Path) -> str:
    data = _load(results, BENCH_HEADLINE)
    if data is None:
        return ""
    parts = []
    for run in data["runs"]:
        if "decode_tok_s" in run:
            mbu = run["decode"].get("mbu")
            parts.append(f"{run['model']} {run['decode_tok_s']['median']:.1f} tok/s"
                         + (f" (MBU {100 * mbu:.0f}%)" if mbu else ""))
    link = f"[{BENCH_HEADLINE.split('/')[1]}]({(results / BENCH_HEADLINE).relative_to(REPO).as_posix()})"
    return (f"Batch-1 decode alone, 128-token prompt, 256 new tokens ({link}, "
            f"{data.get('device_name', '')}): " + ", ".join(parts) + ".")


def block(results: Path) -> str:
    """The root README's block: headline ratios, llama_brrr's speed over each opponent's."""
    header = ["machine", "model", "workload", "llama_brrr tok/s"] + [f"x {label}" for _, label in OPPONENTS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |"
              for row in headline_gpu(results) + headline_cpu_quant(results) + headline_cpu(results)]
    note = ("Generated by `python scripts/readme_results.py` from benchmarks/results/*/*.json: medians; "
            "each ratio is llama_brrr's tok/s over the opponent's, both measured in the same run on "
            "the same weights after their outputs were checked to agree; `-`: not measured there. "
            "Every other figure, with the command that reproduces it, is in the machine's README.")
    return "\n".join([note, "", *lines, "", headline_bench(results)]).rstrip()


# ---- benchmarks/results/<machine>/README.md: every figure with its command ------------------------

def reproduce(data: dict, path: Path) -> str:
    """The command that wrote path, as run from a checkout (the recorded one wrote elsewhere)."""
    command = data.get("command", "")
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    command = re.sub(r"^\S*__main__\.py", "llama-brrr", command)
    command = re.sub(r"^\S*python3?(?=\s)", "python3", command)
    command = re.sub(r" --budget-s \S+", "", command)
    command = re.sub(r" --(json|out) \S+", rf" --\1 {rel}", command)
    return re.sub(r" --out-dir \S+", f" --json {rel}", command)


def machine_block(machine: Path) -> str:
    header = ["model", "workload", "llama_brrr tok/s", "opponent", "opponent tok/s", "llama_brrr x / MBU"]
    lines = ["Generated by `python scripts/readme_results.py` from the JSON files here: medians, "
             "each file also records its versions, machine, peaks and the spread of its repeats."]
    listed = []
    for path in sorted(machine.glob("*.json")):
        data = json.loads(path.read_text())
        rows = file_rows(data, "")
        when = data.get("date_utc", "")[:10]
        command = reproduce(data, path)
        if rows is None:
            listed.append(f"- [{path.name}]({path.name}): `{command}`")
            continue
        lines += ["", f"### [{path.name}]({path.name})" + (f" ({when})" if when else ""), "",
                  f"`{command}`", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row[1:]) + " |" for row in rows]
    if listed:
        lines += ["", "### Per-kernel files (described below)", "", *listed]
    return "\n".join(lines)


def _replace(readme: Path, new_block: str) -> bool:
    """Replaces the marked block of readme; returns whether the file changed."""
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{readme}: no {BEGIN} ... {END} block to rewrite; add the two markers "
                         f"where the results table belongs")
    new = text[:start + len(BEGIN)] + "\n" + new_block + "\n" + text[end:]
    readme.write_text(new)
    return new != text


def rewrite(readme: Path, results: Path) -> bool:
    """Rewrites the root README's headline block; returns whether the file changed."""
    return _replace(readme, block(results))


def targets(readme: Path, results: Path) -> list[tuple[Path, str]]:
    """Every README with a generated block, and the block it gets."""
    out = [(readme, block(results))]
    for machine_readme in sorted(results.glob("*/README.md")):
        if BEGIN in machine_readme.read_text():
            out.append((machine_readme, machine_block(machine_readme.parent)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--check", action="store_true", help="exit 1 if a README is out of date")
    args = parser.parse_args(argv)
    stale = 0
    for readme, new_block in targets(args.readme, args.results):
        before = readme.read_text()
        changed = _replace(readme, new_block)
        if args.check:
            readme.write_text(before)
            if changed:
                print(f"{readme} is out of date: run python scripts/readme_results.py", file=sys.stderr)
            stale += changed
        else:
            print(f"{readme}: results block {'rewritten' if changed else 'already up to date'}")
    return int(stale > 0)


if __name__ == "__main__":
    sys.exit(main())
