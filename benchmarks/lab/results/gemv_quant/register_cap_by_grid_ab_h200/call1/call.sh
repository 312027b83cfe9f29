# session 2026-11-28b call 1: b16 / b2 kernel breakdown (HEAD = diet), x addressed from one pointer a tile (xaddr):
# mma tests, kernel A/B at 2 / 16 rows, 8B 8-layer probe b2,16 alternating
set -u
ROOT=$(pwd); R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $R/pip.txt 2>&1
export PYTHONUNBUFFERED=1
SO=llama_brrr/_C.cpython-312-x86_64-linux-gnu.so
rm -rf /tmp/diet && cp -a $ROOT /tmp/diet
xz -dc scratch/so/xaddr.so.xz > $SO
xz -dc scratch/so/diet.so.xz > /tmp/diet/$SO
declare -A dirs=([diet]=/tmp/diet [xaddr]=$ROOT)
T0=$(date +%s)
step(){ local name=$1 t=$2 d=$3; shift 3; (cd $d && PYTHONPATH=$d:/tmp/site timeout $t "$@" > $R/$name.txt 2>&1); echo "$name rc=$? $(( $(date +%s)-T0 ))s" >> $R/times.txt; }
pack(){ tar -czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
step ktimes_diet 120 /tmp/diet env LLAMA_BRRR_PDL=0 python3 benchmarks/lab/decode_kernel_times.py --shapes llama3-8b --layers 8 -b 2 16 --quant q4_k_m --json $R/ktimes_diet.json; pack
step tests_mma_xaddr 90 $ROOT python3 -m pytest -q -rf -p no:cacheprovider -m cuda tests/test_cuda_gemv_quant_mma.py; pack
for t in diet xaddr; do
  step kb_$t 40 ${dirs[$t]} python3 benchmarks/lab/gpu_gemv_quant_bench.py --path mma --rows 2,16 --out $R/kb_$t.json; pack
done
for round in 1 2; do for t in diet xaddr; do
  step e2e_${t}_$round 60 ${dirs[$t]} python3 benchmarks/lab/quant_decode_probe.py --layers 8 --label ${t}_$round --batches 2,16
  grep '^{' $R/e2e_${t}_$round.txt >> $R/e2e.jsonl; pack
done; done
