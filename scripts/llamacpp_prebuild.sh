#!/usr/bin/env bash
# llamacpp_prebuild.sh — the llama.cpp CUDA peer's binaries built here, off the GPU machine, so that
# a device call spends no minutes on the build: llama-bench with CUDA and llama-quantize for the CPU
# (quantizing runs on the CPU in either build), both from third_party/llama.cpp with
# gpu_llamacpp_peer.sh's cmake arguments, packed into third_party/llamacpp_bin.tar.xz (git-ignored;
# carry it and pass PEER_PREBUILT=third_party/llamacpp_bin.tar.xz to gpu_llamacpp_peer.sh there).
#
#   bash scripts/llamacpp_src.sh        # once: the source tree
#   bash scripts/llamacpp_prebuild.sh   # some 20 minutes on 2 cores
#
# Needs nvcc (the GPU machine's version: the tarball records it) and network for pip's cuBLAS
# (nvidia-cublas 13) when the toolkit has none; with no driver here the build links a stub
# libcuda.so.1 (gpu_llamacpp_peer.sh makes it) and the GPU machine's driver is loaded at run time.
# Environment: PREBUILD_DIR (/tmp/peer-prebuild: the build folders), PEER_JOBS (nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${PREBUILD_DIR:-/tmp/peer-prebuild}
OUT_FILE=$ROOT/third_party/llamacpp_bin.tar.xz
[[ -f third_party/llama.cpp/BRRR_SOURCE.txt ]] || { echo "no third_party/llama.cpp: run scripts/llamacpp_src.sh first" >&2; exit 1; }
mkdir -p "$WORK"

cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
# (the toolkit's cuBLAS where gpu_llamacpp_peer.sh looks for it first)
if [[ -z ${CUBLAS_DIR:-} ]] && ! compgen -G "$cuda_home/include/cublas_v2.h" > /dev/null \
    && ! compgen -G "$cuda_home/targets/*/include/cublas_v2.h" > /dev/null; then
    python3 -m pip install -q --target "$WORK/pip" "nvidia-cublas>=13,<14"
    export CUBLAS_DIR=$WORK/pip/nvidia/cu13
fi

build() {  # cuda(0/1)
    PEER_DIR=$WORK PEER_CUDA=$1 PEER_SHAPES=" " PEER_BUILD_ONLY=1 TOTAL_S=7200 PEER_BUILD_S=7000 \
        OUT=$WORK/out bash scripts/gpu_llamacpp_peer.sh
}
build 1
build 0

pack=$WORK/pack
rm -rf "$pack" && mkdir -p "$pack/bin"
strip -o "$pack/bin/llama-bench" "$WORK/build-cuda/bin/llama-bench"
strip -o "$pack/bin/llama-quantize" "$WORK/build-cpu/bin/llama-quantize"
cp third_party/llama.cpp/BRRR_SOURCE.txt "$WORK/build-cuda/nvcc_version.txt" "$pack/"
{
    echo "llama-bench (CUDA): $(cat "$WORK/build-cuda/cmake_args.txt")"
    echo "llama-quantize (CPU): $(cat "$WORK/build-cpu/cmake_args.txt")"
    echo "built off the GPU machine by scripts/llamacpp_prebuild.sh on $(date -u +%F)"
} > "$pack/cmake_args.txt"
tar -cf - -C "$pack" . | xz -T0 -6 > "$OUT_FILE"
echo "wrote $OUT_FILE ($(stat -c %s "$OUT_FILE") bytes)"
