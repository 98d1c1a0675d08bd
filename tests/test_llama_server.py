"""RoutingClient against real llama-server replicas (skipped unless the engine is
built: ``benchmarks/engines/build_llama_server.sh``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.routing import Endpoint, RoutingClient
from contextpilot_rag.testing import LlamaEngine, LlamaServer, find_llama_server

ENGINE = find_llama_server(Path(__file__).resolve().parents[1])

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        ENGINE is None,
        reason="llama-server not built (run benchmarks/engines/build_llama_server.sh)",
    ),
]

BLOCKS = [
    ContextBlock(
        text=f"Report {i}: the harbour of town {i} handled {100 + i} ships in spring. " * 8,
        id=f"r{i}",
    )
    for i in range(4)
]


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[LlamaServer]]:
    assert ENGINE is not None
    engine: LlamaEngine = ENGINE
    with ExitStack() as stack:
        yield [
            stack.enter_context(LlamaServer(engine, slots=1, context_tokens=4096)) for _ in range(2)
        ]


def test_the_client_follows_the_engine_cache_and_reads_its_timings(
    replicas: list[LlamaServer],
) -> None:
    pilot = ContextPilot()
    urls = [s.base_url for s in replicas]
    with RoutingClient(urls, model=LlamaServer.model_name) as client:
        first = client.complete(pilot.optimize(BLOCKS, "Which town had most ships?"), max_tokens=4)
        second = client.complete(pilot.optimize(BLOCKS, "Which had fewest?"), max_tokens=4)
        pieces = list(
            client.stream(pilot.optimize(BLOCKS, "List them."), kind="completion", max_tokens=8)
        )
    assert first.endpoint in urls and (first.prompt_tokens or 0) > 300
    assert second.endpoint == first.endpoint  # the prefix is cached there
    # llama-server's timings.cache_n: most of the prompt came from the slot's cache
    assert (second.cached_tokens or 0) > 0.6 * (second.prompt_tokens or 1)
    assert second.ttft_s < first.ttft_s
    assert len(pieces) > 1  # streamed token by token


def test_round_robin_alternates_and_misses_the_cache(replicas: list[LlamaServer]) -> None:
    pilot = ContextPilot()
    urls = [s.base_url for s in replicas]
    with RoutingClient(urls, model=LlamaServer.model_name, policy="round-robin") as client:
        answers = [
            client.complete(pilot.optimize(list(reversed(BLOCKS)), f"Question {i}?"), max_tokens=2)
            for i in range(2)
        ]
    assert answers[0].endpoint != answers[1].endpoint
    assert all(a.cached_tokens is not None for a in answers)


def test_a_slot_endpoint_pins_requests_to_its_llama_server_slot() -> None:
    assert ENGINE is not None
    other = [
        ContextBlock(text=b.text.replace("harbour", "airport"), id=f"a{i}")
        for i, b in enumerate(BLOCKS)
    ]
    # no host-memory prompt cache: it would restore a prompt into any slot
    with LlamaServer(
        ENGINE, slots=2, context_tokens=4096, extra_args=("--cache-ram", "0")
    ) as server:
        slots = [Endpoint(server.base_url, slot=i, max_cached_prompts=1) for i in range(2)]
        with RoutingClient(slots, model=LlamaServer.model_name, policy="round-robin") as client:
            harbour = ContextPilot().optimize(BLOCKS, "Which town had most ships?")
            airport = ContextPilot().optimize(other, "Which town had most planes?")
            client.complete(harbour, max_tokens=2)  # slot 0
            client.complete(airport, max_tokens=2)  # slot 1
            again = client.complete(harbour, max_tokens=2)  # slot 0: its own prompt
            crossed = client.complete(harbour, max_tokens=2)  # slot 1: the airport prompt
    assert again.decision.replica_id.endswith("#slot0")
    assert (again.cached_tokens or 0) > 0.9 * (again.prompt_tokens or 1)
    assert crossed.decision.replica_id.endswith("#slot1")
    assert (crossed.cached_tokens or 0) < 0.5 * (crossed.prompt_tokens or 1)
