"""The routing client's parts without a network: the attempt loop is sans I/O, so a test
plays the driver and scripts what the engine answers; the client's configuration; the
order held requests are released in."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpilot_rag.errors import ConfigError, InvalidDecisionError, RoutingError
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
    Wait,
    attempt_loop,
)
from contextpilot_rag.routing.client.config import ClientOptions
from contextpilot_rag.routing.client.dispatch import Dispatcher
from contextpilot_rag.routing.client.endpoints import Endpoint, Replica
from contextpilot_rag.routing.client.holding import Waiter
from contextpilot_rag.routing.client.sse import Lines
from contextpilot_rag.routing.holding import release_order
from contextpilot_rag.routing.metrics import RoutingMetrics
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


class HoldWhileBusy:
    """Sends to ``a`` while it is healthy and idle, holds a request while it is busy,
    and goes to ``b`` once ``a`` is down; records what it saw of ``a`` each time."""

    name = "hold-while-busy"
    route_memory = None

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, int]] = []

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        a = next(state for state in fleet.replicas if state.replica_id == "http://a/v1")
        self.seen.append((request.request_id, a.healthy, a.in_flight))
        if a.healthy and a.in_flight == 0:
            return Decision("http://a/v1", "m", "idle")
        if a.healthy and request.may_hold:
            return Decision("http://a/v1", "m", "wait", hold_s=5.0, predicted_ttft_s=0.1)
        return Decision("http://b/v1", "m", "a is down")

    def observe(self, outcome: Outcome) -> None:
        pass


class Nudged(Waiter):
    """A waiter a test reads instead of sleeping on."""

    def wake(self) -> None:
        pass


def test_a_held_request_is_offered_again_only_once_a_failed_attempt_is_booked() -> None:
    """The attempt on ``a`` fails before its first token: the held request must see
    ``a`` as the failure left it (breaker open, nothing in flight), not idle and
    healthy with the failed attempt still counted."""
    policy = HoldWhileBusy()
    replicas = [Replica(Endpoint(url), "m") for url in ("http://a/v1", "http://b/v1")]
    fleet = Dispatcher(replicas, policy, ClientConfig(model="m"), metrics=None)
    first = Steps(attempt_loop(fleet, CallSpec("chat", "Q1?", {}), Nudged))
    assert first.send(None).url == "http://a/v1/chat/completions"  # type: ignore[union-attr]
    second = Steps(attempt_loop(fleet, CallSpec("chat", "Q2?", {}), Nudged))
    wait = second.send(None)
    assert isinstance(wait, Wait)
    assert first.send(Head(503, {})) is READ_BODY
    retry = first.send(b"overloaded")  # the failure is booked, then the first call retries
    assert isinstance(retry, Open) and retry.url == "http://b/v1/chat/completions"
    held_id = policy.seen[1][0]
    offers = [(healthy, in_flight) for rid, healthy, in_flight in policy.seen if rid == held_id]
    assert offers[0] == (True, 1)  # held while the first attempt ran
    assert offers[1] == (False, 0)  # offered again with the failure booked
    ready = wait.waiter.ready
    assert ready is not None and ready[0].replica_id == "http://b/v1"


def test_closing_wakes_a_held_request_which_then_fails_booking_nothing() -> None:
    replicas = [Replica(Endpoint(url), "m") for url in ("http://a/v1", "http://b/v1")]
    fleet = Dispatcher(replicas, HoldWhileBusy(), ClientConfig(model="m"), metrics=None)
    first = Steps(attempt_loop(fleet, CallSpec("chat", "Q1?", {}), Nudged))
    assert isinstance(first.send(None), Open)
    second = Steps(attempt_loop(fleet, CallSpec("chat", "Q2?", {}), Nudged))
    assert isinstance(second.send(None), Wait)
    fleet.close()
    with pytest.raises(RoutingError, match="closed"):
        second.send(None)  # woken: offered again, refused
    assert not fleet.held
    states = {state.replica_id: state.in_flight for state in fleet.states()}
    assert states == {"http://a/v1": 1, "http://b/v1": 0}  # only the first's attempt


def test_a_closed_client_refuses_every_call_with_a_routing_error() -> None:
    client = RoutingClient(["http://127.0.0.1:1/v1"], model="m")
    client.close()
    for call in (lambda: client.chat("hello"), client.probe, lambda: list(client.stream("hi"))):
        with pytest.raises(RoutingError, match="closed"):
            call()

    async def after_close() -> None:
        with pytest.raises(RoutingError, match="closed"):
            await client.achat("hello")

    asyncio.run(after_close())


def test_after_aclose_a_synchronous_call_is_a_routing_error() -> None:
    client = RoutingClient(["http://127.0.0.1:1/v1"], model="m")
    asyncio.run(client.aclose())  # the loop's connections, and the synchronous ones
    with pytest.raises(RoutingError, match="closed"):
        client.chat("hello")


def test_metrics_bound_to_another_client_are_refused_before_the_store_opens(
    tmp_path: Path,
) -> None:
    metrics = RoutingMetrics()
    RoutingClient(["http://127.0.0.1:1/v1"], model="m", metrics=metrics).close()
    store = tmp_path / "routes.db"
    with pytest.raises(ConfigError, match="already bound"):
        RoutingClient(
            ["http://127.0.0.1:1/v1"], model="m", metrics=metrics, store=f"sqlite:///{store}"
        )
    assert not store.exists()


def test_an_open_command_never_shows_its_headers() -> None:
    command = Open("http://a/v1/chat/completions", {}, {"Authorization": "Bearer sk-1"}, 1.0)
    assert "sk-1" not in repr(command)


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
