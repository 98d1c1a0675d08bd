"""Fixtures of the framework models over ``RoutingClient``: a fleet of loopback
OpenAI-compatible servers, each with its own prefix cache (helpers in routed_fleet.py).
Also puts the checkout's integration packages on the path when they are not installed."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from routed_fleet import SERVER_NAMES, reply_of

from contextpilot_rag.testing import OpenAICompatibleServer

ROOT = Path(__file__).resolve().parents[2]
for package, portion in (
    ("langchain_contextpilot", "langchain"),
    ("llama_index.llms.contextpilot", "llama-index-llms"),
):
    try:  # installed by `make` (pip install -e integrations/...)
        importlib.import_module(package)
    except ModuleNotFoundError:  # the checkout: the package directory on sys.path is enough
        sys.path.insert(0, str(ROOT / "integrations" / portion))
        importlib.invalidate_caches()
    except ImportError:  # its framework is not installed: those tests skip themselves
        pass


@pytest.fixture
def fleet() -> Iterator[list[OpenAICompatibleServer]]:
    """Three servers, each answering :func:`reply_of` its name."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(OpenAICompatibleServer(reply=lambda _m, n=name: reply_of(n)))
            for name in SERVER_NAMES
        ]


@pytest.fixture
def fleet_urls(fleet: list[OpenAICompatibleServer]) -> list[str]:
    return [server.base_url for server in fleet]


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    """One server answering :func:`reply_of` ``"a"``."""
    with OpenAICompatibleServer(reply=lambda _m: reply_of("a")) as one:
        yield one


@pytest.fixture
def slow_server() -> Iterator[OpenAICompatibleServer]:
    """One server that waits 50 ms before each streamed word."""
    with OpenAICompatibleServer(reply=lambda _m: reply_of("slow"), token_delay_s=0.05) as server:
        yield server
