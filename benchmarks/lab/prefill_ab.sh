#!/usr/bin/env bash
# prefill_ab.sh — prefill end to end, 8B and 1B shapes, under each value of one environment
# variable, alternated twice, on a built tree.
#   VAR     the variable (the engine's one runtime switch: LLAMA_BRRR_PDL, values "1 0")
#   VALUES  its values, in the order run ("0 4")
#   PROMPT  prompt tokens (default 2048)
#   TAG     file prefix: $OUT/<TAG><value>_<pass>.json
#   OUT     output folder
# Then `python3 benchmarks/lab/prefill_ttft.py $OUT/<TAG>*.json` tabulates them.
set -u
cd "$(dirname "$0")/../.."
: "${VAR:?name the switch}" "${VALUES:?list its values}" "${TAG:?name the files}" "${OUT:?name the folder}"
PROMPT=${PROMPT:-2048}
mkdir -p "$OUT"
for pass in 1 2; do
    for value in $VALUES; do
        env "$VAR=$value" timeout -k 5 90 python3 -m llama_brrr bench --shape llama3-8b,llama3.2-1b --device cuda \
            -b 1 -p "$PROMPT" -n 0 --repeats 5 --no-split --json "$OUT/$TAG${value}_$pass.json" \
            > /dev/null 2>&1 || echo "prefill $PROMPT $VAR=$value pass $pass: rc=$?"
    done
done
