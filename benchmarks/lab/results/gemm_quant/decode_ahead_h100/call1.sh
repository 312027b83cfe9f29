#!/usr/bin/env bash
# Session 13, call 1: the warpgroup index broadcast from lane 0 (u1: wgmma descriptors in uniform
# registers, gemm_sm90 + attention_prefill_sm90) against the shipped tree (h1): gemm / attention
# CUDA tests on u1, the gemm_quant sweep and prefill end to end on both, alternating, and Nsight
# Compute (full set + per-instruction source counters) of gemm_quant's w13 at 2048 rows on u1.
set -u
O=${OUT:-/tmp/out}; R=$O/r; mkdir -p "$R"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
pack() { (cd "$O" && tar czf r.tgz r); }
nvidia-smi -L > "$R/gpu.txt"; which ncu >> "$R/gpu.txt" 2>&1; ncu --version >> "$R/gpu.txt" 2>&1
ROOT=$(pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
export PYTHONPATH="$ROOT:/tmp/site" PYTHONUNBUFFERED=1
SO=llama_brrr/_C.cpython-312-x86_64-linux-gnu.so
use() { xz -dc scratch/so/$1.so.xz > $SO; }
use u1
timeout 150 python3 -m pytest -q -rf -p no:cacheprovider -m cuda tests/test_cuda_gemm_quant.py tests/test_cuda_kernels.py tests/test_cuda_sass.py tests/test_cuda_engine.py > "$R/tests_u1.log" 2>&1
echo "tests u1 rc=$? $(el)s" >> "$R/times.txt"; pack
SW="--rows 256,512,2048 --reps 10"
for v in u1 h1 u1 h1; do
  use $v
  timeout 40 python3 benchmarks/lab/gemm_quant_sweep.py $SW --json "$R/sweep_$v.jsonl" >> "$R/sweep_$v.txt" 2>&1
  echo "sweep $v rc=$? $(el)s" >> "$R/times.txt"
done; pack
P="--repeats 3 --prefill-only --quants none,q4_k_m --prompts 256,2048"
for v in h1 u1; do
  use $v
  timeout 110 python3 benchmarks/bench_quant_gpu.py --shape llama3-8b $P --out "$R/prefill_8b_$v.json" > "$R/prefill_8b_$v.txt" 2>&1
  echo "prefill 8b $v rc=$? $(el)s" >> "$R/times.txt"; pack
done
use u1
timeout 90 ncu --set full --import-source no --kernel-name regex:gemm_sm90_kernel --launch-count 1 -o "$R/ncu_u1" python3 benchmarks/lab/gemm_quant_sweep.py --matrices w13 --rows 2048 --reps 1 > "$R/ncu_u1_run.txt" 2>&1
echo "ncu u1 rc=$? $(el)s" >> "$R/times.txt"
ncu -i "$R/ncu_u1.ncu-rep" --page raw --csv > "$R/ncu_u1_raw.csv" 2>&1
ncu -i "$R/ncu_u1.ncu-rep" --page details > "$R/ncu_u1_details.txt" 2>&1
ncu -i "$R/ncu_u1.ncu-rep" --page source --csv --print-source sass > "$R/ncu_u1_sass.csv" 2>&1
echo "ncu export rc=$? $(el)s" >> "$R/times.txt"
pack; rm -rf "$R"; true
