#!/usr/bin/env python3
"""Rewrites the results block of README.md (between `<!-- results:begin -->` and
`<!-- results:end -->`) from the JSON files in benchmarks/results/<machine>/, so no number in the
README is typed by hand.

    python scripts/readme_results.py            # rewrite README.md in place
    python scripts/readme_results.py --check    # exit 1 when README.md is out of date

Understood files: compare.json / compare_sweep.json and bench.json / sweep.json (llama-brrr
compare / bench), decode.json (the older benchmarks/bench_decode.py) and decode_smollm2.json
(benchmarks/bench_cpu.py). Others (kernels.json, logs) are linked, not tabulated.
"""

from __future__ import annotations

import argparse
import json
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


def table_rows(results: Path) -> list[list[str]]:
    rows = []
    for path in sorted(results.glob("*/*.json")):
        data = json.loads(path.read_text())
        machine = data.get("device_name") or data.get("gpu") or (data.get("machine") or {}).get("cpu", "")
        source = f"[{path.parent.name}]({path.relative_to(REPO).as_posix()}) {machine}".strip()
        if data.get("benchmark") == "compare":
            rows += rows_compare(data, source)
        elif data.get("benchmark") == "bench":
            rows += rows_bench(data, source)
        elif "shapes" in data:
            rows += rows_decode(data, source)
        elif "contestants" in data and "ratios" in data:
            rows += rows_cpu(data, source)
    return rows


def block(results: Path) -> str:
    header = ["results file, machine", "model", "workload", "llama_brrr tok/s", "opponent",
              "opponent tok/s", "llama_brrr x"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    note = ("Generated by `python scripts/readme_results.py` from benchmarks/results/*/*.json; "
            "medians, ratios measured in the same run on the same weights (each file records the "
            "command, versions and spread).")
    return "\n".join([note, "", *lines])


def rewrite(readme: Path, results: Path) -> bool:
    """Replaces the marked block; returns whether the file changed."""
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{readme}: no {BEGIN} ... {END} block to rewrite; add the two markers "
                         f"where the results table belongs")
    new = text[:start + len(BEGIN)] + "\n" + block(results) + "\n" + text[end:]
    readme.write_text(new)
    return new != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is out of date")
    args = parser.parse_args(argv)
    if args.check:
        before = args.readme.read_text()
        changed = rewrite(args.readme, args.results)
        args.readme.write_text(before)
        if changed:
            print(f"{args.readme} is out of date: run python scripts/readme_results.py", file=sys.stderr)
        return int(changed)
    changed = rewrite(args.readme, args.results)
    print(f"{args.readme}: results block {'rewritten' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
