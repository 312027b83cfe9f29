#!/usr/bin/env bash
# gpu_llamacpp_peer.sh — the llama.cpp CUDA peer (issue 32): llama.cpp built from the source
# vendored in the llama-cpp-python sdist (third_party/llama.cpp, made by scripts/llamacpp_src.sh
# and carried to the GPU machine), random-weight F16 GGUFs of the 1B and 8B shapes written by
# llama_brrr (bench/llamacpp.py write_random_gguf), Q4_K_M and Q8_0 files made from them by
# llama.cpp's quantizer, and llama-bench on each: all layers on the GPU, flash attention on, every
# test at depth 0 and at depth 128 (so "tg128 @ d128" is 128 decode steps after a 128-token
# prompt), -r $PEER_REPS. Run from the repository root on the GPU machine (no network):
#
#   OUT=/path bash scripts/gpu_llamacpp_peer.sh
#
# Steps, each skipped when its output already exists under $PEER_DIR (default /tmp/peer), so a
# second call on the same (still warm) machine carries on where a timed-out one stopped:
#   a. cmake + ninja of llama-bench and llama-quantize only (Release, sm_90a, CUDA, flash
#      attention for F16 / Q8_0 / Q4_0 caches only: GGML_CUDA_FA_ALL_QUANTS off), build time
#      printed; the F16 files are written in the background meanwhile
#   b. $PEER_DIR/models/<shape>.F16.gguf (the 8B one is deleted once both of its quantized files
#      exist: 16 GB of disk)
#   c. llama-quantize to <shape>.Q4_K_M.gguf and <shape>.Q8_0.gguf, 16 threads
#   d. llama-bench of each quantized file and of the 1B F16, JSON per file under
#      $PEER_DIR/results-cuda; $OUT/llamacpp_peer/ gets raw.json (every test of every file, samples
#      included), summary.json (tok/s mean and stdev per test, build, llama.cpp version, GPU) and
#      peer.log (configure, build, quantize and bench logs)
#   e. the files' paths and sizes printed last: llama_brrr can run the same files in the same call
#
# Environment: OUT (default ./out); PEER_DIR (/tmp/peer); PEER_SHAPES ("llama3.2-1b llama3-8b";
# "tiny" = the peer-tiny shape of a CPU dry run); PEER_TYPES ("Q4_K_M Q8_0": the quantized files
# made); PEER_BENCH (1; 0 = build and files only, for a `llama_brrr compare` that runs llama-bench
# itself in the same call); PEER_CUDA (1; 0 = a CPU build, for dry runs);
# PEER_JOBS (nproc); PEER_REPS (5); TOTAL_S (540: every step gets what is left of it); PEER_BUILD_S
# (480: the build's own limit);
# PEER_CONFIGURE_ONLY (0; 1 = stop after cmake's configure, a check of the tree and toolchain);
# PEER_BUILD_ONLY (0; 1 = stop after the build: scripts/llamacpp_prebuild.sh builds off the GPU
# machine this way); PEER_PREBUILT (a tarball of scripts/llamacpp_prebuild.sh: its binaries stand
# in for steps a's configure and build, and the source tree is not needed);
# LLAMA_SRC (third_party/llama.cpp); CUBLAS_DIR (a folder with include/cublas_v2.h and
# lib/libcublas.so*, when the CUDA toolkit lacks cuBLAS: found by itself in Python's nvidia wheels).
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
PEER=${PEER_DIR:-/tmp/peer}
SHAPES=${PEER_SHAPES:-llama3.2-1b llama3-8b}
TYPES=${PEER_TYPES:-Q4_K_M Q8_0}
BENCH=${PEER_BENCH:-1}
[[ $SHAPES == tiny ]] && SHAPES=peer-tiny
CUDA=${PEER_CUDA:-1}
JOBS=${PEER_JOBS:-$(nproc)}
REPS=${PEER_REPS:-5}
TOTAL_S=${TOTAL_S:-540}
SRC=${LLAMA_SRC:-$ROOT/third_party/llama.cpp}
BUILD=$PEER/build-$([[ $CUDA == 1 ]] && echo cuda || echo cpu)
MODELS=$PEER/models
RESULTS=$PEER/results-$([[ $CUDA == 1 ]] && echo cuda || echo cpu)
LOGS=$PEER/logs
RES=$OUT/llamacpp_peer
START=$(date +%s)
mkdir -p "$MODELS" "$RESULTS" "$LOGS" "$RES"
LOG=$LOGS/peer.log

say() { echo "[peer $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
die() { say "FAILED: $*"; stop_writer; finish; exit 1; }
# the background writer and the python it runs (by their process ids)
stop_writer() { [[ -n ${WRITER:-} ]] && { pkill -TERM -P "$WRITER"; kill "$WRITER"; } 2>/dev/null; }
# limited SECONDS CMD...: CMD with at most SECONDS (and never past TOTAL_S, 10 s kept for the end)
limited() {
    local limit=$1
    shift
    local budget=$(( $(left) - 10 ))
    (( budget < limit )) && limit=$budget
    (( limit > 0 )) || return 124
    timeout --kill-after=5 "$limit" "$@"
}
# peer.log under $OUT: this script's log, then the writer's, quantize's, bench's, the build's end
collect_logs() {
    { cat "$LOG"; for f in write quantize bench; do [[ -f $LOGS/$f.log ]] && { echo "==== $f.log"; cat "$LOGS/$f.log"; }; done
      [[ -f $LOGS/build.log ]] && { echo "==== build.log (last 40 lines)"; tail -40 "$LOGS/build.log"; }
    } > "$RES/peer.log" 2>/dev/null
}
finish() {
    PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} python3 - "$RESULTS" "$RES" "$SRC" "$BUILD" "$REPS" <<'EOF' 2>&1 | tee -a "$LOG"
import json, pathlib, subprocess, sys
from llama_brrr.bench.llamacpp import summarize_test
results, res, src, build = (pathlib.Path(a) for a in sys.argv[1:5])
raw = {p.name[:-len(".json")]: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
def gpu():
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        return q.stdout.strip() or q.stderr.strip()
    except OSError as error:
        return f"no nvidia-smi ({error})"
meta = {}
for name in ("build_seconds.txt", "cmake_args.txt", "nvcc_version.txt"):
    p = build / name
    if p.is_file():
        meta[name[:-4]] = p.read_text().strip()
source = src / "BRRR_SOURCE.txt"
summary = {"gpu": gpu(), "llama_cpp_source": source.read_text().strip() if source.is_file() else None,
           "llama_bench_arguments": f"-ngl 99 -fa 1 -p 128 -n 128 -pg 128,128 -d 0,128 -r {sys.argv[5]} -o json",
           **meta, "files": {}}
for name, tests in raw.items():
    model = pathlib.Path(tests[0].get("model_filename", name))
    summary["files"][name] = {"path": str(model),
                              "bytes": model.stat().st_size if model.is_file() else None,
                              "tests": {s["test"]: s for s in map(summarize_test, tests)}}
(res / "raw.json").write_text(json.dumps(raw, indent=1))
(res / "summary.json").write_text(json.dumps(summary, indent=1))
print(f"gpu: {summary['gpu']}")
print(f"{'file':<28}{'GB':>7}  " + "".join(f"{t:>16}" for t in ("pp128", "tg128", "tg128 @ d128", "pp128+tg128")))
for name, f in summary["files"].items():
    cells = "".join(f"{f['tests'][t]['tok_s_mean']:>9.1f} ±{f['tests'][t]['tok_s_stdev'] or 0:>5.1f}"
                    if t in f["tests"] else f"{'-':>16}"
                    for t in ("pp128", "tg128", "tg128 @ d128", "pp128+tg128"))
    size = f"{f['bytes'] / 1e9:7.2f}" if f["bytes"] else f"{'?':>7}"
    print(f"{name:<28}{size}  {cells}")
EOF
    say "models (the files llama_brrr can run too):"
    for f in "$MODELS"/*.gguf; do
        [[ -f $f ]] && printf '  %s  %s bytes\n' "$f" "$(stat -c %s "$f")" | tee -a "$LOG"
    done
    collect_logs
}

say "shapes: $SHAPES; cuda: $CUDA; work dir: $PEER; budget ${TOTAL_S}s"
df -h "$PEER" /dev/shm 2>/dev/null | tee -a "$LOG"
PREBUILT=${PEER_PREBUILT:-}
if [[ -n $PREBUILT ]]; then
    [[ -f $PREBUILT ]] || die "no prebuilt llama.cpp at PEER_PREBUILT=$PREBUILT (scripts/llamacpp_prebuild.sh makes it)"
    mkdir -p "$BUILD" && tar -xJf "$PREBUILT" -C "$BUILD" || die "unpacking $PREBUILT"
    [[ -x $BUILD/bin/llama-bench && -x $BUILD/bin/llama-quantize ]] || die "$PREBUILT lacks bin/llama-bench or bin/llama-quantize"
    SRC=$BUILD  # its BRRR_SOURCE.txt records the source the binaries were built from
    echo prebuilt > "$BUILD/build_seconds.txt"
    say "llama.cpp prebuilt: $PREBUILT"
else
    [[ -f $SRC/CMakeLists.txt && -f $SRC/BRRR_SOURCE.txt ]] \
        || die "no llama.cpp tree at $SRC: run scripts/llamacpp_src.sh here and carry third_party/llama.cpp"
fi

# Python: gguf (for the writer) comes as a carried wheel where the image lacks it.
if ! python3 -c "import gguf" 2>/dev/null; then
    compgen -G ".whl/*.whl" > /dev/null || die "python3 has no gguf and no .whl/ wheels were carried"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    python3 -c "import gguf" 2>> "$LOG" || die "gguf does not import after installing .whl/"
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

# ---- b (background): the F16 files ----------------------------------------------------------------
write_f16() {
    local shape
    for shape in $SHAPES; do
        local target=$MODELS/$shape.F16.gguf
        [[ -f $target ]] && continue
        # the 8B F16 is deleted once quantized; its quantized files stand for it
        local made=1 type
        for type in $TYPES; do [[ -f $MODELS/$shape.$type.gguf ]] || made=0; done
        (( made )) && continue
        local t0=$(date +%s)
        python3 -c "
import sys, pathlib
from llama_brrr.bench.llamacpp import peer_config, write_random_gguf
write_random_gguf(pathlib.Path(sys.argv[2]), peer_config(sys.argv[1]), seed=0)
" "$shape" "$target.partial" || { rm -f "$target.partial"; echo "writing $target failed"; return 1; }
        mv "$target.partial" "$target"
        echo "wrote $target ($(stat -c %s "$target") bytes) in $(( $(date +%s) - t0 ))s"
    done
}
write_f16 > "$LOGS/write.log" 2>&1 &
WRITER=$!

# ---- a: build ---------------------------------------------------------------------------------------
commit=$(sed -n 's/^llama.cpp commit: \([0-9a-f]\{7\}\).*/\1/p' "$SRC/BRRR_SOURCE.txt")
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF
    -DLLAMA_BUILD_COMMIT="$commit" -DLLAMA_BUILD_NUMBER=0 -DGIT_EXE="$SRC/brrr-git.sh"
    # The CPU backend for AVX2 machines, without AMX: built natively on a CPU with AMX tiles, its
    # quantized matmuls segfault at the first eval (seen here with GCC 12, as bench/llamacpp.py
    # notes for llama-cpp-python). With every layer on the GPU the CPU backend only looks up the
    # token embeddings.
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
if [[ $CUDA == 1 ]]; then
    command -v nvcc > /dev/null || die "no nvcc on PATH"
    cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    cmake_args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_CUDA_FA_ALL_QUANTS=OFF
                 -DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    # cuBLAS: the toolkit's own, else the pip wheel PyTorch runs on (nvidia/cu13 or nvidia/cublas)
    if ! compgen -G "$cuda_home/include/cublas_v2.h" > /dev/null \
        && ! compgen -G "$cuda_home/targets/*/include/cublas_v2.h" > /dev/null; then
        cublas=${CUBLAS_DIR:-$(python3 -c "
import pathlib, sys
for base in sys.path:
    for sub in ('nvidia/cu13', 'nvidia/cublas'):
        if (pathlib.Path(base or '.') / sub / 'include/cublas_v2.h').is_file():
            print(pathlib.Path(base or '.').resolve() / sub); raise SystemExit
")}
        [[ -n $cublas && -f $cublas/include/cublas_v2.h ]] || die "no cuBLAS: neither $cuda_home nor a Python nvidia wheel has cublas_v2.h (set CUBLAS_DIR)"
        lib=$(ls "$cublas"/lib/libcublas.so* | head -1)
        liblt=$(ls "$cublas"/lib/libcublasLt.so* | head -1)
        cmake_args+=(-DCUDA_cublas_LIBRARY="$lib" -DCUDA_cublasLt_LIBRARY="$liblt"
                     -DCMAKE_CUDA_FLAGS="-I$cublas/include")
        export LD_LIBRARY_PATH=$cublas/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        # for a llama-bench run outside this script (llama_brrr compare) where the binary's own
        # search path does not lead there (a prebuilt one)
        mkdir -p "$BUILD" && echo "$cublas/lib" > "$BUILD/ld_library_path.txt"
        say "cuBLAS from $cublas"
    fi
    # the driver library, for ggml's virtual-memory pool: the toolkit's stub, else the driver's own
    if ! compgen -G "$cuda_home/lib64/stubs/libcuda.so" > /dev/null \
        && ! compgen -G "$cuda_home/targets/*/lib/stubs/libcuda.so" > /dev/null; then
        libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF; exit}')
        [[ -n $libcuda ]] || libcuda=$(ls /usr/local/nvidia/lib64/libcuda.so* \
            /usr/lib/x86_64-linux-gnu/libcuda.so* /usr/lib64/libcuda.so* 2>/dev/null | head -1)
        if [[ -z $libcuda ]]; then
            # No driver here (a build off the GPU machine): link against a stub of every CUresult
            # function cuda.h declares, named libcuda.so.1 as the driver's, which the loader then
            # finds on the GPU machine; ggml keeps its virtual-memory pool as in a build there.
            libcuda=$PEER/cuda-stub/libcuda.so
            mkdir -p "$PEER/cuda-stub"
            cuda_h=$(ls "$cuda_home"/include/cuda.h "$cuda_home"/targets/*/include/cuda.h \
                /usr/local/cuda/include/cuda.h 2>/dev/null | head -1)
            [[ -n $cuda_h ]] || die "no libcuda.so to link and no cuda.h to make a stub from"
            echo '#include <cuda.h>' | gcc -E -x c -I"$(dirname "$cuda_h")" - \
                | grep -oE 'CUresult[[:space:]]+(__attribute__\(\(visibility\("default"\)\)\)[[:space:]]+)?cu[A-Za-z0-9_]+[[:space:]]*\(' \
                | grep -oE 'cu[A-Za-z0-9_]+[[:space:]]*\($' | tr -d '( ' | sort -u \
                | sed 's/.*/int &(void) { return 0; }/' > "$PEER/cuda-stub/stub.c"
            [[ -s $PEER/cuda-stub/stub.c ]] || die "no CUresult functions found in $cuda_h for the libcuda stub"
            gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$libcuda" "$PEER/cuda-stub/stub.c" \
                || die "no libcuda.so to link, and the stub did not build"
            say "no libcuda.so here: linking a stub ($(wc -l < "$PEER/cuda-stub/stub.c") functions)"
        fi
        cmake_args+=(-DCUDA_cuda_driver_LIBRARY="$libcuda")
    fi
else
    cmake_args+=(-DGGML_CUDA=OFF)
fi
if [[ -z $PREBUILT && ! -f $BUILD/build.ninja ]]; then
    say "configure: cmake ${cmake_args[*]}"
    limited 120 cmake -S "$SRC" -B "$BUILD" "${cmake_args[@]}" >> "$LOG" 2>&1 || die "cmake configure (see peer.log)"
    echo "${cmake_args[*]}" > "$BUILD/cmake_args.txt"
    [[ $CUDA == 1 ]] && nvcc --version | tail -2 > "$BUILD/nvcc_version.txt"
fi
if [[ ${PEER_CONFIGURE_ONLY:-0} == 1 ]]; then
    stop_writer
    say "configured $BUILD (PEER_CONFIGURE_ONLY=1: no build)"
    exit 0
fi
if [[ -f $BUILD/build_seconds.txt ]]; then
    say "build: done before ($(cat "$BUILD/build_seconds.txt") s)"
else
    t0=$(date +%s)
    say "build: ninja -j$JOBS llama-bench llama-quantize"
    limited "${PEER_BUILD_S:-480}" ninja -C "$BUILD" -j"$JOBS" llama-bench llama-quantize >> "$LOGS/build.log" 2>&1
    rc=$?
    # build time over every call that worked on it
    spent=$(( $(cat "$BUILD/build_seconds_so_far.txt" 2>/dev/null || echo 0) + $(date +%s) - t0 ))
    echo "$spent" > "$BUILD/build_seconds_so_far.txt"
    (( rc == 0 )) || die "build (rc $rc after ${spent}s in all; a second call resumes it; log tail in peer.log)"
    echo "$spent" > "$BUILD/build_seconds.txt"
    say "build: ${spent}s"
fi
if [[ ${PEER_BUILD_ONLY:-0} == 1 ]]; then
    stop_writer
    say "built $BUILD/bin (PEER_BUILD_ONLY=1)"
    exit 0
fi
BIN=$BUILD/bin

# ---- c, d: per shape, as soon as its F16 file is written: quantize, then bench ----------------------
have_f16() {  # waits for the writer to finish $1's F16 file; false when it ended without it
    while [[ ! -f $MODELS/$1.F16.gguf ]]; do
        kill -0 "$WRITER" 2>/dev/null || { [[ -f $MODELS/$1.F16.gguf ]]; return; }
        (( $(left) > 10 )) || return 1
        sleep 1
    done
}
for shape in $SHAPES; do
    for type in $TYPES; do
        target=$MODELS/$shape.$type.gguf
        [[ -f $target ]] && continue
        have_f16 "$shape" || die "no F16 file of $shape (writer log in peer.log)"
        t0=$(date +%s)
        limited 300 "$BIN/llama-quantize" "$MODELS/$shape.F16.gguf" "$target.partial" "$type" 16 \
            >> "$LOGS/quantize.log" 2>&1 || die "llama-quantize $shape $type"
        mv "$target.partial" "$target"
        say "quantized $shape $type: $(stat -c %s "$target") bytes in $(( $(date +%s) - t0 ))s"
    done
    # Only the first shape keeps its F16 file (the reference row); the 8B one is 16 GB of disk.
    [[ $shape != "${SHAPES%% *}" ]] && rm -f "$MODELS/$shape.F16.gguf"
    (( BENCH )) || continue
    for type in $TYPES F16; do
        model=$MODELS/$shape.$type.gguf
        json=$RESULTS/$shape.$type.json
        [[ -f $model && ! -f $json ]] || continue
        t0=$(date +%s)
        limited 240 "$BIN/llama-bench" -m "$model" -ngl 99 -fa 1 -p 128 -n 128 -pg 128,128 \
            -d 0,128 -r "$REPS" -o json > "$json.partial" 2>> "$LOGS/bench.log" \
            || { rm -f "$json.partial"; die "llama-bench $shape $type"; }
        mv "$json.partial" "$json"
        say "bench $shape $type: $(( $(date +%s) - t0 ))s"
    done
done
wait "$WRITER"
finish
say "done in $(( $(date +%s) - START ))s"
