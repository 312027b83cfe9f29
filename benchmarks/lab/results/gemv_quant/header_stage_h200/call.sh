#!/bin/bash
# call E: Q4_K's tile headers through a per-warp shared-memory stage (cp.async; stg) against HEAD's
# module (h155): 8 of the 8B's layers and the 1B (Q4_K_M), the quant tests on stg, its PDL-off
# kernel times, and the full 8B Q4_K_M on stg.
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for v in h155 stg; do mkdir -p /tmp/t_$v; git ls-files -z | xargs -0 cp --parents -t /tmp/t_$v; xz -dc scratch/so/$v.so.xz > /tmp/t_$v/llama_brrr/_C.cpython-312-x86_64-linux-gnu.so; done
export PYTHONUNBUFFERED=1
step() { local name=$1 v=$2 t=$3; shift 3; local t0=$(date +%s); (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout $t "$@") > $R/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt; }
P8="python3 benchmarks/lab/quant_decode_probe.py --shape llama3-8b --layers 8 --batches 1"
P1="python3 benchmarks/lab/quant_decode_probe.py --shape llama3.2-1b --batches 1"
i=0; for v in h155 stg stg h155; do i=$((i+1)); step k8_${i}_$v $v 62 $P8 --quant q4_k_m --label $v; done
for v in stg h155; do step k1_$v $v 40 $P1 --quant q4_k_m --label $v; done
grep -h '^{' $R/k8_*.txt $R/k1_*.txt > $R/probes.jsonl
python3 -c "
import json
for l in open('$R/probes.jsonl'): d=json.loads(l); print(d['label'], d['shape'], d['quant'], d['b1_us'], d['b1_spread'])"
step t_stg stg 100 python3 -m pytest -q -rs -m cuda tests/test_cuda_gemv_quant.py tests/test_cuda_quant_engine.py tests/test_decode_launch.py tests/test_paged_kv.py
tail -n 2 $R/t_stg.txt
step kt_stg stg 60 env LLAMA_BRRR_PDL=0 python3 benchmarks/lab/decode_kernel_times.py -b 1 --quant q4_k_m --sequence 16 --shapes llama3-8b --layers 8 --json $R/kt_stg.json
step e8_stg stg 150 python3 -m llama_brrr bench --device cuda -p 128 -n 256 --repeats 3 -b 1 --shape llama3-8b --quant q4_k_m --json $R/e8_stg.json
cd $R && tar czf $OUT/r.tgz . && cd - >/dev/null
cat $R/times.txt; grep "|" $R/e8_stg.txt | tail -n 1; sed -n 14,30p $R/kt_stg.txt
