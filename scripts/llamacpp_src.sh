#!/usr/bin/env bash
# llamacpp_src.sh — the llama.cpp source vendored in the llama-cpp-python sdist, trimmed to what a
# CUDA (or CPU) build of llama-bench and llama-quantize needs, into third_party/llama.cpp/
# (git-ignored: no llama.cpp code is committed; this script is how the tree is made again).
#
#   bash scripts/llamacpp_src.sh [SDIST.tar.gz]
#
# Without an argument the sdist is fetched with pip (network) into a temporary folder. Kept: the
# cmake files, include/, src/, common/, vendor/ (what common links), ggml's core with its CPU and
# CUDA backends, tools/llama-bench and tools/quantize, and a tools/CMakeLists.txt written here that
# adds only those two. Dropped: the other ggml backends, models, docs, tests, examples, the web UI,
# conversion scripts, gguf-py. third_party/llama.cpp/BRRR_SOURCE.txt records the sdist, its sha256,
# the llama.cpp commit the sdist pins (its submodule HEAD) and ggml's version; brrr-git.sh stands
# in for git when ggml's cmake asks for its commit (the tree sits inside this project's checkout,
# where git would answer with our commit); gpu_llamacpp_peer.sh passes both to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VERSION=0.3.36
DEST=$ROOT/third_party/llama.cpp
SDIST=${1:-}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z "$SDIST" ]]; then
    python3 -m pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$work/dl" -q
    SDIST=$(ls "$work"/dl/llama_cpp_python-"$VERSION".tar.gz)
fi
[[ -f "$SDIST" ]] || { echo "no sdist at $SDIST" >&2; exit 1; }
tar -xzf "$SDIST" -C "$work"
top=$work/llama_cpp_python-$VERSION
src=$top/vendor/llama.cpp
[[ -f $src/CMakeLists.txt && -d $src/ggml/src/ggml-cuda ]] || {
    echo "$SDIST does not hold vendor/llama.cpp with ggml-cuda" >&2; exit 1; }

# The submodule's HEAD, as the sdist's .git/modules records it.
commit=$(cat "$top/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || true)
[[ $commit =~ ^[0-9a-f]{40}$ ]] || { echo "no llama.cpp commit found in $SDIST" >&2; exit 1; }
ggml_version=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$src/ggml/CMakeLists.txt" | paste -sd.)

rm -rf "$DEST"
mkdir -p "$DEST/ggml/src" "$DEST/tools"
copy() { for p in "$@"; do cp -a "$src/$p" "$DEST/$p"; done; }
copy CMakeLists.txt LICENSE licenses cmake include src common vendor
copy ggml/CMakeLists.txt ggml/cmake ggml/include
# ggml's core: the loose files of ggml/src (sources, headers, its CMakeLists), then two backends.
find "$src/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$DEST/ggml/src/" \;
copy ggml/src/ggml-cpu ggml/src/ggml-cuda tools/llama-bench tools/quantize
# Headers only mtmd and the server include (audio decoding, image loading): not built here.
rm -f "$DEST/vendor/miniaudio/miniaudio.h" "$DEST/vendor/stb/stb_image.h"

cat > "$DEST/tools/CMakeLists.txt" <<'EOF'
# Written by llama_brrr's scripts/llamacpp_src.sh: only the two tools this trimmed tree keeps.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
EOF

# ggml's cmake asks git for its commit; inside this checkout git would answer with ours.
cat > "$DEST/brrr-git.sh" <<EOF
#!/bin/sh
# Stands in for git at configure time: answers ggml's two questions for the pinned commit.
case "\$1" in
    rev-parse) echo ${commit:0:7} ;;
    *) exit 0 ;;
esac
EOF
chmod +x "$DEST/brrr-git.sh"

cat > "$DEST/BRRR_SOURCE.txt" <<EOF
source: llama-cpp-python $VERSION sdist ($(basename "$SDIST"), sha256 $(sha256sum "$SDIST" | cut -d' ' -f1))
llama.cpp commit: $commit (the sdist's vendor/llama.cpp submodule HEAD)
ggml version: $ggml_version
trimmed by: scripts/llamacpp_src.sh (ggml core + CPU + CUDA backends, src, include, common, vendor, tools/llama-bench, tools/quantize)
EOF
find "$DEST" -type f | wc -l | xargs echo "files:"
du -sh "$DEST"
cat "$DEST/BRRR_SOURCE.txt"
