#!/usr/bin/env bash
# tp_prefill_ab.sh — A/B of a tensor-parallel prefill's row-parallel steps on a machine of 2+ GPUs,
# in one run: the 8B shape's 2048-token prefill at TP 1 once, then at every TP size of $TPS
# (default "2", "2 4" on 4+ GPUs) in this tree and in each variant, REPEATS (5) repeats each.
# A variant is a copy of this tree changed one way, NAME=SPEC in $VARIANTS:
#   sed:FILE:EXPR   the sed expression EXPR applied to FILE (the change must take, or the run stops)
#   tar:PATH        a tarball unpacked over the copy (say, another commit's csrc/: `git archive`)
#   patch:PATH      a patch (-p1) applied to the copy (benchmarks/lab/variants/*.patch; each names
#                   the tree it applies to)
#   VARIANTS="nccl=sed:csrc/cuda/tuning.h:s/RowsMaxRanks[[:space:]]=[[:space:]]2;/RowsMaxRanks=1;/" \
#       OUT=/tmp/ab bash benchmarks/lab/tp_prefill_ab.sh
# $OUT gets prefill_*.json, bench.log, table.txt and the build logs. The measurements are in
# docs/kernels/allreduce.md.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
REPEATS=${REPEATS:-5}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TPS=${TPS:-$( (( GPUS >= 4 )) && echo "2 4" || echo "2")}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LLAMA_BRRR_CUDA=1 LLAMA_BRRR_CUDA_ARCHS=${LLAMA_BRRR_CUDA_ARCHS:-90a}
JOBS=${MAX_JOBS:-16}
names=(this)
declare -A dirs=([this]=$ROOT)
for spec in ${VARIANTS:-}; do
    name=${spec%%=*} how=${spec#*=}
    d=/tmp/tpab_$name
    rm -rf "$d" && mkdir -p "$d" &&
        tar -C "$ROOT" --exclude=./build --exclude=./.whl --exclude=./.git -cf - . | tar -C "$d" -xf - ||
        { echo "variant $name: cannot copy the tree"; exit 1; }
    case $how in
        sed:*)
            rest=${how#sed:} file=${rest%%:*} expr=${rest#*:}
            cp "$d/$file" "$d/$file.orig" && sed -i "$expr" "$d/$file" && ! cmp -s "$d/$file" "$d/$file.orig" ||
                { echo "variant $name: '$expr' changed nothing in $file"; exit 1; } ;;
        tar:*) tar -C "$d" -xf "${how#tar:}" || { echo "variant $name: cannot unpack ${how#tar:}"; exit 1; } ;;
        patch:*) (cd "$d" && patch -s -p1 < "$ROOT/${how#patch:}") || { echo "variant $name: ${how#patch:} does not apply"; exit 1; } ;;
        *) echo "variant $name: unknown spec '$how'"; exit 1 ;;
    esac
    names+=("$name")
    dirs[$name]=$d
done
pids=()
for name in "${names[@]}"; do
    (cd "${dirs[$name]}" && MAX_JOBS=$JOBS python3 setup.py build_ext --inplace > "$OUT/build_$name.log" 2>&1) &
    pids+=($!)
done
for i in "${!names[@]}"; do
    wait "${pids[$i]}" || { tail -30 "$OUT/build_${names[$i]}.log"; exit 1; }
done
say "built: ${names[*]}"
BENCH=(python3 -m llama_brrr bench --device cuda --repeats "$REPEATS" --shape llama3-8b -b 1 --workloads 2048:0)
PYTHONPATH=$ROOT:${PYTHONPATH:-} timeout 120 "${BENCH[@]}" --tensor-parallel 1 --json "$OUT/prefill_tp1.json" \
    >> "$OUT/bench.log" 2>&1
say "TP 1 done"
for tp in $TPS; do
    for name in "${names[@]}"; do
        d=${dirs[$name]}
        (cd "$d" && PYTHONPATH=$d:${PYTHONPATH:-} timeout 150 "${BENCH[@]}" --tensor-parallel "$tp" \
            --json "$OUT/prefill_tp${tp}_$name.json" >> "$OUT/bench.log" 2>&1)
        say "TP $tp $name done"
    done
done
python3 - "$OUT" "$TPS" "${names[@]}" <<'PY' | tee "$OUT/table.txt"
import json, sys
out, tps, names = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def rate(path):
    try:
        r = json.load(open(path))["runs"][0]["prefill_tok_s"]
    except (OSError, KeyError, IndexError, ValueError) as e:
        return None, f"unreadable ({e!r})"
    return r["median"], f"[{r['min']:.0f}, {r['max']:.0f}]"
one, spread = rate(f"{out}/prefill_tp1.json")
print(f"TP 1: {one} tok/s {spread}")
for tp in tps:
    for name in names:
        v, s = rate(f"{out}/prefill_tp{tp}_{name}.json")
        ratio = f"{v / one:.3f}x" if v and one else "-"
        print(f"TP {tp} {name:9s} {v} tok/s {s}  {ratio} of TP 1")
PY
