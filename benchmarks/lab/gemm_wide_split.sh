#!/usr/bin/env bash
# gemm_wide_split.sh — M = 512 projections as 256-column tiles with K split to fill one wave
# (LLAMA_BRRR_GEMM_WIDE_SPLIT=1, a switch of the tree at 6dccef8, retired after run CN: slower)
# against one wave of 128-column tiles (=0), on a built tree:
#   1. gemm_epilogue_cost.py at M = 512 on the 8B wo / w2 / wqkv and 1B wo / w2 / wqkv shapes,
#      bf16 store and residual add, alternated twice;
#   2. prefill of 512 tokens (one M = 512 chunk), both shapes, end to end, alternated twice;
#   3. once, with the switch off: the residual add at M = 2048 / 4096 / 8192 beside cuBLAS doing
#      the same job (an addmm into the fp32 residual), and prefill of 2048 tokens with the residual
#      spread off and on (LLAMA_BRRR_GEMM_RESIDUAL_SPREAD=0 / 4), alternated twice.
# Output in $OUT: epilogue.txt, same_job.txt, prefill_*.json, table.txt.
#   OUT=/tmp/wide bash benchmarks/lab/gemm_wide_split.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm_wide_split}
mkdir -p "$OUT"
SHAPES=4096x4096,4096x14336,6144x4096,2048x2048,2048x8192,3072x2048
for pass in 1 2; do
    for w in 0 1; do
        LLAMA_BRRR_GEMM_WIDE_SPLIT=$w timeout -k 5 90 python3 benchmarks/lab/gemm_epilogue_cost.py \
            --label "wide${w}_$pass" --epilogues store_bf16,add_residual --shapes $SHAPES --ms 512 \
            >> "$OUT/epilogue.txt" 2>&1 || echo "epilogue wide=$w pass $pass: rc=$?"
    done
done
VAR=LLAMA_BRRR_GEMM_WIDE_SPLIT VALUES="0 1" PROMPT=512 TAG=prefill512_wide OUT="$OUT" bash benchmarks/lab/prefill_ab.sh
timeout -k 5 120 python3 benchmarks/lab/gemm_epilogue_cost.py --label same_job --epilogues store_f32,add_residual \
    --shapes 4096x4096,4096x14336,2048x2048,2048x8192 --ms 512,2048,4096,8192 > "$OUT/same_job.txt" 2>&1 \
    || echo "same job: rc=$?"
VAR=LLAMA_BRRR_GEMM_RESIDUAL_SPREAD VALUES="0 4" TAG=prefill2048_spread OUT="$OUT" bash benchmarks/lab/prefill_ab.sh
{
    echo "setting           N      K     M epilogue            us cuBLAS us x cuBLAS same-job us x same"
    grep -E "^wide" "$OUT/epilogue.txt" | sort -k2,2n -k3,3n -k5,5 -k1,1
    echo
    cat "$OUT/same_job.txt"
    echo
    echo "prefill, TTFT ms (median / min of 5):"
    python3 benchmarks/lab/prefill_ttft.py "$OUT"/prefill*.json
} > "$OUT/table.txt"
cat "$OUT/table.txt"
