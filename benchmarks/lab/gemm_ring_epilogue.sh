#!/usr/bin/env bash
# gemm_ring_epilogue.sh — the Hopper GEMM's AddResidual / StoreF32 staged a whole tile at once in
# ring slots (LLAMA_BRRR_GEMM_RING_EPILOGUE=1, ring_box in gemm.cu) against two staging boxes per
# warpgroup (=0), on a built tree:
#   1. the GEMM / matmul CUDA tests with the ring epilogue on;
#   2. gemm_epilogue_cost.py (bf16 store, fp32 store, fp32 residual add) on the Llama-3-8B wo / w2
#      and Llama-3.2-1B wo / w2 shapes at M = 512..8192, alternated twice;
#   3. prefill of 2048 tokens, both shapes, end to end, alternated twice.
# Every step has a time limit (a lost mbarrier arrival would hang). Output in $OUT: tests.log,
# ring<r>_<pass>.txt, prefill_ring<r>_<pass>.json, table.txt.
#   OUT=/tmp/ring bash benchmarks/lab/gemm_ring_epilogue.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm_ring_epilogue}
mkdir -p "$OUT"
LLAMA_BRRR_GEMM_RING_EPILOGUE=1 timeout -k 5 150 python3 -m pytest -q -m cuda tests/test_cuda_kernels.py \
    -k "gemm or matmul" -p no:cacheprovider -x > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -n 3 "$OUT/tests.log"
for pass in 1 2; do
    for r in 0 1; do
        LLAMA_BRRR_GEMM_RING_EPILOGUE=$r timeout -k 5 90 python3 benchmarks/lab/gemm_epilogue_cost.py \
            --label "ring${r}_$pass" --shapes 4096x4096,4096x14336,2048x2048,2048x8192 --ms 512,2048,4096,8192 \
            > "$OUT/ring${r}_$pass.txt" 2>&1 || echo "ring=$r pass $pass: rc=$?"
    done
done
for pass in 1 2; do
    for r in 0 1; do
        LLAMA_BRRR_GEMM_RING_EPILOGUE=$r timeout -k 5 90 python3 -m llama_brrr bench --shape llama3-8b,llama3.2-1b \
            --device cuda -b 1 -p 2048 -n 0 --repeats 5 --no-split --json "$OUT/prefill_ring${r}_$pass.json" \
            > /dev/null 2>&1 || echo "prefill ring=$r pass $pass: rc=$?"
    done
done
{
    echo "setting           N      K     M epilogue            us cuBLAS us x cuBLAS"
    for f in "$OUT"/ring?_?.txt; do grep -E "^ring" "$f"; done | sort -k2,2n -k3,3n -k4,4n -k5,5 -k1,1
    echo
    echo "prefill of 2048 tokens, TTFT ms (median / min of 5):"
    python3 - "$OUT" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "prefill_ring*.json"))):
    cells = [f"{r['model']} {1e3 * r['ttft_s']['median']:.2f} / {1e3 * r['ttft_s']['min']:.2f}"
             for r in json.load(open(path))["runs"]]
    print(os.path.basename(path), *cells, sep="   ")
PY
} | tee "$OUT/table.txt"
