#!/usr/bin/env bash
# gpu_check.sh — the one script to run on the GPU machine (repo root, no network): builds the CUDA
# module, runs the CUDA tests, a compute-sanitizer memcheck of a short generation, and the
# benchmarks; everything lands in $OUT (default ./out):
#   build.log      nvidia-smi, the build
#   tests.log      pytest -m cuda (and, with the cpu-tests phase, pytest -m "not cuda")
#   sanitizer.log  compute-sanitizer --tool memcheck on a tiny model, 8 tokens, graphs on and off,
#                  and on a tiny quantized model of mixed block types (scripts/sanitize_quant.py)
#   gemm_race.log  benchmarks/lab/gemm_residual_race.py: AddResidual checked bit for bit, repeated,
#                  on short-K shapes with an N tail
#   ab/            with BASE_DIR holding another tree of the project (e.g. the commit before a
#                  change, unpacked by `git archive REV | tar -x -C .base`): batch-1 decode (128-token
#                  prompt, 256 new tokens) and 2048-token prefill of the 1B and 8B shapes from both
#                  trees, in the order base, this, this, base; ab/table.txt sets them side by side
#   kernels.json   benchmarks/bench_kernels.py $KERNELS_ARGS (default --quick: 1B shapes)
#   bench.json     llama-brrr bench: batch-1 decode, 128-token prompt, 256 new tokens, 1B and 8B
#   bench_quant_Q.json  the same with --quant Q for each Q of $QUANTS (default: none q4_k_m q8_0)
#   sweep.json     llama-brrr bench --sweep $SWEEP_ARGS (default --quick)
#   profile/       llama-brrr profile of 1B-shape decode: report, roofline / breakdown PNGs, trace
#   compare.json   llama-brrr compare on $COMPARE_SHAPES (llama3.2-1b) against torch eager, HF,
#                  torch.compile
#   labs/          each lab program of benchmarks/lab built and run (run_*_lab.sh)
#   summary.txt    the table printed last
# The whole run keeps inside TOTAL_S seconds (default 540): every phase has a time limit.
# Carried wheels (.whl/*.whl) are installed first: what the GPU image lacks, made here with
#   pip download gguf pybind11 fastapi uvicorn --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 --implementation cp -d /tmp/wh
# keeping gguf, pybind11 and the server's own packages (fastapi, starlette, pydantic, pydantic_core,
# annotated_types, annotated_doc, typing_inspection, opentelemetry_api, uvicorn) in .whl/.
# PHASES picks what runs after the build (default below, in this order):
#   cuda-tests cpu-tests sanitizer gemmrace ab kernels decode quant sweep profile compare labs
#   OUT=/path/to/out [PHASES="cuda-tests sanitizer"] [BASE_DIR=.base] bash scripts/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
TOTAL_S=${TOTAL_S:-540}
PHASES=${PHASES:-cuda-tests sanitizer gemmrace ab kernels decode}
BASE_DIR=${BASE_DIR:-}

source "$ROOT/scripts/lib_phases.sh"  # makes $OUT, starts the clock (START) and SUMMARY

# ---- environment ---------------------------------------------------------------------------------
: > "$OUT/build.log"
use_carried_wheels "$OUT/build.log"
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
# The baseline tree (BASE_DIR) builds in the background while this one does.
BASE_PID=
if [[ -n "$BASE_DIR" ]] && wanted ab; then
    (cd "$BASE_DIR" && MAX_JOBS=8 python3 setup.py build_ext --inplace > "$OUT/base_build.log" 2>&1) &
    BASE_PID=$!
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
from llama_brrr.sampling import uniform_rows

config = ModelConfig(dim=2056, hidden_dim=200, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                     vocab_size=1001, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64})
sampled = uniform_rows(2, temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.1,
                       seed=[1, 2])
for graphs in (True, False):
    engine = _C.Engine("cuda", config.engine_dict(600, 2), "bf16", 0)
    engine.use_cuda_graphs = graphs
    engine.init_random(7, 0.02)
    engine.prefill(1, np.arange(530, dtype=np.int32) % 1001, 0, "all")
    engine.prefill(0, np.array([5, 6, 7], np.int32), 0, "none")
    tokens, positions, slots = np.array([8, 9], np.int32), np.array([3, 530], np.int32), np.array([0, 1], np.int32)
    for step in range(8):
        engine.decode(tokens, slots, positions, step % 3 == 0)
        tokens, _ = engine.sample(slots, positions, sampled, np.full(2, step, np.uint64))
        tokens = tokens.astype(np.int32)
        positions += 1
    for step in range(2):
        engine.decode(tokens[:1], slots[:1], positions[:1], True)
        positions[:1] += 1
    rounds, _ = engine.decode_steps(tokens[:1], slots[:1], positions[:1], uniform_rows(1),
                                    np.zeros(1, np.uint64), 3)
    print("graphs" if graphs else "eager", "tokens", tokens.tolist(), "greedy rounds", rounds[:, 0].tolist())
print("sanitized run done")
EOF
    wanted sanitizer && phase sanitizer 120 "$OUT/sanitizer.log" "$SANITIZER" --tool memcheck \
        --error-exitcode 1 --leak-check no python3 /tmp/brrr_sanitize.py
    wanted sanitizer && phase sanitizer-quant 120 "$OUT/sanitizer.log" "$SANITIZER" --tool memcheck \
        --error-exitcode 3 python3 scripts/sanitize_quant.py

    wanted gemmrace && phase gemmrace 60 "$OUT/gemm_race.log" python3 benchmarks/lab/gemm_residual_race.py \
        --ks 64,136,576 --repeats 5

    # ---- benchmarks -------------------------------------------------------------------------------
    # shellcheck disable=SC2086  # KERNELS_ARGS is a list of arguments
    wanted kernels && phase kernels 180 "$OUT/bench.log" python3 benchmarks/bench_kernels.py ${KERNELS_ARGS:---quick} \
        --out "$OUT/kernels.json"
    if wanted ab && [[ -n "$BASE_PID" ]]; then
        if wait "$BASE_PID"; then
            phase ab "${AB_S:-300}" "$OUT/bench.log" bash scripts/ab_bench.sh "$BASE_DIR" "$OUT/ab"
        else
            SUMMARY+=("$(printf '%-12s %-8s %6s  %s' ab skipped - "the baseline build failed: base_build.log")")
        fi
    fi
    wanted profile && phase profile 160 "$OUT/bench.log" python3 -m llama_brrr profile --shape llama3.2-1b \
        --device cuda --max-new-tokens 128 --torch --out "$OUT/profile"
    wanted decode && phase decode 90 "$OUT/bench.log" python3 -m llama_brrr bench --shape llama3.2-1b,llama3-8b \
        --device cuda -b 1 -p 128 -n 256 --repeats 5 --json "$OUT/bench.json"
    # shellcheck disable=SC2086  # SWEEP_ARGS is a list of arguments
    # quantized decode (issue 32): batch 1 and 16, bf16 and each of $QUANTS, random weights
    if wanted quant; then
        for q in ${QUANTS:-none q4_k_m q8_0}; do
            phase "quant-$q" "${QUANT_S:-200}" "$OUT/bench.log" python3 -m llama_brrr bench \
                --shape ${QUANT_SHAPES:-llama3.2-1b,llama3-8b} --device cuda -b ${QUANT_BATCHES:-1} -p 128 -n 256 \
                --repeats 3 --quant "$q" --json "$OUT/bench_quant_$q.json"
        done
    fi
    wanted sweep && phase sweep "${SWEEP_S:-150}" "$OUT/bench.log" python3 -m llama_brrr bench --sweep ${SWEEP_ARGS:---quick} \
        --device cuda --json "$OUT/sweep.json"
        # shellcheck disable=SC2086  # COMPARE_ARGS is a list of arguments
    wanted compare && phase compare "${COMPARE_S:-200}" "$OUT/bench.log" python3 -m llama_brrr compare \
        --shape "${COMPARE_SHAPES:-llama3.2-1b}" --device cuda ${COMPARE_ARGS:--b 1 -p 128,2048 -n 128 --repeats 3 --no-split} \
        --budget-s "${COMPARE_S:-200}" --out-dir "$OUT"
    if wanted labs; then
        for lab in gemm flash_decode attention_prefill gemv sampling; do
            phase "lab-$lab" 240 "$OUT/bench.log" env OUT="$OUT/labs/$lab" bash "benchmarks/lab/run_${lab}_lab.sh"
        done
    fi
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
