"""Routing state shared across processes: ``RoutingClient(store=...)``.

One conformance suite runs against every :class:`RouteStore` (memory, SQLite, a real
``redis-server``); the trust rules are checked on the route tables; and routers in
separate **processes** share routes and load through Redis and SQLite in front of
loopback engines that simulate a prefix cache (each its own cache)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from contextpilot_rag.errors import ConfigError, StoreUnavailableError
from contextpilot_rag.routing import RanvierPolicy, RouteRequest, RoutingClient
from contextpilot_rag.routing.gorgo import PrefixLocations
from contextpilot_rag.routing.ranvier import RouteTable
from contextpilot_rag.routing.route_store import (
    Load,
    MemoryRouteStore,
    RouteStore,
    RouteUpdate,
    SharedRoute,
    open_route_store,
)
from contextpilot_rag.routing.shared_routes import SharedRoutes
from contextpilot_rag.stores.sqlite_routes import SQLiteRouteStore
from contextpilot_rag.testing import OpenAICompatibleServer

DOCS = [f"[doc{i}]\n" + f"Document {i} talks about topic {i}. " * 60 for i in range(6)]
SHARED_LOGGER = "contextpilot_rag.routing.shared_routes"

if TYPE_CHECKING:
    from conftest import FakeClock, RedisServer


def conversation(turns: int) -> list[dict[str, str]]:
    """A RAG conversation of ``turns`` user turns; each prefix of it is an earlier turn's
    prompt (plus that turn's answer)."""
    messages = [
        {"role": "system", "content": "Answer from the documents. " * 20},
        {"role": "user", "content": "\n\n".join(DOCS[:4]) + "\n\nWhat is topic 1?"},
    ]
    for turn in range(1, turns):
        messages += [
            {"role": "assistant", "content": f"Topic {turn} is about documents."},
            {"role": "user", "content": f"And what about topic {turn + 1}? " * 10},
        ]
    return messages


def _sqlite(path: Path, clock: Callable[[], float], **bounds: Any) -> SQLiteRouteStore:
    return SQLiteRouteStore(path / "routes.db", clock=clock, **bounds)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[Callable[..., RouteStore]]:
    """A factory of stores of one kind (bounds as keywords); memory and SQLite run on
    the fake clock, Redis on its own (real time)."""
    made: list[RouteStore] = []

    def make(**bounds: Any) -> RouteStore:
        if request.param == "memory":
            store: RouteStore = MemoryRouteStore(clock=clock, **bounds)
        elif request.param == "sqlite":
            store = _sqlite(tmp_path, clock, **bounds)
        else:
            url = request.getfixturevalue("redis_url")
            store = open_route_store(url, **bounds)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def _is_redis(store: RouteStore) -> bool:
    return type(store).__name__ == "RedisRouteStore"


def _pass(store: RouteStore, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    if _is_redis(store):
        time.sleep(seconds)


def test_a_published_route_is_found_with_its_replica_blocks_origin_and_age(
    make_store: Callable[..., RouteStore],
) -> None:
    store = make_store()
    store.publish("a", [RouteUpdate(11, "http://e1/v1", 3), RouteUpdate(12, "http://e1/v1", 5)])
    found = sorted(store.lookup([12, 11, 99]), key=lambda route: route.key)
    assert [(r.key, r.replica_id, r.blocks, r.origin) for r in found] == [
        (11, "http://e1/v1", 3, "a"),
        (12, "http://e1/v1", 5, "a"),
    ]
    assert all(0 <= route.age_s < 1 for route in found)
    assert store.lookup([]) == []


def test_any_int_key_is_found_as_published(make_store: Callable[..., RouteStore]) -> None:
    """Engines' block hashes are unsigned 64-bit; SQLite stores signed ones."""
    store = make_store()
    keys = [2**63, 2**64 - 1, -5, 0, 2**63 - 1]
    store.publish("a", [RouteUpdate(key, f"r{n}", n + 1) for n, key in enumerate(keys)])
    found = {route.key: (route.replica_id, route.blocks) for route in store.lookup(keys)}
    assert found == {key: (f"r{n}", n + 1) for n, key in enumerate(keys)}


def test_the_latest_route_for_a_key_wins(make_store: Callable[..., RouteStore]) -> None:
    store = make_store()
    store.publish("a", [RouteUpdate(7, "r1", 2)])
    store.publish("b", [RouteUpdate(7, "r2#slot1", 4)])
    (route,) = store.lookup([7])
    assert (route.replica_id, route.blocks, route.origin) == ("r2#slot1", 4, "b")


def test_the_store_holds_at_most_max_routes_dropping_the_oldest(
    make_store: Callable[..., RouteStore], clock: FakeClock
) -> None:
    store = make_store(max_routes=5)
    for key in range(12):
        store.publish("a", [RouteUpdate(key, "r", 1)])
        _pass(store, clock, 0.002)
    kept = {route.key for route in store.lookup(list(range(12)))}
    assert kept == set(range(7, 12))


def test_a_route_older_than_its_ttl_is_never_returned(
    make_store: Callable[..., RouteStore], clock: FakeClock
) -> None:
    store = make_store(route_ttl_s=1.0)
    store.publish("a", [RouteUpdate(1, "r", 1)])
    _pass(store, clock, 0.6)
    store.publish("a", [RouteUpdate(2, "r", 1)])
    _pass(store, clock, 0.6)
    assert [route.key for route in store.lookup([1, 2])] == [2]


def test_a_load_report_is_replaced_expires_and_can_be_withdrawn(
    make_store: Callable[..., RouteStore], clock: FakeClock
) -> None:
    store = make_store(load_ttl_s=1.0)
    store.report_load("a", {"r1": (2, 100), "r2": (0, 0)})
    store.report_load("a", {"r1": (1, 50)})
    store.report_load("b", {"r1": (3, 0)})
    assert store.loads() == {"a": {"r1": (1, 50)}, "b": {"r1": (3, 0)}}
    store.withdraw("b")
    assert store.loads() == {"a": {"r1": (1, 50)}}
    _pass(store, clock, 1.2)
    assert store.loads() == {}


def test_bad_bounds_are_config_errors(tmp_path: Path) -> None:
    for bounds in ({"max_routes": 0}, {"route_ttl_s": 0}, {"load_ttl_s": -1.0}):
        with pytest.raises(ConfigError):
            MemoryRouteStore(**bounds)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            SQLiteRouteStore(tmp_path / "x.db", **bounds)  # type: ignore[arg-type]


def _request(hashes: Sequence[int], boundaries: Sequence[int]) -> RouteRequest:
    return RouteRequest(
        "r", len(hashes) * 16, tuple(hashes), boundaries=tuple(boundaries), block_tokens=16
    )


def test_prefix_locations_use_a_peer_route_only_where_nothing_local_is_known() -> None:
    table = PrefixLocations()
    request = _request([1, 2, 3, 4], [2, 4])
    assert table.learn_peer(4, "peer-replica", 4, 0.0, 1.0)
    assert table.cached_blocks(request, 1.0) == {"peer-replica": 4}
    table.record([1, 2, 3, 4], [2, 4], "local-replica", 2.0)  # this router sent it itself
    assert table.cached_blocks(request, 2.0) == {"local-replica": 4}
    assert not table.learn_peer(4, "peer-replica", 4, 2.0, 2.0)  # a local entry wins


def test_a_local_forget_overrides_a_peer_claim() -> None:
    table = PrefixLocations()
    table.learn_peer(4, "r1", 4, 0.0, 0.0)
    table.forget(4, "r1")
    assert table.cached_blocks(_request([1, 2, 3, 4], [4]), 0.0) == {}


def test_peer_routes_are_evicted_before_local_ones() -> None:
    for table in (PrefixLocations(capacity=3), RouteTable(capacity=3)):
        table.learn_peer(100, "peer", 1, 0.0, 0.0)
        for key in (1, 2, 3):
            if isinstance(table, PrefixLocations):
                table.record([key], [1], "local", 0.0)
            else:
                table.learn([key], [1], "local", 0.0)
        assert len(table) == 3 and not table.knows(100, 0.0)
        assert all(table.knows(key, 0.0) for key in (1, 2, 3))


def test_ranvier_takes_a_peer_route_unless_its_own_is_live() -> None:
    table = RouteTable(ttl_s=10.0)
    table.learn([1, 2], [2], "local", 0.0)
    assert not table.learn_peer(2, "peer", 2, 5.0, 5.0)
    route = table.get(2, 5.0)
    assert route is not None and (route.replica_id, route.trust) == ("local", "local")
    assert table.learn_peer(2, "peer", 2, 20.0, 20.0)  # the local route expired meanwhile
    route = table.get(2, 20.0)
    assert route is not None and (route.replica_id, route.trust) == ("peer", "peer")


@pytest.fixture
def fleet() -> Iterator[list[str]]:
    """Three loopback engines, each with its own prefix cache: their base URLs."""
    with ExitStack() as stack:
        servers = [stack.enter_context(OpenAICompatibleServer()) for _ in range(3)]
        yield [server.base_url for server in servers]


class CountingStore(MemoryRouteStore):
    """A memory store that counts look-ups, and fails every call while ``down``."""

    def __init__(self, **bounds: Any) -> None:
        super().__init__(**bounds)
        self.lookups = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailableError("the test store is down")

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        self._check()
        self.lookups += 1
        return super().lookup(keys)

    def publish(self, origin: str, routes: Sequence[RouteUpdate]) -> None:
        self._check()
        super().publish(origin, routes)

    def report_load(self, origin: str, load: Mapping[str, Load]) -> None:
        self._check()
        super().report_load(origin, load)

    def loads(self) -> dict[str, dict[str, Load]]:
        self._check()
        return super().loads()


def test_without_a_store_nothing_is_shared(fleet: list[str]) -> None:
    with RoutingClient(fleet, model="m") as client:
        assert client.shared is None
        assert client.config.store is None


def test_remote_routes_have_lower_trust_than_local_ones(fleet: list[str]) -> None:
    e0, e1, e2 = fleet
    store = MemoryRouteStore()
    with (
        RoutingClient([e0, e1, e2], model="m", store=store) as local,
        RoutingClient([e2, e1], model="m", store=store) as other,
        RoutingClient([e0, e1, e2], model="m", store=store) as fresh,
    ):
        assert local.chat(conversation(1)).endpoint == e0  # its own route: e0
        local.shared.flush()  # type: ignore[union-attr]
        # a router that does not serve e0 learns the same prefix on e2, published last
        assert other.chat(conversation(1)).endpoint == e2
        other.shared.flush()  # type: ignore[union-attr]
        # the store now says e2: a router that knows nothing follows it ...
        assert fresh.chat(conversation(1)).endpoint == e2
        # ... while the router that saw e0 itself keeps its own route
        assert local.chat(conversation(1)).endpoint == e0


def test_a_request_whose_prefixes_are_known_locally_waits_on_no_lookup(fleet: list[str]) -> None:
    store = CountingStore()
    with RoutingClient(fleet, model="m", store=store) as client:
        client.chat(conversation(1))
        before = store.lookups
        for _ in range(3):
            client.chat(conversation(1))
        assert store.lookups == before


def test_a_store_that_fails_degrades_to_local_routing_logs_once_and_resyncs(
    fleet: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = CountingStore()
    with RoutingClient(fleet, model="m", store=store) as client:
        shared = client.shared
        assert shared is not None
        shared.retry_s = 0.05
        store.down = True
        with caplog.at_level(logging.WARNING, logger=SHARED_LOGGER):
            for turns in (1, 2, 3):
                start = time.monotonic()
                assert client.chat(conversation(turns)).endpoint == fleet[0]
                assert time.monotonic() - start < 1.0
        warnings = [r for r in caplog.records if r.name == SHARED_LOGGER]
        assert shared.degraded and len(warnings) == 1
        assert len(store) == 0  # nothing reached it
        store.down = False
        deadline = time.monotonic() + 5
        while shared.degraded and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not shared.degraded
        shared.flush()
        assert len(store) > 0  # the routes learned while it was down were published


class HungStore(MemoryRouteStore):
    """A memory store whose look-ups hang until ``release`` is set (2 s at most);
    ``released_in_time``: whether it was set while a look-up waited."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()
        self.released_in_time: bool | None = None

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        self.entered.set()
        self.released_in_time = self.release.wait(2.0)
        return super().lookup(keys)


def test_an_async_call_waits_for_a_hung_store_off_the_event_loop(fleet: list[str]) -> None:
    store = HungStore()

    async def main() -> str:
        async with RoutingClient(fleet, model="m", store=store) as client:
            call = asyncio.create_task(client.achat(conversation(1)))
            while not store.entered.is_set():  # this loop runs while the look-up hangs
                await asyncio.sleep(0.005)
            store.release.set()
            return (await call).text

    assert asyncio.run(main())
    assert store.released_in_time


def test_the_queue_of_unpublished_routes_is_bounded() -> None:
    store = CountingStore()
    store.down = True
    shared = SharedRoutes(store, dict, max_pending=10)
    try:
        for i in range(50):
            shared.learned(_request(list(range(i * 10, i * 10 + 4)), [2, 4]), "r")
        shared.flush()
        assert len(shared._pending) == 10
    finally:
        shared.close()


class BuggyStore(MemoryRouteStore):
    """A memory store whose next ``failures`` publishes raise an error that is no
    :class:`StoreError` (a bug in a store of the user's)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    def publish(self, origin: str, routes: Sequence[RouteUpdate]) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug in the store")
        super().publish(origin, routes)


def test_a_store_that_raises_an_unexpected_error_loses_no_route_and_stops_no_sharing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = BuggyStore()
    store.failures = 1
    shared = SharedRoutes(store, dict)
    shared.retry_s = 0.05
    try:
        with caplog.at_level(logging.WARNING, logger=SHARED_LOGGER):
            shared.learned(_request([1, 2, 3, 4], [2, 4]), "r")
            deadline = time.monotonic() + 5
            while store.failures and time.monotonic() < deadline:  # the thread's round
                time.sleep(0.01)
            assert store.failures == 0
            shared.learned(_request([5, 6, 7, 8], [2, 4]), "r")  # the thread lives on
            deadline = time.monotonic() + 5
            while len(store) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert {route.key for route in store.lookup([2, 4, 6, 8])} == {2, 4, 6, 8}
        assert any("failed unexpectedly" in r.getMessage() for r in caplog.records)
    finally:
        shared.close()


@pytest.mark.parametrize(
    "store",
    [
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:6379/zero",
        "mysql://127.0.0.1/routes",
        "sqlite:///no/such/directory/routes.db",
        "redis://127.0.0.1:6379/0?pool=3",
        "",
        42,
    ],
)
def test_a_bad_store_is_a_config_error_before_anything_is_created(
    store: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    threads = threading.active_count()
    with pytest.raises(ConfigError):
        RoutingClient(["http://127.0.0.1:9/v1"], model="m", store=store)  # type: ignore[arg-type]
    assert threading.active_count() == threads
    assert list(tmp_path.iterdir()) == []


ROUTER = textwrap.dedent(
    """
    import json, sys, time
    from contextpilot_rag.routing import RoutingClient
    from contextpilot_rag.routing.route_store import open_route_store

    spec = json.loads(sys.argv[1])
    store = spec["store"]
    if store is not None and spec.get("load_ttl_s"):
        store = open_route_store(store, load_ttl_s=spec["load_ttl_s"])
    client = RoutingClient(spec["endpoints"], model="m", policy=spec["policy"], store=store)
    for turns in spec["chats"]:
        result = client.chat(spec["messages"][str(turns)])
        print(json.dumps({"endpoint": result.endpoint, "cached": result.cached_tokens}))
    if spec.get("stream"):
        stream = iter(client.stream(spec["messages"]["1"], max_tokens=500))
        next(stream)
        client.shared.flush()
        print(json.dumps({"streaming": True}), flush=True)
        time.sleep(120)
    if client.shared is not None:
        client.shared.flush()
    client.close()
    """
)


def _router(store: str | None, endpoints: Sequence[str], **spec: Any) -> subprocess.Popen[str]:
    spec = {
        "store": store,
        "endpoints": list(endpoints),
        "policy": "combined",
        "chats": [],
        "messages": {turns: conversation(turns) for turns in (1, 2, 3)},
        **spec,
    }
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen(
        [sys.executable, "-c", ROUTER, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _results(process: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(params=["redis", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


def test_a_prefix_learned_in_process_a_routes_process_b_to_the_same_replica(
    fleet: list[str], store_url: str
) -> None:
    e0, e1, e2 = fleet
    (a,) = _results(_router(store_url, [e2, e0, e1], chats=[1]))  # ties: its first, e2
    assert a["endpoint"] == e2
    b, b_next = _results(_router(store_url, [e0, e1, e2], chats=[2, 3]))
    assert b["endpoint"] == e2 and b["cached"] > 0  # the engine served A's prefix
    assert b_next["endpoint"] == e2
    (alone,) = _results(_router(None, [e0, e1, e2], chats=[2]))
    assert alone["endpoint"] == e0  # without the store it would not know


@pytest.fixture
def slow_fleet() -> Iterator[list[str]]:
    """Three engines; the first streams slowly (a request stays in flight)."""
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                OpenAICompatibleServer(
                    token_delay_s=0.3 if i == 0 else 0.0, reply=lambda _m: "word " * 400
                )
            )
            for i in range(3)
        ]
        yield [server.base_url for server in servers]


def _in_flight(client: RoutingClient, replica: str) -> int:
    client.shared.flush()  # type: ignore[union-attr]
    return next(r.in_flight for r in client.replicas if r.replica_id == replica)


def test_load_of_process_a_is_seen_by_b_and_disappears_after_a_dies(
    slow_fleet: list[str], redis_url: str
) -> None:
    e0, e1, e2 = slow_fleet
    a = _router(redis_url, slow_fleet, stream=True, load_ttl_s=1.0)
    try:
        assert a.stdout is not None
        assert json.loads(a.stdout.readline()) == {"streaming": True}, a.stderr
        with RoutingClient([e0, e1, e2], model="m", policy="least-request", store=redis_url) as b:
            assert _in_flight(b, e0) == 1
            chosen = {b.chat("hello", max_tokens=1).endpoint for _ in range(4)}
            assert e0 not in chosen  # A's request counts in B's decisions
            a.send_signal(signal.SIGKILL)
            a.wait(10)
            deadline = time.monotonic() + 5
            while _in_flight(b, e0) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _in_flight(b, e0) == 0  # A's report expired with its TTL
            chosen = {b.chat("hello", max_tokens=1).endpoint for _ in range(3)}
            assert chosen == {e0, e1, e2}
    finally:
        a.kill()
        a.wait(10)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_with_redis_killed_mid_run_requests_are_still_routed_quickly(
    fleet: list[str], persistent_redis: RedisServer, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = persistent_redis.url()
    with RoutingClient(fleet, model="m", store=url) as client:
        shared = client.shared
        assert shared is not None
        shared.retry_s = 0.2
        client.chat(conversation(1))
        assert shared.flush()
        getattr(persistent_redis, fault)()
        with caplog.at_level(logging.WARNING, logger=SHARED_LOGGER):
            for turns in (2, 3, 2, 3):
                start = time.monotonic()
                assert client.chat(conversation(turns)).endpoint == fleet[0]
                assert time.monotonic() - start < 1.5  # one Redis timeout (0.25 s) at most
        assert shared.degraded
        assert len([r for r in caplog.records if r.name == SHARED_LOGGER]) == 1
        if fault == "kill":
            persistent_redis.start()
        else:
            persistent_redis.resume()
        deadline = time.monotonic() + 10
        while shared.degraded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not shared.degraded  # resynced: routes and load shared again
        shared.flush()
        probe = open_route_store(url)
        try:
            keys = _keys(client, conversation(3))
            assert {route.origin for route in probe.lookup(keys)} == {shared.origin}
        finally:
            probe.close()


def _keys(client: RoutingClient, messages: list[dict[str, str]]) -> list[int]:
    """The boundary keys of ``messages`` as ``client`` computes them."""
    from contextpilot_rag.routing.prompt_keys import serialise

    dispatcher = client._dispatcher
    request = dispatcher.keys.request(serialise(messages, None), request_id="probe")
    return [request.block_hashes[b - 1] for b in request.boundaries]


def test_a_ranvier_client_shares_routes_too(fleet: list[str]) -> None:
    e0, e1, e2 = fleet
    store = MemoryRouteStore()
    with (
        RoutingClient([e2, e0, e1], model="m", policy=RanvierPolicy(), store=store) as a,
        RoutingClient([e0, e1, e2], model="m", policy=RanvierPolicy(), store=store) as b,
    ):
        first = a.chat(conversation(1)).endpoint
        a.shared.flush()  # type: ignore[union-attr]
        assert b.chat(conversation(2)).endpoint == first


def test_serve_workers_pass_their_store_to_the_routing_client(
    fleet: list[str], redis_url: str
) -> None:
    pytest.importorskip("starlette")
    from contextpilot_rag.serve.config import ServeConfig
    from contextpilot_rag.serve.proxy import Proxy

    proxy = Proxy(ServeConfig(endpoints=tuple(fleet), model="m", store=redis_url))
    try:
        shared = proxy.client.shared
        assert shared is not None and not shared.degraded
        assert proxy.client.config.store == redis_url
    finally:
        proxy.client.close()


def test_other_routers_in_flight_requests_count_and_their_queued_tokens_only_when_asked() -> None:
    store = MemoryRouteStore()
    store.report_load("other", {"r1": (2, 500)})
    for queued_tokens, expected in ((False, (2, 0)), (True, (2, 500))):
        shared = SharedRoutes(store, lambda: {"r1": (1, 100)}, queued_tokens=queued_tokens)
        try:
            assert shared.flush()
            assert shared.remote_load() == {"r1": expected}  # its own load is not in it
        finally:
            shared.close()
