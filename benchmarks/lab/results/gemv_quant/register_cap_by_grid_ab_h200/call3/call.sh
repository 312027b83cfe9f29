# session 2026-11-28b call 3: the whole CUDA suite on cap (with the new register-cap tests); q6t (80 registers at NT = 2 for
# Q6_K / Q8_0 too) against cap: its mma tests, kernels q6_k / q8_0 at 2 / 16 rows, 8B 8-layer probe b2,16 alternating
set -u
ROOT=$(pwd); R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $R/pip.txt 2>&1
export PYTHONUNBUFFERED=1
SO=llama_brrr/_C.cpython-312-x86_64-linux-gnu.so
rm -rf /tmp/q6t && cp -a $ROOT /tmp/q6t
xz -dc scratch/so/cap.so.xz > $SO
xz -dc scratch/so/q6t.so.xz > /tmp/q6t/$SO
declare -A dirs=([cap]=$ROOT [q6t]=/tmp/q6t)
T0=$(date +%s)
step(){ local name=$1 t=$2 d=$3; shift 3; (cd $d && PYTHONPATH=$d:/tmp/site timeout $t "$@" > $R/$name.txt 2>&1); echo "$name rc=$? $(( $(date +%s)-T0 ))s" >> $R/times.txt; }
pack(){ tar -czf $OUT/r.tgz -C $OUT r; }
step tests_cuda_cap 280 $ROOT python3 -m pytest -q -rfs -p no:cacheprovider -m cuda tests/; pack
step tests_mma_q6t 60 /tmp/q6t python3 -m pytest -q -rf -p no:cacheprovider -m cuda tests/test_cuda_gemv_quant_mma.py -k "q6_k or q8_0"; pack
for t in cap q6t; do
  step kb_$t 30 ${dirs[$t]} python3 benchmarks/lab/gpu_gemv_quant_bench.py --path mma --types q6_k,q8_0 --rows 2,16 --out $R/kb_$t.json; pack
done
for round in 1 2; do for t in cap q6t; do
  step e2e_${t}_$round 60 ${dirs[$t]} python3 benchmarks/lab/quant_decode_probe.py --layers 8 --label ${t}_$round --batches 16
  grep '^{' $R/e2e_${t}_$round.txt >> $R/e2e.jsonl; pack
done; done
