#!/usr/bin/env bash
# decode_batches.sh — batched decode end to end: the Llama-3.2-1B and Llama-3-8B shapes at batch
# 1..16 (128-token prompts, 64 new tokens, CUDA graphs on), one process. Batches of
# tuning::kGemvTensorCoreMinRows rows or more take gemv.cu's tensor-core kernel.
# Output: $OUT/batches.json and $OUT/table.txt (median decode tok/s per shape and batch). Run on a
# baseline tree too (gpu_check.sh's BASE_PATCH) and batches_table.py sets the two side by side.
#   OUT=/tmp/batches [BATCHES=1,2,3,4,8,16] bash benchmarks/lab/decode_batches.sh [repeats]
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_batches}
REPEATS=${1:-3}
BATCHES=${BATCHES:-1,2,3,4,8,16}
SHAPES=${SHAPES:-llama3.2-1b,llama3-8b}
mkdir -p "$OUT"
python3 -m llama_brrr bench --shape "$SHAPES" --device cuda -b "$BATCHES" -p 128 -n 64 \
    --repeats "$REPEATS" --no-split --json "$OUT/batches.json" > "$OUT/batches.log" 2>&1 \
    || { echo "   failed: see batches.log"; tail -n 5 "$OUT/batches.log"; }
python3 benchmarks/lab/batches_table.py "$OUT" | tee "$OUT/table.txt"
