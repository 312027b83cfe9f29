# lib_phases.sh — the time-limited phase runner of the GPU scripts (gpu_check.sh, gpu_serve.sh,
# gpu_tp.sh), sourced by them, and their shared set-up. The caller sets ROOT, OUT, TOTAL_S and
# PHASES first; sourcing makes $OUT and starts the clock the phases' time limits count from.
# shellcheck shell=bash

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

# use_carried_wheels LOG: this tree on PYTHONPATH, and the carried wheels (.whl/*.whl: what the GPU
# image lacks, see gpu_check.sh) installed into /tmp/site and put before it; pip's output to LOG.
use_carried_wheels() {
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    if compgen -G ".whl/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> "$1" 2>&1
        export PYTHONPATH="/tmp/site:$PYTHONPATH"
    fi
}
