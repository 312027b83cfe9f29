#!/usr/bin/env bash
# decode_variants.sh — what each decode fusion buys, measured end to end: batch-1 decode of the
# Llama-3.2-1B and Llama-3-8B shapes (128-token prompt, 256 new tokens, CUDA graphs on) under the
# engine's diagnostic switches, all in one process per variant and one run of this script:
#   01 shipped      fused RMSNorm in the GEMV prologue, PDL, first weight loads before the PDL
#                   wait, no L2 weight prefetch
#   02 prefetch     LLAMA_BRRR_GEMV_PREFETCH=1: cp.async.bulk.prefetch.L2 of the W rows before the
#                   PDL wait (shipped until 2026-11-23: it measured 8-13% slower)
#   03 no-norm      LLAMA_BRRR_GEMV_NORM=0: rmsnorm_residual into xn, then the plain GEMV
#   04 no-pdl       LLAMA_BRRR_PDL=0: kernels launched plainly (each waits for the last to drain)
#   05 none         03 + 04
#   06 no-early     LLAMA_BRRR_GEMV_EARLY=0: the GEMV's first weight loads wait for the previous
#                   kernel instead of being issued before the PDL wait
#   07 fd-chunk128  LLAMA_BRRR_DECODE_CHUNK=128: flash_decode splits of at least two 64-position
#                   tiles (fewer CTAs, less merging); shipped: 64
#   08 fd-chunk256  LLAMA_BRRR_DECODE_CHUNK=256
#   09 fd-no-early  LLAMA_BRRR_DECODE_EARLY=0: flash_decode's first K/V rows wait for the QKV GEMV
#   10 fd-threads128  LLAMA_BRRR_DECODE_THREADS=128: flash_decode CTAs of 128 threads (shipped: 256)
#   11 fd-late      LLAMA_BRRR_DECODE_LATE_TRIGGER=1: the wo GEMV launches as flash_decode's CTAs
#                   exit, not while they run (shipped: late at hd 128 only)
#   13 fd-early     LLAMA_BRRR_DECODE_LATE_TRIGGER=0: the wo GEMV may launch once flash_decode's
#                   first K/V rows are asked for, at every head dim
#   12 fd-1-per-sm  LLAMA_BRRR_DECODE_CTAS_PER_SM=1: a grid of one flash_decode CTA per SM (shipped: 2)
#   14 gemv-trigger LLAMA_BRRR_GEMV_EARLY_TRIGGER=1: a GEMV lets the next kernel launch before its
#                   own PDL wait, so the GEMV after next (w13 behind wo) starts its weight loads
#                   while flash_decode runs (shipped since runs CY / CZ: 63 is the form before)
#   15, 16          14 with flash_decode's trigger late (15) or early (16) at every head dim
#   17 gemv-loads8  LLAMA_BRRR_GEMV_LOADS=8: at M = 1, 8 W loads per lane in flight everywhere (shipped:
#                   16, which asks for the 1B wqkv / w13 row pairs of a warp at once, except where its
#                   registers would split a one-wave grid in two, gemv.cu pick_m1_kernel; run S
#                   measured 16 everywhere against 8 at 1.070x on 1B, 1.011x on 8B)
#   18 gemv-loads32 LLAMA_BRRR_GEMV_LOADS=32
#   19              18 + 14
#   20 gemv-loads16 LLAMA_BRRR_GEMV_LOADS=16: 16 everywhere
#   (21-29, run 2026-11-24 on 52795eb and retired, code there: flash_decode warming wo's / w13's
#   first rows in L2, the GEMV's weight loads evict-first, the GEMV warming its next steps; see
#   benchmarks/results/h100-sxm/variants/warm_table.txt)
#   30 stage-loop   LLAMA_BRRR_GEMV_STAGE_ASYNC=0: the GEMV stages plain x rows (wo, w2) with a
#                   load-store loop, one L2 round trip per 16 bytes a thread (shipped: cp.async)
#   31 norm-global  LLAMA_BRRR_GEMV_NORM_SMEM=0: the fused RMSNorm of long rows (M x K >= 4096)
#                   reads x and norm_w from global memory twice (sum, then the staging loop) instead
#                   of from shared-memory copies made by cp.async (shipped)
#   (32, and 31 / 01 in other forms, run 2026-11-25 and retired, code at 86a7525 / fd26d07 /
#   45a9e43: the copies at every K, TMA bulk copies, cp.async on an mbarrier; see
#   benchmarks/results/h100-sxm/variants/stage_*_table.txt; 33, the
#   M = 1 GEMV with four W rows per warp on grids of 4+ waves, code at e111a8f: gemv_wide_table.txt)
#   (34, run 2026-11-25 (run AP) and retired, code at 00f543e: the GEMV reloading each W register
#   slot for the next step as soon as this step had consumed it, instead of all of a step's loads
#   at the top of the next step: 1B 0.927x, 8B 0.924x; see benchmarks/results/h100-sxm/variants/
#   gemv_refill_table.txt)
#   (35, run 2026-11-25 (runs AU-AX) and retired, code at 49d6c7a / 0e49468: every layer in one
#   persistent kernel; see benchmarks/results/h100-sxm/variants/persistent_table.txt)
#   36 split-fence  LLAMA_BRRR_DECODE_RELEASE=0: flash_decode counts a finished split with a fence in
#                   every thread and a relaxed atomic instead of one acq_rel atomic (shipped since
#                   run BA: 1B 1.009x, 8B 1.003x; variants/release_table.txt)
#   (37, run BD 2026-11-25 and retired, code at b1e896d: decode_steps replaying one graph per round
#   with the sampler inside, against the forward's graph and the sampler launched after it: 1B
#   1.001 / 1.009 / 0.996x, 8B 0.999-1.000x over three alternations; see
#   benchmarks/results/h100-sxm/variants/round_graph_table.txt)
#   38 fd-1-per-sm-early  12 + 13: one flash_decode CTA per SM, the wo GEMV free to launch beside it
#                   (run BD: 8B 0.970x)
#   (39-41, run BG 2026-11-25 and retired, code at 8b806c1: flash_decode ringing 4 or 6 K/V tiles
#   with chunks of at least 128-384 positions: 1B 0.928-0.941x, 8B 0.989-1.005x; see
#   benchmarks/results/h100-sxm/variants/stages_table.txt)
#   (42-44, run BJ 2026-11-25 and retired, code at d86c4dc: the wo GEMV (42, 43) or wo and w2 (44)
#   streaming two W rows per warp, half the CTAs, so the 8B wo grid fits beside flash_decode's CTAs,
#   with flash_decode's trigger as shipped (42) or early (43, 44): 1B 0.974-0.992x, 8B 0.956-0.999x;
#   the early 8B trigger loses with the smaller grid as without it; variants/rows2_table.txt)
#   (45-47, run BK 2026-11-25 and retired, code at d831d13: the wo GEMV free to launch once a
#   flash_decode CTA's last K/V tile has landed, alone (45), with 128-thread CTAs (46) or with the
#   GEMVs' early trigger (47): 1B 0.970-0.996x, 8B 0.953-0.974x, where 13 measured 0.972x at 8B in
#   the same passes; variants/trigger_landed_table.txt)
#   48 fd-one-chunk LLAMA_BRRR_DECODE_CHUNK=1048576: one flash_decode CTA per KV head, no merge (the
#                   trigger as shipped)
#   49 fd-one-chunk-early  48 + 13: with no merge, the decode's only global accesses after its K/V
#                   loads are its output stores; if wo's early weight loads hurt 8B by delaying the
#                   merge's L2 round trips, the early trigger should stop losing here
#   50 fd-chunk128-early   07 + 13
#                   (48-50, run BO: 8B 0.984 / 0.941 / 0.956x, 1B 0.981-0.984 / 0.974-0.977 /
#                   1.001-1.006x; the early trigger loses more without a merge: variants/one_chunk_table.txt)
#   (51-54, run BP 2026-11-25 and retired, code at 16bc7de: wo launched early with its early weight
#   loads paced, CTA b waiting (b % 8) x 500 / 1000 / 2000 ns (51 / 52 / 54), and 500 with the
#   trigger as shipped (53): 8B 0.962-0.974x early (13: 0.971x), 1.000-1.001x as shipped; 1B
#   0.916-1.004x; variants/wo_paced_table.txt)
#   (55, run BR 2026-11-25, code at 2397a9c: flash_decode's shared-memory tile kernel, shipped until
#   then, against the warp-owned rows that replaced it: 1B 0.999x, 8B 0.994x;
#   benchmarks/results/h100-sxm/variants/warps_table.txt)
#   56 gemv-late-residual  LLAMA_BRRR_GEMV_EARLY_RESIDUAL=0: the wo / w2 GEMVs read the residual in
#                   their epilogue (a read-add-write at the end of every warp) instead of right after
#                   their PDL wait (run BU: 8B 0.985x, 1B 0.985-0.998x; variants/early_residual_table.txt)
#   (57, run BV 2026-11-25 and retired, code at ef1a76a: the QKV GEMV reading positions and slots and
#   turning its RoPE angles right after its PDL wait: no gain, 1B 1.000-1.004x and 8B 1.002x for the
#   epilogue form; variants/early_rope_table.txt)
#   (58-62, runs CY / CZ 2026-11-26 and retired, code at 5bd831e / 8f753f3: 8 W loads per lane where
#   they cover a row in one step, 1B 0.953-0.972x; variants/exact_loads_table.txt)
#   63 gemv-late-trigger  LLAMA_BRRR_GEMV_EARLY_TRIGGER=0: the GEMV lets the next kernel launch only
#                   after its own PDL wait (shipped until runs CY / CZ)
# Every variant computes the same tokens (the bench checks nothing here; tests/test_cuda_fused.py
# holds the fused and unfused paths to the same reference). Output: $OUT/<variant>.json and
# $OUT/table.txt (median decode tok/s, spread, ms/token, ratio to 01).
# ONLY="01 06" runs just the variants with those numbers; SHAPES picks the shapes (default both).
#   OUT=/tmp/variants [ONLY="01 06"] [SHAPES=llama3.2-1b] bash benchmarks/lab/decode_variants.sh [repeats]
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/decode_variants}
REPEATS=${1:-3}
ONLY=${ONLY:-}
SHAPES=${SHAPES:-llama3.2-1b,llama3-8b}
mkdir -p "$OUT"
variants=(
    "01-shipped|"
    "02-prefetch|LLAMA_BRRR_GEMV_PREFETCH=1"
    "03-no-norm|LLAMA_BRRR_GEMV_NORM=0"
    "04-no-pdl|LLAMA_BRRR_PDL=0"
    "05-none|LLAMA_BRRR_GEMV_NORM=0 LLAMA_BRRR_PDL=0"
    "06-no-early|LLAMA_BRRR_GEMV_EARLY=0"
    "07-fd-chunk128|LLAMA_BRRR_DECODE_CHUNK=128"
    "08-fd-chunk256|LLAMA_BRRR_DECODE_CHUNK=256"
    "09-fd-no-early|LLAMA_BRRR_DECODE_EARLY=0"
    "10-fd-threads128|LLAMA_BRRR_DECODE_THREADS=128"
    "11-fd-late|LLAMA_BRRR_DECODE_LATE_TRIGGER=1"
    "12-fd-1-per-sm|LLAMA_BRRR_DECODE_CTAS_PER_SM=1"
    "13-fd-early|LLAMA_BRRR_DECODE_LATE_TRIGGER=0"
    "14-gemv-trigger|LLAMA_BRRR_GEMV_EARLY_TRIGGER=1"
    "15-gemv-trigger-fd-late|LLAMA_BRRR_GEMV_EARLY_TRIGGER=1 LLAMA_BRRR_DECODE_LATE_TRIGGER=1"
    "16-gemv-trigger-fd-early|LLAMA_BRRR_GEMV_EARLY_TRIGGER=1 LLAMA_BRRR_DECODE_LATE_TRIGGER=0"
    "17-gemv-loads8|LLAMA_BRRR_GEMV_LOADS=8"
    "18-gemv-loads32|LLAMA_BRRR_GEMV_LOADS=32"
    "19-gemv-trigger-loads32|LLAMA_BRRR_GEMV_LOADS=32 LLAMA_BRRR_GEMV_EARLY_TRIGGER=1"
    "20-gemv-loads16|LLAMA_BRRR_GEMV_LOADS=16"
    "30-stage-loop|LLAMA_BRRR_GEMV_STAGE_ASYNC=0"
    "31-norm-global|LLAMA_BRRR_GEMV_NORM_SMEM=0"
    "36-split-fence|LLAMA_BRRR_DECODE_RELEASE=0"
    "38-fd-1-per-sm-early|LLAMA_BRRR_DECODE_CTAS_PER_SM=1 LLAMA_BRRR_DECODE_LATE_TRIGGER=0"
    "48-fd-one-chunk|LLAMA_BRRR_DECODE_CHUNK=1048576"
    "49-fd-one-chunk-early|LLAMA_BRRR_DECODE_CHUNK=1048576 LLAMA_BRRR_DECODE_LATE_TRIGGER=0"
    "50-fd-chunk128-early|LLAMA_BRRR_DECODE_CHUNK=128 LLAMA_BRRR_DECODE_LATE_TRIGGER=0"
    "56-gemv-late-residual|LLAMA_BRRR_GEMV_EARLY_RESIDUAL=0"
    "63-gemv-late-trigger|LLAMA_BRRR_GEMV_EARLY_TRIGGER=0"
)
for v in "${variants[@]}"; do
    name=${v%%|*}
    envs=${v#*|}
    [[ -z "$ONLY" || " $ONLY " == *" ${name%%-*} "* ]] || continue
    echo "== $name: ${envs:-(defaults)}"
    env $envs python3 -m llama_brrr bench --shape "$SHAPES" --device cuda -b 1 -p 128 -n 256 \
        --repeats "$REPEATS" --no-split --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
        || { echo "   failed: see $name.log"; tail -n 5 "$OUT/$name.log"; }
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows, base = [], {}
for path in sorted(out.glob("[0-9][0-9]-*.json")):
    for run in json.loads(path.read_text())["runs"]:
        tok = run["decode_tok_s"]
        rows.append((path.stem, run["model"], tok["median"], tok["spread_pct"], run["ms_per_token"]))
        base.setdefault(run["model"], tok["median"])
print(f"{'variant':16} {'shape':12} {'tok/s':>8} {'spread%':>8} {'ms/tok':>7} {'vs 01':>6}")
for name, model, tps, spread, ms in rows:
    print(f"{name:16} {model:12} {tps:8.1f} {spread:8.2f} {ms:7.3f} {tps / base[model]:6.3f}")
PY
