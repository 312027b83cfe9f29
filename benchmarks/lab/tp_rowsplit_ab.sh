#!/usr/bin/env bash
# tp_rowsplit_ab.sh — A/B of a tensor-parallel prefill's row-parallel steps, on a machine of 2+
# GPUs, in one run. "this" is the tree as it stands: from tuning::kTpRowSplitMinRows rows on, each
# wo / w2 step is a reduce-scatter of the bf16 parts, add + RMSNorm of the rank's share of rows,
# and an all-gather of the normalized rows (CudaEngine::row_parallel_matmul). "allreduce" is a
# copy with that switch point moved out of reach: one NCCL all-reduce of the bf16 parts, the sum
# added into every row of x, and the next matmul's RMSNorm over every row. Runs the 8B shape's
# 2048-token prefill at TP 1 once and at every TP size of $TPS (default "2", "2 4" on 4 GPUs) in
# both trees, REPEATS (5) repeats each.
#   OUT=/tmp/ab bash benchmarks/lab/tp_rowsplit_ab.sh
# $OUT gets prefill_*.json, bench.log, table.txt and the build logs. The measurements are in
# docs/kernels/allreduce.md.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
REPEATS=${REPEATS:-5}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TPS=${TPS:-$( (( GPUS >= 4 )) && echo "2 4" || echo "2")}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LLAMA_BRRR_CUDA=1 LLAMA_BRRR_CUDA_ARCHS=${LLAMA_BRRR_CUDA_ARCHS:-90a}
VARIANT=/tmp/tpab_allreduce
rm -rf "$VARIANT" && mkdir -p "$VARIANT" &&
    tar -C "$ROOT" --exclude=./build --exclude=./.whl --exclude=./.git -cf - . | tar -C "$VARIANT" -xf - &&
    sed -i 's/constexpr int kTpRowSplitMinRows = [0-9]*;/constexpr int kTpRowSplitMinRows = 1 << 30;/' \
        "$VARIANT/csrc/cuda/tuning.h" &&
    grep -q "kTpRowSplitMinRows = 1 << 30" "$VARIANT/csrc/cuda/tuning.h" || { echo "the variant did not take"; exit 1; }
(MAX_JOBS=${MAX_JOBS:-32} python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1) &
this_build=$!
(cd "$VARIANT" && MAX_JOBS=${MAX_JOBS:-32} python3 setup.py build_ext --inplace > "$OUT/build_allreduce.log" 2>&1) &
variant_build=$!
wait $this_build || { tail -30 "$OUT/build.log"; exit 1; }
wait $variant_build || { tail -30 "$OUT/build_allreduce.log"; exit 1; }
say built
BENCH=(python3 -m llama_brrr bench --device cuda --repeats "$REPEATS" --shape llama3-8b -b 1 --workloads 2048:0)
PYTHONPATH=$ROOT:${PYTHONPATH:-} timeout 120 "${BENCH[@]}" --tensor-parallel 1 --json "$OUT/prefill_tp1.json" \
    >> "$OUT/bench.log" 2>&1
say "TP 1 done"
for tp in $TPS; do
    for name in this allreduce; do
        d=$ROOT
        [[ $name == allreduce ]] && d=$VARIANT
        (cd "$d" && PYTHONPATH=$d:${PYTHONPATH:-} timeout 150 "${BENCH[@]}" --tensor-parallel "$tp" \
            --json "$OUT/prefill_tp${tp}_$name.json" >> "$OUT/bench.log" 2>&1)
        say "TP $tp $name done"
    done
done
python3 - "$OUT" $TPS <<'PY' | tee "$OUT/table.txt"
import json, sys
out, tps = sys.argv[1], sys.argv[2:]
def rate(path):
    try:
        r = json.load(open(path))["runs"][0]["prefill_tok_s"]
    except (OSError, KeyError, IndexError, ValueError) as e:
        return None, f"unreadable ({e!r})"
    return r["median"], f"[{r['min']:.0f}, {r['max']:.0f}]"
one, spread = rate(f"{out}/prefill_tp1.json")
print(f"TP 1: {one} tok/s {spread}")
for tp in tps:
    for name in ("this", "allreduce"):
        v, s = rate(f"{out}/prefill_tp{tp}_{name}.json")
        ratio = f"{v / one:.3f}x" if v and one else "-"
        print(f"TP {tp} {name:9s} {v} tok/s {s}  {ratio} of TP 1")
PY
