"""The routing client's parts without a network: the attempt loop is sans I/O, so a test
plays the driver and scripts what the engine answers; the client's configuration; the
order held requests are released in."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpilot_rag.errors import ConfigError, InvalidDecisionError
from contextpilot_rag.routing import RoundRobinPolicy, RoutingClient
from contextpilot_rag.routing.client import ClientConfig
from contextpilot_rag.routing.client.attempts import (
    READ_BODY,
    READ_TEXT,
    CallSpec,
    Head,
    Open,
    Raised,
    Steps,
    attempt_loop,
)
from contextpilot_rag.routing.client.config import ClientOptions
from contextpilot_rag.routing.client.dispatch import Dispatcher
from contextpilot_rag.routing.client.endpoints import Endpoint, Replica
from contextpilot_rag.routing.client.holding import Waiter
from contextpilot_rag.routing.client.sse import Lines
from contextpilot_rag.routing.holding import release_order
from contextpilot_rag.routing.types import Decision, FleetView, Outcome, RouteRequest

SSE = {"content-type": "text/event-stream"}
HELLO = 'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}'


def dispatcher(*urls: str) -> Dispatcher:
    replicas = [Replica(Endpoint(url), "m") for url in urls]
    return Dispatcher(replicas, RoundRobinPolicy(), ClientConfig(model="m"), metrics=None)


def play(steps: Steps, script: Sequence[object]) -> tuple[list[object], list[str]]:
    """Be the driver: answer each command with the next scripted event; the commands
    seen and the text delivered."""
    commands: list[object] = []
    delivered: list[str] = []
    events, event = iter(script), None
    while (command := steps.send(event)) is not None:
        if isinstance(command, str):
            delivered.append(command)
            event = None
        else:
            commands.append(command)
            event = next(events)
    return commands, delivered


def test_the_attempt_loop_fails_over_with_no_io_at_all() -> None:
    fleet = dispatcher("http://a/v1", "http://b/v1")
    spec = CallSpec("chat", "Q?", {})
    stream = [HELLO + "\n", "\ndata: [DO", "NE]\r", "\n"]  # lines cut anywhere
    script = [Head(503, {"retry-after": "7"}), b"busy", Head(200, SSE), *stream]
    commands, delivered = play(Steps(attempt_loop(fleet, spec, Waiter)), [*script, None])
    opened = [c.url for c in commands if isinstance(c, Open)]
    assert opened == ["http://a/v1/chat/completions", "http://b/v1/chat/completions"]
    assert commands[1] is READ_BODY and commands[-1] is READ_TEXT
    assert delivered == ["hello"]
    answer = spec.holder[0]
    assert (answer.text, answer.endpoint, answer.attempts) == ("hello", "http://b/v1", 2)
    busy = fleet.replicas["http://a/v1"]
    assert busy.open_until - time.monotonic() > 6  # its Retry-After
    assert all(r.in_flight == 0 and r.queued_tokens == 0 for r in fleet.replicas.values())


class _Cancelled(BaseException):
    """Stands for the caller giving up (a closed stream, a cancelled task)."""


def test_a_cancelled_call_releases_its_counters_and_leaves_the_breaker_alone() -> None:
    fleet = dispatcher("http://a/v1")
    steps = Steps(attempt_loop(fleet, CallSpec("chat", "Q?", {}, streaming=True), Waiter))
    assert isinstance(steps.send(None), Open)
    assert steps.send(Head(200, SSE)) is READ_TEXT
    assert steps.send(HELLO + "\n\n") == "hello"
    assert fleet.states()[0].in_flight == 1
    with pytest.raises(_Cancelled):
        steps.send(Raised(_Cancelled()))
    state = fleet.states()[0]
    assert state.in_flight == 0 and state.queued_tokens == 0 and state.healthy


@given(st.text(alphabet="ab \r\n\x85:"), st.lists(st.integers(0, 40)))
def test_lines_split_text_in_pieces_as_splitlines_splits_the_whole(
    text: str, cuts: list[int]
) -> None:
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    lines = Lines()
    seen = [line for a, b in itertools.pairwise(bounds) for line in lines.feed(text[a:b])]
    assert seen + lines.flush() == text.splitlines()


def test_held_requests_without_a_prediction_are_released_first_then_smallest_ttft() -> None:
    held = {"late": (0.5, 3), "unknown": (None, 2), "early": (0.5, 1), "fast": (0.1, 4)}
    order = sorted(held, key=lambda name: release_order(*held[name]))
    assert order == ["unknown", "fast", "early", "late"]


def test_client_config_is_validated_and_the_keywords_map_onto_it() -> None:
    assert set(ClientOptions.__annotations__) == {f.name for f in fields(ClientConfig)}
    for bad in ({"timeout_s": 0}, {"max_attempts": 0}, {"backoff_s": 5, "max_backoff_s": 1}):
        with pytest.raises(ConfigError):
            ClientConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown chat template"):
        ClientConfig(chat_template="vicuna")
    base = ClientConfig(model="m", max_attempts=2)
    client = RoutingClient(["http://127.0.0.1:1/v1"], config=base, max_attempts=5)
    assert client.config == ClientConfig(model="m", max_attempts=5)
    assert RoutingClient(["http://127.0.0.1:1/v1"], config=base).config is base


def test_the_client_imports_no_pilot() -> None:
    loaded = "print('contextpilot_rag.pilot' in sys.modules)"
    code = f"import sys, contextpilot_rag.routing.client; {loaded}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


class StrayPolicy:
    """Chooses a replica the fleet does not have."""

    name = "stray"
    route_memory = None

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        return Decision("http://127.0.0.1:9/v1", "m", "stray")

    def observe(self, outcome: Outcome) -> None:
        pass


def test_a_decision_for_an_unknown_replica_is_the_simulators_error_and_books_nothing() -> None:
    client = RoutingClient(["http://127.0.0.1:1/v1"], model="m", policy=StrayPolicy())
    with pytest.raises(InvalidDecisionError, match="stray"):
        client.chat("hello")
    assert all(state.in_flight == 0 and state.queued_tokens == 0 for state in client.replicas)
