#!/bin/bash
# call 10: the final module (HEAD 4b05537 + gemv_quant parts on warps of their own) — tests, then 8B probes against HEAD's module
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for v in head final; do mkdir -p /tmp/t_$v; git ls-files -z | xargs -0 cp --parents -t /tmp/t_$v; xz -dc scratch/so/$v.so.xz > /tmp/t_$v/llama_brrr/_C.cpython-312-x86_64-linux-gnu.so; done
export PYTHONUNBUFFERED=1
step() { local name=$1 v=$2 t=$3; shift 3; local t0=$(date +%s); (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout $t "$@") > $R/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt; }
step t_fd final 80 python3 -m pytest -q -rs -m cuda tests/test_cuda_kernels.py -k flash_decode
step t_final final 80 python3 -m pytest -q -rs -m cuda tests/test_cuda_gemv_quant.py tests/test_cuda_quant_engine.py tests/test_decode_launch.py tests/test_paged_kv.py
P="python3 benchmarks/lab/quant_decode_probe.py --shape llama3-8b --layers 8 --quant q4_k_m --batches 1"
for v in final head; do step k8_$v $v 62 $P --label $v; done
grep -h '^{' $R/k8_*.txt > $R/probes.jsonl
cd $R && tar czf $OUT/r.tgz . && cd - >/dev/null
cat $R/times.txt $R/probes.jsonl; tail -n 2 $R/t_fd.txt; tail -n 4 $R/t_final.txt
