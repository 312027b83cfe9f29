#!/usr/bin/env bash
# run_decode_persistent_lab.sh — builds cuda_decode_persistent_lab.cu for sm_90a once per variant
# (compile-time knobs of decode_persistent.cu, all built in parallel) and runs each: the persistent
# decode kernel's time per launch against the copy rate, and its per-phase trace.
#   01 shipped      the engine's build (8 producer lanes, 4 KB ring slots, no L2 look-ahead)
#   02 lanes1       one producer thread feeds all eight consumer warps
#   03 piece8k      8 KB ring slots (half as many bulk copies, half as many slots a warp)
#   04 lanes1-8k    02 + 03
#   05 no-math      the consumers wait for and release every slot but do no arithmetic: the
#                   weight stream's own ceiling (outputs meaningless)
#   06 l2-128k      at the start of each phase the producer asks L2 for the first 128 KB of this
#                   CTA's rows of the next phase
#   07 l2-512k      the same with 512 KB
# Output in $OUT: build-<variant>.log, <variant>.txt, table.txt (the per-launch lines).
#   OUT=/tmp/dp [ONLY="01 05"] benchmarks/lab/run_decode_persistent_lab.sh      # Hopper GPU, ~2 min
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_persistent_lab}
ONLY=${ONLY:-}
mkdir -p "$OUT"
variants=(
    "01-shipped|"
    "02-lanes1|-DBRRR_DP_PRODUCER_LANES=1"
    "03-piece8k|-DBRRR_DP_PIECE_BYTES=8192"
    "04-lanes1-8k|-DBRRR_DP_PRODUCER_LANES=1 -DBRRR_DP_PIECE_BYTES=8192"
    "05-no-math|-DBRRR_DP_NO_MATH=1"
    "06-l2-128k|-DBRRR_DP_L2_AHEAD_KB=128"
    "07-l2-512k|-DBRRR_DP_L2_AHEAD_KB=512"
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
