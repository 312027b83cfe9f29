#!/bin/bash
# call 9: the final form (pair2: parts on warps of their own, one-type kernels SASS-identical but 31) vs base; whole CUDA suite on pair2
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
for v in base pair2; do mkdir -p /tmp/t_$v; git ls-files -z | xargs -0 cp --parents -t /tmp/t_$v; xz -dc scratch/so/$v.so.xz > /tmp/t_$v/llama_brrr/_C.cpython-312-x86_64-linux-gnu.so; done
export PYTHONUNBUFFERED=1
step() { local name=$1 v=$2 t=$3; shift 3; local t0=$(date +%s); (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout $t "$@") > $R/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt; }
P="python3 benchmarks/lab/quant_decode_probe.py"
for v in pair2 base; do step k8_$v $v 70 $P --shape llama3-8b --layers 8 --label $v --quant q4_k_m --batches 1; done
for v in pair2 base; do step k1_$v $v 50 $P --shape llama3.2-1b --label $v --quant q4_k_m --batches 1; done
for v in pair2 base; do step q8_$v $v 50 $P --shape llama3-8b --layers 8 --label $v --quant q8_0 --batches 1; done
step t_all pair2 270 python3 -m pytest -q -rs -m cuda tests
grep -h '^{' $R/k*_*.txt $R/q*_*.txt > $R/probes.jsonl
cd $R && tar czf $OUT/r.tgz . && cd - >/dev/null
cat $R/times.txt $R/probes.jsonl; tail -n 15 $R/t_all.txt
