#!/usr/bin/env bash
# gemm_residual_red.sh — the Hopper GEMM's AddResidual epilogue by red.v4 from the accumulators
# (LLAMA_BRRR_GEMM_RESIDUAL_RED=1) against the TMA reduce of staged boxes (=0), on a built tree:
#   1. the GEMM / matmul CUDA tests with red on (tests/test_cuda_kernels.py -k "gemm or matmul");
#   2. gemm_epilogue_cost.py's add_residual (and bf16 store, the no-epilogue yardstick) on the
#      Llama-3-8B wo / w2 and Llama-3.2-1B wo / w2 shapes at M = 512..8192, alternated twice;
#   3. prefill of 2048 tokens, both shapes, end to end, alternated twice.
# Output in $OUT: tests.log, red<r>_<pass>.txt, prefill_red<r>_<pass>.json, table.txt.
#   OUT=/tmp/red bash benchmarks/lab/gemm_residual_red.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm_residual_red}
mkdir -p "$OUT"
LLAMA_BRRR_GEMM_RESIDUAL_RED=1 python3 -m pytest -q -m cuda tests/test_cuda_kernels.py -k "gemm or matmul" \
    -p no:cacheprovider > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"
for pass in 1 2; do
    for r in 0 1; do
        LLAMA_BRRR_GEMM_RESIDUAL_RED=$r python3 benchmarks/lab/gemm_epilogue_cost.py --label "red${r}_$pass" \
            --epilogues store_bf16,add_residual --shapes 4096x4096,4096x14336,2048x2048,2048x8192 \
            --ms 512,2048,4096,8192 > "$OUT/red${r}_$pass.txt" 2>&1
    done
done
for pass in 1 2; do
    for r in 0 1; do
        LLAMA_BRRR_GEMM_RESIDUAL_RED=$r python3 -m llama_brrr bench --shape llama3-8b,llama3.2-1b --device cuda \
            -b 1 -p 2048 -n 0 --repeats 5 --no-split --json "$OUT/prefill_red${r}_$pass.json" > /dev/null 2>&1
    done
done
{
    head -n 1 "$OUT/red0_1.txt"
    for f in "$OUT"/red?_?.txt; do tail -n +2 "$f"; done | sort -k2,2n -k3,3n -k4,4n -k5,5 -k1,1
    echo
    echo "prefill of 2048 tokens, TTFT ms (median / min of 5):"
    python3 - "$OUT" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "prefill_red*.json"))):
    cells = [f"{r['model']} {1e3 * r['ttft_s']['median']:.2f} / {1e3 * r['ttft_s']['min']:.2f}"
             for r in json.load(open(path))["runs"]]
    print(os.path.basename(path), *cells, sep="   ")
PY
} | tee "$OUT/table.txt"
