#!/usr/bin/env bash
# run_flash_decode_lab.sh — builds cuda_flash_decode_lab.cu for sm_90a, checks every variant
# against the float64 reference, then times them in a graphed decode chain. Output in $OUT:
#   build.log, check.log, bench.jsonl (one line per shape x context x variant), table.txt
#   OUT=/tmp/fd benchmarks/lab/run_flash_decode_lab.sh      # on a Hopper GPU, about a minute
# BLOCK_SIZE=N (16, 32, 64 or 128; default 16): the KV block size of the lab's identity block table.
# BATCH=1: also the serving shapes (batches 16 to 256 of 1024 / 1536 positions; the forced-split
# variants 16-18): batch.jsonl, batch_table.txt.
# FP8=1: an e4m3 cache: check, then the serving shapes only (batch mode; variant 27 is the earlier
# e4m3 form of the tensor-core kernel).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/flash_decode_lab}
BLOCK=(--block-size "${BLOCK_SIZE:-16}")
[[ "${FP8:-0}" == 1 ]] && BLOCK+=(--fp8)
mkdir -p "$OUT"
BIN=/tmp/flash_decode_lab.bin
if ! nvcc -O3 -std=c++17 --use_fast_math -lineinfo --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA \
        -gencode=arch=compute_90a,code=sm_90a benchmarks/lab/cuda_flash_decode_lab.cu \
        csrc/cuda/attention_decode.cu -o "$BIN" \
        > "$OUT/build.log" 2>&1; then
    echo "build failed:"; tail -40 "$OUT/build.log"; exit 2
fi
timeout 120 "$BIN" check "${BLOCK[@]}" > "$OUT/check.log" 2>&1
rc=$?
tail -n 20 "$OUT/check.log"
(( rc == 0 )) || { echo "check failed (exit $rc): no timing"; exit 1; }
# table JSONL TITLE KEYS MAIN SIDE: one row per KEYS (comma-separated fields), one column per
# variant, each cell the MAIN field with the SIDE field in brackets.
table() {
    python3 - "$@" <<'PY'
import json, sys
path, title, keys, main, side = sys.argv[1:]
keys = keys.split(",")
rows = [json.loads(line) for line in open(path)]
variants = list(dict.fromkeys(r["variant"] for r in rows))
print(title)
print("".join(f"{k:>12}" for k in keys) + "".join(f"{v:>20}" for v in variants))
for key in dict.fromkeys(tuple(r[k] for k in keys) for r in rows):
    cells = {r["variant"]: r for r in rows if tuple(r[k] for k in keys) == key}
    print("".join(f"{k:>12}" for k in key) + "".join(
        f"{cells[v][main]:>10.2f} ({cells[v][side]:>7.2f})" for v in variants))
PY
}
if [[ "${FP8:-0}" != 1 ]]; then
    timeout 240 "$BIN" bench "${BLOCK[@]}" > "$OUT/bench.jsonl" 2> "$OUT/bench.err" || { cat "$OUT/bench.err"; exit 1; }
    table "$OUT/bench.jsonl" "us per layer added to a graphed chain behind a QKV stand-in (isolated us per call in brackets)" \
        shape,context chain_us isolated_us | tee "$OUT/table.txt"
fi
if [[ "${BATCH:-0}" == 1 || "${FP8:-0}" == 1 ]]; then
    timeout 300 "$BIN" batch "${BLOCK[@]}" > "$OUT/batch.jsonl" 2> "$OUT/batch.err" || { cat "$OUT/batch.err"; exit 1; }
    table "$OUT/batch.jsonl" "us per call, 16 calls back to back in a graph (KV GB/s read in brackets)" \
        shape,batch,context isolated_us GBps | tee "$OUT/batch_table.txt"
fi
