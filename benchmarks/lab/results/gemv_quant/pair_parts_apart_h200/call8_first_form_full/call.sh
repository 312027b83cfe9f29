#!/bin/bash
# call 8: pair vs base, Q8_0 probes alternating (pair first), full-model batch-1 benches
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
for v in base pair; do mkdir -p /tmp/t_$v; git ls-files -z | xargs -0 cp --parents -t /tmp/t_$v; xz -dc scratch/so/$v.so.xz > /tmp/t_$v/llama_brrr/_C.cpython-312-x86_64-linux-gnu.so; done
export PYTHONUNBUFFERED=1
step() { local name=$1 v=$2 t=$3; shift 3; local t0=$(date +%s); (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout $t "$@") > $R/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt; }
P="python3 benchmarks/lab/quant_decode_probe.py"
for r in 1 2; do for v in pair base; do step q8_$v$r $v 50 $P --shape llama3-8b --layers 8 --label $v --quant q8_0 --batches 1; done; done
B="python3 -m llama_brrr bench --device cuda -p 128 -n 256 --repeats 3 -b 1"
for v in pair base; do step full_1b_$v $v 60 $B --shape llama3.2-1b --quant q4_k_m --json $R/full_1b_q4_k_m_$v.json; done
for v in pair base; do step full_8b_$v $v 150 $B --shape llama3-8b --quant q4_k_m --json $R/full_8b_q4_k_m_$v.json; done
grep -h '^{' $R/q8_*.txt > $R/probes.jsonl
cd $R && tar czf $OUT/r.tgz . && cd - >/dev/null
cat $R/times.txt $R/probes.jsonl; grep -h "tg256" $R/full_*.txt
