#!/bin/bash
# call 7: gemv_quant_pair with parts on warps of their own (pair) vs 4b05537's module (base): probes + the quant tests
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
for v in base pair; do mkdir -p /tmp/t_$v; git ls-files -z | xargs -0 cp --parents -t /tmp/t_$v; xz -dc scratch/so/$v.so.xz > /tmp/t_$v/llama_brrr/_C.cpython-312-x86_64-linux-gnu.so; done
export PYTHONUNBUFFERED=1
step() { local name=$1 v=$2 t=$3; shift 3; local t0=$(date +%s); (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout $t "$@") > $R/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt; }
P="python3 benchmarks/lab/quant_decode_probe.py"
for r in 1 2; do for v in base pair; do step k8_$v$r $v 70 $P --shape llama3-8b --layers 8 --label $v --quant q4_k_m --batches 1; done; done
for r in 1 2; do for v in base pair; do step k1_$v$r $v 50 $P --shape llama3.2-1b --label $v --quant q4_k_m --batches 1; done; done
step t_gq pair 150 python3 -m pytest -q -x -rs -m cuda tests/test_cuda_gemv_quant.py
step t_qe pair 100 python3 -m pytest -q -x -rs -m cuda tests/test_cuda_quant_engine.py
for v in base pair; do step q8_$v $v 50 $P --shape llama3-8b --layers 8 --label $v --quant q8_0 --batches 1; done
for v in base pair; do step q41_$v $v 40 $P --shape llama3.2-1b --label $v --quant q4_1 --batches 1; done
grep -h '^{' $R/k*_*.txt $R/q*_*.txt > $R/probes.jsonl
cd $R && tar czf $OUT/r.tgz . && cd - >/dev/null
cat $R/times.txt $R/probes.jsonl; tail -3 $R/t_gq.txt $R/t_qe.txt
