"""Tables on stdout, the results JSON, and the grouped bar chart of a compare run."""

from __future__ import annotations

import json
import re
from pathlib import Path


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _pct(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "n/a"


def _rate(summary: dict) -> str:
    return f"{summary['median']:.1f} ±{summary['spread_pct']:.0f}%"


def bench_rows(run: dict) -> list[list[str]]:
    """llama-bench style: one row per phase of a workload (ppN = prefill, tgN@C = decode)."""
    w = run["workload"]
    common = [run["model"], run["dtype"], str(w["batch"])]
    rows = [common + [f"pp{w['prompt']}", _rate(run["prefill_tok_s"]),
                      f"{1e3 * run['ttft_s']['median']:.1f}", "", _pct(run["prefill"]["mfu"]),
                      _pct(run["prefill"]["mbu"])]]
    if "decode_tok_s" in run:
        rows.append(common + [f"tg{w['generate']}@{w['prompt']}", _rate(run["decode_tok_s"]), "",
                              f"{run['ms_per_token']:.2f}", _pct(run["decode"]["mfu"]),
                              _pct(run["decode"]["mbu"])])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)] if rows else \
        [len(h) for h in header]
    line = "| " + " | ".join(h.ljust(n) for h, n in zip(header, widths)) + " |"
    rule = "|" + "|".join("-" * (n + 2) for n in widths) + "|"
    body = ["| " + " | ".join(c.ljust(n) for c, n in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, rule, *body])


def split_text(entry: dict, phase: str) -> str:
    s = entry.get("split", {})
    if "unavailable" in s or phase not in s:
        return "n/a"
    p = s[phase]
    wall = p.get("wall_s") or sum(p.get(k) or 0 for k in ("compute_s", "memory_s", "overhead_s"))
    if not wall:
        return "n/a"
    return (f"{100 * (p['compute_s'] or 0) / wall:.0f}/{100 * (p['memory_s'] or 0) / wall:.0f}/"
            f"{100 * (p['overhead_s'] or 0) / wall:.0f}")


def print_bench(result: dict) -> str:
    rows = [row for run in result["runs"] for row in bench_rows(run)]
    text = [f"{result['device_name']} ({result['device']}), median of {result['repeats']} after "
            f"{result['warmup']} warm-up; peaks: {result['peaks']['source']}",
            table(["model", "dtype", "batch", "test", "tok/s", "TTFT ms", "ms/tok", "MFU", "MBU"], rows)]
    text += [f"skipped {s['model']} {', '.join(s.get('workloads', []))}: {s['note']}"
             for s in result["skipped"]]
    return "\n".join(text)


def print_compare(result: dict) -> str:
    text = [f"{result['device_name']} ({result['device']}), median of {result['repeats']} after "
            f"{result['warmup']} warm-up; ratios = llama_brrr / contestant; split = compute/memory/"
            f"overhead % of the phase's wall time"]
    for run in result["runs"]:
        rows = []
        for key, e in run["contestants"].items():
            if "skipped" in e:
                rows.append([key, "-", "-", "-", "-", "-", e["skipped"][:70]])
                continue
            r = run["ratios"].get(key, {})
            agrees = e.get("check", {}).get("agrees")
            verdict = {True: "agrees", False: "DISAGREES", None: e.get("check", {}).get("note", "unchecked")}[agrees]
            rows.append([key,
                         _rate(e["decode_tok_s"]) if "decode_tok_s" in e else "-",
                         _rate(e["prefill_tok_s"]),
                         f"{r['decode_tok_s']:.2f}x" if "decode_tok_s" in r else "-",
                         f"{r['prefill_tok_s']:.2f}x" if "prefill_tok_s" in r else "-",
                         f"{split_text(e, 'decode')} / {split_text(e, 'prefill')}", verdict])
        text += ["", f"{run['model']} {run['dtype']} {run['name']}",
                 table(["contestant", "decode tok/s", "prefill tok/s", "decode x", "prefill x",
                        "split dec / pre", "check"], rows)]
    reasons = {e["split"]["unavailable"] for run in result["runs"] for e in run["contestants"].values()
               if "unavailable" in e.get("split", {})}
    text += [f"split n/a: {reason}" for reason in sorted(reasons)]
    text += [f"skipped {s['model']} {', '.join(s.get('workloads', []))}: {s['note']}"
             for s in result["skipped"]]
    return "\n".join(text)


def write_json(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def plot_compare(result: dict, path: Path) -> None:
    """Grouped bars: one group per workload and phase, one bar per contestant, log tok/s."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the PNG needs matplotlib: pip install matplotlib (or pip install "
                          "'llama_brrr[bench]'), or pass --no-png") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups, keys = [], []
    for run in result["runs"]:
        for phase, metric in (("decode", "decode_tok_s"), ("prefill", "prefill_tok_s")):
            values = {k: e[metric]["median"] for k, e in run["contestants"].items() if metric in e}
            if values:
                # A requantized twin's file name is long; its type says which file it is.
                groups.append((f"{run.get('file_type') or run['model']}\n{run['name']}\n{phase}", values))
                keys += [k for k in values if k not in keys]
    if not groups:
        return
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * max(1, len(keys) / 3)), 4.8))
    for j, key in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i, (_, v) in enumerate(groups) if key in v]
        ys = [v[key] for _, v in groups if key in v]
        bars = ax.bar(xs, ys, width, label=key, color="#d62728" if key == "llama_brrr" else None)
        ax.bar_label(bars, labels=[f"{y:.0f}" for y in ys], fontsize=6, padding=2)
    ax.set_xticks(range(len(groups)), [g for g, _ in groups], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s (median)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"llama_brrr compare, {result['device_name']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _mb(value) -> str:
    return f"{value / 1e6:.0f}" if isinstance(value, (int, float)) else "n/a"


def print_quant_peer(result: dict) -> str:
    """compare --quant-twins: each file's census, RSS and perplexity, then every ratio against its target."""
    text = ["", f"files ({result['threads']} threads on both sides):"]
    rows = []
    for label, f in result["files"].items():
        ppl = f.get("perplexity", {})
        rss = f["rss"]
        census = ", ".join(f"{k} {v}" for k, v in f["census"]["types"].items())
        rows.append([label, _mb(f["file_bytes"]), census,
                     _mb(rss["llama_brrr"].get("rss_after_load")), _mb(rss["llama_brrr"].get("peak_rss")),
                     _mb(rss["llama.cpp"].get("rss_after_load")),
                     f"{ppl['llama_brrr']:.3f} / {ppl['llama.cpp']:.3f} ({100 * (ppl['ratio'] - 1):+.2f}%)"
                     if ppl else "-"])
    text.append(table(["file", "MB", "tensors by type", "ours RSS MB", "ours peak MB", "llama.cpp RSS MB",
                       "ppl ours / llama.cpp"], rows))
    made = {f["made_by"] for f in result["files"].values() if f["made_by"] != "the source file"}
    text += [f"twins made by {m}" for m in sorted(made)]
    rows = [[t["file_type"], t["workload"], t["metric"].replace("_tok_s", ""),
             f"{t['llama_brrr']:.1f} ±{t['llama_brrr_spread_pct']:.0f}%",
             f"{t['llama.cpp']:.1f} ±{t['llama.cpp_spread_pct']:.0f}%", f"{t['ratio']:.2f}x",
             f">= {t['target']}x" if t["target"] is not None else "-",
             {True: "met", False: "NOT MET", None: "-"}[t["met"]]] for t in result["targets"]]
    text += ["", "issue 31 targets (llama_brrr / llama.cpp, medians, same run; ± = (max - min) / median):",
             table(["file", "workload", "phase", "llama_brrr tok/s", "llama.cpp tok/s", "ratio", "target", ""],
                   rows)]
    return "\n".join(text)
