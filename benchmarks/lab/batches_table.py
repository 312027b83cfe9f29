"""batches_table.py — the table of decode_batches.sh's output: median decode tok/s per shape and
batch, one column per JSON file of the folder. Given a second folder (the same script run on a
baseline tree, gpu_check.sh's BASE_PATCH), each figure is also set against the baseline's: its
column of the same name, or its only column.
  python3 benchmarks/lab/batches_table.py OUT [BASE_OUT]
"""
import json
import sys
from pathlib import Path


def load(folder: Path) -> dict:
    """{(model, batch): {file stem: decode tok/s median}} from every *.json in folder."""
    table = {}
    for path in sorted(folder.glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            key = (run["model"], run["workload"]["batch"])
            table.setdefault(key, {})[path.stem] = run["decode_tok_s"]["median"]
    return table


def cell(value, base) -> str:
    if value is None:
        return f"{'-':>16}"
    return f"{value:9.1f} {value / base:5.2f}x" if base else f"{value:16.1f}"


def main():
    this = load(Path(sys.argv[1]))
    base = load(Path(sys.argv[2])) if len(sys.argv) > 2 else None
    cols = sorted({c for by in this.values() for c in by})
    against = ", x of the baseline's" if base is not None else ""
    print(f"{'shape':12} {'batch':>5} " + " ".join(f"{c:>16}" for c in cols) + f"   (tok/s{against})")
    for (model, batch), by in sorted(this.items()):
        ref = {}
        if base is not None:
            theirs = base.get((model, batch), {})
            for c in cols:
                ref[c] = theirs.get(c, next(iter(theirs.values())) if len(theirs) == 1 else None)
        print(f"{model:12} {batch:5d} " + " ".join(cell(by.get(c), ref.get(c)) for c in cols))


if __name__ == "__main__":
    main()
