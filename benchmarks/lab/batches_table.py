"""batches_table.py — the tables of decode_batches.sh's output: median decode tok/s per shape, batch
and GEMV switch point (rows<N>.json: LLAMA_BRRR_GEMV_MMA_ROWS=N), each against 17 (the CUDA cores
alone). Given a second folder (the same script run on a baseline tree, gpu_check.sh's BASE_PATCH),
it sets this folder's figures against the baseline's instead, point by point.
  python3 benchmarks/lab/batches_table.py OUT [BASE_OUT]
"""
import json
import sys
from pathlib import Path


def load(folder: Path) -> dict:
    """{(model, batch): {rows: decode tok/s median}} from every rows<N>.json in folder."""
    table = {}
    for path in folder.glob("rows*.json"):
        for run in json.loads(path.read_text())["runs"]:
            key = (run["model"], run["workload"]["batch"])
            table.setdefault(key, {})[int(path.stem[4:])] = run["decode_tok_s"]["median"]
    return table


def cell(value, base) -> str:
    if value is None:
        return f"{'-':>16}"
    return f"{value:9.1f} {value / base:5.2f}x" if base else f"{value:16.1f}"


def main():
    this = load(Path(sys.argv[1]))
    base = load(Path(sys.argv[2])) if len(sys.argv) > 2 else None
    cols = sorted({r for by in this.values() for r in by})
    against = ", x of the baseline's" if base is not None else ", x of rows>=17" if 17 in cols else ""
    print(f"{'shape':12} {'batch':>5} " + " ".join(f"{'rows>=' + str(r):>16}" for r in cols) + f"   (tok/s{against})")
    for (model, batch), by in sorted(this.items()):
        ref = {r: (base.get((model, batch), {}).get(r) if base is not None else by.get(17)) for r in cols}
        print(f"{model:12} {batch:5d} " + " ".join(cell(by.get(r), ref[r]) for r in cols))


if __name__ == "__main__":
    main()
