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
python3 benchmarks/lab/batches_table.py "$OUT" | tee "$OUT/table.txt"
