#!/usr/bin/env bash
# run_decode_persistent_lab.sh — builds cuda_decode_persistent_lab.cu for sm_90a once per variant
# (compile-time knobs of decode_persistent.cu, all built in parallel) and runs each: the persistent
# decode kernel's time per launch against the copy rate, and its per-phase trace.
#   01 shipped      the engine's build (each warp cp.async-streams its rows into 4 KB ring slots)
#   02 piece8k      8 KB slots (half as many a warp)
#   03 piece2k      2 KB slots (twice as many, up to 8 a warp)
#   04 no-math      the warps stream and wait for every slot but do no arithmetic: the weight
#                   stream's own ceiling (outputs meaningless)
#   (the first form, a TMA producer warp, and its variants ran 2026-11-25 on 49d6c7a and were
#   retired: the bulk-copy stream topped out near 2.5 TB/s)
# Output in $OUT: build-<variant>.log, <variant>.txt, table.txt (the per-launch lines).
#   OUT=/tmp/dp [ONLY="01 05"] benchmarks/lab/run_decode_persistent_lab.sh      # Hopper GPU, ~2 min
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_persistent_lab}
ONLY=${ONLY:-}
mkdir -p "$OUT"
variants=(
    "01-shipped|"
    "02-piece8k|-DBRRR_DP_PIECE_BYTES=8192"
    "03-piece2k|-DBRRR_DP_PIECE_BYTES=2048"
    "04-no-math|-DBRRR_DP_NO_MATH=1"
)
selected=()
for v in "${variants[@]}"; do
    name=${v%%|*}
    [[ -z "$ONLY" || " $ONLY " == *" ${name%%-*} "* ]] && selected+=("$v")
done
for v in "${selected[@]}"; do
    name=${v%%|*}
    # shellcheck disable=SC2086  # the flags are a list
    nvcc -O3 -std=c++17 --use_fast_math -lineinfo --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA ${v#*|} \
        -gencode=arch=compute_90a,code=sm_90a benchmarks/lab/cuda_decode_persistent_lab.cu csrc/cuda/attention.cu \
        -o "/tmp/dp_lab_$name" > "$OUT/build-$name.log" 2>&1 &
done
wait
: > "$OUT/table.txt"
for v in "${selected[@]}"; do
    name=${v%%|*}
    [[ -x "/tmp/dp_lab_$name" ]] || { echo "$name: build failed"; tail -5 "$OUT/build-$name.log"; continue; }
    echo "== $name ${v#*|}" | tee -a "$OUT/table.txt"
    timeout 60 "/tmp/dp_lab_$name" > "$OUT/$name.txt" 2>&1 || echo "$name: exit $?" | tee -a "$OUT/table.txt"
    grep -E "^llama|kernel " "$OUT/$name.txt" | tee -a "$OUT/table.txt"
done
