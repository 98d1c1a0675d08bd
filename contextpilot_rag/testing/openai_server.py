"""An OpenAI-compatible HTTP server for tests and examples, on the standard library only.

:class:`OpenAICompatibleServer` answers ``POST /v1/chat/completions``, ``POST
/v1/completions``, ``GET /v1/models`` and ``GET /health`` on loopback, streamed (SSE) or
not, like an inference engine with automatic prefix caching: every prompt is tokenized
and admitted to the server's own :class:`~contextpilot_rag.sim.prefix_cache.PrefixCacheModel`,
and the hit is reported as ``usage.prompt_tokens_details.cached_tokens``. Real clients
(``openai``, LangChain's ``ChatOpenAI``, LlamaIndex's ``OpenAILike``) work unchanged::

    with OpenAICompatibleServer() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        client.chat.completions.create(model="test-model", messages=[...])

A chat prompt is tokenized as :class:`~contextpilot_rag.sim.replay.EngineTokenizer`
does it: ``<|role|>\\n{content}\\n`` per message, each message encoded on its own (text
parts of a list content are joined with ``"\\n"``, as vLLM does). A completions prompt
is encoded as it is. Only prompt tokens are admitted to the cache, not the reply.

A top-level ``cache_salt`` (a non-empty string of at most 128 characters without
``@``, ``/``, ``\\`` or NUL, as vLLM 0.32 takes it; anything else is HTTP 400) is
mixed into the first block's hash, as vLLM does: a salted prompt shares no cached block
with a prompt of another salt or of none.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..lifecycle import Startable
from ..sim.prefix_cache import CacheResult, PrefixCacheModel, salted_tokens
from ..tokenizers import Tokenizer, default_tokenizer

__all__ = ["OWNED_BY", "OpenAICompatibleServer", "ReplyFunction", "default_reply"]

logger = logging.getLogger(__name__)

ReplyFunction = Callable[[list[dict[str, Any]]], str]
"""Makes the reply text from a request's messages (OpenAI chat format)."""

OWNED_BY = "contextpilot-test"
"""The ``owned_by`` field of the served model in ``GET /v1/models``."""

_BLOCK_HEADER = re.compile(r"^\[[^\[\]\s]+\]$", re.MULTILINE)
_MAX_SALT_CHARS = 128  # vLLM's limits (0.32: validate_cache_salt)
_SALT_FORBIDDEN = frozenset("@/\\\x00")
_WORD_START = re.compile(r"(?<=\S)(?=\s)")
_JSON = dict[str, Any]


def default_reply(messages: Sequence[dict[str, Any]]) -> str:
    """``"Answer from {n} context documents."``, where ``n`` counts the block headers
    (lines that are only ``[label]``, as :func:`~contextpilot_rag.render_block` writes
    them) in the last user message; ``n`` is 0 when there is no user message."""
    users = [message for message in messages if message.get("role") == "user"]
    try:
        text = _content_text(users[-1].get("content"), "content") if users else ""
    except _RequestError:
        text = ""
    return f"Answer from {len(_BLOCK_HEADER.findall(text))} context documents."


class _RequestError(Exception):
    """A request answered with an OpenAI-style error instead of a completion."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = "invalid_request_error" if status < 500 else "server_error"

    def body(self) -> _JSON:
        """The JSON error object, as the OpenAI API writes it."""
        return {
            "error": {"message": self.message, "type": self.error_type, "param": None, "code": None}
        }


@dataclass(frozen=True)
class _Options:
    """Request fields that shape the answer, shared by both completion endpoints."""

    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    cache_salt: str | None = None


@dataclass(frozen=True)
class _ParsedRequest:
    """A validated completion request. ``segments`` are the prompt's pieces, each
    tokenized on its own; ``messages`` is what the reply function receives."""

    kind: Literal["chat", "text"]
    segments: tuple[str, ...]
    messages: list[dict[str, Any]]
    options: _Options


def _parse_chat(body: _JSON) -> _ParsedRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _RequestError("'messages' must be a non-empty list of message objects")
    segments = tuple(_chat_segment(index, message) for index, message in enumerate(messages))
    return _ParsedRequest("chat", segments, messages, _parse_options(body))


def _parse_completion(body: _JSON) -> _ParsedRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _RequestError("'prompt' must be a non-empty string or a list of one")
    messages = [{"role": "user", "content": prompt}]
    return _ParsedRequest("text", (prompt,), messages, _parse_options(body))


def _chat_segment(index: int, message: object) -> str:
    """The text an engine's chat template makes of one message."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _RequestError(f"messages[{index}] must be an object with a string 'role'")
    text = _content_text(message.get("content"), f"messages[{index}].content")
    return f"<|{message['role']}|>\n{text}\n"


def _content_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(part, f"{where}[{i}]") for i, part in enumerate(content))
    raise _RequestError(f"{where} must be a string, a list of text parts or null")


def _part_text(part: object, where: str) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return cast(str, part["text"])
    raise _RequestError(f"{where} must be {{'type': 'text', 'text': <string>}} (only text parts)")


def _parse_options(body: _JSON) -> _Options:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _RequestError("'model' must be a string")
    stream = _optional_bool(body.get("stream"), "stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _RequestError("'stream_options' must be an object or null")
    if stream_options is not None and not stream:
        raise _RequestError("'stream_options' is only allowed when 'stream' is true")
    if body.get("n") not in (None, 1):
        raise _RequestError(f"only n=1 is served, got n={body.get('n')!r}")
    include_usage = _optional_bool((stream_options or {}).get("include_usage"), "include_usage")
    return _Options(model, stream, include_usage, _max_tokens(body), _cache_salt(body))


def _cache_salt(body: _JSON) -> str | None:
    if "cache_salt" not in body or body["cache_salt"] is None:
        return None
    salt = body["cache_salt"]
    if (
        not isinstance(salt, str)
        or not salt
        or len(salt) > _MAX_SALT_CHARS
        or _SALT_FORBIDDEN.intersection(salt)
    ):
        raise _RequestError(
            f"'cache_salt' must be a non-empty string of at most {_MAX_SALT_CHARS} "
            "characters without '@', '/', '\\' or NUL"
        )
    return salt


def _optional_bool(value: object, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _RequestError(f"'{name}' must be a boolean")
    return value


def _max_tokens(body: _JSON) -> int | None:
    """``max_completion_tokens`` (the newer name) or else ``max_tokens``; None if neither."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _RequestError(f"'{name}' must be an integer >= 1")
        return value
    return None


def _json_body(raw: bytes) -> _JSON:
    try:
        body = json.loads(raw)
    except ValueError:
        raise _RequestError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _RequestError("request body must be a JSON object")
    return body


@dataclass(frozen=True)
class _Answer:
    """The reply as sent: possibly cut to ``max_tokens`` (then ``finish_reason`` is
    ``"length"``)."""

    text: str
    finish_reason: Literal["stop", "length"]
    completion_tokens: int


@dataclass(frozen=True)
class _Outcome:
    answer: _Answer
    usage: _JSON


def _split_words(text: str) -> list[str]:
    """``text`` cut where whitespace follows a word, so each piece but the first starts
    with whitespace (as BPE tokens do: ``"Answer", " from"``); the pieces join back to
    ``text``. These are the content deltas of a streamed reply."""
    return [piece for piece in _WORD_START.split(text) if piece]


def _limit_answer(text: str, tokenizer: Tokenizer, max_tokens: int | None) -> _Answer:
    """``text``, or its longest run of leading words within ``max_tokens`` tokens."""
    tokens = tokenizer.count(text)
    if max_tokens is None or tokens <= max_tokens:
        return _Answer(text, "stop", tokens)
    words, kept = _split_words(text), ""
    for word in words:
        if tokenizer.count(kept + word) > max_tokens:
            break
        kept += word
    if not kept and max_tokens >= 1:  # an engine decodes a token at least: a word's head
        head = words[0]
        within = (
            head[:n] for n in range(len(head), 0, -1) if tokenizer.count(head[:n]) <= max_tokens
        )
        kept = next(within, head[:1])
    return _Answer(kept, "length", tokenizer.count(kept))


def _usage(cached: CacheResult, completion_tokens: int) -> _JSON:
    return {
        "prompt_tokens": cached.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": cached.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached.cached_tokens},
    }


class _Engine:
    """The simulated inference engine behind the HTTP layer: makes replies, admits
    prompts to the prefix cache and records request bodies. Thread-safe.

    Invariant: ``_requests[i]`` is the body of the i-th prompt admitted to ``cache``
    since the last reset (both change together, under ``_lock``)."""

    def __init__(
        self,
        *,
        model: str,
        cache: PrefixCacheModel,
        reply: ReplyFunction,
        tokenizer: Tokenizer,
        token_delay_s: float,
    ) -> None:
        self.model = model
        self.cache = cache
        self.token_delay_s = token_delay_s
        self._reply = reply
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._requests: list[_JSON] = []
        self._disconnects = 0

    def disconnect_next(self, count: int) -> None:
        with self._lock:
            self._disconnects += count

    def take_disconnect(self) -> bool:
        """Whether to drop this request (consumes one of :meth:`disconnect_next`)."""
        with self._lock:
            if self._disconnects <= 0:
                return False
            self._disconnects -= 1
            return True

    def requests(self) -> list[_JSON]:
        with self._lock:
            return copy.deepcopy(self._requests)

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()
            self.cache.reset()

    def complete(self, request: _ParsedRequest, body: _JSON) -> _Outcome:
        """Answer ``request``: reply text, cache admission, usage."""
        text = self._reply_text(request.messages)
        tokens = [
            token for segment in request.segments for token in self._tokenizer.encode(segment)
        ]
        tokens = salted_tokens(tokens, request.options.cache_salt)
        with self._lock:
            self._requests.append(body)
            cached = self.cache.admit(tokens)
        answer = _limit_answer(text, self._tokenizer, request.options.max_tokens)
        return _Outcome(answer, _usage(cached, answer.completion_tokens))

    def _reply_text(self, messages: list[dict[str, Any]]) -> str:
        try:
            text = self._reply(copy.deepcopy(messages))
        except Exception as exc:
            logger.warning("the reply function failed", exc_info=True)
            raise _RequestError(f"reply function failed: {exc!r}", status=500) from exc
        if not isinstance(text, str):
            raise _RequestError(
                f"reply function returned {type(text).__name__}, not str",
                status=500,
            )
        return text


@dataclass(frozen=True)
class _Envelope:
    """The fields every response object and chunk of one completion share."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, id_prefix: str, model: str) -> _Envelope:
        return cls(f"{id_prefix}-{uuid.uuid4().hex[:24]}", int(time.time()), model)

    def wrap(self, object_name: str, choices: list[_JSON], usage: _JSON | None = None) -> _JSON:
        payload: _JSON = {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return payload


class _Format(Protocol):
    """How one endpoint writes a whole response and the chunks of a streamed one."""

    id_prefix: ClassVar[str]

    def __init__(self, envelope: _Envelope) -> None: ...
    def response(self, answer: _Answer, usage: _JSON) -> _JSON: ...
    def opening(self) -> list[_JSON]: ...
    def delta(self, piece: str) -> _JSON: ...
    def closing(self, finish_reason: str) -> _JSON: ...
    def usage_chunk(self, usage: _JSON) -> _JSON: ...


class _ChatFormat:
    """``chat.completion`` objects and ``chat.completion.chunk`` stream chunks."""

    id_prefix: ClassVar[str] = "chatcmpl"

    def __init__(self, envelope: _Envelope) -> None:
        self._envelope = envelope

    def response(self, answer: _Answer, usage: _JSON) -> _JSON:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": answer.text},
            "logprobs": None,
            "finish_reason": answer.finish_reason,
        }
        return self._envelope.wrap("chat.completion", [choice], usage)

    def opening(self) -> list[_JSON]:
        return [self._chunk({"role": "assistant", "content": ""}, None)]

    def delta(self, piece: str) -> _JSON:
        return self._chunk({"content": piece}, None)

    def closing(self, finish_reason: str) -> _JSON:
        return self._chunk({}, finish_reason)

    def usage_chunk(self, usage: _JSON) -> _JSON:
        return self._envelope.wrap("chat.completion.chunk", [], usage)

    def _chunk(self, delta: _JSON, finish_reason: str | None) -> _JSON:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope.wrap("chat.completion.chunk", [choice])


class _TextFormat:
    """``text_completion`` objects; streamed chunks are ``text_completion`` objects too."""

    id_prefix: ClassVar[str] = "cmpl"

    def __init__(self, envelope: _Envelope) -> None:
        self._envelope = envelope

    def response(self, answer: _Answer, usage: _JSON) -> _JSON:
        return self._envelope.wrap(
            "text_completion", [self._choice(answer.text, answer.finish_reason)], usage
        )

    def opening(self) -> list[_JSON]:
        return []

    def delta(self, piece: str) -> _JSON:
        return self._envelope.wrap("text_completion", [self._choice(piece, None)])

    def closing(self, finish_reason: str) -> _JSON:
        return self._envelope.wrap("text_completion", [self._choice("", finish_reason)])

    def usage_chunk(self, usage: _JSON) -> _JSON:
        return self._envelope.wrap("text_completion", [], usage)

    @staticmethod
    def _choice(text: str, finish_reason: str | None) -> _JSON:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _stream_payloads(
    fmt: _Format, outcome: _Outcome, *, include_usage: bool, delay_s: float
) -> Iterator[str]:
    """The SSE ``data:`` payloads of a streamed answer, pausing ``delay_s`` before each
    content delta (so the first token, too, arrives after one delay)."""
    for chunk in fmt.opening():
        yield json.dumps(chunk)
    for piece in _split_words(outcome.answer.text):
        if delay_s:
            time.sleep(delay_s)
        yield json.dumps(fmt.delta(piece))
    yield json.dumps(fmt.closing(outcome.answer.finish_reason))
    if include_usage:
        yield json.dumps(fmt.usage_chunk(outcome.usage))
    yield "[DONE]"


class _Handler(BaseHTTPRequestHandler):
    """One connection: routes requests to the engine and writes JSON or SSE replies.
    Request errors become OpenAI-style JSON errors; nothing escapes to the server."""

    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # answer even a garbled request line with a status
    server_version = "contextpilot-test"
    timeout = 30.0  # an idle keep-alive connection's thread ends after this
    server: _HTTPServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol-level errors (a malformed request line or headers, an unsupported
        method) as OpenAI-style JSON too; the connection is closed after them."""
        self.close_connection = True
        self._send_error(_RequestError(message or HTTPStatus(code).phrase, status=code))

    def _dispatch(self, method: str) -> None:
        self._streaming = False
        try:
            raw = self._read_body() if method != "GET" else b""
            handler = self._route(method, urlsplit(self.path).path)
            if method == "POST" and self.server.engine.take_disconnect():
                self.close_connection = True  # read the request, answer nothing
                return
            handler(raw)
        except _RequestError as error:
            self._send_error(error)
        except ConnectionError:
            self.close_connection = True
        except Exception:
            logger.exception("unexpected error answering %s %s", method, self.path)
            if self._streaming:  # too late for an error status
                self.close_connection = True
            else:
                self._send_error(_RequestError("internal server error", status=500))

    def _routes(self) -> dict[tuple[str, str], Callable[[bytes], None]]:
        """(method, path) → the handler of the request body; subclasses serve others."""
        return {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/chat/completions"): self._chat_completions,
            ("POST", "/v1/completions"): self._completions,
        }

    def _route(self, method: str, path: str) -> Callable[[bytes], None]:
        routes = self._routes()
        path = path.rstrip("/") or "/"
        handler = routes.get((method, path))
        if handler is not None:
            return handler
        if any(known == path for _, known in routes):
            raise _RequestError(f"method {method} is not allowed on {path}", status=405)
        raise _RequestError(f"no such endpoint: {method} {path}", status=404)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise _RequestError("chunked request bodies are not supported; send Content-Length")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise _RequestError("invalid Content-Length header")
        return self.rfile.read(length)

    def _health(self, _raw: bytes) -> None:
        self._send_json(200, {"status": "ok"})

    def _models(self, _raw: bytes) -> None:
        model = {
            "id": self.server.engine.model,
            "object": "model",
            "created": self.server.started,
            "owned_by": OWNED_BY,
        }
        self._send_json(200, {"object": "list", "data": [model]})

    def _chat_completions(self, raw: bytes) -> None:
        body = _json_body(raw)
        self._answer(_parse_chat(body), body, _ChatFormat)

    def _completions(self, raw: bytes) -> None:
        body = _json_body(raw)
        self._answer(_parse_completion(body), body, _TextFormat)

    def _answer(self, request: _ParsedRequest, body: _JSON, format_type: type[_Format]) -> None:
        engine = self.server.engine
        outcome = engine.complete(request, body)
        envelope = _Envelope.new(format_type.id_prefix, request.options.model or engine.model)
        fmt = format_type(envelope)
        if not request.options.stream:
            self._send_json(200, fmt.response(outcome.answer, outcome.usage))
            return
        payloads = _stream_payloads(
            fmt, outcome, include_usage=request.options.include_usage, delay_s=engine.token_delay_s
        )
        self._send_event_stream(payloads)

    def _send_error(self, error: _RequestError) -> None:
        self._send_json(error.status, error.body())

    def _send_json(self, status: int, payload: _JSON) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _send_event_stream(self, payloads: Iterator[str]) -> None:
        self._send_sse(f"data: {payload}\n\n".encode() for payload in payloads)

    def _send_sse(self, frames: Iterator[bytes]) -> None:
        """A 200 ``text/event-stream`` response of whole SSE frames, chunked."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._streaming = True
        for frame in frames:
            self._write_chunk(frame)
        self._write_chunk(b"")  # the empty chunk ends the body

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


class _HTTPServer(ThreadingHTTPServer):
    """Serves one engine, a thread per connection. Keeps the open connections so
    :meth:`close_connections` can end idle keep-alive ones when the server stops."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self, address: tuple[str, int], engine: Any, handler: type[_Handler] | None = None
    ) -> None:
        self.engine = engine
        self.started = int(time.time())  # the models' ``created``
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler or _Handler)

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Shut down every open connection (their handler threads then end)."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("error on the connection from %s", client_address, exc_info=True)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _LoopbackServer(Startable):
    """Serves one engine over HTTP from a daemon thread: start, stop, port. Subclasses
    give the engine and the handler type (a :class:`_Handler` subclass whose routes
    call the engine); ``thread_name`` names the serving thread."""

    thread_name: ClassVar[str] = "loopback-test-server"

    def __init__(self, *, host: str, port: int, engine: Any, handler: type[_Handler]) -> None:
        self._host = host
        self._port = port
        self._serving = (engine, handler)
        self._lifecycle_lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port. Raises ``RuntimeError`` when the server is not running."""
        return int(self._running().server_address[1])

    @property
    def root_url(self) -> str:
        """``http://<host>:<port>``. Raises ``RuntimeError`` when not running."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server is serving."""
        return self._httpd is not None

    def start(self: _S) -> _S:
        """Bind (port 0: a free port) and serve in a daemon thread. No-op if running."""
        with self._lifecycle_lock:
            if self._httpd is None:
                server_type = _HTTPServer6 if ":" in self._host else _HTTPServer
                httpd = server_type((self._host, self._port), *self._serving)
                thread = threading.Thread(
                    target=httpd.serve_forever,
                    kwargs={"poll_interval": 0.05},
                    name=f"{self.thread_name}-{httpd.server_address[1]}",
                    daemon=True,
                )
                thread.start()
                self._httpd, self._thread = httpd, thread
        return self

    def stop(self) -> None:
        """Stop serving, close the port and open connections, join the thread.
        Idempotent; the server may be started again afterwards."""
        with self._lifecycle_lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
            if httpd is None or thread is None:
                return
            httpd.shutdown()
            httpd.close_connections()
            httpd.server_close()
            thread.join()

    def _running(self) -> _HTTPServer:
        httpd = self._httpd
        if httpd is None:
            raise RuntimeError("the server is not running; call start() or use it in a with block")
        return httpd


_S = TypeVar("_S", bound=_LoopbackServer)


class OpenAICompatibleServer(_LoopbackServer):
    """An OpenAI-compatible server on loopback for tests and examples.

    ``reply(messages)`` makes the answer text (default: :func:`default_reply`); for
    ``/v1/completions`` it receives ``[{"role": "user", "content": prompt}]``. Streamed
    replies are sent one word per chunk, ``token_delay_s`` before each. ``max_tokens``
    (or ``max_completion_tokens``) cuts the reply to whole words within that many
    tokens, with ``finish_reason="length"``. Any ``model`` name is accepted and echoed.

    ``requests`` lists the bodies of the completion requests answered (not of those
    rejected), in the order their prompts were admitted to ``cache``.
    """

    thread_name: ClassVar[str] = "openai-test-server"

    def __init__(
        self,
        *,
        model: str = "test-model",
        host: str = "127.0.0.1",
        port: int = 0,
        block_size: int = 16,
        cache_capacity_tokens: int | None = None,
        reply: ReplyFunction | None = None,
        tokenizer: Tokenizer | None = None,
        token_delay_s: float = 0.0,
    ) -> None:
        _validate(model=model, host=host, port=port, reply=reply, token_delay_s=token_delay_s)
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            raise ConfigError("tokenizer must implement the Tokenizer protocol (encode, count)")
        self.cache = PrefixCacheModel(block_size=block_size, capacity_tokens=cache_capacity_tokens)
        self._engine = _Engine(
            model=model,
            cache=self.cache,
            reply=reply or default_reply,
            tokenizer=tokenizer or default_tokenizer(),
            token_delay_s=float(token_delay_s),
        )
        super().__init__(host=host, port=port, engine=self._engine, handler=_Handler)

    @property
    def model(self) -> str:
        """The model id served by ``/v1/models``."""
        return self._engine.model

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>/v1``. Raises ``RuntimeError`` when not running."""
        return f"{self.root_url}/v1"

    # -- the real-engine benchmark's engine target (bench.engine_suite.EngineTarget) --

    @property
    def model_name(self) -> str:
        """:attr:`model`, as the benchmark suite names it."""
        return self.model

    @property
    def block_size(self) -> int:
        """The prefix cache's block size in tokens."""
        return self.cache.block_size

    @property
    def kv_cache_tokens(self) -> int | None:
        """The prefix cache's capacity in tokens (``None``: unbounded)."""
        return self.cache.capacity_tokens

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache (the recorded requests stay); always ``True``."""
        self.cache.reset()
        return True

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of the JSON bodies of the answered completion requests, in order."""
        return self._engine.requests()

    def reset(self) -> None:
        """Forget the recorded requests and empty the prefix cache."""
        self._engine.reset()

    def disconnect_next(self, count: int = 1) -> None:
        """Read the next ``count`` completion requests and close their connections
        without an answer, as a server does that times out a keep-alive connection just
        as a request arrives on it (the client sees it disconnect before any response)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"count must be an integer >= 0, got {count!r}")
        self._engine.disconnect_next(count)


def _validate(
    *, model: object, host: object, port: object, reply: object, token_delay_s: object
) -> None:
    if not isinstance(model, str) or not model:
        raise ConfigError(f"model must be a non-empty string, got {model!r}")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"host must be a non-empty string, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port must be an integer in 0..65535 (0: any free port), got {port!r}")
    if reply is not None and not callable(reply):
        raise ConfigError("reply must be a callable taking the messages, or None")
    if (
        isinstance(token_delay_s, bool)
        or not isinstance(token_delay_s, (int, float))
        or not token_delay_s >= 0
    ):
        raise ConfigError(f"token_delay_s must be a number >= 0, got {token_delay_s!r}")
