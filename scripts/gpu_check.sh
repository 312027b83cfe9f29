#!/usr/bin/env bash
# gpu_check.sh — the one script to run on the GPU machine (repo root, no network): builds the CUDA
# module, runs the CUDA tests (and the CPU tests, quickly), a compute-sanitizer memcheck of a short
# generation, and the benchmarks; everything lands in $OUT (default ./out):
#   build.log      nvidia-smi, the build
#   tests.log      pytest -m cuda, then pytest -m "not cuda"
#   sanitizer.log  compute-sanitizer --tool memcheck on a tiny model, 8 tokens, graphs on and off
#   gemm_race.log  benchmarks/lab/gemm_residual_race.py: AddResidual checked bit for bit, repeated, on
#                  short-K shapes with an N tail (the TMA epilogue's staging-box race)
#   bench.log      the benchmarks' tables
#   kernels.json   benchmarks/bench_kernels.py $KERNELS_ARGS (default --quick: 1B shapes)
#   variants/      benchmarks/lab/decode_variants.sh: decode with each fusion switched off
#   batches/       benchmarks/lab/decode_batches.sh: decode at batch 1..16 per GEMV switch point
#   compare.json   llama-brrr compare on $COMPARE_SHAPES (llama3.2-1b) with $COMPARE_ARGS (default
#   compare.png    batch 1, prompts of 128 and 2048, 128 new tokens, no split) against torch eager,
#                  HF eager / sdpa, torch.compile; written after each workload, so a cut run keeps
#                  what it measured
#   bench.json     llama-brrr bench: batch-1 decode, 128-token prompt, 256 new tokens, 1B and 8B shapes
#   sweep.json     llama-brrr bench --sweep $SWEEP_ARGS (default --quick: 3 shapes, decode batch
#                  x context, prefill; the full sweep adds batch 4: SWEEP_ARGS="--repeats 3 -n 32")
#   profile/       llama-brrr profile of 1B-shape decode: report, roofline / breakdown PNGs, trace
#   gemm_lab/      benchmarks/lab/run_gemm_lab.sh: GEMM variants checked and timed against cuBLAS
#   flash_decode_lab/  benchmarks/lab/run_flash_decode_lab.sh: flash_decode launch variants, checked
#                  and timed in a graphed chain
#   attention_prefill_lab/  benchmarks/lab/run_attention_prefill_lab.sh: prefill attention kernels,
#                  checked against a float64 reference and timed on the Llama heads
#   gemv_lab/      benchmarks/lab/run_gemv_lab.sh: the decode GEMV against tensor-core variants,
#                  checked (batch invariance too) and timed at M = 1..16
#   batches_base/  with BASE_PATCH=file: the batches phase again on a baseline tree (this tree with
#   batches_ab.txt that patch reversed: the code before a change), built in $BASE_DIR (default
#                  /tmp/brrr_base) beside the main build, ROWS=${BASE_ROWS:-$ROWS}; batches_ab.txt
#                  sets its decode tok/s against this tree's, per shape, batch and switch point
#   summary.txt    the table printed last
#   results.tar.gz everything above but summary.txt, packed (PACK=0 leaves the files as they are)
# The whole run keeps inside TOTAL_S seconds (default 540): every phase has a time limit; the
# sweep gets up to SWEEP_S (default 150) s, the decode variants VARIANTS_S (default 200) and compare what is left. Carried wheels (.whl/*.whl, e.g. gguf) are installed first.
# PHASES picks what runs after the build (default: all of them, in this order):
#   cuda-tests cpu-tests sanitizer gemmrace kernels variants batches basebatches gemmlab fdlab aplab gemvlab profile decode sweep compare
#   OUT=/path/to/out [PHASES="cuda-tests sanitizer"] bash scripts/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
TOTAL_S=${TOTAL_S:-540}
PHASES=${PHASES:-cuda-tests cpu-tests sanitizer gemmrace kernels variants batches basebatches gemmlab fdlab aplab gemvlab profile decode sweep compare}
BASE_DIR=${BASE_DIR:-/tmp/brrr_base}
mkdir -p "$OUT"
START=$(date +%s)
SUMMARY=()

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( TOTAL_S - $(elapsed) )); }
wanted() { [[ " $PHASES " == *" $1 "* ]]; }

# phase NAME LIMIT_S LOG CMD...: runs CMD with a time limit, appends to LOG, records the outcome.
phase() {
    local name=$1 limit=$2 log=$3
    shift 3
    local budget
    budget=$(left)
    if (( budget < 15 )); then
        SUMMARY+=("$(printf '%-12s %-8s %6s  %s' "$name" skipped - "no time left of TOTAL_S=$TOTAL_S")")
        return 1
    fi
    (( limit > budget - 10 )) && limit=$(( budget - 10 ))
    local t0 rc
    t0=$(date +%s)
    echo "==== $name: $* (limit ${limit}s) ====" >> "$log"
    timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    local status=ok
    (( rc == 124 || rc == 137 )) && status=timeout
    (( rc != 0 && rc != 124 && rc != 137 )) && status="rc=$rc"
    # the pytest/sanitizer/bench verdict line of this phase, else its last line
    local detail
    detail=$(sed -n "/^==== $name: /,\$p" "$log" | grep -E " passed| failed|[0-9] errors?|ERROR SUMMARY|^wrote " \
             | tail -n 1)
    [[ -z "$detail" ]] && detail=$(grep -v '^\s*$' "$log" | tail -n 1)
    echo "==== $name: $status after $(( $(date +%s) - t0 ))s ====" >> "$log"
    SUMMARY+=("$(printf '%-12s %-8s %6s  %s' "$name" "$status" "$(( $(date +%s) - t0 ))s" "${detail:0:100}")")
    return $rc
}

# ---- environment ---------------------------------------------------------------------------------
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUT/build.log" 2>&1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
# A carried model file (weights/*.gguf is git-ignored) serves as the default model for the tests.
if [[ -z "${LLAMA_BRRR_DEFAULT_MODEL:-}" ]]; then
    for f in weights/*.gguf; do
        [[ -f "$f" ]] && export LLAMA_BRRR_DEFAULT_MODEL="$ROOT/$f" && break
    done
fi
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

{
    echo "date: $(date -u)"; echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "python: $(python3 --version 2>&1)"; echo "default model: ${LLAMA_BRRR_DEFAULT_MODEL:-none}"
    nvidia-smi 2>&1
    nvcc --version 2>&1 | tail -n 2
} >> "$OUT/build.log"

# ---- build ----------------------------------------------------------------------------------------
export LLAMA_BRRR_CUDA=1 LLAMA_BRRR_CUDA_ARCHS=${LLAMA_BRRR_CUDA_ARCHS:-90a} MAX_JOBS=${MAX_JOBS:-16}
# The baseline tree builds in the background while the main one does: a copy of this tree (build
# objects included, so only the files the patch touches recompile) with BASE_PATCH reversed.
BASE_PID=
if [[ -n "${BASE_PATCH:-}" ]] && wanted basebatches; then
    rm -rf "$BASE_DIR" && mkdir -p "$BASE_DIR"
    tar -cf - --exclude=./out --exclude=./.whl . | tar -xf - -C "$BASE_DIR"
    if patch -R -p1 -d "$BASE_DIR" < "$BASE_PATCH" > "$OUT/base_build.log" 2>&1; then
        (cd "$BASE_DIR" && python3 setup.py build_ext --inplace >> "$OUT/base_build.log" 2>&1) &
        BASE_PID=$!
    else
        echo "BASE_PATCH $BASE_PATCH does not reverse onto this tree" >> "$OUT/base_build.log"
    fi
fi
if phase build 300 "$OUT/build.log" python3 setup.py build_ext --inplace \
        && phase import 30 "$OUT/build.log" python3 -c \
            "from llama_brrr import _C; n = _C.cuda_device_count(); print('cuda devices:', n); assert _C.cuda_compiled() and n > 0"; then

    # ---- tests ------------------------------------------------------------------------------------
    wanted cuda-tests && phase cuda-tests 240 "$OUT/tests.log" python3 -m pytest -q -rf --maxfail=60 -m cuda \
        tests/ -p no:cacheprovider
    wanted cpu-tests && phase cpu-tests 90 "$OUT/tests.log" python3 -m pytest -q -m "not cuda and not slow" \
        tests/ -p no:cacheprovider

    # ---- compute-sanitizer ------------------------------------------------------------------------
    cat > /tmp/brrr_sanitize.py <<'EOF'
# A tiny model through prefill (chunked), decode (graphed and eager) and sampling, 8 tokens each at
# batch 2 (the tensor-core GEMV; dim 2056 ends inside its 2048-column step) and 2 at batch 1 (the
# CUDA-core GEMV, normalizing from shared-memory copies: M x K >= 4096), then 3 greedy rounds of
# decode_steps at batch 1 (the sampler feeding the loop back on the device).
import numpy as np
from llama_brrr import _C
from llama_brrr.config import ModelConfig

config = ModelConfig(dim=2056, hidden_dim=200, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                     vocab_size=1001, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64})
for graphs in (True, False):
    engine = _C.Engine("cuda", config.engine_dict(600, 2), "bf16", 0)
    engine.use_cuda_graphs = graphs
    engine.init_random(7, 0.02)
    engine.prefill(1, np.arange(530, dtype=np.int32) % 1001, 0, "all")
    engine.prefill(0, np.array([5, 6, 7], np.int32), 0, "none")
    tokens, positions, slots = np.array([8, 9], np.int32), np.array([3, 530], np.int32), np.array([0, 1], np.int32)
    ones = np.ones(2, np.float32)
    for step in range(8):
        engine.decode(tokens, slots, positions, step % 3 == 0)
        tokens, _ = engine.sample(slots, positions, np.full(2, 0.8, np.float32), np.full(2, 40, np.int32),
                                  np.full(2, 0.9, np.float32), np.full(2, 0.02, np.float32), 1.1 * ones,
                                  np.array([1, 2], np.uint64), np.full(2, step, np.uint64))
        tokens = tokens.astype(np.int32)
        positions += 1
    for step in range(2):
        engine.decode(tokens[:1], slots[:1], positions[:1], True)
        positions[:1] += 1
    greedy = (np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones(1, np.float32), np.zeros(1, np.float32),
              np.ones(1, np.float32), np.zeros(1, np.uint64), np.zeros(1, np.uint64))
    rounds, _ = engine.decode_steps(tokens[:1], slots[:1], positions[:1], *greedy, 3)
    print("graphs" if graphs else "eager", "tokens", tokens.tolist(), "greedy rounds", rounds[:, 0].tolist())
print("sanitized run done")
EOF
    wanted sanitizer && phase sanitizer 120 "$OUT/sanitizer.log" "$SANITIZER" --tool memcheck \
        --error-exitcode 1 --leak-check no python3 /tmp/brrr_sanitize.py

    wanted gemmrace && phase gemmrace 60 "$OUT/gemm_race.log" python3 benchmarks/lab/gemm_residual_race.py \
        --ks 64,136,576 --repeats 5

    # ---- benchmarks -------------------------------------------------------------------------------
    # shellcheck disable=SC2086  # KERNELS_ARGS is a list of arguments
    wanted kernels && phase kernels 180 "$OUT/bench.log" python3 benchmarks/bench_kernels.py ${KERNELS_ARGS:---quick} \
        --out "$OUT/kernels.json"
    wanted variants && phase variants "${VARIANTS_S:-200}" "$OUT/bench.log" env OUT="$OUT/variants" bash benchmarks/lab/decode_variants.sh
    wanted batches && phase batches "${BATCHES_S:-200}" "$OUT/bench.log" env OUT="$OUT/batches" bash benchmarks/lab/decode_batches.sh
    if [[ -n "$BASE_PID" ]] && ! wait "$BASE_PID"; then
        SUMMARY+=("$(printf '%-12s %-8s %6s  %s' basebatches skipped - "the baseline build failed: base_build.log")")
    elif [[ -n "$BASE_PID" ]]; then
        phase basebatches "${BATCHES_S:-200}" "$OUT/bench.log" env OUT="$OUT/batches_base" \
            PYTHONPATH="$BASE_DIR:$PYTHONPATH" ROWS="${BASE_ROWS:-${ROWS:-2 3 5 17}}" \
            bash "$BASE_DIR/benchmarks/lab/decode_batches.sh" \
            && python3 benchmarks/lab/batches_table.py "$OUT/batches" "$OUT/batches_base" | tee "$OUT/batches_ab.txt"
    fi
    wanted gemmlab && phase gemmlab 240 "$OUT/bench.log" env OUT="$OUT/gemm_lab" bash benchmarks/lab/run_gemm_lab.sh
    wanted fdlab && phase fdlab 200 "$OUT/bench.log" env OUT="$OUT/flash_decode_lab" bash benchmarks/lab/run_flash_decode_lab.sh
    wanted aplab && phase aplab 240 "$OUT/bench.log" env OUT="$OUT/attention_prefill_lab" bash benchmarks/lab/run_attention_prefill_lab.sh
    wanted gemvlab && phase gemvlab 240 "$OUT/bench.log" env OUT="$OUT/gemv_lab" bash benchmarks/lab/run_gemv_lab.sh
    wanted profile && phase profile 160 "$OUT/bench.log" python3 -m llama_brrr profile --shape llama3.2-1b \
        --device cuda --max-new-tokens 128 --torch --out "$OUT/profile"
    wanted decode && phase decode 90 "$OUT/bench.log" python3 -m llama_brrr bench --shape llama3.2-1b,llama3-8b \
        --device cuda -b 1 -p 128 -n 256 --repeats 5 --json "$OUT/bench.json"
    # shellcheck disable=SC2086  # SWEEP_ARGS is a list of arguments
    wanted sweep && phase sweep "${SWEEP_S:-150}" "$OUT/bench.log" python3 -m llama_brrr bench --sweep ${SWEEP_ARGS:---quick} \
        --device cuda --json "$OUT/sweep.json"
    BENCH_S=$(( $(left) - 25 ))
    # shellcheck disable=SC2086  # COMPARE_ARGS is a list of arguments
    wanted compare && phase compare $(( BENCH_S + 15 )) "$OUT/bench.log" python3 -m llama_brrr compare \
        --shape "${COMPARE_SHAPES:-llama3.2-1b}" --device cuda ${COMPARE_ARGS:--b 1 -p 128,2048 -n 128 --repeats 3 --no-split} \
        --budget-s "$BENCH_S" --out-dir "$OUT"
fi

# ---- summary --------------------------------------------------------------------------------------
{
    echo
    echo "==== gpu_check summary ($(elapsed)s of TOTAL_S=$TOTAL_S) ===="
    printf '%-12s %-8s %6s  %s\n' phase status time detail
    printf '%s\n' "${SUMMARY[@]}"
    if [[ -f "$OUT/bench.log" ]]; then
        echo
        sed -n '/^==== compare: /,$p' "$OUT/bench.log" | grep -v '^\[' | tail -n 40
    fi
} | tee "$OUT/summary.txt"

# The device returns few files: everything but the summary travels as one archive (big traces
# stay behind).
if [[ -n "${PACK:-1}" && "${PACK:-1}" != 0 ]]; then
    find "$OUT" -type f -size +20M -delete
    tar -czf /tmp/gpu_check_results.tar.gz -C "$OUT" --exclude summary.txt . && \
        find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/gpu_check_results.tar.gz "$OUT/results.tar.gz"
fi
