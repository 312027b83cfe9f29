#!/usr/bin/env bash
# decode_batches.sh — where the decode GEMV should leave the CUDA cores for the tensor cores,
# measured end to end: decode of the Llama-3.2-1B and Llama-3-8B shapes at batch 1..16 (128-token
# prompts, 64 new tokens, CUDA graphs on), once per switch point LLAMA_BRRR_GEMV_MMA_ROWS=N (batches
# of N or more rows take gemv.cu's tensor-core kernel; 17 = never), one process each.
# Output: $OUT/rows<N>.json and $OUT/table.txt (median decode tok/s per batch and switch point, and
# each against 17, the CUDA cores alone).
#   OUT=/tmp/batches [ROWS="2 3 5 17"] [BATCHES=1,2,3,4,8,16] bash benchmarks/lab/decode_batches.sh [repeats]
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_batches}
REPEATS=${1:-3}
ROWS=${ROWS:-2 3 5 17}
BATCHES=${BATCHES:-1,2,3,4,8,16}
SHAPES=${SHAPES:-llama3.2-1b,llama3-8b}
mkdir -p "$OUT"
for rows in $ROWS; do
    echo "== LLAMA_BRRR_GEMV_MMA_ROWS=$rows"
    LLAMA_BRRR_GEMV_MMA_ROWS=$rows python3 -m llama_brrr bench --shape "$SHAPES" --device cuda -b "$BATCHES" \
        -p 128 -n 64 --repeats "$REPEATS" --no-split --json "$OUT/rows$rows.json" > "$OUT/rows$rows.log" 2>&1 \
        || { echo "   failed: see rows$rows.log"; tail -n 5 "$OUT/rows$rows.log"; }
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
table = {}
for path in sorted(out.glob("rows*.json"), key=lambda p: int(p.stem[4:])):
    for run in json.loads(path.read_text())["runs"]:
        key = (run["model"], run["workload"]["batch"])
        table.setdefault(key, {})[int(path.stem[4:])] = run["decode_tok_s"]["median"]
cols = sorted({r for v in table.values() for r in v})
print(f"{'shape':12} {'batch':>5} " + " ".join(f"{'rows>=' + str(r):>16}" for r in cols) + "   (tok/s, x of rows>=17)")
for (model, batch), by in sorted(table.items()):
    base = by.get(17)
    cells = [f"{by[r]:9.1f} {by[r] / base:5.2f}x" if r in by and base else f"{by.get(r, float('nan')):16.1f}"
             for r in cols]
    print(f"{model:12} {batch:5d} " + " ".join(f"{c:>16}" for c in cells))
PY
