#!/usr/bin/env bash
# gpu_serve.sh — the serving targets of issue 33 on one GPU (repo root, no network, the CUDA module
# already built: LLAMA_BRRR_CUDA=1 python3 setup.py build_ext --inplace). Random bf16 weights.
# Phases, in priority order (PHASES picks; each has a time limit; the whole run keeps inside
# TOTAL_S, default 540 s); everything lands in $OUT (default ./out):
#   http     1B, HTTP_PROMPTS (512) requests x 1,024 in / 1,024 out at 256 slots, all at once,
#            offline (scheduler) and through the OpenAI server (http) in one run:      http.json
#            (512 = two waves of 256 slots: ~25 s a mode at ~22k out tok/s, both inside 2 min)
#   ttft     the same requests through HTTP, Poisson arrivals at 0.8 x the offline request
#            throughput http.json measured (TTFT_RATE_FALLBACK if that phase failed):  ttft.json
#   hf       8B, HF_PROMPTS (64) requests x 1,024 / 1,024, ours (scheduler) then transformers'
#            generate_batch on the same requests (HF runs last, after our engine freed the GPU; its
#            weights are ours, bf16; HF_LIMIT_S, default 220 s, bounds the phase):      hf.json
#   soak     benchmarks/bench_serve_soak.py on the 1B shape: 200 streaming clients for SOAK_MIN
#            (1.5) minutes, within SOAK_LIMIT_S (170) s; no request lost, no error, KV blocks back
#            to zero:                                                                 soak.json
#   profile  benchmarks/bench_serve_step.py: 256 rows at 1,500 tokens of context on the 1B shape,
#            host vs engine time of a scheduler step (1 and 16 decode rounds), cProfile of the
#            host part, the engine profiler over decode steps:                        profile/
#   summary.txt  the verdicts against the targets, printed last.
# SMOKE=1 runs every phase on the CPU with tiny workloads (smollm2-135m shape, the soak's tiny
# model): the check of this script end to end before GPU time is spent on it.
# KV_CACHE_DTYPE=fp8: the bench serve phases (http, ttft, hf) with an e4m3 KV cache (default auto).
#   OUT=/path/to/out [PHASES="http ttft"] [TOTAL_S=540] [SMOKE=1] bash scripts/gpu_serve.sh
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
TOTAL_S=${TOTAL_S:-540}
PHASES=${PHASES:-http ttft hf soak profile}
SMOKE=${SMOKE:-0}
LOG="$OUT/serve.log"

source "$ROOT/scripts/lib_phases.sh"  # makes $OUT, starts the clock (START) and SUMMARY

# ---- environment ---------------------------------------------------------------------------------
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null && ! python3 -c "import fastapi, uvicorn" 2> /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
BENCH=(python3 -m llama_brrr bench serve --repeats 1 --kv-cache-dtype "${KV_CACHE_DTYPE:-auto}")

if [[ "$SMOKE" == 1 ]]; then
    DEV=cpu; SMALL=smollm2-135m; BIG=smollm2-135m
    HTTP_ARGS=(--num-prompts 8 --input-len 32 --output-len 16 --max-num-seqs 8)
    HF_ARGS=(--num-prompts 4 --input-len 32 --output-len 8 --max-num-seqs 4)
    SOAK_ARGS=(--clients 20 --minutes 0.1)
    STEP_ARGS=(--shape smollm2-135m --rows 8 --context 64 --steps 3 --decode-steps 1,4 --profile-steps 2
               --cprofile 2)
    TTFT_RATE_FALLBACK=${TTFT_RATE_FALLBACK:-2}
else
    DEV=cuda; SMALL=llama3.2-1b; BIG=llama3-8b
    HTTP_ARGS=(--num-prompts "${HTTP_PROMPTS:-512}" --input-len 1024 --output-len 1024 --max-num-seqs 256)
    HF_ARGS=(--num-prompts "${HF_PROMPTS:-64}" --input-len 1024 --output-len 1024
             --max-num-seqs "${HF_PROMPTS:-64}")
    SOAK_ARGS=(--shape llama3.2-1b --max-num-seqs 128 --max-seq-len 1024 --max-tokens 64
               --clients 200 --minutes "${SOAK_MIN:-1.5}")
    STEP_ARGS=(--shape llama3.2-1b --rows 256 --context 1500 --steps 32 --decode-steps 1,16
               --profile-steps 8 --cprofile 16)
    # About 0.8 x 512 requests / 26 s: the fallback when the http phase measured nothing.
    TTFT_RATE_FALLBACK=${TTFT_RATE_FALLBACK:-16}
fi

{
    echo "date: $(date -u)"; echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "python: $(python3 --version 2>&1)  smoke: $SMOKE  device: $DEV"
    [[ "$DEV" == cuda ]] && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1
} >> "$LOG"

# ---- phases ---------------------------------------------------------------------------------------
if wanted http; then
    phase http 170 "$LOG" "${BENCH[@]}" --device "$DEV" --shape "$SMALL" "${HTTP_ARGS[@]}" \
        --modes scheduler,http --json "$OUT/http.json"
fi

if wanted ttft; then
    RATE=$(python3 - "$OUT/http.json" "$TTFT_RATE_FALLBACK" <<'EOF'
import json, sys
try:
    print(f"{0.8 * json.load(open(sys.argv[1]))['modes']['scheduler']['request_throughput']:.3f}")
except (OSError, KeyError, ValueError):
    print(sys.argv[2])
EOF
)
    echo "ttft: Poisson rate $RATE req/s" >> "$LOG"
    phase ttft 120 "$LOG" "${BENCH[@]}" --device "$DEV" --shape "$SMALL" "${HTTP_ARGS[@]}" \
        --modes http --request-rate "$RATE" --json "$OUT/ttft.json"
fi

if wanted hf; then
    # Ours holds half the GPU (its KV pool does not need more at 64 rows); HF gets the whole of
    # it once ours is freed.
    phase hf "${HF_LIMIT_S:-220}" "$LOG" "${BENCH[@]}" --device "$DEV" --shape "$BIG" "${HF_ARGS[@]}" \
        --gpu-memory-utilization 0.5 --modes scheduler,hf --json "$OUT/hf.json"
fi

if wanted soak; then
    phase soak "${SOAK_LIMIT_S:-170}" "$LOG" python3 benchmarks/bench_serve_soak.py --device "$DEV" "${SOAK_ARGS[@]}" \
        --out "$OUT/soak.json"
fi

if wanted profile; then
    phase profile 150 "$LOG" python3 benchmarks/bench_serve_step.py --engine real --device "$DEV" \
        "${STEP_ARGS[@]}" --out "$OUT/profile"
fi

# ---- summary --------------------------------------------------------------------------------------
{
    echo
    echo "==== gpu_serve summary ($(elapsed)s of TOTAL_S=$TOTAL_S, smoke=$SMOKE) ===="
    printf '%s\n' "${SUMMARY[@]}"
    python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])

def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None

def mode(d, m):
    return (d or {}).get("modes", {}).get(m)

d = load("http.json")
s, h = mode(d, "scheduler"), mode(d, "http")
if s and h:
    print(f"http: offline {s['output_tok_s']:,.0f} out tok/s ({s['request_throughput']:.2f} req/s), "
          f"HTTP {h['output_tok_s']:,.0f}: {h['output_tok_s'] / s['output_tok_s']:.1%} of offline "
          f"(target >= 90%); failed {s['failed']}/{h['failed']}; HTTP TTFT p99 {h['ttft_ms']['p99']:.0f} ms")
elif d:
    print(f"http: partial: modes {list(d.get('modes', {}))}, notes {d.get('notes')}")
d = load("ttft.json")
h = mode(d, "http")
if h:
    rate = d["options"]["request_rate"]
    print(f"ttft: Poisson {rate:.2f} req/s: TTFT p99 {h['ttft_ms']['p99']:.0f} ms (target < 2000), "
          f"median {h['ttft_ms']['median']:.0f}; TPOT median {h['tpot_ms']['median']:.1f} ms; "
          f"{h['output_tok_s']:,.0f} out tok/s; failed {h['failed']}")
d = load("hf.json")
s, f = mode(d, "scheduler"), mode(d, "hf")
if s:
    line = f"hf: ours {s['output_tok_s']:,.0f} out tok/s"
    if f:
        line += (f", HF generate_batch {f['output_tok_s']:,.0f}: ours/HF "
                 f"{s['output_tok_s'] / f['output_tok_s']:.2f}x (target >= 5x); HF failed {f['failed']}, "
                 f"agrees {f.get('agrees_with_scheduler', 0):.0%}")
    else:
        line += f"; HF: {(d.get('notes') or {}).get('hf', 'did not finish (partial JSON)')}"
    print(line + f"; requests {d['requests']}")
d = load("soak.json")
if d:
    c = d["counts"]
    print(f"soak: passed={d['passed']}: {d['clients']} clients {d['wall_s']:.0f} s, sent {c['sent']}, "
          f"completed {c['completed']}, dropped {c['dropped']}, lost {d['lost']}, errors {c['errors']}, "
          f"wrong text {c['wrong_text']}, wrong count {c['wrong_count']}; KV blocks used at the end "
          f"{d['final_usage']['kv_blocks_used']}, slots {d['final_usage']['slots_used']}; "
          f"{d['output_tok_s']:,.0f} out tok/s, TTFT p99 {d['ttft_ms']['p99'] or 0:.0f} ms")
d = load("profile/step.json")
if d:
    for k, r in d["runs"].items():
        print(f"profile {k}: {r['rows']} rows, step {r['step_ms_mean']:.2f} ms (mean), engine "
              f"{r['engine_ms_per_step']:.2f} ms, host {r['host_us_per_step']:.0f} us "
              f"({r['host_share']:.1%}), {r['host_us_per_token']:.2f} us/token")
    p = d.get("profile")
    if p:
        dec = p["phases"].get("decode", {})
        print(f"profile kernels (decode, {p['steps']} steps of {p['rows']} rows): wall "
              f"{dec.get('wall_s', 0) * 1e3:.1f} ms, busy {dec.get('busy_s', 0) * 1e3:.1f} ms, MBU "
              f"{dec.get('mbu')}")
        for k in p["kernels_top"][:8]:
            print(f"   {k['name'][:40]:<40} {k['calls']:>7.0f} calls {k['time_s'] * 1e3:>9.2f} ms")
EOF
} | tee "$OUT/summary.txt"
