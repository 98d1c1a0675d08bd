# Two entry points on a fresh machine: `make demo` and `make test`. Each creates .venv if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROXY_VENV := .venv-litellm-proxy
PROXY_STAMP := $(PROXY_VENV)/.installed
WHEELS_VENV := .venv-wheels
NEWEST_VENV := .venv-newest
LOWEST_CORE_VENV := .venv-lowest-core
LOWEST_INTEGRATIONS_VENV := .venv-lowest-integrations
# the core's extras a user may install (CORE_EXTRAS; dev, test and integration-tests are
# ours); the integration tests' venv takes them but cloud, whose anthropic>=2 would lift
# the frameworks' own Anthropic packages above their lower bounds
EXTRAS_NO_CLOUD := hf,bench,bm25,faiss,metrics,kv-events,serve,redis,eval
# $(call find_python,3.X): a python3.X that runs, on PATH or pyenv's; empty if none
find_python = $(shell for p in python$(1) $$(pyenv root 2>/dev/null)/versions/$(1).*/bin/python$(1); \
	do "$$p" -c "" 2>/dev/null && { command -v "$$p"; break; }; done)
# the oldest Python our packages support (requires-python), for the lowest-bounds runs,
# and the newest released one, for test-newest; else $(PYTHON) (both say which they ran)
OLDEST_PYTHON := $(call find_python,3.10)
LOWEST_PYTHON := $(or $(OLDEST_PYTHON),$(PYTHON))
NEWEST_PYTHON := $(or $(call find_python,3.13),$(call find_python,3.12),$(PYTHON))
CORE_EXTRAS := $(EXTRAS_NO_CLOUD),cloud
INTEGRATIONS := -e integrations/langchain -e integrations/llama-index \
	-e integrations/llama-index-llms -e integrations/mem0
# what the examples import besides our wheels (their engines are loopback test servers)
EXAMPLE_DEPS := "langchain-openai>=1.0,<2" "llama-index-llms-openai-like>=0.8,<0.9"

.PHONY: demo test test-engine test-wheels test-newest test-lowest lint dist bench bench-families bench-sim bench-soak bench-engine bench-litellm-proxy bench-cloud clean

$(STAMP): pyproject.toml integrations/*/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps $(INTEGRATIONS)
# LiteLLM only through its plug-in's extra (its bounds: litellm-contextpilot's pyproject)
	$(BIN)/pip install --quiet -e "integrations/litellm[litellm]"
# a real redis-server for the Redis store tests (they skip, saying why, where apt cannot install it)
	command -v redis-server >/dev/null || (apt-get install -y -qq redis-server >/dev/null 2>&1 \
		|| sudo -n apt-get install -y -qq redis-server >/dev/null 2>&1) \
		|| echo "redis-server not installed: the Redis store tests will be skipped"
	touch $(STAMP)

# LiteLLM's proxy server (litellm-contextpilot's `proxy` extra) in an environment of its
# own: the extra resolves only to some LiteLLM releases, and the rest of the suite keeps
# the newest. A few minutes and most of a GiB, once; where it cannot be installed, the
# proxy tests skip, saying why (tests/integrations/test_litellm_proxy.py).
$(PROXY_STAMP): pyproject.toml integrations/litellm/pyproject.toml
	$(PYTHON) -m venv $(PROXY_VENV)
	($(PROXY_VENV)/bin/pip install --quiet --upgrade pip \
		&& $(PROXY_VENV)/bin/pip install --quiet -e . -e "integrations/litellm[proxy]" \
		&& touch $(PROXY_STAMP)) \
		|| echo "litellm[proxy] not installed: the LiteLLM proxy tests will be skipped"

demo: $(STAMP)
	$(BIN)/contextpilot-rag demo

lint: $(STAMP)
	$(BIN)/ruff check contextpilot_rag integrations tests examples benchmarks scripts
	$(BIN)/ruff format --check contextpilot_rag integrations tests examples benchmarks scripts
	$(BIN)/mypy

test: lint test-wheels test-lowest $(PROXY_STAMP)
	MEM0_TELEMETRY=False $(BIN)/pytest -q

# Every declared lower bound, tested: uv resolves each package's direct dependencies to
# the lowest versions their bounds allow that install together (--resolution
# lowest-direct; what they pull in resolves as usual) in a throwaway venv on the oldest
# Python we support, and that package's tests run there. The core with every user extra
# runs the suite but tests/integrations (the few tests of tests/ that drive a
# framework skip, saying so); the integration packages, with the frameworks their tests
# drive, run tests/integrations (LiteLLM's proxy has its own venv; tests of a framework
# feature newer than its lower bound skip there, saying so). A framework that resolves
# above an adapter's lower bound (lifted by another package's requirement) fails the run,
# unless LOWEST_KNOWN_LIFTS names it: then it is listed. A few minutes; part of
# `make test`, so CI checks the bounds on every change.
# Known lifts, untested bounds to settle: litellm to 1.84.0 (uv's lowest-direct
# resolution picks it; pinned, 1.83.7 resolves with the rest).
LOWEST_KNOWN_LIFTS := litellm
test-lowest: $(STAMP)
	rm -rf $(LOWEST_CORE_VENV) $(LOWEST_INTEGRATIONS_VENV)
	@echo "test-lowest: on $(LOWEST_PYTHON)$(if $(OLDEST_PYTHON),, (no Python 3.10 found))"
	$(BIN)/uv venv --quiet --no-python-downloads --python $(LOWEST_PYTHON) $(LOWEST_CORE_VENV)
	VIRTUAL_ENV=$(LOWEST_CORE_VENV) $(BIN)/uv pip install --quiet --resolution lowest-direct \
		-e ".[$(CORE_EXTRAS),test]"
	MEM0_TELEMETRY=False $(LOWEST_CORE_VENV)/bin/pytest -q -p no:cacheprovider \
		--ignore=tests/integrations
	$(BIN)/uv venv --quiet --no-python-downloads --python $(LOWEST_PYTHON) \
		$(LOWEST_INTEGRATIONS_VENV)
	VIRTUAL_ENV=$(LOWEST_INTEGRATIONS_VENV) $(BIN)/uv pip install --quiet \
		--resolution lowest-direct -e ".[$(EXTRAS_NO_CLOUD),integration-tests,test]" $(INTEGRATIONS) \
		-e "integrations/litellm[litellm]"
	VIRTUAL_ENV=$(LOWEST_INTEGRATIONS_VENV) $(BIN)/uv pip freeze --quiet | $(BIN)/python \
		scripts/check_lowest_bounds.py $(addprefix --lifted ,$(LOWEST_KNOWN_LIFTS)) \
		integrations/*/pyproject.toml
	MEM0_TELEMETRY=False $(LOWEST_INTEGRATIONS_VENV)/bin/pytest -q -p no:cacheprovider \
		tests/integrations --ignore=tests/integrations/test_litellm_proxy.py

# Wheels and sdists of the core and of every integration, in dist/ (see README: install).
dist: $(STAMP)
	$(BIN)/pip install --quiet "build>=1.2,<2"
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	for package in integrations/*/; do $(BIN)/python -m build --outdir dist $$package || exit 1; done

# What a user of the wheels gets: `make dist`, then a fresh venv with only the wheels of
# dist/ (dependencies from the registry) runs every example offline. A few minutes, most
# of them pip's; part of `make test`, so CI checks it on every change.
test-wheels: dist
	rm -rf $(WHEELS_VENV)
	$(PYTHON) -m venv $(WHEELS_VENV)
	$(WHEELS_VENV)/bin/pip install --quiet --upgrade pip
	$(WHEELS_VENV)/bin/pip install --quiet --no-compile "$$(ls dist/contextpilot_rag-*.whl)[faiss,serve]" \
		$$(ls dist/*.whl | grep -v '/contextpilot_rag-') $(EXAMPLE_DEPS)
	$(WHEELS_VENV)/bin/python scripts/run_examples.py

# The weekly newest-versions check (docs/integrations/README.md), not part of `make test`:
# a throwaway venv on the newest Python found with the newest releases the upper bounds
# allow, then the whole suite.
test-newest:
	rm -rf $(NEWEST_VENV)
	@echo "test-newest: on $(NEWEST_PYTHON)"
	$(NEWEST_PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install --quiet --upgrade pip
	$(NEWEST_VENV)/bin/pip install --quiet --upgrade --upgrade-strategy eager -e ".[dev]" \
		$(INTEGRATIONS) -e "integrations/litellm[litellm]"
	$(NEWEST_VENV)/bin/pip list --format=freeze | grep -i -E '^(langchain|llama-index|mem0ai|litellm)'
	MEM0_TELEMETRY=False $(NEWEST_VENV)/bin/pytest -q

# Benchmarks are scripts of this checkout (benchmarks/), each writing its own generated
# section of docs/benchmarks.md. The reference implementation (contextpilot 0.5.0) is
# installed without its serving dependencies: the benchmark uses only its index.
bench: $(STAMP)
	$(BIN)/pip install --quiet scipy numpy
	$(BIN)/pip install --quiet --no-deps contextpilot==0.5.0
	$(BIN)/python benchmarks/bench.py --write docs/benchmarks.md --plot docs/img/hit_ratio.png

# Workload families (issue 22): many drawn workloads per mode, the held-out worst case,
# bounds and small-instance optima; about ten minutes on two cores.
bench-families: $(STAMP)
	$(BIN)/pip install --quiet scipy numpy
	$(BIN)/pip install --quiet --no-deps contextpilot==0.5.0
	$(BIN)/python benchmarks/families.py --write docs/benchmarks.md --plot docs/img/families.png
	$(BIN)/python benchmarks/batch_headroom.py --write docs/benchmarks.md --plot docs/img/batch_headroom.png --jobs 2

# The simulated routing benchmarks and the client overhead: no engine, a few minutes.
bench-sim: $(STAMP)
	$(BIN)/python benchmarks/routing.py --write docs/benchmarks.md --plot docs/img/route_sim.png
	$(BIN)/python benchmarks/conversation_routing.py --write docs/benchmarks.md --plot docs/img/conversation_routing.png
	$(BIN)/python benchmarks/conversation_knobs.py --write docs/benchmarks.md --plot docs/img/conversation_knobs.png --random 40 --also-trace ../shared/data/mooncake/synthetic_trace.jsonl
	$(BIN)/python benchmarks/conversation_tails.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/routing_tails.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/ttca_warmup.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/slot_reuse.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/client_overhead.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/annotation_overhead.py --write docs/benchmarks.md

# The soak: a million optimize calls per store (memory, then a redis-server the script
# starts on loopback), latency and memory over time. Long: run it on a quiet machine.
bench-soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --write docs/benchmarks.md --plot docs/img/soak.png

# The real LiteLLM proxy with our strategy vs its simple-shuffle and least-busy on loopback
# engines (docs/benchmarks.md, litellm-proxy): a proxy started per arm and run, minutes.
bench-litellm-proxy: $(STAMP) $(PROXY_STAMP)
	$(BIN)/python benchmarks/litellm_routing.py --proxy --write docs/benchmarks.md

# The real-engine suite: installs vLLM's CPU build + SmolLM2 on first use (minutes), then
# online, batch, multi-turn and the LangChain path on it (docs/benchmarks.md, engine-suite).
bench-engine: $(STAMP)
	$(BIN)/python benchmarks/engine.py --write docs/benchmarks.md --plot docs/img/engine_suite.png

# Hosted prompt caches (issue 25): input-token cost on the emulated Anthropic and OpenAI
# caches, unmodified vs contextpilot_rag (docs/benchmarks.md, cloud); no API key, minutes.
bench-cloud: $(STAMP)
	$(BIN)/python benchmarks/cloud.py --write docs/benchmarks.md --plot docs/img/cloud.png
	$(BIN)/python benchmarks/cloud_variants.py --write docs/benchmarks.md --plot docs/img/cloud_variants.png
	$(BIN)/python benchmarks/cloud_overhead.py --write docs/benchmarks.md

# Tests against real engines (deselected by `make test`; each skips when its engine is absent).
test-engine: $(STAMP)
	MEM0_TELEMETRY=False $(BIN)/pytest -q -m engine

clean:
	rm -rf $(VENV) $(PROXY_VENV) $(WHEELS_VENV) $(NEWEST_VENV) $(LOWEST_CORE_VENV) \
		$(LOWEST_INTEGRATIONS_VENV) dist .pytest_cache .mypy_cache .ruff_cache
