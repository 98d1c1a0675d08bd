"""Faults: Redis, a ``serve`` worker or a replica goes away, and comes back.

Real servers throughout: ``redis-server`` (killed with SIGKILL and restarted on its
port and data directory, ``appendonly yes``), ``contextpilot-rag serve`` processes,
and loopback engines. Where a reply must be lost after Redis applied a command, a TCP
relay in front of the real server drops it (the network losing a reply), never a fake
Redis.

Already covered elsewhere, and not repeated here:

- ``tests/test_stores.py``: with Redis killed, ``optimize``/``record_answer`` fail fast
  and leave this process's state as it was; a hung (SIGSTOPped) Redis fails a call
  within its timeout; processes and Redis restarting lose no recorded turn.
- ``tests/test_route_store.py``: a routing client whose Redis is killed or hung routes
  on its own state (one warning), and resyncs when it is back.
- ``tests/test_routing_client.py``: an engine killed mid-stream fails over to another.

What this file adds: the pilot and the routing client of one worker on one Redis
through an outage, exactly which turn loses what (a write applied whose reply was lost,
an answer whose write met the outage, a worker killed mid-answer), a ``serve`` worker
killed and its conversation continued on another, and a replica of the proxy's fleet
killed and brought back.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextpilot_rag import ContextBlock, ContextPilot, Prompt
from contextpilot_rag.errors import StoreUnavailableError
from contextpilot_rag.routing import RoutingClient
from contextpilot_rag.testing import OpenAICompatibleServer, RedisServer

MODEL = "test-model"
STORE_TIMEOUT_S = 0.5
BOUND_S = STORE_TIMEOUT_S + 1.0  # a failed call: one timeout at most, plus scheduling
DOCS = {
    f"doc{i}": " ".join([f"Document {i} says something particular about topic {i}."] * 8)
    for i in range(8)
}
TURNS = [("doc0", "doc1", "doc2"), ("doc2", "doc3"), ("doc4", "doc0"), ("doc1", "doc5", "doc4")]


def blocks_of(turn: int) -> list[ContextBlock]:
    return [ContextBlock(DOCS[doc_id], id=doc_id) for doc_id in TURNS[turn]]


def question(turn: int) -> str:
    return f"Question {turn}: what do these documents say?"


def answer(turn: int) -> str:
    return f"Answer {turn}: they agree."


def in_one_process(turns: int) -> list[Prompt]:
    """The prompts of the first ``turns`` turns played by one in-memory pilot."""
    pilot, prompts = ContextPilot(), []
    for turn in range(turns):
        prompts.append(pilot.optimize(blocks_of(turn), question(turn), conversation_id="c"))
        pilot.record_answer(prompts[-1], answer(turn))
    return prompts


def chat(
    base: str, turn: int, conversation_id: str | None, timeout_s: float = 30
) -> httpx.Response:
    """Turn ``turn`` through the proxy at ``base``: its documents in the field."""
    documents = [{"id": doc_id, "text": DOCS[doc_id]} for doc_id in TURNS[turn]]
    field: dict[str, Any] = {"documents": documents}
    if conversation_id is not None:
        field["conversation_id"] = conversation_id
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question(turn)}],
        "contextpilot": field,
    }
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=timeout_s)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def elapsed_s(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def failing_within(call: Callable[[], object], bound_s: float = BOUND_S) -> None:
    """``call`` raises StoreUnavailableError, within ``bound_s`` (no hang)."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        call()
    assert time.monotonic() - started < bound_s


@pytest.fixture
def engines() -> Iterator[list[OpenAICompatibleServer]]:
    with ExitStack() as stack:
        yield [stack.enter_context(OpenAICompatibleServer(model=MODEL)) for _ in range(2)]


# -- (a) Redis killed and restarted ----------------------------------------------------------


def test_with_redis_killed_a_worker_fails_fast_routes_alone_and_resumes_where_it_stopped(
    persistent_redis: RedisServer, engines: list[OpenAICompatibleServer]
) -> None:
    url = persistent_redis.url()
    pilot = ContextPilot(store=f"{url}?timeout_s={STORE_TIMEOUT_S}")
    urls = [engine.base_url for engine in engines]
    with RoutingClient(urls, model=MODEL, store=url) as client:
        shared = client.shared
        assert shared is not None
        shared.retry_s = 0.2
        for turn in (0, 1):
            prompt = pilot.optimize(blocks_of(turn), question(turn), conversation_id="c")
            client.chat(prompt)
            pilot.record_answer(prompt, answer(turn))
        third = pilot.optimize(blocks_of(2), question(2), conversation_id="c")
        persistent_redis.kill()
        failing_within(lambda: pilot.record_answer(third, answer(2)))  # the answer meets it
        failing_within(lambda: pilot.optimize(blocks_of(3), question(3), conversation_id="c"))
        for _ in range(3):  # routing goes on, on this client's own routes and load
            assert elapsed_s(lambda: client.chat(third)) < BOUND_S
        assert shared.degraded
        persistent_redis.start()
        wait_until(lambda: not shared.degraded, 10, "the routing client resyncs")
    stored = pilot.conversation("c").turns
    assert [t.question for t in stored] == [question(t) for t in (0, 1, 2)]  # none lost
    assert [t.answer for t in stored] == [answer(0), answer(1), None]  # only that answer
    pilot.record_answer(third, answer(2))  # the turn is there: it can be answered now
    fourth = pilot.optimize(blocks_of(3), question(3), conversation_id="c")
    assert [b.id for b in fourth.deduplicated] == ["doc1", "doc4"]  # shown before the kill
    assert fourth.messages == in_one_process(4)[-1].messages


@pytest.mark.usefixtures("redis_server")  # skips where redis-server is not installed
def test_a_redis_restarted_without_persistence_starts_its_conversations_afresh(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path) as server:  # no appendonly: a restart keeps nothing
        pilot = ContextPilot(store=server.url())
        first = pilot.optimize(blocks_of(0), question(0), conversation_id="c")
        pilot.record_answer(first, answer(0))
        server.kill()
        server.start()
        again = pilot.optimize(blocks_of(2), question(2), conversation_id="c")
        assert not again.history_lost  # no trace is left to tell a loss from a new id
        assert [t.question for t in pilot.conversation("c").turns] == [question(2)]


def test_a_serve_worker_answers_503_while_redis_is_down_and_continues_after(
    persistent_redis: RedisServer,
) -> None:
    pytest.importorskip("starlette")
    from contextpilot_rag.serve import BackgroundServer, ServeConfig

    def reply(messages: Sequence[dict[str, Any]]) -> str:
        if str(messages[-1]["content"]).endswith(question(1)):
            persistent_redis.kill()  # after the turn was written, before its answer is
        return "The documents agree."

    with ExitStack() as stack:
        fleet = [stack.enter_context(OpenAICompatibleServer(model=MODEL, reply=reply))]
        config = ServeConfig(
            endpoints=(fleet[0].base_url,),
            model=MODEL,
            store=f"{persistent_redis.url()}?timeout_s={STORE_TIMEOUT_S}",
        )
        server = stack.enter_context(BackgroundServer(config))
        base = server.base_url.removesuffix("/v1")
        assert chat(base, 0, "c").status_code == 200
        assert chat(base, 1, "c").status_code == 200  # answered; its record met the outage
        started = time.monotonic()
        refused = chat(base, 2, "c")
        assert time.monotonic() - started < BOUND_S
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "store_unavailable"
        assert str(persistent_redis.port) not in refused.text  # the store's address stays in
        assert chat(base, 2, None).status_code == 200  # documents without a conversation
        body = {"model": MODEL, "messages": [{"role": "user", "content": "no documents"}]}
        plain = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert plain.status_code == 200  # both routed on the worker's own state
        persistent_redis.start()
        turns = server.proxy.pilot.conversation("c").turns
        assert [(t.question, t.answer is None) for t in turns] == [
            (question(0), False),
            (question(1), True),  # its answer is what the outage lost
        ]
        again = chat(base, 2, "c")
        assert again.status_code == 200
        assert again.json()["contextpilot"]["blocks_deduplicated"] == 1  # doc0, of turn 0


class ReplyDroppingRelay:
    """A TCP relay on loopback in front of a real ``redis-server`` that can lose one
    reply: once armed with a marker, the first command whose bytes carry it reaches
    Redis and runs, and nothing Redis sends back on that connection reaches the
    client (which times out), as when the network loses the reply."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0?timeout_s={STORE_TIMEOUT_S}"

    def lose_reply_to(self, marker: str) -> None:
        with self._lock:
            self._marker = marker.encode()

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._upstream_port))
            self._sockets += [client, server]
            muted = threading.Event()
            threading.Thread(
                target=self._requests, args=(client, server, muted), daemon=True
            ).start()
            threading.Thread(
                target=self._replies, args=(server, client, muted), daemon=True
            ).start()

    def _requests(
        self, client: socket.socket, server: socket.socket, muted: threading.Event
    ) -> None:
        tail = b""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if self._marker is not None and self._marker in tail + data:
                        self._marker = None
                        muted.set()  # before Redis can answer
                    tail = data[-64:]
                server.sendall(data)
        _close_both(client, server)

    def _replies(
        self, server: socket.socket, client: socket.socket, muted: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not muted.is_set():
                    client.sendall(data)
        _close_both(client, server)


def _close_both(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(redis_server: RedisServer) -> Iterator[ReplyDroppingRelay]:
    redis_server.flush()
    relay = ReplyDroppingRelay(redis_server.port)
    yield relay
    relay.close()


def test_a_turn_written_whose_reply_was_lost_is_kept_once_awaiting_its_answer(
    relay: ReplyDroppingRelay,
) -> None:
    pilot = ContextPilot(store=relay.url())
    first = pilot.optimize(blocks_of(0), question(0), conversation_id="c")
    pilot.record_answer(first, answer(0))
    index_before = pilot.index_stats()
    relay.lose_reply_to(question(1))
    failing_within(lambda: pilot.optimize(blocks_of(1), question(1), conversation_id="c"))
    assert pilot.index_stats() == index_before  # this process recorded nothing
    stored = pilot.conversation("c").turns
    assert [(t.question, t.answer) for t in stored] == [
        (question(0), answer(0)),
        (question(1), None),
    ]
    # The caller, who got the error, asks again: the question is a new turn, and the
    # lost-reply turn stays in the history unanswered (its documents shown in full there).
    again = pilot.optimize(blocks_of(1), question(1), conversation_id="c")
    pilot.record_answer(again, answer(1))
    stored = pilot.conversation("c").turns
    assert [(t.question, t.answer) for t in stored][1:] == [
        (question(1), None),
        (question(1), answer(1)),
    ]
    assert [b.id for b in again.deduplicated] == ["doc2", "doc3"]


def test_an_answer_written_whose_reply_was_lost_is_recorded_once_when_retried(
    relay: ReplyDroppingRelay,
) -> None:
    pilot = ContextPilot(store=relay.url())
    prompt = pilot.optimize(blocks_of(0), question(0), conversation_id="c")
    relay.lose_reply_to(answer(0))
    failing_within(lambda: pilot.record_answer(prompt, answer(0)))
    assert [t.answer for t in pilot.conversation("c").turns] == [answer(0)]  # it was applied
    pilot.record_answer(prompt, answer(0))  # a retry of the same answer: done, not an error
    assert [t.answer for t in pilot.conversation("c").turns] == [answer(0)]


# -- (b) a serve worker killed -----------------------------------------------------------------


class ServeWorker:
    """A ``contextpilot-rag serve`` process of its own (one worker) on ``store``."""

    def __init__(self, endpoints: Sequence[str], store: str, log: Path) -> None:
        port = free_port()
        command = [sys.executable, "-m", "contextpilot_rag.cli", "serve", "--model", MODEL]
        command += ["--port", str(port), "--policy", "round-robin", "--store", store]
        for endpoint in endpoints:
            command += ["--endpoint", endpoint]
        with open(log, "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    def up(self) -> bool:
        """Whether it answers ``/health``; a worker that exited fails the test."""
        assert self.process.poll() is None, self.log.read_text(errors="replace")[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.base}/health", timeout=2).status_code == 200
        return False

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


class HeldReply:
    """An engine reply function that holds the answer to ``question(held)`` until
    released (a worker can be killed while it waits)."""

    def __init__(self, held: int) -> None:
        self.held = question(held)
        self.arrived, self.release = threading.Event(), threading.Event()

    def __call__(self, messages: Sequence[dict[str, Any]]) -> str:
        if str(messages[-1]["content"]).endswith(self.held):
            self.arrived.set()
            self.release.wait(30)
        return f"The documents answer: {str(messages[-1]['content'])[-30:]}"


def ask_ignoring_the_kill(base: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        chat(base, 2, "c", timeout_s=60)


def test_a_serve_worker_killed_mid_answer_leaves_its_turns_to_another_worker(
    redis_url: str, tmp_path: Path
) -> None:
    reply = HeldReply(held=2)
    with ExitStack() as stack:
        fleet = [
            stack.enter_context(OpenAICompatibleServer(model=MODEL, reply=reply)) for _ in range(2)
        ]
        endpoints = [engine.base_url for engine in fleet]
        stack.callback(reply.release.set)
        a, b = (ServeWorker(endpoints, redis_url, tmp_path / f"{name}.log") for name in "ab")
        stack.callback(a.kill)
        stack.callback(b.kill)
        wait_until(lambda: a.up() and b.up(), 120, "both serve workers")
        answers = [
            chat(a.base, turn, "c").json()["choices"][0]["message"]["content"] for turn in (0, 1)
        ]
        in_flight = threading.Thread(target=ask_ignoring_the_kill, args=(a.base,), daemon=True)
        in_flight.start()
        assert reply.arrived.wait(30)  # A wrote turn 2 and waits for its answer
        a.kill()  # SIGKILL
        reply.release.set()
        response = chat(b.base, 3, "c")
        assert response.status_code == 200, response.text
        extension = response.json()["contextpilot"]
        assert extension["blocks_deduplicated"] == 2  # doc1 (A's turn 0), doc4 (A's turn 2)
        sent = next(
            body["messages"]
            for engine in fleet
            for body in engine.requests
            if body["messages"][-1]["content"].endswith(question(3))
        )
        roles = [m["role"] for m in sent]
        # A's turn 2 awaits its answer: the stand-in keeps the roles alternating
        assert roles == ["system", *["user", "assistant"] * 3, "user"]
        assert sent[-2]["content"] == "(no answer)"
        assert [sent[2]["content"], sent[4]["content"]] == answers  # A's answers, as recorded
        assert sent[5]["content"].endswith(question(2))  # the killed turn: kept, unanswered
        assert DOCS["doc4"] in sent[5]["content"] and DOCS["doc4"] not in sent[6]["content"]


# -- (c) a replica killed --------------------------------------------------------------------


def test_a_replica_killed_is_routed_around_and_used_again_once_back() -> None:
    pytest.importorskip("starlette")
    from contextpilot_rag.serve import BackgroundServer, ServeConfig

    with ExitStack() as stack:
        fleet = [
            stack.enter_context(OpenAICompatibleServer(model=MODEL, port=free_port()))
            for _ in range(2)
        ]
        config = ServeConfig(
            endpoints=tuple(e.base_url for e in fleet), model=MODEL, policy="round-robin"
        )
        proxy = stack.enter_context(BackgroundServer(config))
        base = proxy.base_url.removesuffix("/v1")
        down, up = fleet

        def served_by(engine: OpenAICompatibleServer, turns: range) -> int:
            before = len(engine.requests)
            for turn in turns:
                assert chat(base, turn % len(TURNS), "c").status_code == 200
            return len(engine.requests) - before

        assert served_by(down, range(2)) == 1  # round-robin: one each
        down.stop()
        assert served_by(up, range(2, 6)) == 4  # every request answered, by the other
        down.start()  # on its port again
        wait_until(lambda: all(r.healthy for r in proxy.proxy.client.replicas), 30, "breaker")
        assert served_by(down, range(6, 10)) == 2  # used again
        turns = proxy.proxy.pilot.conversation("c").turns
        assert len(turns) == 10 and all(turn.answer for turn in turns)
