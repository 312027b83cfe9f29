#!/usr/bin/env bash
# gpu_tp.sh — the tensor-parallel run on a machine of several GPUs (issue 34): builds the CUDA
# module, runs the multi-GPU tests and the TP benchmarks; everything lands in $OUT (default ./out):
#   build.log        nvidia-smi (with the NVLink topology), the build
#   tests.log        pytest tests/test_tp_cuda.py (the TP 2 cases, and the TP 4 ones on 4+ GPUs)
#   tp<N>.json       8B shape, batch-1 and batch-64 decode, 128-token prompt, 128 new tokens, TP N
#   tp<N>_prefill2048.json  8B shape, one 2048-token prefill, TP N
#   tp4_70b.json     70B shape at TP 4 (random bf16 weights, 35 GB a GPU), batch 1 and 64
#   all_reduce_tp<N>.json   all-reduce latency inside a graph, NCCL and the one-shot kernel
#   serve_tp<N>.json, serve_tp<N>_steps.json  1B shape, bench serve (offline scheduler), 256
#                    requests x 512 in / 256 out at 128 slots, TP N > 1, pipelined steps
#                    (the default) and step by step (--no-pipeline)
#   bench.log        every benchmark's table
#   summary.txt      the table printed last
# TPS lists the group sizes (default: 1 2 and, on 4+ GPUs, 4). PHASES picks what runs after the
# build, in this order: tests decode prefill 70b allreduce serve
#   OUT=/path/to/out [PHASES="decode 70b"] [TOTAL_S=540] bash scripts/gpu_tp.sh
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
TOTAL_S=${TOTAL_S:-540}
PHASES=${PHASES:-tests decode prefill 70b allreduce serve}

source "$ROOT/scripts/lib_phases.sh"  # makes $OUT, starts the clock (START) and SUMMARY

: > "$OUT/build.log"
use_carried_wheels "$OUT/build.log"
# NVLink SHARP multicast stays off (the lent machines' rule); P2P over NVLink is what the one-shot
# all-reduce uses.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TPS=${TPS:-$( (( GPUS >= 4 )) && echo "1 2 4" || echo "1 2")}
{
    echo "date: $(date -u)"; echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi 2>&1; nvidia-smi topo -m 2>&1
} >> "$OUT/build.log"

export LLAMA_BRRR_CUDA=1 LLAMA_BRRR_CUDA_ARCHS=${LLAMA_BRRR_CUDA_ARCHS:-90a} MAX_JOBS=${MAX_JOBS:-32}
BENCH=(python3 -m llama_brrr bench --device cuda --repeats 3)
if phase build 300 "$OUT/build.log" python3 setup.py build_ext --inplace; then
    wanted tests && phase tests 240 "$OUT/tests.log" python3 -m pytest -q -rfs tests/test_tp_cuda.py
    if wanted decode; then
        for n in $TPS; do
            phase "decode-tp$n" 120 "$OUT/bench.log" "${BENCH[@]}" --shape llama3-8b -b 1,64 -p 128 -n 128 \
                --tensor-parallel "$n" --json "$OUT/tp$n.json"
        done
    fi
    if wanted prefill; then
        for n in $TPS; do
            phase "prefill-tp$n" 90 "$OUT/bench.log" "${BENCH[@]}" --shape llama3-8b -b 1 --workloads 2048:0 \
                --tensor-parallel "$n" --json "$OUT/tp${n}_prefill2048.json"
        done
    fi
    if wanted 70b && (( GPUS >= 4 )); then
        phase 70b-tp4 200 "$OUT/bench.log" "${BENCH[@]}" --shape llama3-70b -b 1,64 -p 128 -n 128 \
            --tensor-parallel 4 --json "$OUT/tp4_70b.json"
    fi
    if wanted allreduce; then
        for n in $TPS; do
            (( n > 1 )) && phase "allreduce-tp$n" 90 "$OUT/bench.log" python3 benchmarks/bench_all_reduce.py \
                --tensor-parallel "$n" --out "$OUT/all_reduce_tp$n.json"
        done
    fi
    if wanted serve; then
        SERVE=(python3 -m llama_brrr bench serve --device cuda --shape llama3.2-1b --modes scheduler --repeats 1
               --num-prompts 256 --input-len 512 --output-len 256 --max-num-seqs 128)
        for n in $TPS; do
            (( n > 1 )) || continue
            phase "serve-tp$n" 120 "$OUT/bench.log" "${SERVE[@]}" --tensor-parallel "$n" --pipeline --json "$OUT/serve_tp$n.json"
            phase "steps-tp$n" 120 "$OUT/bench.log" "${SERVE[@]}" --tensor-parallel "$n" --no-pipeline \
                --json "$OUT/serve_tp${n}_steps.json"
        done
    fi
fi

printf '%s\n' "gpu_tp.sh on $GPUS GPU(s), TPS=\"$TPS\", $(elapsed)s of TOTAL_S=$TOTAL_S" "${SUMMARY[@]}" \
    | tee "$OUT/summary.txt"
