#!/usr/bin/env bash
# run_sampling_lab.sh — builds cuda_sampling_lab.cu once per sampler variant (01: csrc/cuda/
# sampling.cu as it is; the others: that file with a benchmarks/lab/variants/sampling_*.patch
# applied), runs each on the GPU and tabulates us per call. diag_* variants are diagnostics that
# leave a step out (their tokens differ on purpose); the others must draw 01's tokens ('=' in the
# table; '~' where summation order moved a draw).
#   OUT=/tmp/sl benchmarks/lab/run_sampling_lab.sh      # on a Hopper GPU, about a minute
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/sampling_lab}
mkdir -p "$OUT/src"
NVCC=(nvcc -O3 -std=c++17 --use_fast_math --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA
      -gencode=arch=compute_90a,code=sm_90a)
names=(01_shipped)
cp csrc/cuda/sampling.cu "$OUT/src/01_shipped.cu"
i=2
for p in benchmarks/lab/variants/sampling_*.patch; do
    name=$(printf "%02d_%s" "$i" "$(basename "$p" .patch | sed 's/^sampling_//')")
    cp csrc/cuda/sampling.cu "$OUT/src/$name.cu"
    patch -s "$OUT/src/$name.cu" < "$p" || { echo "patch $p failed"; exit 2; }
    names+=("$name")
    i=$((i + 1))
done
for n in "${names[@]}"; do
    "${NVCC[@]}" benchmarks/lab/cuda_sampling_lab.cu "$OUT/src/$n.cu" -o "$OUT/$n.bin" \
        > "$OUT/$n.build.log" 2>&1 &
done
wait
for n in "${names[@]}"; do
    [[ -x "$OUT/$n.bin" ]] || { echo "build of $n failed:"; tail -20 "$OUT/$n.build.log"; exit 2; }
    timeout 120 "$OUT/$n.bin" | sed "s/^{/{\"variant\": \"$n\", /" >> "$OUT/lab.jsonl" || { echo "$n failed"; exit 1; }
done
python3 - "$OUT/lab.jsonl" <<'PY' | tee "$OUT/table.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
variants = list(dict.fromkeys(r["variant"] for r in rows))
print("us per call (20 calls, V = 128,256); '=' same tokens as 01, '~' not")
print(f"{'B':>4} {'case':>18}" + "".join(f"{v:>24}" for v in variants))
for key in dict.fromkeys((r["B"], r["case"]) for r in rows):
    cells = {r["variant"]: r for r in rows if (r["B"], r["case"]) == key}
    base = cells[variants[0]]["tokens_fnv"]
    print(f"{key[0]:>4} {key[1]:>18}" + "".join(
        f"{cells[v]['us']:>22.1f} {'=' if cells[v]['tokens_fnv'] == base else '~'}" for v in variants))
PY
