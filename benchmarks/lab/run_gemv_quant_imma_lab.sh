#!/usr/bin/env bash
# run_gemv_quant_imma_lab.sh — builds cuda_gemv_quant_imma_lab.cu for sm_90a, checks and times it
# (the program does both; exit 2 if any output is off). Output in $OUT: build.log, table.txt
#   OUT=/tmp/imma [EPI_SWEEP=1] bash benchmarks/lab/run_gemv_quant_imma_lab.sh     # Hopper GPU, 15-30 s
# (EPI_SWEEP=1: the epilogue-cost rows too, see the program's banner)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/imma_lab}
mkdir -p "$OUT"
BIN=$(mktemp -d)/imma_lab
nvcc -O3 -std=c++17 -Icsrc -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$BIN" benchmarks/lab/cuda_gemv_quant_imma_lab.cu \
    > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 2; }
timeout 150 "$BIN" 50 | tee "$OUT/table.txt"
