#!/bin/bash
# call A (session 11-29 b): Q8_0 GEMV trigger after the walk (late_all: every Q8_0 kernel; late_norm:
# the norm-input ones only) against HEAD's module (h155), 8 of the 8B's layers and the 1B; then the
# whole CUDA suite on HEAD's module.
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for v in h155 late_all late_norm; do mkdir -p /tmp/t_$v; git ls-files -z | xargs -0 cp --parents -t /tmp/t_$v; xz -dc scratch/so/$v.so.xz > /tmp/t_$v/llama_brrr/_C.cpython-312-x86_64-linux-gnu.so; done
export PYTHONUNBUFFERED=1
step() { local name=$1 v=$2 t=$3; shift 3; local t0=$(date +%s); (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v:/tmp/site timeout $t "$@") > $R/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt; }
P8="python3 benchmarks/lab/quant_decode_probe.py --shape llama3-8b --layers 8 --batches 1"
P1="python3 benchmarks/lab/quant_decode_probe.py --shape llama3.2-1b --batches 1"
for v in h155 late_all late_norm; do step q8a_$v $v 50 $P8 --quant q8_0 --label $v; done
for v in late_norm late_all h155; do step q8b_$v $v 50 $P8 --quant q8_0 --label $v; done
for v in h155 late_all late_norm; do step q1_$v $v 40 $P1 --quant q8_0 --label $v; done
grep -h '^{' $R/q8a_*.txt $R/q8b_*.txt $R/q1_*.txt > $R/probes.jsonl
step suite h155 300 python3 -m pytest -q -rs -m cuda tests/
cd $R && tar czf $OUT/r.tgz . && cd - >/dev/null
cat $R/times.txt; python3 -c "
import json
for l in open('$R/probes.jsonl'): d=json.loads(l); print(d['label'], d['shape'], d['quant'], d['b1_us'], d['b1_spread'])"
tail -n 3 $R/suite.txt
