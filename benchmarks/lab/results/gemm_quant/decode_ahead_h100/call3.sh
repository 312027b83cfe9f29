#!/usr/bin/env bash
# Session 13, call 3: prefill end to end at 512 / 1024 tokens with gemm_quant at every M (i3e)
# against the shipped rule (u1), 8B and 1B; the whole CUDA suite on i3; Nsight Compute full set
# with per-instruction source counters of i3's w13 at 2048 rows.
set -u
O=${OUT:-/tmp/out}; R=$O/r; mkdir -p "$R"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
pack() { (cd "$O" && tar czf r.tgz r); }
nvidia-smi -L > "$R/gpu.txt"
ROOT=$(pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
export PYTHONPATH="$ROOT:/tmp/site" PYTHONUNBUFFERED=1
SO=llama_brrr/_C.cpython-312-x86_64-linux-gnu.so
use() { xz -dc scratch/so/$1.so.xz > $SO; }
P="--repeats 3 --prefill-only --quants none,q4_k_m --prompts 512,1024"
for v in i3e u1; do
  use $v
  timeout 110 python3 benchmarks/bench_quant_gpu.py --shape llama3-8b $P --out "$R/prefill_8b_$v.json" > "$R/prefill_8b_$v.txt" 2>&1
  echo "prefill 8b $v rc=$? $(el)s" >> "$R/times.txt"; pack
done
for v in i3e u1; do
  use $v
  timeout 40 python3 benchmarks/bench_quant_gpu.py --shape llama3.2-1b --repeats 3 --prefill-only --quants none,q4_k_m --prompts 256,512,1024 --out "$R/prefill_1b_$v.json" > "$R/prefill_1b_$v.txt" 2>&1
  echo "prefill 1b $v rc=$? $(el)s" >> "$R/times.txt"; pack
done
use i3
timeout 60 ncu --set full --import-source no --kernel-name regex:gemm_sm90_kernel --launch-count 1 -o "$R/ncu_i3" python3 benchmarks/lab/gemm_quant_sweep.py --matrices w13 --rows 2048 --reps 1 > "$R/ncu_i3_run.txt" 2>&1
echo "ncu i3 rc=$? $(el)s" >> "$R/times.txt"
ncu -i "$R/ncu_i3.ncu-rep" --page raw --csv > "$R/ncu_i3_raw.csv" 2>&1
ncu -i "$R/ncu_i3.ncu-rep" --page details > "$R/ncu_i3_details.txt" 2>&1
ncu -i "$R/ncu_i3.ncu-rep" --page source --csv --print-source sass > "$R/ncu_i3_sass.csv" 2>&1
rm -f "$R/ncu_i3.ncu-rep"; pack
timeout 170 python3 -m pytest -q -rf --maxfail=30 -p no:cacheprovider -m cuda tests/ > "$R/tests_cuda_i3.log" 2>&1
echo "tests cuda i3 rc=$? $(el)s" >> "$R/times.txt"
pack; rm -rf "$R"; true
