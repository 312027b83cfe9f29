#!/usr/bin/env bash
# Session 13, call 2: gemm_quant decoding the next k tile between this one's MMAs (i2), and with
# the raw W copies a step ahead of x on barriers of their own (i3; i3e = i3 with gemm_quant at
# every M), against u1 (the warpgroup index broadcast only): CUDA tests of the GEMMs on i3 (and
# gemm_quant's on i2), the per-call sweep alternating, Nsight Compute of i3's w13 at 2048 rows,
# prefill end to end 8B (i3e, u1, i3 as time allows).
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
use i3
timeout 120 python3 -m pytest -q -rf -x -p no:cacheprovider -m cuda tests/test_cuda_gemm_quant.py tests/test_cuda_kernels.py > "$R/tests_i3.log" 2>&1
rc=$?; echo "tests i3 rc=$rc $(el)s" >> "$R/times.txt"; pack
use i2
timeout 60 python3 -m pytest -q -rf -x -p no:cacheprovider -m cuda tests/test_cuda_gemm_quant.py > "$R/tests_i2.log" 2>&1
echo "tests i2 rc=$? $(el)s" >> "$R/times.txt"; pack
SW="--rows 256,512,1024,2048 --reps 10"
for v in i3 i2 u1 i3 i2 u1; do
  use $v
  timeout 40 python3 benchmarks/lab/gemm_quant_sweep.py $SW --json "$R/sweep_$v.jsonl" >> "$R/sweep_$v.txt" 2>&1
  echo "sweep $v rc=$? $(el)s" >> "$R/times.txt"
done; pack
NCU="ncu --clock-control none --kernel-name regex:gemm_sm90_kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats"
use i3
timeout 40 $NCU python3 benchmarks/lab/gemm_quant_sweep.py --matrices w13 --rows 2048 --reps 1 > "$R/ncu_w13_2048_i3.txt" 2>&1
echo "ncu i3 rc=$? $(el)s" >> "$R/times.txt"; pack
P="--repeats 3 --prefill-only --quants none,q4_k_m --prompts 256,2048"
for v in i3e u1 i3; do
  use $v
  timeout 150 python3 benchmarks/bench_quant_gpu.py --shape llama3-8b $P --out "$R/prefill_8b_$v.json" > "$R/prefill_8b_$v.txt" 2>&1
  echo "prefill 8b $v rc=$? $(el)s" >> "$R/times.txt"; pack
  [ "$(el)" -gt 400 ] && break
done
pack; rm -rf "$R"; true
