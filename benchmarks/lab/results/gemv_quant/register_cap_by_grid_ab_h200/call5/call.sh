# session 2026-11-28b call 5: Q8_0 end to end, HEAD (diet) against cap: 8B 8-layer probe b2,16, one round each
set -u
ROOT=$(pwd); R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $R/pip.txt 2>&1
export PYTHONUNBUFFERED=1
SO=llama_brrr/_C.cpython-312-x86_64-linux-gnu.so
rm -rf /tmp/diet && cp -a $ROOT /tmp/diet
xz -dc scratch/so/cap.so.xz > $SO
xz -dc scratch/so/diet.so.xz > /tmp/diet/$SO
declare -A dirs=([diet]=/tmp/diet [cap]=$ROOT)
T0=$(date +%s)
step(){ local name=$1 t=$2 d=$3; shift 3; (cd $d && PYTHONPATH=$d:/tmp/site timeout $t "$@" > $R/$name.txt 2>&1); echo "$name rc=$? $(( $(date +%s)-T0 ))s" >> $R/times.txt; }
pack(){ tar -czf $OUT/r.tgz -C $OUT r; }
for t in diet cap; do
  step e2e_q8_$t 70 ${dirs[$t]} python3 benchmarks/lab/quant_decode_probe.py --layers 8 --quant q8_0 --label q8_$t --batches 2,16
  grep '^{' $R/e2e_q8_$t.txt >> $R/e2e.jsonl; pack
done
