#!/usr/bin/env bash
# gemv_quant_ab.sh — A/B of quantized-GEMV source variants on one GPU, in one run: builds this
# tree, then one copy per variant with one source file swapped (the copies reuse this tree's
# objects, so each rebuilds that file), and per tree runs quant_decode_probe.py (8 layers of the 8B
# shape, q4_k_m, batches $PROBE_BATCHES, default 1,2) and gpu_gemv_quant_bench.py ($BENCH_ARGS,
# default M = 1 on the 8B projections).
#   VARIANTS="base=/path/gemv_quant_base.cu deep=/path/x.cu" OUT=/tmp/ab bash benchmarks/lab/gemv_quant_ab.sh
#   VARIANTS="walk=/tmp/walk.cu:csrc/cuda/gemv_quant_mma.cu" PROBE_BATCHES=1,2,16 \
#       BENCH_ARGS="--path mma --rows 2,16" OUT=/tmp/ab bash benchmarks/lab/gemv_quant_ab.sh
# A variant is NAME=FILE[:TARGET]: FILE replaces TARGET (default csrc/cuda/gemv_quant.cu), e.g. a
# `git show REV:csrc/cuda/gemv_quant.cu`.
# "this" is the tree as it stands. $OUT gets e2e.jsonl, kb_<name>.log / .json and the build logs,
# packed into one ab.tgz (the device machine returns few files).
set -u
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
R=$(mktemp -d)
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LLAMA_BRRR_CUDA=1 LLAMA_BRRR_CUDA_ARCHS=${LLAMA_BRRR_CUDA_ARCHS:-90a}
MAX_JOBS=16 python3 setup.py build_ext --inplace > "$R/build.log" 2>&1 || { tail -40 "$R/build.log"; exit 1; }
say built
names=(this)
declare -A dirs=([this]=$ROOT)
for spec in ${VARIANTS:-}; do
    name=${spec%%=*} file=${spec#*=} target=csrc/cuda/gemv_quant.cu
    if [[ "$file" == *:* ]]; then target=${file#*:} file=${file%%:*}; fi
    names+=("$name")
    dirs[$name]=/tmp/ab_$name
    rm -rf "/tmp/ab_$name" && cp -a "$ROOT" "/tmp/ab_$name" && cp "$file" "/tmp/ab_$name/$target" &&
        touch "/tmp/ab_$name/$target"
    (cd "/tmp/ab_$name" && MAX_JOBS=2 python3 setup.py build_ext --inplace > "$R/build_$name.log" 2>&1) &
done
wait
say "variants built: ${names[*]}"
for name in "${names[@]}"; do
    d=${dirs[$name]}
    (cd "$d" && PYTHONPATH=$d:${PYTHONPATH:-} timeout 120 python3 benchmarks/lab/quant_decode_probe.py --layers 8 \
        --label "$name" --batches "${PROBE_BATCHES:-1,2}" >> "$R/e2e.jsonl" 2>> "$R/e2e.err")
    say "decode $name: $(tail -1 "$R/e2e.jsonl")"
done
for name in "${names[@]}"; do
    d=${dirs[$name]}
    (cd "$d" && PYTHONPATH=$d:${PYTHONPATH:-} timeout 90 python3 benchmarks/lab/gpu_gemv_quant_bench.py \
        --types "${KTYPES:-q4_k,q6_k,q8_0}" ${BENCH_ARGS:---rows 1} --out "$R/kb_$name.json" > "$R/kb_$name.log" 2>&1)
    say "kernels $name"
    grep -E "^(wqkv|wo|w13|w2|lm_head) " "$R/kb_$name.log" | sed "s/^/$name /"
done
mkdir -p "$OUT"
tar czf "$OUT/ab.tgz" -C "$R" .
cp "$R/e2e.jsonl" "$OUT/" 2>/dev/null
