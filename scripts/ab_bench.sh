#!/usr/bin/env bash
# ab_bench.sh — end-to-end speed of two trees of the project on the same GPU in one run: batch-1
# decode (128-token prompt, 256 new tokens) and 2048-token prefill of the Llama-3.2-1B and
# Llama-3-8B shapes, run in the order base, this, this, base so that drift of the machine falls on
# both sides alike. Both trees must be built in place (setup.py build_ext --inplace).
#   bash scripts/ab_bench.sh BASE_TREE OUT_DIR [repeats]
# Output: OUT_DIR/{base,this}_{decode,prefill}_{1,2}.json and OUT_DIR/table.txt (medians, this / base).
set -u
cd "$(dirname "$0")/.."
BASE=$(cd "$1" && pwd)
OUT=$2
REPEATS=${3:-5}
THIS=$(pwd)
mkdir -p "$OUT"
run() {  # run TREE TAG
    local tree=$1 tag=$2
    (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -m llama_brrr bench \
        --shape llama3.2-1b,llama3-8b --device cuda -b 1 -p 128 -n 256 --repeats "$REPEATS" --no-split \
        --json "$OUT/${tag}_decode.json") > "$OUT/$tag.log" 2>&1 || echo "$tag decode failed: $OUT/$tag.log"
    (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -m llama_brrr bench \
        --shape llama3.2-1b,llama3-8b --device cuda -b 1 -p 2048 -n 0 --repeats "$REPEATS" --no-split \
        --json "$OUT/${tag}_prefill.json") >> "$OUT/$tag.log" 2>&1 || echo "$tag prefill failed: $OUT/$tag.log"
}
run "$BASE" base_1
run "$THIS" this_1
run "$THIS" this_2
run "$BASE" base_2
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
def rates(tag, phase, key):
    found = {}
    for f in sorted(out.glob(f"{tag}_[12]_{phase}.json")):
        for r in json.loads(f.read_text())["runs"]:
            if key in r:
                found.setdefault(r["model"], []).append(r[key]["median"])
    return found
print(f"{'shape':<14}{'phase':<22}{'base tok/s':>14}{'this tok/s':>14}{'this/base':>10}")
for phase, key, label in (("decode", "decode_tok_s", "decode b1 pp128 tg256"),
                          ("prefill", "prefill_tok_s", "prefill b1 pp2048")):
    base, this = rates("base", phase, key), rates("this", phase, key)
    for shape in base:
        if shape in this:
            b, t = statistics.mean(base[shape]), statistics.mean(this[shape])
            runs = " ".join(f"{x:.1f}" for x in base[shape] + this[shape])
            print(f"{shape:<14}{label:<22}{b:>14.1f}{t:>14.1f}{t / b:>10.3f}   (base, this runs: {runs})")
PY
