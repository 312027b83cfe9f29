#!/usr/bin/env bash
# tp_overlap_ab.sh — A/B of overlapping a prefill's all-reduces with its matmuls under tensor
# parallelism, on a machine of 2+ GPUs, in one run. "this" is the tree as it stands (each wo / w2
# all-reduce after the whole matmul). Every variant is a copy with
# benchmarks/lab/variants/tp_overlap_parts.patch applied (CudaEngine::row_parallel_matmul cuts a
# prefill pass into parts of ROWS rows; each part's NCCL all-reduce and add run on a second stream
# beside the next part's matmul), its part size written into forward.cu (only the changed files
# rebuild). Runs the 8B shape's 2048-token prefill at TP 1 once and at TP $TP (default 2) in every tree.
#   VARIANTS="p1024=1024 p512=512" OUT=/tmp/ab bash benchmarks/lab/tp_overlap_ab.sh
# $OUT gets prefill_*.json, bench.log, table.txt and the build logs. The measurements are in
# docs/kernels/allreduce.md.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
TP=${TP:-2}
REPEATS=${REPEATS:-5}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LLAMA_BRRR_CUDA=1 LLAMA_BRRR_CUDA_ARCHS=${LLAMA_BRRR_CUDA_ARCHS:-90a}
MAX_JOBS=${MAX_JOBS:-32} python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
say built
names=(this)
declare -A dirs=([this]=$ROOT)
for spec in ${VARIANTS:-}; do
    name=${spec%%=*} rows=${spec#*=}
    names+=("$name")
    dirs[$name]=/tmp/tpab_$name
    rm -rf "/tmp/tpab_$name" && cp -a "$ROOT" "/tmp/tpab_$name" &&
        (cd "/tmp/tpab_$name" && patch -s -p1 < benchmarks/lab/variants/tp_overlap_parts.patch) &&
        sed -i "s/tuning::kTpOverlapPartRows/$rows/" "/tmp/tpab_$name/csrc/cuda/forward.cu" &&
        grep -q "std::max(1, rows / $rows)" "/tmp/tpab_$name/csrc/cuda/forward.cu" ||
        { echo "variant $name: the part size did not take"; exit 1; }
    (cd "/tmp/tpab_$name" && MAX_JOBS=4 python3 setup.py build_ext --inplace > "$OUT/build_$name.log" 2>&1) &
done
wait
say "variants built: ${names[*]}"
BENCH=(python3 -m llama_brrr bench --device cuda --repeats "$REPEATS" --shape llama3-8b -b 1 --workloads 2048:0)
PYTHONPATH=$ROOT:${PYTHONPATH:-} timeout 120 "${BENCH[@]}" --tensor-parallel 1 --json "$OUT/prefill_tp1.json" \
    >> "$OUT/bench.log" 2>&1
say "TP 1 done"
for name in "${names[@]}"; do
    d=${dirs[$name]}
    (cd "$d" && PYTHONPATH=$d:${PYTHONPATH:-} timeout 150 "${BENCH[@]}" --tensor-parallel "$TP" \
        --json "$OUT/prefill_tp${TP}_$name.json" >> "$OUT/bench.log" 2>&1)
    say "TP $TP $name done"
done
python3 - "$OUT" "$TP" "${names[@]}" <<'EOF' | tee "$OUT/table.txt"
import json, sys
out, tp, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def rate(path):
    try:
        r = json.load(open(path))["runs"][0]["prefill_tok_s"]
    except (OSError, KeyError, IndexError, ValueError) as e:
        return None, f"unreadable ({e!r})"
    return r["median"], f"[{r['min']:.0f}, {r['max']:.0f}]"
one, spread = rate(f"{out}/prefill_tp1.json")
print(f"TP 1: {one} tok/s {spread}")
for n in names:
    v, s = rate(f"{out}/prefill_tp{tp}_{n}.json")
    ratio = f"{v / one:.3f}x" if v and one else "-"
    print(f"TP {tp} {n:8s} {v} tok/s {s}  {ratio} of TP 1")
EOF
