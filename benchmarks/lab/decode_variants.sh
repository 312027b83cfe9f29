#!/usr/bin/env bash
# decode_variants.sh — what PDL buys, measured end to end: batch-1 decode of the Llama-3.2-1B and
# Llama-3-8B shapes (128-token prompt, 256 new tokens, CUDA graphs on), one process per variant:
#   01 shipped      every kernel launched with programmatic dependent launch (launch.cuh)
#   04 no-pdl       LLAMA_BRRR_PDL=0: kernels launched plainly (each waits for the last to drain)
# The fusions and launch choices that other variants once switched off are fixed in the kernels
# now; what each measured is in docs/kernels/gemv.md and docs/kernels/attention.md.
# Both compute the same tokens (the bench checks nothing here). Output: $OUT/<variant>.json and
# $OUT/table.txt (median decode tok/s, spread, ms/token, ratio to 01).
# ONLY="01" runs just the variants with those numbers; SHAPES picks the shapes (default both).
#   OUT=/tmp/variants [ONLY="01 04"] [SHAPES=llama3.2-1b] bash benchmarks/lab/decode_variants.sh [repeats]
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_variants}
REPEATS=${1:-3}
ONLY=${ONLY:-}
SHAPES=${SHAPES:-llama3.2-1b,llama3-8b}
mkdir -p "$OUT"
variants=(
    "01-shipped|"
    "04-no-pdl|LLAMA_BRRR_PDL=0"
)
for v in "${variants[@]}"; do
    name=${v%%|*}
    envs=${v#*|}
    [[ -z "$ONLY" || " $ONLY " == *" ${name%%-*} "* ]] || continue
    echo "== $name: ${envs:-(defaults)}"
    env $envs python3 -m llama_brrr bench --shape "$SHAPES" --device cuda -b 1 -p 128 -n 256 \
        --repeats "$REPEATS" --no-split --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
        || { echo "   failed: see $name.log"; tail -n 5 "$OUT/$name.log"; }
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows, base = [], {}
for path in sorted(out.glob("[0-9][0-9]-*.json")):
    for run in json.loads(path.read_text())["runs"]:
        tok = run["decode_tok_s"]
        rows.append((path.stem, run["model"], tok["median"], tok["spread_pct"], run["ms_per_token"]))
        base.setdefault(run["model"], tok["median"])
print(f"{'variant':16} {'shape':12} {'tok/s':>8} {'spread%':>8} {'ms/tok':>7} {'vs 01':>6}")
for name, model, tps, spread, ms in rows:
    print(f"{name:16} {model:12} {tps:8.1f} {spread:8.2f} {ms:7.3f} {tps / base[model]:6.3f}")
PY
