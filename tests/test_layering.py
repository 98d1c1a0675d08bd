"""Layers import downward only (STYLE.md, practice 16).

Each pure layer module is imported in a fresh interpreter in which the frameworks,
httpx and rich cannot be imported, and must import without them and without loading a
layer above it (the client, the pilot facade, benchmarks, retrievers, the proxy).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BLOCKED = ("httpx", "rich", "langchain_core", "langchain", "llama_index", "mem0", "litellm")

ABOVE = (
    "contextpilot_rag.routing.client",
    "contextpilot_rag.pilot",
    "contextpilot_rag.bench",
    "contextpilot_rag.retrievers",
    "contextpilot_rag.serve",
    "contextpilot_rag.cli",
    "contextpilot_rag.engines",
)

PURE_MODULES = (
    "contextpilot_rag.errors",
    "contextpilot_rag.blocks",
    "contextpilot_rag.escaping",
    "contextpilot_rag.tokenizers",
    "contextpilot_rag.index",
    "contextpilot_rag.ordering",
    "contextpilot_rag.conversations",
    "contextpilot_rag.annotations",
    "contextpilot_rag.prompt",
    "contextpilot_rag.request_field",
    "contextpilot_rag.usage",
    "contextpilot_rag.cloud",
    "contextpilot_rag.batch",
    "contextpilot_rag.batch.progress",
    "contextpilot_rag.routing.types",
    "contextpilot_rag.routing.common",
    "contextpilot_rag.routing.baselines",
    "contextpilot_rag.routing.ranvier",
    "contextpilot_rag.routing.gorgo",
    "contextpilot_rag.routing.tuner",
    "contextpilot_rag.routing.laar",
    "contextpilot_rag.routing.combined",
    "contextpilot_rag.routing.external",
    "contextpilot_rag.routing.registry",
    "contextpilot_rag.routing.measure",
    "contextpilot_rag.routing.metrics",
    "contextpilot_rag.routing",
    "contextpilot_rag.sim.prefix_cache",
    "contextpilot_rag.sim.provider_cache",
    "contextpilot_rag.sim.fleet",
    "contextpilot_rag.sim.traces",
    "contextpilot_rag.sim.accuracy",
    "contextpilot_rag.sim.ttca",
    "contextpilot_rag.sim",
    "contextpilot_rag.kv_events.events",
    "contextpilot_rag.kv_events.mirror",
    "contextpilot_rag.kv_events.tracker",
    "contextpilot_rag.kv_events",
)

_BLOCKING_IMPORT = """
import importlib
import sys
from importlib.abc import MetaPathFinder

BLOCKED = set({blocked!r})


class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: a pure layer must not import it")
        return None


sys.meta_path.insert(0, Blocker())
importlib.import_module({module!r})
above = sorted(m for m in sys.modules if m.startswith({above!r}))
if above:
    sys.exit(f"{module} imported layers above it: {{above}}")
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def _import_blocked(module: str) -> subprocess.CompletedProcess[str]:
    return _run(_BLOCKING_IMPORT.format(blocked=BLOCKED, module=module, above=ABOVE))


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_layer_imports_without_frameworks_or_upper_layers(module: str) -> None:
    result = _import_blocked(module)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_blocker_blocks() -> None:
    result = _import_blocked("httpx")
    assert result.returncode != 0 and "httpx is blocked" in result.stderr


def test_importing_the_package_leaves_rich_and_httpx_out() -> None:
    code = textwrap.dedent(
        """
        import sys
        import contextpilot_rag
        import contextpilot_rag.routing
        upper = ("rich", "httpx", "contextpilot_rag.pilot", "contextpilot_rag.routing.client")
        print(",".join(m for m in upper if m in sys.modules))
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ""


def test_importing_the_package_loads_no_framework_or_model_library() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import contextpilot_rag
        heavy = {(*BLOCKED[2:], "torch", "transformers", "tokenizers")!r}
        print(",".join(sorted({{m for m in sys.modules if m.partition(".")[0] in heavy}})))
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ""


def test_the_facade_and_the_client_still_import_on_first_use() -> None:
    code = textwrap.dedent(
        """
        import contextpilot_rag, contextpilot_rag.routing as routing
        assert contextpilot_rag.ContextPilot.__module__ == "contextpilot_rag.pilot"
        assert routing.RoutingClient.__name__ == "RoutingClient"
        assert "RoutingClient" in dir(routing) and "ContextPilot" in dir(contextpilot_rag)
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-2000:]
