#!/usr/bin/env bash
# run_gemv_lab.sh — builds cuda_gemv_lab.cu for sm_90a (with the engine's gemv.cu and what it
# links against, compiled side by side), checks every variant against the reference, then times
# them at M = 1, 4, 8, 16. Output in $OUT: build.log, check.log, table.txt
#   OUT=/tmp/gemv benchmarks/lab/run_gemv_lab.sh      # on a Hopper GPU, about two minutes
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemv_lab}
mkdir -p "$OUT"
OBJ=$(mktemp -d)
FLAGS=(-O3 -std=c++17 --use_fast_math -lineinfo --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA
       -gencode=arch=compute_90a,code=sm_90a)
pids=()
for src in benchmarks/lab/cuda_gemv_lab.cu csrc/cuda/gemv.cu csrc/cuda/gemm_sm80.cu csrc/cuda/gemm_sm90.cu csrc/cuda/matmul.cu \
           csrc/cuda/norm.cu csrc/cuda/rope.cu; do
    nvcc "${FLAGS[@]}" -Xptxas -v -c "$src" -o "$OBJ/$(basename "$src").o" > "$OUT/build_$(basename "$src").log" 2>&1 &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
cat "$OUT"/build_*.log > "$OUT/build.log" && rm -f "$OUT"/build_*.log
if (( failed )) || ! nvcc "${FLAGS[@]}" "$OBJ"/*.o -o "$OBJ/gemv_lab" >> "$OUT/build.log" 2>&1; then
    echo "build failed:"; tail -40 "$OUT/build.log"; exit 2
fi
timeout 120 "$OBJ/gemv_lab" check > "$OUT/check.log" 2>&1
rc=$?
tail -n 3 "$OUT/check.log"
(( rc == 0 )) || { echo "check failed (exit $rc): no timing"; exit 1; }
timeout 240 "$OBJ/gemv_lab" bench | tee "$OUT/table.txt"
