#!/usr/bin/env bash
# run_attention_prefill_lab.sh — builds cuda_attention_prefill_lab.cu for sm_90a, checks every
# prefill attention variant against the float64 reference, then times those that passed on Llama
# head shapes (exit 1 when any failed).
# Output in $OUT:
#   build.log, check.log, bench.jsonl (one line per variant x shape x T), bench.err, table.txt
#   OUT=/tmp/ap benchmarks/lab/run_attention_prefill_lab.sh   # on a Hopper GPU, under a minute
# BLOCK_SIZE=N (16, 32, 64 or 128; default 16): the KV block size of the lab's identity block table.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/attention_prefill_lab}
BLOCK=(--block-size "${BLOCK_SIZE:-16}")
mkdir -p "$OUT"
BIN=/tmp/attention_prefill_lab.bin
# BRRR_MBARRIER_TIMEOUT: a lost arrival in the TMA variants traps instead of hanging the run.
if ! nvcc -O3 -std=c++17 --use_fast_math -lineinfo --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA \
        -DBRRR_MBARRIER_TIMEOUT -gencode=arch=compute_90a,code=sm_90a \
        benchmarks/lab/cuda_attention_prefill_lab.cu csrc/cuda/attention_prefill_sm80.cu \
        csrc/cuda/attention_prefill_sm90.cu -o "$BIN" \
        > "$OUT/build.log" 2>&1; then
    echo "build failed:"; tail -40 "$OUT/build.log"; exit 2
fi
timeout 120 "$BIN" check "${BLOCK[@]}" > "$OUT/check.log" 2>&1
rc=$?
grep -v '^FAIL' "$OUT/check.log" | tail -n 24
# Variants that failed a case, or did not run all of them (a fault ends the check), are not timed;
# the others are. No per-variant summary at all (the check itself died): no timing.
total=$(sed -n 's/^\([0-9A-Za-z_]*\): \([0-9]*\) cases, .*/\2/p' "$OUT/check.log" | sort -n | tail -n 1)
[[ -n "$total" ]] || { echo "check failed (exit $rc) before its summary: no timing"; exit 1; }
skip=$(sed -n 's/^\([0-9A-Za-z_]*\): \([0-9]*\) cases, \([0-9]*\) failures.*/\1 \2 \3/p' "$OUT/check.log" \
       | awk -v total="$total" '$2 < total || $3 > 0 { printf "%s%s", sep, $1; sep = "," }')
[[ -z "$skip" ]] || echo "not timed (failed the check): $skip"
timeout 180 "$BIN" bench --skip "$skip" "${BLOCK[@]}" > "$OUT/bench.jsonl" 2> "$OUT/bench.err" || { cat "$OUT/bench.err"; exit 1; }
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/bench.jsonl")]
variants = list(dict.fromkeys(r["variant"] for r in rows))
width = max([18] + [len(v) + 2 for v in variants])
print(f"causal prefill attention, TF/s (speed-up over {variants[0]} in brackets)")
print(f"{'shape':<12}{'T':>7}" + "".join(f"{v:>{width}}" for v in variants))
for key in dict.fromkeys((r["shape"], r["T"]) for r in rows):
    cells = {r["variant"]: r for r in rows if (r["shape"], r["T"]) == key}
    print(f"{key[0]:<12}{key[1]:>7}" + "".join(
        f"{cells[v]['tflops']:.1f} ({cells[v]['vs_first']:.2f}x)".rjust(width) if v in cells else "-".rjust(width)
        for v in variants))
PY
(( rc == 0 )) || { echo "check failed (exit $rc): the variants named above were not timed"; exit 1; }
