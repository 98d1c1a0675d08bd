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
from contextpilot_rag.routing import CombinedPolicy, RoundRobinPolicy, RoutingClient
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


def _slot_dispatcher(policy: object) -> Dispatcher:
    """Two llama-server-style servers, each listed as two slot targets."""
    endpoints = [
        Endpoint(url, slot=slot, prefill_tokens_per_s=1000.0)
        for url in ("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
        for slot in (0, 1)
    ]
    replicas = [Replica(endpoint, "m") for endpoint in endpoints]
    return Dispatcher(replicas, policy, ClientConfig(model="m"), metrics=None)  # type: ignore[arg-type]


def test_the_slots_of_one_server_see_each_others_queued_prompts() -> None:
    dispatch = _slot_dispatcher(RoundRobinPolicy())
    first, second, third, fourth = dispatch.replicas.values()
    first.queued_tokens, first.in_flight = 3000, 1
    third.queued_tokens, third.in_flight = 200, 1
    states = {s.replica_id: s for s in dispatch.states()}
    # a slot's own prompts and those of the other slot of its server: they share its compute
    assert states[first.replica_id].queued_tokens == 3000
    assert states[second.replica_id].queued_tokens == 3000
    assert states[third.replica_id].queued_tokens == 200
    assert states[fourth.replica_id].queued_tokens == 200
    # in-flight counts stay per slot (a slot runs its own request)
    assert [states[r.replica_id].in_flight for r in (first, second, third, fourth)] == [1, 0, 1, 0]


def test_slots_of_other_servers_and_plain_endpoints_stay_apart() -> None:
    endpoints = [
        Endpoint("http://127.0.0.1:1/v1", slot=0),
        Endpoint("http://127.0.0.1:2/v1", slot=0),
        Endpoint("http://127.0.0.1:1/v1/x"),
    ]
    dispatch = Dispatcher(
        [Replica(e, "m") for e in endpoints], RoundRobinPolicy(), ClientConfig(model="m"), None
    )
    first, second, plain = dispatch.replicas.values()
    first.queued_tokens = 500
    states = {s.replica_id: s.queued_tokens for s in dispatch.states()}
    assert states == {first.replica_id: 500, second.replica_id: 0, plain.replica_id: 0}


def test_combined_sends_a_prompt_to_an_idle_server_not_to_a_busy_servers_free_slot() -> None:
    dispatch = _slot_dispatcher(CombinedPolicy())
    busy = next(iter(dispatch.replicas.values()))
    busy.queued_tokens, busy.in_flight = 8000, 1  # server 1 prefills 8 s of prompt
    request = RouteRequest("r", prompt_tokens=500, expected_output_tokens=8)
    with dispatch.lock:
        _, replica = dispatch._offer(request, time.monotonic())
    assert replica is not None
    assert replica.endpoint.base_url == "http://127.0.0.1:2/v1"
