#!/usr/bin/env bash
# gemm_residual_spread.sh — the Hopper GEMM's AddResidual with the tile's residual asked of L2 box
# by box over the last 1 / F of its main loop (LLAMA_BRRR_GEMM_RESIDUAL_SPREAD=F) against not asked
# (F = 0), on a built tree:
#   1. the GEMM / matmul CUDA tests with F = 2;
#   2. gemm_epilogue_cost.py's add_residual on the Llama-3-8B wo / w2 and Llama-3.2-1B wo / w2
#      shapes at M = 512..8192 for F = 0, 1, 2, 4, alternated twice;
#   3. prefill of 2048 tokens, both shapes, end to end, F = 0, 1, 2, alternated twice.
# Output in $OUT: tests.log, spread<F>_<pass>.txt, prefill_spread<F>_<pass>.json, table.txt.
#   OUT=/tmp/spread bash benchmarks/lab/gemm_residual_spread.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm_residual_spread}
mkdir -p "$OUT"
LLAMA_BRRR_GEMM_RESIDUAL_SPREAD=2 timeout -k 5 150 python3 -m pytest -q -m cuda tests/test_cuda_kernels.py \
    -k "gemm or matmul" -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$OUT/tests.log"
for pass in 1 2; do
    for f in 0 1 2 4; do
        LLAMA_BRRR_GEMM_RESIDUAL_SPREAD=$f timeout -k 5 90 python3 benchmarks/lab/gemm_epilogue_cost.py \
            --label "spread${f}_$pass" --epilogues add_residual --shapes 4096x4096,4096x14336,2048x2048,2048x8192 \
            --ms 512,2048,4096,8192 > "$OUT/spread${f}_$pass.txt" 2>&1 || echo "spread=$f pass $pass: rc=$?"
    done
done
VAR=LLAMA_BRRR_GEMM_RESIDUAL_SPREAD VALUES="0 1 2" TAG=prefill_spread OUT="$OUT" bash benchmarks/lab/prefill_ab.sh
{
    echo "setting           N      K     M epilogue            us cuBLAS us x cuBLAS"
    for f in "$OUT"/spread?_?.txt; do grep -E "^spread" "$f"; done | sort -k2,2n -k3,3n -k4,4n -k1,1
    echo
    echo "prefill of 2048 tokens, TTFT ms (median / min of 5):"
    python3 benchmarks/lab/prefill_ttft.py "$OUT"/prefill_spread*.json
} > "$OUT/table.txt"
# the device returns few files: the table first in the output, then the 8B / 1B wo rows compactly
grep -E "^spread|^prefill" "$OUT/table.txt" | awk '{print $1, $2, $3, $4, $6, $8}' | grep -E " (4096 4096|2048 2048|4096 14336|2048 8192) " | head -200
grep -A20 "^prefill of" "$OUT/table.txt"
