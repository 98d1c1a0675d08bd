"""RoutingClient against endpoints that misbehave, on loopback: wrong-shaped JSON, streams
cut short, keep-alive trickles, slow answers, ``Retry-After``, and credentials that must
never show. Every server here answers from a script, so each fault is exact."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import (
    ChatResult,
    Endpoint,
    EndpointError,
    RoutingClient,
    RoutingError,
)
from contextpilot_rag.routing.client.endpoints import retry_after_s as _retry_after_s

SSE = {"Content-Type": "text/event-stream"}
QUESTION = [{"role": "user", "content": "Which?"}]


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


def stream(*pieces: str) -> list[bytes | float]:
    """A complete chat stream of ``pieces``."""
    return [*(chunk(p) for p in pieces), chunk(finish="stop"), b"data: [DONE]\n\n"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: status, headers, then the body piece by piece (a float is
    a pause of that many seconds); the connection closes after the last piece."""

    pieces: Sequence[bytes | float] = ()
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: SSE)


class ScriptServer:
    """Answers its n-th ``POST`` with ``replies[n]`` (the last one once they run out);
    ``headers`` holds the request headers received."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = replies
        self.headers: list[dict[str, str]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def posts(self) -> int:
        return len(self.headers)

    def next_reply(self, headers: dict[str, str]) -> Reply:
        self.headers.append(headers)
        return self.replies[min(len(self.headers), len(self.replies)) - 1]

    def __enter__(self) -> ScriptServer:
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                reply = script.next_reply(dict(self.headers))
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.close_connection = True
                try:
                    for piece in reply.pieces:
                        if isinstance(piece, float):
                            time.sleep(piece)
                        else:
                            self.wfile.write(piece)
                            self.wfile.flush()
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        serve = self._server.serve_forever
        threading.Thread(target=serve, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def idle(client: RoutingClient) -> bool:
    return all(r.in_flight == 0 and r.queued_tokens == 0 for r in client.replicas)


def healthy(client: RoutingClient, url: str) -> bool:
    return {r.replica_id: r.healthy for r in client.replicas}[url]


Call = Callable[..., ChatResult]


def sync_chat(client: RoutingClient, prompt: Any = QUESTION, **params: Any) -> ChatResult:
    return client.chat(prompt, **params)


def async_chat(client: RoutingClient, prompt: Any = QUESTION, **params: Any) -> ChatResult:
    async def run() -> ChatResult:
        try:
            return await client.achat(prompt, **params)
        finally:
            await client.aclose()

    return asyncio.run(run())


def sync_stream(client: RoutingClient) -> tuple[list[str], ChatResult]:
    answer = client.stream(QUESTION)
    pieces = list(answer)
    return pieces, answer.result


def async_stream(client: RoutingClient) -> tuple[list[str], ChatResult]:
    async def run() -> tuple[list[str], ChatResult]:
        try:
            answer = client.astream(QUESTION)
            pieces = [piece async for piece in answer]
            return pieces, answer.result
        finally:
            await client.aclose()

    return asyncio.run(run())


CHATS = pytest.mark.parametrize("call", [sync_chat, async_chat], ids=["sync", "async"])
STREAMS = pytest.mark.parametrize("read", [sync_stream, async_stream], ids=["sync", "async"])


@pytest.fixture
def good() -> Iterator[ScriptServer]:
    with ScriptServer(Reply(stream("good", " answer"))) as server:
        yield server


# ---------------------------------------------------------------- item 6: wrong shapes

WRONG_SHAPES = [
    "null",
    "[1]",
    '{"choices": [null]}',
    '{"choices": "x"}',
    '{"choices": [{"delta": "x"}]}',
    '{"usage": 5}',
    '{"choices": [{"delta": {"content": 7}}]}',
    '{"choices": [{"delta": {"tool_calls": [{"function": "x"}]}}]}',
]


def assert_it_fails_over(call: Call, bad: ScriptServer, good: ScriptServer) -> None:
    """Round robin sends the first attempt to ``bad``: the answer comes from ``good``,
    ``bad`` is counted toward its breaker, and nothing stays in flight."""
    client = RoutingClient([bad.base_url, good.base_url], model="m", policy="round-robin")
    result = call(client)
    assert result.text == "good answer" and result.attempts == 2
    assert not healthy(client, bad.base_url)
    assert idle(client)


@CHATS
@pytest.mark.parametrize("payload", WRONG_SHAPES)
def test_a_wrong_shaped_stream_chunk_is_an_endpoint_fault_that_fails_over(
    call: Call, payload: str, good: ScriptServer
) -> None:
    with ScriptServer(Reply([f"data: {payload}\n\n".encode(), *stream("bad")])) as bad:
        assert_it_fails_over(call, bad, good)


@CHATS
def test_wrong_shaped_chunks_everywhere_end_in_a_routing_error(call: Call) -> None:
    with ScriptServer(Reply([b"data: [1]\n\n"])) as bad:
        client = RoutingClient([bad.base_url], model="m", max_attempts=2)
        with pytest.raises(RoutingError) as caught:
            call(client)
    assert len(caught.value.attempts) == 2
    assert all("malformed" in (a.error or "") for a in caught.value.attempts)
    assert idle(client)


JSON = {"Content-Type": "application/json"}


def json_reply(payload: object) -> Reply:
    return Reply([json.dumps(payload).encode()], headers=JSON)


@CHATS
def test_a_non_streamed_json_reply_is_taken_as_the_whole_answer(call: Call) -> None:
    payload = {
        "choices": [{"message": {"content": "whole answer"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
    }
    with ScriptServer(json_reply(payload)) as server:
        client = RoutingClient([server.base_url], model="m")
        result = call(client)
    assert result.text == "whole answer" and result.finish_reason == "stop"
    assert (result.prompt_tokens, result.cached_tokens) == (9, 4)


@CHATS
@pytest.mark.parametrize(
    "payload",
    [None, [], {"choices": [{"message": "x"}]}, {"choices": [{"message": {"content": ["x"]}}]}],
)
def test_a_wrong_shaped_non_streamed_reply_is_an_endpoint_fault(
    call: Call, payload: object, good: ScriptServer
) -> None:
    with ScriptServer(json_reply(payload)) as bad:
        client = RoutingClient([bad.base_url, good.base_url], model="m", policy="round-robin")
        result = call(client)
        assert not healthy(client, bad.base_url)
    assert result.text == "good answer" and result.attempts == 2
    with ScriptServer(json_reply(payload)) as bad:
        client = RoutingClient([bad.base_url], model="m", max_attempts=1)
        with pytest.raises(RoutingError, match="malformed reply"):
            call(client)


@CHATS
@pytest.mark.parametrize("headers", [SSE, JSON], ids=["stream", "json"])
def test_a_reply_that_does_not_decode_is_an_endpoint_fault_that_fails_over(
    call: Call, headers: Mapping[str, str], good: ScriptServer
) -> None:
    garbled = Reply([b"not gzip at all"], headers={**headers, "Content-Encoding": "gzip"})
    with ScriptServer(garbled) as bad:
        assert_it_fails_over(call, bad, good)


# ------------------------------------------------------------- engines that refuse


@CHATS
@pytest.mark.parametrize("status", [401, 403, 404])
def test_an_engine_that_refuses_every_request_is_an_endpoint_fault_that_fails_over(
    call: Call, status: int, good: ScriptServer
) -> None:
    refusal = Reply([b'{"error": {"message": "invalid key"}}'], status=status, headers=JSON)
    with ScriptServer(refusal) as wrong_key:
        assert_it_fails_over(call, wrong_key, good)


@CHATS
@pytest.mark.parametrize("status", [400, 413, 422])
def test_the_callers_own_bad_request_is_not_retried_and_leaves_the_breaker_alone(
    call: Call, status: int, good: ScriptServer
) -> None:
    too_long = Reply([b"the prompt is over the context length"], status=status, headers={})
    with ScriptServer(too_long) as engine:
        client = RoutingClient([engine.base_url, good.base_url], model="m", policy="round-robin")
        with pytest.raises(EndpointError) as caught:
            call(client)
        assert caught.value.status == status and "context length" in str(caught.value)
        assert (engine.posts, good.posts) == (1, 0)
        assert healthy(client, engine.base_url) and idle(client)


# --------------------------------------------------------------- item 7: resumed streams


@STREAMS
def test_a_resumed_stream_never_ends_shorter_than_what_was_delivered(
    read: Callable[[RoutingClient], tuple[list[str], ChatResult]],
) -> None:
    cut = Reply([chunk("alpha"), chunk(" beta"), chunk(" gamma")])  # no [DONE]: cut short
    with ScriptServer(cut) as first, ScriptServer(Reply(stream("alpha", " beta"))) as second:
        client = RoutingClient([first.base_url, second.base_url], model="m", policy="round-robin")
        with pytest.raises(RoutingError, match="shorter"):
            read(client)
        assert second.posts == 1 and idle(client)


@STREAMS
def test_a_resumed_stream_that_reproduces_the_delivered_text_continues_after_it(
    read: Callable[[RoutingClient], tuple[list[str], ChatResult]],
) -> None:
    cut = Reply([chunk("alpha"), chunk(" beta")])
    with ScriptServer(cut) as first, ScriptServer(Reply(stream("alpha beta", " end"))) as second:
        client = RoutingClient([first.base_url, second.base_url], model="m", policy="round-robin")
        pieces, result = read(client)
    assert pieces == ["alpha", " beta", " end"]
    assert result.text == "alpha beta end" and result.attempts == 2


@CHATS
def test_a_chat_takes_the_retry_s_whole_answer_since_it_delivered_nothing(call: Call) -> None:
    cut = Reply([chunk("alpha"), chunk(" beta")])
    with ScriptServer(cut) as first, ScriptServer(Reply(stream("other", " text"))) as second:
        client = RoutingClient([first.base_url, second.base_url], model="m", policy="round-robin")
        result = call(client)
        assert result.text == "other text" and result.attempts == 2
        assert idle(client)


# ---------------------------------------------------------------- item 8: time bounds


@CHATS
def test_keep_alive_comments_do_not_stretch_the_timeout(call: Call, good: ScriptServer) -> None:
    trickle = Reply([b": ping\n\n", 0.05] * 40 + stream("late"))  # 2 s of keep-alives
    with ScriptServer(trickle) as slow:
        client = RoutingClient([slow.base_url], model="m", timeout_s=0.3, max_attempts=1)
        started = time.monotonic()
        with pytest.raises(RoutingError, match="no event"):
            call(client)
        assert time.monotonic() - started < 1.0
        both = RoutingClient(
            [slow.base_url, good.base_url], model="m", timeout_s=0.3, policy="round-robin"
        )
        assert call(both).text == "good answer"
        assert not healthy(both, slow.base_url) and idle(both)


@CHATS
def test_deadline_s_bounds_a_whole_call_that_keeps_making_progress(call: Call) -> None:
    slow = Reply([x for i in range(30) for x in (chunk(f"w{i} "), 0.1)] + stream())
    with ScriptServer(slow) as server:
        client = RoutingClient([server.base_url], model="m", timeout_s=5.0, deadline_s=0.4)
        started = time.monotonic()
        with pytest.raises(RoutingError, match="deadline") as caught:
            call(client)
        assert time.monotonic() - started < 1.0
        assert len(caught.value.attempts) == 1
        assert healthy(client, server.base_url)  # the caller's budget ran out, not its fault
        assert idle(client)


@CHATS
def test_deadline_s_bounds_a_server_that_says_nothing(call: Call) -> None:
    with ScriptServer(Reply([2.0, *stream("late")])) as server:
        client = RoutingClient([server.base_url], model="m", timeout_s=5.0, deadline_s=0.3)
        started = time.monotonic()
        with pytest.raises(RoutingError, match="deadline"):
            call(client)
        assert time.monotonic() - started < 1.0 and idle(client)


def test_deadline_s_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="deadline_s"):
        RoutingClient(["http://127.0.0.1:1/v1"], model="m", deadline_s=0)


# --------------------------------------------------------------- item 9: Retry-After


def busy(status: int, retry_after: str) -> Reply:
    return Reply([b"busy"], status=status, headers={"Retry-After": retry_after})


def http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@CHATS
@pytest.mark.parametrize(
    ("status", "retry_after"), [(429, lambda: "30"), (503, lambda: http_date(30))]
)
def test_retry_after_keeps_the_endpoint_out_for_that_long(
    call: Call, status: int, retry_after: Callable[[], str], good: ScriptServer
) -> None:
    with ScriptServer(busy(status, retry_after())) as limited:
        client = RoutingClient(
            [limited.base_url, good.base_url],
            model="m",
            policy="round-robin",
            backoff_s=0.01,
            max_backoff_s=60.0,
        )
        assert call(client).attempts == 2
        time.sleep(0.05)  # far past its own backoff of 0.01 s
        assert not healthy(client, limited.base_url)
        for _ in range(3):
            assert call(client).endpoint == good.base_url
        assert limited.posts == 1 and idle(client)


@CHATS
def test_retry_after_is_capped_at_max_backoff_s(call: Call, good: ScriptServer) -> None:
    with ScriptServer(busy(429, "86400")) as limited:
        client = RoutingClient(
            [limited.base_url, good.base_url],
            model="m",
            policy="round-robin",
            backoff_s=0.01,
            max_backoff_s=0.3,
        )
        call(client)
        time.sleep(0.1)
        assert not healthy(client, limited.base_url)
        time.sleep(0.35)
        assert healthy(client, limited.base_url)


def test_retry_after_values() -> None:
    assert _retry_after_s("12", cap_s=30.0) == 12.0
    assert _retry_after_s("12", cap_s=5.0) == 5.0
    assert 8.0 < _retry_after_s(http_date(10), cap_s=30.0) <= 10.0
    assert _retry_after_s(http_date(-10), cap_s=30.0) == 0.0  # a date in the past
    for ignored in (None, "", "soon", "-3", "nan", "inf", "Mon, 99 Foo 2024"):
        assert _retry_after_s(ignored, cap_s=30.0) == 0.0


# ----------------------------------------------------------- item 10: credentials


SECRETS = ("s3cretpw", "sk-s3cretkey")


def shown(*things: object) -> str:
    return "\n".join(str(t) + repr(t) for t in things)


@CHATS
def test_url_credentials_and_api_keys_never_show(
    call: Call, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with ScriptServer(Reply([b"overloaded"], status=503, headers={})) as down:
        url = down.base_url.replace("http://", "http://user:s3cretpw@")
        endpoint = Endpoint(url, api_key="sk-s3cretkey")
        client = RoutingClient([endpoint], model="m", metrics=True, max_attempts=2)
        with pytest.raises(RoutingError) as caught:
            call(client)
        assert (
            down.headers[0]["Authorization"]
            == "Basic " + base64.b64encode(b"user:s3cretpw").decode()
        )  # the credentials are still sent, as HTTP basic auth
    assert client.metrics is not None
    text = shown(
        caught.value,
        caught.value.attempts,
        endpoint,
        client.replicas,
        caplog.text,
        client.metrics.exposition().decode(),
    )
    assert "127.0.0.1" in text and "***" in text
    assert not [secret for secret in SECRETS if secret in text]


def test_an_answer_and_a_rejection_hide_the_credentials_too() -> None:
    echo = [b"bad key sk-s3cretkey for user:s3cretpw"]
    rejection, refusal = Reply(echo, status=400, headers={}), Reply(echo, status=401, headers={})
    with ScriptServer(Reply(stream("fine")), rejection, refusal) as server:
        url = server.base_url.replace("http://", "http://user:s3cretpw@")
        client = RoutingClient([Endpoint(url, api_key="sk-s3cretkey")], model="m", max_attempts=1)
        answer = client.chat(QUESTION)
        with pytest.raises(EndpointError) as rejected:
            client.chat(QUESTION)
        with pytest.raises(RoutingError) as refused:  # a 401 is the endpoint's fault
            client.chat(QUESTION)
    assert answer.text == "fine" and answer.endpoint == url.replace("user:s3cretpw", "***")
    text = shown(answer, rejected.value, refused.value, refused.value.attempts)
    assert "bad key ***" in text and not [secret for secret in SECRETS if secret in text]
    with pytest.raises(ConfigError) as bad:
        Endpoint("ftp://user:s3cretpw@host/v1")
    assert "s3cretpw" not in str(bad.value)


def test_an_engine_echoing_the_basic_auth_header_shows_no_credentials() -> None:
    token = base64.b64encode(b"user:s3cret@pw").decode()  # decodes to the password
    echo = [f"bad header Basic {token}; raw s3cret%40pw".encode()]
    rejection, refusal = Reply(echo, status=400, headers={}), Reply(echo, status=401, headers={})
    with ScriptServer(rejection, refusal) as server:
        url = server.base_url.replace("http://", "http://user:s3cret%40pw@")
        client = RoutingClient([Endpoint(url)], model="m", max_attempts=1)
        with pytest.raises(EndpointError) as rejected:
            client.chat(QUESTION)
        with pytest.raises(RoutingError) as refused:
            client.chat(QUESTION)
    text = shown(rejected.value, refused.value, refused.value.attempts)
    assert "bad header Basic ***" in text
    assert not [secret for secret in (token, "s3cret%40pw", "s3cret@pw") if secret in text]
    assert rejected.value.reason.startswith("bad header") and "127.0.0.1" not in (
        rejected.value.reason
    )


def test_an_api_key_alone_is_sent_as_a_bearer_token(good: ScriptServer) -> None:
    client = RoutingClient([Endpoint(good.base_url, api_key="sk-s3cretkey")], model="m")
    client.chat(QUESTION)
    assert good.headers[0]["Authorization"] == "Bearer sk-s3cretkey"
