#!/usr/bin/env bash
# run_gemm_lab.sh — builds benchmarks/lab/cuda_gemm_lab.cu for sm_90a and runs it on the GPU here:
# the correctness sweep (every variant x epilogue x odd/model shape) and the benchmark table
# against cuBLAS. Everything lands in $OUT (default ./out): build.log (ptxas registers/spills),
# sass_summary.txt (HGMMA/UTMALDG counts per kernel), check.log/.jsonl, bench.log/.jsonl.
# About 3 minutes on an H100 (build ~1 min, checks ~1 min, bench ~1 min).
# Usage: [OUT=dir] benchmarks/lab/run_gemm_lab.sh [variant numbers for the bench, e.g. 01,05,08]
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-./out}"
mkdir -p "$OUT"
BIN="$OUT/gemm_lab"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1 || true

# cuBLAS (the reference and the opponent): the toolkit's, or the one PyTorch's wheels carry.
CUBLAS_FLAGS=(-lcublas)
if ! echo '#include <cublas_v2.h>' | nvcc -x cu -E - -o /dev/null > /dev/null 2>&1; then
    hdr=""
    for d in $(python3 -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null) /usr/local /opt; do
        hdr=$(find "$d" -name cublas_v2.h 2>/dev/null | head -1)
        [ -n "$hdr" ] && break
    done
    [ -n "$hdr" ] || { echo "no cublas_v2.h found"; exit 2; }
    root=$(dirname "$(dirname "$hdr")")
    lib=$(find "$root" -name "libcublas.so*" 2>/dev/null | sort | head -1)
    [ -n "$lib" ] || { echo "no libcublas.so near $hdr"; exit 2; }
    libdir=$(dirname "$lib")
    CUBLAS_FLAGS=(-I"$(dirname "$hdr")" -L"$libdir" -l:"$(basename "$lib")" -Xlinker -rpath="$libdir")
    echo "cuBLAS from $root ($(basename "$lib"))"
fi

# BRRR_MBARRIER_TIMEOUT: a lost arrival traps (an error) instead of hanging the run.
if ! nvcc -O3 -std=c++17 --use_fast_math -lineinfo --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA \
        -DBRRR_MBARRIER_TIMEOUT -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
        benchmarks/lab/cuda_gemm_lab.cu csrc/cuda/gemm_sm80.cu csrc/cuda/gemm_sm90.cu csrc/cuda/matmul.cu \
        csrc/cuda/gemv.cu csrc/cuda/norm.cu csrc/cuda/rope.cu -o "$BIN" "${CUBLAS_FLAGS[@]}" > "$OUT/build.log" 2>&1; then
    echo "build failed:"; tail -40 "$OUT/build.log"; exit 2
fi
grep -E "spill|Used [0-9]+ registers" "$OUT/build.log" | sort | uniq -c > "$OUT/ptxas_summary.txt"
if command -v cuobjdump > /dev/null; then
    cuobjdump -sass "$BIN" > "$OUT/sass.txt" 2>&1
    awk '/Function :/ {f=$3} /HGMMA|UTMALDG|SYNCS|HMMA/ {split($2, op, "."); n[f" "op[1]]++}
         END {for (k in n) print n[k], k}' "$OUT/sass.txt" | sort -k2 > "$OUT/sass_summary.txt"
    rm -f "$OUT/sass.txt"
fi

# One process per variant for the check: a variant that faults (or traps on a lost mbarrier
# arrival) cannot take the others' results with it. Only variants that pass are benchmarked.
VARIANTS="01 02 03 04 05 06 07 08 09 10 11"
passed=""
: > "$OUT/check.log"
: > "$OUT/check.jsonl"
for v in $VARIANTS; do
    rc=0
    timeout 90 "$BIN" check "$OUT/check_$v.jsonl" "$v" >> "$OUT/check.log" 2>&1 || rc=$?
    cat "$OUT/check_$v.jsonl" >> "$OUT/check.jsonl" 2>/dev/null; rm -f "$OUT/check_$v.jsonl"
    echo "variant $v check exit $rc"
    [ $rc -eq 0 ] && passed="$passed${passed:+,}$v"
done
grep -E "FAIL|Error|error|trap" "$OUT/check.log" | head -40
echo "passed: ${passed:-none}"
only="${1:-$passed}"
bstatus=0
if [ -n "$only" ]; then
    timeout 170 "$BIN" bench "$OUT/bench.jsonl" "$only" > "$OUT/bench.log" 2>&1 || bstatus=$?
    echo "bench exit $bstatus"; cat "$OUT/bench.log"
fi
rm -f "$BIN"
[ "$passed" = "$(echo $VARIANTS | tr ' ' ',')" ] && [ $bstatus -eq 0 ]
