"""``RoutingClient``: an OpenAI-compatible client that routes every request over a fleet
of endpoints with a routing policy and feeds what the engines report back to it.

::

    client = RoutingClient(["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"],
                           model="qwen2.5-7b", policy="combined")
    result = client.chat(pilot.optimize(question, blocks))   # a Prompt or chat messages
    result.text, result.endpoint, result.ttft_s, result.cached_tokens

Every request is streamed from the engine (also by :meth:`RoutingClient.chat`), so
TTFT is measured at the first content token (an engine that ignores ``stream`` and
answers one JSON object is read whole). Per endpoint the client keeps live
``in_flight`` and ``queued_tokens`` counters (a prompt is queued from dispatch to its
first token) on every path — success, failure, timeout, cancellation — and a circuit
breaker: a transport error, a 5xx/429 answer or a malformed reply opens it for an
exponentially growing backoff (or the answer's ``Retry-After``, seconds or an HTTP-date,
if longer; at most ``max_backoff_s`` either way), after which one request may try again.

Feedback: the engine's ``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang,
OpenAI) or ``timings.cache_n`` (llama-server) goes to ``policy.observe`` with the
measured TTFT and end-to-end time, which trims routes the engine disproved; its
``usage.prompt_tokens`` refines the character-per-token estimate of the route keys
(:mod:`~contextpilot_rag.routing.prompt_keys`).

Failures: a transport error, a 5xx/429 answer, a reply of the wrong shape (JSON that
is not the OpenAI format), ``timeout_s`` without a stream event (SSE keep-alive comments
are no progress) or a stream that ends early makes the client retry on another
``(endpoint, model)`` (the failed one excluded) up to ``max_attempts``. A stream
(:meth:`RoutingClient.stream`) already partly delivered resumes after the delivered
text when the retry reproduces it, and fails with :class:`RoutingError` when it
diverges or ends shorter: the caller never gets less than it was given. ``chat`` and
``complete`` have delivered nothing, so they take the retry's whole answer. With
``deadline_s`` no call (all its attempts and waits) outlasts it: :class:`RoutingError`.
Other 4xx answers are the caller's error and raise :class:`EndpointError` at once.
Credentials in a base URL (``http://user:key@host/v1``, sent as HTTP basic auth) and API
keys never appear in results, errors, logs or metrics: the URL shows as
:attr:`Endpoint.display_url` (``http://***@host/v1``).
:meth:`RoutingClient.solve` retries until ``verify`` accepts an answer, excluding each
``(endpoint, model)`` already tried, and reports the time to a correct answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import email.utils
import itertools
import json
import logging
import math
import operator
import threading
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast
from urllib.parse import unquote

import httpx

from ..errors import ConfigError, ContextPilotError, InvalidInputError
from ..pilot import ContextPilot
from ..prompt import Prompt
from .common import route_memory
from .gorgo import PrefixLocations
from .metrics import DecisionRecord, RoutingMetrics, decision_log, route_table_entries
from .prompt_keys import (
    ChatTemplate,
    PromptInput,
    PromptKeys,
    PromptText,
    chat_template,
    serialise,
)
from .ranvier import RouteTable
from .types import Decision, Outcome, Policy, ReplicaState, RouteRequest

__all__ = [
    "AsyncChatStream",
    "Attempt",
    "ChatResult",
    "ChatStream",
    "Endpoint",
    "EndpointError",
    "OwnedClient",
    "RoutingClient",
    "RoutingError",
    "SolveResult",
    "client_source",
]

logger = logging.getLogger(__name__)

Kind = Literal["chat", "completion"]


class RoutingError(ContextPilotError, RuntimeError):
    """Every attempt failed (or a resumed stream diverged); ``attempts`` says how."""

    def __init__(self, message: str, attempts: Sequence[Attempt] = ()) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)


class EndpointError(ContextPilotError, RuntimeError):
    """An endpoint rejected the request itself (a 4xx other than 429): not retried."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible server. ``models`` it serves (empty: the client's
    ``model``); ``rtt_s`` the network round trip if known (else measured by
    :meth:`RoutingClient.probe`, 0 until then); the rates feed the cost policies.

    ``slot``: a llama-server slot (``-np``) to address: every request carries it as
    ``id_slot``, and the endpoint is a routing target of its own (:attr:`target`,
    its own counters and breaker), so several slots of one server may be listed.
    ``max_cached_prompts``: how many of its most recent prompts the endpoint keeps
    cached (a llama-server slot keeps 1), ``None`` for a prefix cache that keeps
    earlier prefixes; the route table of the ``combined``, ``gorgo`` and ``ranvier``
    policies then forgets prefixes newer prompts have overwritten."""

    base_url: str
    models: tuple[str, ...] = ()
    region: str = "local"
    rtt_s: float | None = None
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0
    api_key: str | None = field(default=None, repr=False)
    slot: int | None = None
    max_cached_prompts: int | None = None

    def __post_init__(self) -> None:
        url = self.base_url
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            shown = _split_credentials(url)[0] if isinstance(url, str) else url
            raise ConfigError(f"base_url must start with http:// or https://, got {shown!r}")
        object.__setattr__(self, "base_url", url.rstrip("/"))
        _Secrets.attach(self)
        if isinstance(self.models, str) or not all(isinstance(m, str) and m for m in self.models):
            raise ConfigError("models must be a tuple of non-empty model names")
        object.__setattr__(self, "models", tuple(self.models))
        if self.rtt_s is not None and self.rtt_s < 0:
            raise ConfigError(f"rtt_s must be >= 0, got {self.rtt_s}")
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ConfigError("prefill_tokens_per_s and decode_tokens_per_s must be > 0")
        for name in ("slot", "max_cached_prompts"):
            value, least = getattr(self, name), 0 if name == "slot" else 1
            if value is not None and (type(value) is not int or value < least):
                raise ConfigError(f"{name} must be None or an integer >= {least}, got {value!r}")

    @property
    def display_url(self) -> str:
        """``base_url`` with its credentials (``user:password@``) shown as ``***@``:
        what results, errors, logs and metrics name the endpoint by."""
        return _Secrets.of(self).display_url

    @property
    def target(self) -> str:
        """The routing target: :attr:`display_url`, or ``display_url#slot<n>`` for a slot."""
        url = self.display_url
        return url if self.slot is None else f"{url}#slot{self.slot}"

    def __repr__(self) -> str:  # the dataclass's, with the URL's credentials redacted
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)[1:] if f.repr]
        return f"Endpoint(base_url={self.display_url!r}, {', '.join(shown)})"


class _Secrets:
    """What an :class:`Endpoint` sends but never shows: its URL split from the
    credentials, the ``Authorization`` header they make (URL credentials as HTTP basic
    auth, as httpx would send them, else ``api_key`` as a bearer token), and the secret
    strings to scrub from any text shown."""

    __slots__ = ("display_url", "headers", "request_url", "secrets")

    def __init__(self, endpoint: Endpoint) -> None:
        self.display_url, self.request_url, userinfo = _split_credentials(endpoint.base_url)
        self.headers: dict[str, str] = {}
        if endpoint.api_key:
            self.headers["Authorization"] = f"Bearer {endpoint.api_key}"
        user, _, password = userinfo.partition(":")
        user, password = unquote(user), unquote(password)
        if userinfo:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        found = (userinfo, password or user, endpoint.api_key or "")
        self.secrets = tuple(s for s in sorted(set(found), key=len, reverse=True) if len(s) > 2)

    @staticmethod
    def attach(endpoint: Endpoint) -> None:
        object.__setattr__(endpoint, "_secrets", _Secrets(endpoint))

    @staticmethod
    def of(endpoint: Endpoint) -> _Secrets:
        return cast(_Secrets, endpoint.__dict__["_secrets"])

    def scrub(self, text: str) -> str:
        """``text`` with every secret of the endpoint replaced by ``***``."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def _split_credentials(url: str) -> tuple[str, str, str]:
    """``(display URL, URL without credentials, userinfo)`` of ``url``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return url, url, ""
    return f"{scheme}{sep}***@{host}{slash}{path}", f"{scheme}{sep}{host}{slash}{path}", userinfo


@dataclass(frozen=True)
class ChatResult:
    """One answered request. ``endpoint`` is the base URL that answered (its
    :attr:`Endpoint.display_url`: credentials redacted); token counts
    are the engine's (``None`` when it reported none). ``ttft_s`` and ``e2e_s`` count
    from the start of the answering attempt, time the policy held it included (late
    binding: the client keeps a held request and offers it to the policy again when
    one of its prompts is prefilled, or after the policy's ``hold_s`` at the latest,
    nothing sent and no endpoint counter touched meanwhile)."""

    text: str
    endpoint: str
    model: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    decision: Decision
    attempts: int = 1
    tool_calls: tuple[dict[str, Any], ...] = ()
    """The tool calls of a chat answer, in the OpenAI format (``id``, ``type``,
    ``function.name``, ``function.arguments`` as a JSON string), streamed fragments
    joined."""


@dataclass(frozen=True)
class Attempt:
    """One try of a logical request: where (the endpoint's :attr:`~Endpoint.display_url`),
    how long, and how it ended (``error``: credentials redacted)."""

    endpoint: str
    model: str
    latency_s: float
    error: str | None = None
    correct: bool | None = None


@dataclass(frozen=True)
class SolveResult:
    """The outcome of :meth:`RoutingClient.solve`: the accepted answer (or ``None``),
    every attempt, and ``ttca_s`` — the wall time until the accepted answer (or until
    giving up)."""

    answer: ChatResult | None
    attempts: tuple[Attempt, ...]
    ttca_s: float

    @property
    def correct(self) -> bool:
        return self.answer is not None


class _Replica:
    """Live state of one (endpoint, model) pair. Mutated under the client's lock."""

    __slots__ = (
        "decode_rate",
        "endpoint",
        "failures",
        "in_flight",
        "model",
        "open_until",
        "prefill_rate",
        "queued_tokens",
        "replica_id",
        "rtt_s",
    )

    def __init__(self, endpoint: Endpoint, model: str) -> None:
        self.endpoint = endpoint
        self.model = model
        multi = len(endpoint.models) > 1
        self.replica_id = f"{endpoint.target}#{model}" if multi else endpoint.target
        self.in_flight = 0
        self.queued_tokens = 0
        self.rtt_s = endpoint.rtt_s or 0.0
        self.failures = 0
        self.open_until = 0.0
        self.prefill_rate = endpoint.prefill_tokens_per_s
        self.decode_rate = endpoint.decode_tokens_per_s

    def learn(self, uncached: int, ttft_s: float, generated: int, decode_s: float) -> None:
        """Fold one answer into the effective prefill and decode rates (EWMA). The
        prefill rate is measured over the TTFT, so time spent queued behind other
        prompts lowers it: under load, uncached tokens are priced at what they cost."""
        prefill_s = ttft_s - self.rtt_s
        if uncached >= _MIN_RATE_TOKENS and prefill_s > 0:
            self.prefill_rate += _RATE_ALPHA * (uncached / prefill_s - self.prefill_rate)
        if generated >= _MIN_RATE_TOKENS // 8 and decode_s > 0:
            self.decode_rate += _RATE_ALPHA * (generated / decode_s - self.decode_rate)

    def state(self, now: float) -> ReplicaState:
        e = self.endpoint
        return ReplicaState(
            replica_id=self.replica_id,
            model=self.model,
            region=e.region,
            rtt_s=self.rtt_s,
            in_flight=self.in_flight,
            queued_tokens=self.queued_tokens,
            prefill_tokens_per_s=self.prefill_rate,
            decode_tokens_per_s=self.decode_rate,
            healthy=now >= self.open_until,
        )


@dataclass
class _Plan:
    """One dispatched attempt; the counters it holds are released exactly once."""

    replica: _Replica
    request: RouteRequest
    decision: Decision
    body: dict[str, Any]
    url: str
    started: float
    characters: int
    queued: bool = True
    closed: bool = False
    retry_after_s: float = 0.0  # the endpoint's Retry-After, if it answered one

    @property
    def held_s(self) -> float:
        """Time the request waited at the client before dispatch (late binding)."""
        return self.started - self.request.arrival_s


class _Waiter:
    """A request the policy held (late binding), waiting at the client. ``order``:
    (predicted TTFT, arrival number), the order releases offer held requests in;
    ``ready``: the dispatch a release decided for it (counters booked)."""

    __slots__ = ("order", "ready", "request")

    def __init__(self, request: RouteRequest) -> None:
        self.request = request
        self.order = (math.inf, 0)
        self.ready: tuple[Decision, _Replica] | None = None

    def wake(self) -> None:
        """Nudge the waiting caller (from any thread)."""
        raise NotImplementedError


class _ThreadWaiter(_Waiter):
    """A held request of a blocking call."""

    __slots__ = ("event",)

    def __init__(self, request: RouteRequest) -> None:
        super().__init__(request)
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()

    def wait(self, timeout_s: float) -> None:
        self.event.wait(timeout_s)
        self.event.clear()


class _TaskWaiter(_Waiter):
    """A held request of a coroutine on ``loop``."""

    __slots__ = ("event", "loop")

    def __init__(self, request: RouteRequest, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(request)
        self.event = asyncio.Event()
        self.loop = loop

    def wake(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout_s)
        self.event.clear()


@dataclass(frozen=True)
class _Held:
    """The policy held the request: wait for a release or ``wait_s`` (the policy's
    estimate of when the request's wait drops to its threshold), then resume."""

    waiter: _Waiter
    wait_s: float


_HOLD_RECHECK_S = 0.5  # a held request is offered again at least this often
_WAITER_ORDER = operator.attrgetter("order")


@dataclass
class _Reply:
    """What the stream of one attempt delivered."""

    text: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    responded: bool = False  # the response's status line arrived
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by index


class _AttemptFailed(Exception):
    """A failure worth retrying elsewhere (transport, 5xx/429, cut stream)."""


_RETRY_STATUS = {429, 500, 502, 503, 504}
_MIN_RATE_TOKENS = 64  # shorter prefills say more about overheads than about the rate
_RATE_ALPHA = 0.3


def _parse_line(kind: Kind, line: str, reply: _Reply) -> str:
    """Fold one SSE line into ``reply``; returns the content delta (may be empty)."""
    if not line.startswith("data:"):
        return ""
    data = line[5:].strip()
    if data == "[DONE]":
        reply.done = True
        return ""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise _AttemptFailed(f"malformed stream chunk: {data[:80]!r}") from exc
    return _fold(kind, _object(chunk, "stream chunk"), "delta", reply)


def _parse_body(kind: Kind, body: bytes, reply: _Reply) -> str:
    """Fold a whole (non-streamed) JSON reply into ``reply``; returns its text."""
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise _AttemptFailed(f"malformed reply: {body[:80]!r}") from exc
    text = _fold(kind, _object(answer, "reply"), "message", reply)
    reply.done = True
    return text


def _fold(
    kind: Kind, chunk: Mapping[str, Any], part: Literal["delta", "message"], reply: _Reply
) -> str:
    """Fold one stream chunk (``part`` ``"delta"``) or a whole reply (``"message"``)
    into ``reply``; its text. A field of the wrong JSON type is the endpoint's fault."""
    usage = _optional(chunk.get("usage"), "usage")
    timings = _optional(chunk.get("timings"), "timings")
    reply.usage, reply.timings = usage or reply.usage, timings or reply.timings
    choices = chunk.get("choices")
    if not choices:
        return ""
    if not isinstance(choices, list):
        raise _AttemptFailed(f"malformed reply: choices is {type(choices).__name__}, not a list")
    choice = _object(choices[0], "choice")
    finish_reason = _string(choice.get("finish_reason"), "finish_reason")
    if finish_reason:
        reply.finish_reason = finish_reason
    if kind == "completion":
        return _string(choice.get("text"), "text")
    message = _optional(choice.get(part), part)
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _AttemptFailed(f"malformed reply: tool_calls is {type(calls).__name__}, not a list")
    for index, call in enumerate(calls):
        _join_tool_call(reply.tool_calls, _object(call, "tool call"), index)
    return _string(message.get("content"), "content")


def _object(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object; anything else is malformed."""
    if isinstance(value, dict):
        return value
    raise _AttemptFailed(f"malformed reply: {what} is {type(value).__name__}, not an object")


def _optional(value: object, what: str) -> dict[str, Any]:
    """An optional JSON object (``None``: empty)."""
    return {} if value is None else _object(value, what)


def _string(value: object, what: str) -> str:
    """``value`` as a JSON string (``None``: empty); anything else is malformed."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    raise _AttemptFailed(f"malformed reply: {what} is {type(value).__name__}, not a string")


def _join_tool_call(calls: dict[int, dict[str, Any]], fragment: Mapping[str, Any], at: int) -> None:
    """Add one tool-call fragment (streamed, OpenAI: the first of a call carries its
    ``id``, ``type`` and name; later ones pieces of ``arguments``; whole in a
    non-streamed reply, at position ``at`` when it has no ``index``) to ``calls``."""
    index = fragment.get("index", at)
    call = calls.setdefault(
        index if isinstance(index, int) else at,
        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
    )
    if fragment.get("id"):
        call["id"] = str(fragment["id"])
    if fragment.get("type"):
        call["type"] = str(fragment["type"])
    function = _optional(fragment.get("function"), "function")
    call["function"]["name"] += _string(function.get("name"), "function name")
    call["function"]["arguments"] += _string(function.get("arguments"), "function arguments")


def _count(mapping: Mapping[str, Any] | None, key: str) -> int | None:
    """An integer field of an engine's report, ``None`` when absent or not an integer."""
    value = (mapping or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cached_tokens(reply: _Reply) -> int | None:
    details = (reply.usage or {}).get("prompt_tokens_details")
    cached = _count(details if isinstance(details, dict) else None, "cached_tokens")
    return cached if cached is not None else _count(reply.timings, "cache_n")


def _prompt_tokens(reply: _Reply) -> int | None:
    prompt_tokens = _count(reply.usage, "prompt_tokens")
    if prompt_tokens is not None:
        return prompt_tokens
    prompt_n = _count(reply.timings, "prompt_n")
    return None if prompt_n is None else prompt_n + (_count(reply.timings, "cache_n") or 0)


class _Resume:
    """Delivers one logical stream across retries. Invariant: ``_parts`` joined is
    the text handed to a streaming caller, and what a caller got is never taken back:
    a retry must reproduce it (that part is skipped, not delivered again) before it
    delivers more; a retry that diverges from it, or ends before reproducing all of
    it, fails the request. A non-streaming call (``streaming`` false) has handed
    nothing out, so each attempt's text is taken whole."""

    __slots__ = ("_matched", "_parts", "_replay", "stale_retry", "streaming")

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self._parts: list[str] = []
        self._replay = ""  # the delivered text the current attempt has to reproduce
        self._matched = 0  # how much of it the current attempt reproduced so far
        self.stale_retry = True  # one retry on the same endpoint after a stale connection

    def restart(self) -> None:
        """A new attempt begins: it has to reproduce everything delivered so far."""
        self._replay, self._matched = "".join(self._parts), 0

    def feed(self, piece: str) -> str:
        """The part of the attempt's next ``piece`` that is new to the caller."""
        if self._matched < len(self._replay):
            piece = self._reproduce(piece)
        if piece and self.streaming:
            self._parts.append(piece)
        return piece

    def _reproduce(self, piece: str) -> str:
        """Match ``piece`` against the delivered text; the rest of it is new."""
        start = self._matched
        overlap = min(len(piece), len(self._replay) - start)
        if not self._replay.startswith(piece[:overlap], start):
            raise RoutingError("a retried stream diverged from the text already delivered")
        self._matched += overlap
        return piece[overlap:]

    def finish(self) -> None:
        """The attempt ended: it must have reproduced all the delivered text."""
        if self._matched < len(self._replay):
            raise RoutingError(
                f"a retried stream ended after {self._matched} characters, shorter than "
                f"the {len(self._replay)} already delivered"
            )


class ChatStream(Iterator[str]):
    """Text deltas of one routed request; ``result`` once exhausted. ``close()`` (or
    leaving a ``with`` block) cancels it and releases its counters."""

    def __init__(self, deltas: Iterator[str], holder: list[ChatResult]) -> None:
        self._deltas = deltas
        self._holder = holder

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    @property
    def result(self) -> ChatResult:
        if not self._holder:
            raise RuntimeError("the stream has not finished; iterate it to the end first")
        return self._holder[0]

    def close(self) -> None:
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncChatStream:
    """Async twin of :class:`ChatStream` (``async for``; ``aclose()`` cancels)."""

    def __init__(self, deltas: AsyncIterator[str], holder: list[ChatResult]) -> None:
        self._deltas = deltas
        self._holder = holder

    def __aiter__(self) -> AsyncChatStream:
        return self

    async def __anext__(self) -> str:
        return await self._deltas.__anext__()

    @property
    def result(self) -> ChatResult:
        if not self._holder:
            raise RuntimeError("the stream has not finished; iterate it to the end first")
        return self._holder[0]

    async def aclose(self) -> None:
        aclose = getattr(self._deltas, "aclose", None)
        if aclose is not None:
            await aclose()


class RoutingClient:
    """Routes OpenAI-compatible chat/completion requests over ``endpoints``.

    ``endpoints``: base URLs (``http://host:port/v1``) or :class:`Endpoint` objects.
    ``model``: the model to ask for (endpoints listing models serve only those);
    ``None`` routes over every model the endpoints list (accuracy-aware policies).
    ``policy``: a policy name of :func:`~contextpilot_rag.routing.make_policy` or a
    policy object. ``chat_template``: the engines' chat template if known (``"chatml"``,
    ``"llama3"``, ``"gemma"`` or a :class:`~.prompt_keys.ChatTemplate`): route keys then
    follow the text the engine prefills, and completion prompts are scanned for turn
    ends; unknown, message ends are estimated proportionally. ``metrics``: ``True``
    (or a :class:`RoutingMetrics`) keeps Prometheus metrics in :attr:`metrics`
    (:mod:`~contextpilot_rag.routing.metrics`); every finished attempt is also logged as
    JSON on ``contextpilot_rag.routing.decisions``. ``learn_rates``: replace each
    endpoint's configured prefill and decode rates by what its answers show (EWMA of
    uncached tokens over TTFT, completion tokens over decode time), so the policy
    prices uncached tokens at what they cost on the fleet as it is loaded. ``pilot``:
    the :class:`~contextpilot_rag.ContextPilot` that builds the Prompts sent; each
    answer's cache hit goes back to its index (:meth:`ContextPilot.observe_cache`), so
    a predicted hit the engine did not serve is trimmed from the index.

    Time bounds: ``timeout_s`` bounds each attempt's every wait for progress — to
    connect, for the answer's first stream event (TTFT) and between two events; an SSE
    comment (``: ping``) or blank keep-alive line does not count, and each network read
    is bounded by it too. An attempt past it fails over (the endpoint's fault).
    ``deadline_s`` (default ``None``: unbounded) bounds a whole call — every attempt, the
    time held at the client and, for a stream, the time its consumer takes — by wall
    time from the call; past it the call raises :class:`RoutingError` and the endpoint's
    breaker is left alone (the caller's budget ran out, not the endpoint). In
    :meth:`solve` it bounds each answer. ``max_backoff_s`` also caps ``Retry-After``.
    Thread-safe; one client serves sync and async callers."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        model: str | None = None,
        policy: str | Policy = "combined",
        timeout_s: float = 120.0,
        deadline_s: float | None = None,
        max_attempts: int = 3,
        block_tokens: int = 16,
        chars_per_token: float = 4.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
        metrics: bool | RoutingMetrics = False,
        chat_template: str | ChatTemplate | None = None,
        learn_rates: bool = True,
        pilot: ContextPilot | None = None,
    ) -> None:
        if not endpoints:
            raise ConfigError("RoutingClient needs at least one endpoint")
        if timeout_s <= 0 or max_attempts < 1 or backoff_s <= 0 or max_backoff_s < backoff_s:
            raise ConfigError(
                "timeout_s > 0, max_attempts >= 1 and 0 < backoff_s <= max_backoff_s needed"
            )
        if deadline_s is not None and not deadline_s > 0:
            raise ConfigError(f"deadline_s must be None or > 0, got {deadline_s!r}")
        parsed = [e if isinstance(e, Endpoint) else Endpoint(e) for e in endpoints]
        if len({e.target for e in parsed}) != len(parsed):
            raise ConfigError("endpoints must be distinct (base URL and slot)")
        replicas: list[_Replica] = []
        for endpoint in parsed:
            models = endpoint.models or ((model,) if model else ())
            if not models:
                raise ConfigError(
                    f"{endpoint.display_url}: no model; pass model= or Endpoint.models"
                )
            replicas += [_Replica(endpoint, m) for m in models if model is None or m == model]
        if not replicas:
            raise ConfigError(f"no endpoint serves model {model!r}")
        self.model = model
        from . import make_policy  # the package imports this module

        self.policy: Policy = make_policy(policy) if isinstance(policy, str) else policy
        self.max_attempts = max_attempts
        self.deadline_s = deadline_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.keys = PromptKeys(block_tokens=block_tokens, chars_per_token=chars_per_token)
        self.chat_template = _template(chat_template)
        self.learn_rates = learn_rates
        self.pilot = pilot
        self._replicas = {r.replica_id: r for r in replicas}
        _limit_cached_prompts(self.policy, replicas)
        self._lock = threading.RLock()  # _finish releases counters under it
        self._held: dict[str, _Waiter] = {}  # late binding: requests waiting at the client
        self._held_numbers = itertools.count()
        self._timeout_s = timeout_s
        self._timeout = httpx.Timeout(timeout_s)
        self._http = httpx.Client(timeout=self._timeout, transport=transport)
        self._async_transport = async_transport
        self._ahttp: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}  # one per loop
        self.metrics: RoutingMetrics | None = None
        if metrics:
            self.metrics = metrics if isinstance(metrics, RoutingMetrics) else RoutingMetrics()
            self.metrics.bind(self._metrics_state)

    # ----------------------------------------------------------------- public API

    @property
    def replicas(self) -> list[ReplicaState]:
        """The fleet as the policy sees it now (counters, health)."""
        now = time.monotonic()
        with self._lock:
            return [r.state(now) for r in self._replicas.values()]

    def chat(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Route and answer a chat request (a Prompt, OpenAI messages, or a string sent
        as one user message). ``params`` go to the engine (``max_tokens``, ...)."""
        holder: list[ChatResult] = []
        for _ in self._run("chat", prompt, params, holder):
            pass
        return holder[0]

    def complete(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Route and answer a ``/completions`` request (base models); a Prompt is
        sent as its :attr:`~contextpilot_rag.prompt.Prompt.text`."""
        holder: list[ChatResult] = []
        for _ in self._run("completion", prompt, params, holder):
            pass
        return holder[0]

    def stream(self, prompt: PromptInput, *, kind: Kind = "chat", **params: Any) -> ChatStream:
        """Route a request and iterate its text deltas as they arrive."""
        holder: list[ChatResult] = []
        return ChatStream(self._run(kind, prompt, params, holder, streaming=True), holder)

    async def achat(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Async :meth:`chat`."""
        holder: list[ChatResult] = []
        async for _ in self._arun("chat", prompt, params, holder):
            pass
        return holder[0]

    async def acomplete(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Async :meth:`complete`."""
        holder: list[ChatResult] = []
        async for _ in self._arun("completion", prompt, params, holder):
            pass
        return holder[0]

    def astream(
        self, prompt: PromptInput, *, kind: Kind = "chat", **params: Any
    ) -> AsyncChatStream:
        """Async :meth:`stream`."""
        holder: list[ChatResult] = []
        return AsyncChatStream(self._arun(kind, prompt, params, holder, streaming=True), holder)

    def solve(
        self,
        prompt: PromptInput,
        verify: Callable[[str], bool],
        *,
        max_attempts: int = 10,
        kind: Kind = "chat",
        **params: Any,
    ) -> SolveResult:
        """Answer until ``verify(text)`` accepts, each retry excluding the
        ``(endpoint, model)`` pairs already tried; at most ``max_attempts`` answers."""
        solving = _Solving(max_attempts, self.metrics)
        for _ in range(max_attempts):
            holder: list[ChatResult] = []
            try:
                for _ in self._run(kind, prompt, params, holder, *solving.next_round()):
                    pass
            except RoutingError:
                break
            done = solving.judged(holder[0], bool(verify(holder[0].text)))
            if done is not None:
                return done
        return solving.result(None)

    async def asolve(
        self,
        prompt: PromptInput,
        verify: Callable[[str], bool | Awaitable[bool]],
        *,
        max_attempts: int = 10,
        kind: Kind = "chat",
        **params: Any,
    ) -> SolveResult:
        """Async :meth:`solve` (``verify`` may be a coroutine function)."""
        solving = _Solving(max_attempts, self.metrics)
        for _ in range(max_attempts):
            holder: list[ChatResult] = []
            try:
                async for _ in self._arun(kind, prompt, params, holder, *solving.next_round()):
                    pass
            except RoutingError:
                break
            verdict = verify(holder[0].text)
            ok = bool(await verdict) if asyncio.iscoroutine(verdict) else bool(verdict)
            done = solving.judged(holder[0], ok)
            if done is not None:
                return done
        return solving.result(None)

    def probe(self) -> dict[str, float | None]:
        """``GET /models`` on every endpoint: sets its RTT (a failure opens its
        breaker). Returns base URL → RTT in seconds (``None`` if unreachable)."""
        rtts: dict[str, float | None] = {}  # slots of one server share its RTT
        for endpoint in {r.endpoint.base_url: r.endpoint for r in self._replicas.values()}.values():
            started = time.monotonic()
            try:
                url = f"{_Secrets.of(endpoint).request_url}/models"
                self._http.get(url, headers=self._headers(endpoint))
                rtts[endpoint.base_url] = rtt = time.monotonic() - started
            except httpx.TransportError:
                rtts[endpoint.base_url] = None
            with self._lock:
                for replica in self._replicas.values():
                    if replica.endpoint.base_url == endpoint.base_url:
                        if rtts[endpoint.base_url] is None:
                            self._trip(replica, time.monotonic())
                        else:
                            replica.rtt_s = rtt
                            replica.failures, replica.open_until = 0, 0.0
        return rtts

    def close(self) -> None:
        """Close the HTTP connections (the async client is closed by :meth:`aclose`)."""
        self._http.close()

    async def aclose(self) -> None:
        self._http.close()
        loop = asyncio.get_running_loop()
        ahttp = self._ahttp.pop(loop, None)
        if ahttp is not None:
            await ahttp.aclose()
        for other in [other for other in self._ahttp if other.is_closed()]:
            del self._ahttp[other]  # its loop is gone: nothing left to close it with

    def __enter__(self) -> RoutingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RoutingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------- the attempt loop

    def _async_http(self) -> httpx.AsyncClient:
        """The async HTTP client of the running event loop (connections belong to the
        loop that opened them, so each loop gets its own)."""
        loop = asyncio.get_running_loop()
        ahttp = self._ahttp.get(loop)
        if ahttp is None:
            for other in [other for other in self._ahttp if other.is_closed()]:
                del self._ahttp[other]
            ahttp = httpx.AsyncClient(timeout=self._timeout, transport=self._async_transport)
            self._ahttp[loop] = ahttp
        return ahttp

    def _text(self, kind: Kind, prompt: PromptInput) -> PromptText:
        if kind == "completion":
            if isinstance(prompt, Prompt):
                return serialise(prompt, completion=True)
            if not isinstance(prompt, str):
                raise InvalidInputError("complete() takes a string or a Prompt")
        elif isinstance(prompt, str):  # a chat request from a bare string: one user turn
            prompt = [{"role": "user", "content": prompt}]
        return serialise(prompt, self.chat_template)

    def _plan(
        self,
        kind: Kind,
        text: PromptText,
        params: Mapping[str, Any],
        logical_id: str,
        attempt: int,
        excluded: frozenset[tuple[str, str]],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> _Plan | _Held:
        """Route one attempt; a hold registers the request as held, to be woken in
        ``loop`` (a coroutine's) or in the calling thread (``None``)."""
        now = time.monotonic()
        max_tokens = params.get("max_tokens") or params.get("max_completion_tokens") or 128
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise InvalidInputError(f"max_tokens must be an integer, got {max_tokens!r}")
        request = self.keys.request(  # hashing the prompt needs no lock
            text,
            request_id=uuid.uuid4().hex,
            expected_output_tokens=max_tokens,
            session=params.get("user"),
            logical_id=logical_id,
            attempt=attempt,
            excluded=excluded,
            arrival_s=now,
            may_hold=True,
        )
        with self._lock:
            decision, replica = self._offer(request, now)
            if replica is None:
                waiter = _ThreadWaiter(request) if loop is None else _TaskWaiter(request, loop)
                return self._hold(waiter, decision)
        return self._build(kind, text, params, request, decision, replica, now)

    def _resume(
        self, kind: Kind, text: PromptText, params: Mapping[str, Any], held: _Held
    ) -> _Plan | _Held:
        """After a wake-up or ``held.wait_s``: the dispatch a release decided, else
        the request offered again (its wait counts from its first offer)."""
        waiter, now = held.waiter, time.monotonic()
        with self._lock:
            if waiter.ready is None:
                self._held.pop(waiter.request.request_id, None)
                decision, replica = self._offer(waiter.request, now)
                if replica is None:
                    return self._hold(waiter, decision)
            else:
                decision, replica = waiter.ready
        return self._build(kind, text, params, waiter.request, decision, replica, now)

    def _abandon(
        self, kind: Kind, text: PromptText, params: Mapping[str, Any], held: _Held
    ) -> None:
        """The caller of a held request gave up (cancelled, interrupted): forget it,
        and give back what a release had booked for it."""
        waiter = held.waiter
        with self._lock:
            self._held.pop(waiter.request.request_id, None)
            ready, waiter.ready = waiter.ready, None
        if ready is not None:
            plan = self._build(kind, text, params, waiter.request, *ready, time.monotonic())
            self._finish(plan, None, "cancelled", cancelled=True)

    def _offer(self, request: RouteRequest, now: float) -> tuple[Decision, _Replica | None]:
        """The policy's decision for ``request`` (call with the lock held); a dispatch
        books its replica's counters, a hold (``None``) books nothing."""
        states = tuple(r.state(now) for r in self._replicas.values())
        if not any(state.healthy for state in states):  # every breaker open: try anyway
            states = tuple(replace(state, healthy=True) for state in states)
        decision = self.policy.choose(request, _View(now, states))
        if self.metrics is not None:
            self.metrics.decided(self.policy.name, decision)
        if decision.hold_s > 0:
            return decision, None
        replica = self._replicas.get(decision.replica_id)
        if replica is None or replica.model != decision.model:
            raise RoutingError(f"policy chose unknown replica {decision.replica_id!r}")
        replica.in_flight += 1
        replica.queued_tokens += request.prompt_tokens
        return decision, replica

    def _hold(self, waiter: _Waiter, decision: Decision) -> _Held:
        """Register a held request (lock held) until a release or its timer."""
        waiter.order = (_predicted_ttft(decision), next(self._held_numbers))
        self._held[waiter.request.request_id] = waiter
        return _Held(waiter, min(decision.hold_s, _HOLD_RECHECK_S))

    def _release_held(self) -> None:
        """A prompt was prefilled: offer the held requests again, smallest predicted
        TTFT first (as the simulator does); each dispatched one is handed to its
        caller, already booked. Called with the lock held."""
        if not self._held:
            return
        now = time.monotonic()
        for waiter in sorted(self._held.values(), key=_WAITER_ORDER):
            try:
                decision, replica = self._offer(waiter.request, now)
            except RoutingError:  # raised again in the caller's own offer
                continue
            if replica is None:  # held again: its place by its new prediction
                waiter.order = (_predicted_ttft(decision), waiter.order[1])
                continue
            del self._held[waiter.request.request_id]
            waiter.ready = (decision, replica)
            with contextlib.suppress(RuntimeError):  # the caller's event loop is gone
                waiter.wake()

    def _build(
        self,
        kind: Kind,
        text: PromptText,
        params: Mapping[str, Any],
        request: RouteRequest,
        decision: Decision,
        replica: _Replica,
        now: float,
    ) -> _Plan:
        """The HTTP request of a dispatched attempt."""
        logger.debug(
            "route %s -> %s (%s)",
            request.request_id,
            decision.replica_id,
            decision.reason,
            extra={
                "replica": decision.replica_id,
                "reason": decision.reason,
                "predicted_cached_tokens": decision.predicted_cached_tokens,
                "attempt": request.attempt,
            },
        )
        body: dict[str, Any] = {**params, "model": replica.model, "stream": True}
        body["stream_options"] = {"include_usage": True}
        if replica.endpoint.slot is not None:
            body["id_slot"] = replica.endpoint.slot  # llama-server's slot field
        if kind == "chat":
            body["messages"] = [dict(m) for m in text.messages]
            path = "chat/completions"
        else:
            body["prompt"] = text.text
            path = "completions"
        url = f"{_Secrets.of(replica.endpoint).request_url}/{path}"
        return _Plan(replica, request, decision, body, url, now, len(text.text))

    def _first_token(self, plan: _Plan) -> None:
        with self._lock:
            if plan.queued:
                plan.queued = False
                plan.replica.queued_tokens -= plan.request.prompt_tokens
                self._release_held()

    def _release(self, plan: _Plan) -> None:
        """Give back the plan's counters (once)."""
        if plan.closed:
            return
        plan.closed = True
        self._first_token(plan)
        plan.replica.in_flight -= 1

    def _trip(self, replica: _Replica, now: float, at_least_s: float = 0.0) -> None:
        """Open the replica's breaker for its backoff, or ``at_least_s`` if longer."""
        replica.failures += 1
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (replica.failures - 1))
        replica.open_until = now + max(backoff, at_least_s)

    def _metrics_state(self) -> tuple[list[ReplicaState], int | None]:
        with self._lock:
            return self.replicas, route_table_entries(self.policy)

    def _record(
        self,
        plan: _Plan,
        outcome: Outcome,
        observed: int | None,
        prompt_tokens: int | None,
        result: str | None,
    ) -> None:
        """The decision log line and the metrics of one finished attempt (``observed``:
        the cached tokens the engine reported)."""
        if self.metrics is None and not decision_log.isEnabledFor(logging.INFO):
            return
        record = DecisionRecord.of(
            self.policy.name,
            plan.replica.endpoint.target,
            outcome,
            observed,
            prompt_tokens,
            held_s=plan.held_s,
        )
        if result is not None:
            record = replace(record, result=result)
        record.log()
        if self.metrics is not None:
            self.metrics.finished(record, answered=outcome.error is None)

    def _finish(
        self,
        plan: _Plan,
        reply: _Reply | None,
        error: str | None,
        *,
        cancelled: bool = False,
        result: str | None = None,
    ) -> ChatResult | None:
        now = time.monotonic()
        ttft = (reply.first_token_at if reply and reply.first_token_at else now) - plan.started
        with self._lock:
            if plan.closed:
                return None
            self._release(plan)
            cached = _cached_tokens(reply) if reply else None
            if error is not None and not cancelled:
                self._trip(plan.replica, now, plan.retry_after_s)
            elif error is None:
                plan.replica.failures, plan.replica.open_until = 0, 0.0
            prompt_tokens = _prompt_tokens(reply) if reply else None
            if error is None and prompt_tokens:
                self.keys.observe_tokens(plan.characters, prompt_tokens)
                if self.learn_rates and reply is not None:
                    generated = _count(reply.usage, "completion_tokens")
                    plan.replica.learn(
                        prompt_tokens - (cached or 0),
                        ttft,
                        generated or 0,
                        now - plan.started - ttft,
                    )
            outcome = Outcome(
                plan.request,
                plan.decision,
                ttft,
                now - plan.started,
                cached_tokens=plan.decision.predicted_cached_tokens if cached is None else cached,
                error=error,
                cancelled=cancelled,
            )
            self.policy.observe(outcome)
        self._record(plan, outcome, cached, prompt_tokens, result)
        if error is not None or reply is None:
            return None
        held_s = plan.held_s
        return ChatResult(
            text="".join(reply.text),
            endpoint=plan.replica.endpoint.display_url,
            model=plan.replica.model,
            ttft_s=held_s + ttft,
            e2e_s=held_s + now - plan.started,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            completion_tokens=_count(reply.usage, "completion_tokens"),
            finish_reason=reply.finish_reason,
            decision=plan.decision,
            attempts=plan.request.attempt + 1,
            tool_calls=tuple(reply.tool_calls[i] for i in sorted(reply.tool_calls)),
        )

    def _request_args(self, plan: _Plan, deadline: float) -> dict[str, Any]:
        headers = self._headers(plan.replica.endpoint)
        args: dict[str, Any] = {"method": "POST", "url": plan.url, "json": plan.body}
        args["headers"] = headers
        if deadline < math.inf:  # no single read may outlast the call's deadline
            remaining_s = max(deadline - time.monotonic(), _DEADLINE_SLACK_S)
            args["timeout"] = httpx.Timeout(min(self._timeout_s, remaining_s))
        return args

    def _succeeded(self, plan: _Plan, reply: _Reply, prompt: PromptInput) -> ChatResult:
        result = self._finish(plan, reply, None)
        if result is None:  # closed already: cannot happen on the success path
            raise RoutingError("internal error: an attempt finished twice")
        cached, total = result.cached_tokens, result.prompt_tokens
        if self.pilot is not None and isinstance(prompt, Prompt) and cached is not None and total:
            self.pilot.observe_cache(prompt, min(cached, total), total)
        return result

    def _exhausted(self, errors: Sequence[Attempt]) -> RoutingError:
        last = errors[-1].error if errors else "no attempt"
        return RoutingError(f"all {self.max_attempts} attempts failed; last: {last}", errors)

    def _deadline(self) -> float:
        """The monotonic time a call that starts now must end by (``deadline_s``)."""
        return math.inf if self.deadline_s is None else time.monotonic() + self.deadline_s

    def _timed_out(self, errors: Sequence[Attempt]) -> RoutingError:
        return RoutingError(
            f"the deadline of {self.deadline_s} s passed after {len(errors)} attempts", errors
        )

    def _deadline_passed(self, plan: _Plan, reply: _Reply, errors: list[Attempt]) -> RoutingError:
        """End the attempt in flight at the deadline: the caller's budget ran out, so
        the endpoint's breaker is left alone."""
        self._finish(plan, reply, "deadline passed", cancelled=True, result="deadline")
        endpoint = plan.replica.endpoint.display_url
        latency = time.monotonic() - plan.started
        errors.append(Attempt(endpoint, plan.replica.model, latency, "deadline passed"))
        return self._timed_out(errors)

    # _run and _arun are twins (sync / async HTTP); the shared steps live in helpers.

    def _on_line(self, kind: Kind, line: str, plan: _Plan, reply: _Reply, resume: _Resume) -> str:
        """Fold one stream line into ``reply``; the text to deliver (may be empty)."""
        return self._deliver(_parse_line(kind, line, reply), plan, reply, resume)

    def _on_body(self, kind: Kind, body: bytes, plan: _Plan, reply: _Reply, resume: _Resume) -> str:
        """Fold a non-streamed JSON reply (an engine that ignored ``stream``) into
        ``reply``; the text to deliver."""
        return self._deliver(_parse_body(kind, body, reply), plan, reply, resume)

    def _deliver(self, piece: str, plan: _Plan, reply: _Reply, resume: _Resume) -> str:
        if reply.first_token_at is None and (piece or reply.tool_calls):
            reply.first_token_at = time.monotonic()
            self._first_token(plan)
        if not piece:
            return ""
        reply.text.append(piece)
        return resume.feed(piece)

    def _failed(
        self, plan: _Plan, reply: _Reply, exc: Exception, errors: list[Attempt], resume: _Resume
    ) -> frozenset[tuple[str, str]]:
        """Book a retryable failure; the pair to exclude from the next attempts.

        A connection the server closed before answering (a pooled keep-alive
        connection it had already timed out) is not the endpoint's fault: the first
        such failure of a request retries the same endpoint, breaker untouched."""
        endpoint = plan.replica.endpoint
        error = _Secrets.of(endpoint).scrub(f"{type(exc).__name__}: {exc}")
        stale = isinstance(exc, httpx.RemoteProtocolError) and not reply.responded
        if stale and resume.stale_retry:
            resume.stale_retry = False
            self._finish(plan, reply, error, cancelled=True, result="stale")
        else:
            stale = False
            self._finish(plan, reply, error)
        latency = time.monotonic() - plan.started
        errors.append(Attempt(endpoint.display_url, plan.replica.model, latency, error))
        return (
            frozenset() if stale else frozenset({(plan.decision.replica_id, plan.decision.model)})
        )

    def _headers(self, endpoint: Endpoint) -> dict[str, str]:
        return _Secrets.of(endpoint).headers

    def _check_status(self, response: httpx.Response, body: bytes, plan: _Plan) -> None:
        """Raise for an error answer: retryable (keeping the endpoint out for its
        ``Retry-After``, at most ``max_backoff_s``) or the caller's (:class:`EndpointError`)."""
        status = response.status_code
        if status in _RETRY_STATUS:
            retry_after = response.headers.get("retry-after")
            plan.retry_after_s = _retry_after_s(retry_after, self.max_backoff_s)
            raise _AttemptFailed(f"HTTP {status} from {plan.url}")
        self._finish(plan, None, f"HTTP {status}", cancelled=True, result="rejected")
        text = _Secrets.of(plan.replica.endpoint).scrub(body.decode(errors="replace"))
        raise EndpointError(f"{plan.url} answered HTTP {status}: {text[:200]}", status)

    def _dispatch(
        self, kind: Kind, text: PromptText, params: Mapping[str, Any], call: _Call, attempt: int
    ) -> _Plan:
        """Route one attempt, waiting at the client while the policy holds it (late
        binding), until the call's deadline at most."""
        if call.past_deadline():
            raise self._timed_out(call.errors)
        plan = self._plan(kind, text, params, call.logical_id, attempt, call.excluded)
        try:
            while isinstance(plan, _Held):
                cast(_ThreadWaiter, plan.waiter).wait(call.capped(plan.wait_s))
                if call.past_deadline():
                    raise self._timed_out(call.errors)
                plan = self._resume(kind, text, params, plan)
        except BaseException:
            if isinstance(plan, _Held):
                self._abandon(kind, text, params, plan)
            raise
        return plan

    async def _adispatch(
        self, kind: Kind, text: PromptText, params: Mapping[str, Any], call: _Call, attempt: int
    ) -> _Plan:
        """Async :meth:`_dispatch`."""
        if call.past_deadline():
            raise self._timed_out(call.errors)
        loop = asyncio.get_running_loop()
        plan = self._plan(kind, text, params, call.logical_id, attempt, call.excluded, loop)
        try:
            while isinstance(plan, _Held):
                await cast(_TaskWaiter, plan.waiter).wait(call.capped(plan.wait_s))
                if call.past_deadline():
                    raise self._timed_out(call.errors)
                plan = self._resume(kind, text, params, plan)
        except BaseException:
            if isinstance(plan, _Held):
                self._abandon(kind, text, params, plan)
            raise
        return plan

    def _attempt(self, kind: Kind, plan: _Plan, reply: _Reply, call: _Call) -> Iterator[str]:
        """One HTTP exchange; yields the text new to the caller."""
        with self._http.stream(**self._request_args(plan, call.deadline)) as response:
            reply.responded = True
            if response.status_code >= 400:
                self._check_status(response, response.read(), plan)
            if _is_json(response):
                new = self._on_body(kind, response.read(), plan, reply, call.resume)
                if new:
                    yield new
            else:
                watch = _Watch(plan.started, self._timeout_s, call.deadline)
                for line in response.iter_lines():
                    watch.line(line)
                    new = self._on_line(kind, line, plan, reply, call.resume)
                    if new:
                        yield new
        _ended(reply, call.resume)

    async def _aattempt(
        self, kind: Kind, plan: _Plan, reply: _Reply, call: _Call
    ) -> AsyncGenerator[str, None]:
        """Async :meth:`_attempt`."""
        ahttp = self._async_http()
        async with ahttp.stream(**self._request_args(plan, call.deadline)) as response:
            reply.responded = True
            if response.status_code >= 400:
                self._check_status(response, await response.aread(), plan)
            if _is_json(response):
                new = self._on_body(kind, await response.aread(), plan, reply, call.resume)
                if new:
                    yield new
            else:
                watch = _Watch(plan.started, self._timeout_s, call.deadline)
                async for line in response.aiter_lines():
                    watch.line(line)
                    new = self._on_line(kind, line, plan, reply, call.resume)
                    if new:
                        yield new
        _ended(reply, call.resume)

    def _run(
        self,
        kind: Kind,
        prompt: PromptInput,
        params: Mapping[str, Any],
        holder: list[ChatResult],
        logical_id: str | None = None,
        excluded: frozenset[tuple[str, str]] = frozenset(),
        first_attempt: int = 0,
        failures: list[Attempt] | None = None,
        *,
        streaming: bool = False,
    ) -> Iterator[str]:
        text = self._text(kind, prompt)
        call = _Call(logical_id, excluded, failures, streaming, self._deadline())
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            plan = self._dispatch(kind, text, params, call, attempt)
            reply = _Reply()
            call.resume.restart()
            try:
                yield from self._attempt(kind, plan, reply, call)
            except (httpx.TransportError, _AttemptFailed, _DeadlinePassed) as exc:
                if call.timed_out(exc):
                    raise self._deadline_passed(plan, reply, call.errors) from None
                call.excluded |= self._failed(plan, reply, exc, call.errors, call.resume)
                continue
            except BaseException:
                self._finish(plan, reply, "cancelled", cancelled=True)
                raise
            holder.append(self._succeeded(plan, reply, prompt))
            return
        raise self._exhausted(call.errors)

    async def _arun(
        self,
        kind: Kind,
        prompt: PromptInput,
        params: Mapping[str, Any],
        holder: list[ChatResult],
        logical_id: str | None = None,
        excluded: frozenset[tuple[str, str]] = frozenset(),
        first_attempt: int = 0,
        failures: list[Attempt] | None = None,
        *,
        streaming: bool = False,
    ) -> AsyncIterator[str]:
        text = self._text(kind, prompt)
        call = _Call(logical_id, excluded, failures, streaming, self._deadline())
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            plan = await self._adispatch(kind, text, params, call, attempt)
            reply = _Reply()
            call.resume.restart()
            try:
                async with contextlib.aclosing(self._aattempt(kind, plan, reply, call)) as pieces:
                    async for new in pieces:
                        yield new
            except (httpx.TransportError, _AttemptFailed, _DeadlinePassed) as exc:
                if call.timed_out(exc):
                    raise self._deadline_passed(plan, reply, call.errors) from None
                call.excluded |= self._failed(plan, reply, exc, call.errors, call.resume)
                continue
            except BaseException:
                self._finish(plan, reply, "cancelled", cancelled=True)
                raise
            holder.append(self._succeeded(plan, reply, prompt))
            return
        raise self._exhausted(call.errors)


def _is_json(response: httpx.Response) -> bool:
    """Whether the engine answered one JSON object instead of an event stream."""
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("application/json")


def _ended(reply: _Reply, resume: _Resume) -> None:
    """Check that an attempt's answer is complete: ``[DONE]`` seen, and at least the
    text already delivered to the caller."""
    if not reply.done:
        raise _AttemptFailed("the stream ended before [DONE]")
    resume.finish()


class _DeadlinePassed(Exception):
    """The call's ``deadline_s`` passed while an attempt was streaming."""


_DEADLINE_SLACK_S = 0.005  # a read timed out this close to the deadline was cut by it


class _Call:
    """The state one logical call carries across its attempts: its id, the pairs it
    excludes, the failed attempts so far, the stream delivered, its deadline."""

    __slots__ = ("deadline", "errors", "excluded", "logical_id", "resume")

    def __init__(
        self,
        logical_id: str | None,
        excluded: frozenset[tuple[str, str]],
        failures: list[Attempt] | None,
        streaming: bool,
        deadline: float,
    ) -> None:
        self.logical_id = logical_id or uuid.uuid4().hex
        self.excluded = excluded
        self.errors = failures if failures is not None else []
        self.resume = _Resume(streaming)
        self.deadline = deadline

    def past_deadline(self) -> bool:
        return time.monotonic() >= self.deadline

    def capped(self, wait_s: float) -> float:
        """``wait_s``, or less to wake up at the deadline."""
        return min(wait_s, max(self.deadline - time.monotonic(), 0.0))

    def timed_out(self, exc: Exception) -> bool:
        """Whether ``exc`` ended the attempt because the deadline passed."""
        if isinstance(exc, _DeadlinePassed):
            return True
        cut = isinstance(exc, httpx.TimeoutException)
        return cut and time.monotonic() + _DEADLINE_SLACK_S >= self.deadline


class _Watch:
    """The time bounds of one streamed attempt, checked at every line: at most
    ``timeout_s`` since dispatch or the last event (SSE comments and blank
    keep-alive lines are no progress), and the call's deadline. A server that sends
    nothing at all is cut by the per-read timeout of the HTTP client."""

    __slots__ = ("deadline", "last_event", "timeout_s")

    def __init__(self, started: float, timeout_s: float, deadline: float) -> None:
        self.last_event = started
        self.timeout_s = timeout_s
        self.deadline = deadline

    def line(self, line: str) -> None:
        now = time.monotonic()
        if now >= self.deadline:
            raise _DeadlinePassed
        if line.startswith("data:"):
            self.last_event = now
        elif now - self.last_event > self.timeout_s:
            raise _AttemptFailed(f"no event for {self.timeout_s} s (only keep-alives)")


def _retry_after_s(value: str | None, cap_s: float) -> float:
    """The wait a ``Retry-After`` header asks for (delay-seconds or an HTTP-date),
    at most ``cap_s``; 0 when absent, unreadable or past."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = _seconds_until(value)
    return min(seconds, cap_s) if math.isfinite(seconds) and seconds > 0 else 0.0


def _seconds_until(http_date: str) -> float:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp() - time.time()


_template = chat_template  # the constructor's parameter shadows the function


def _predicted_ttft(decision: Decision) -> float:
    """The order key of a held request: its predicted TTFT (unknown: last)."""
    predicted = decision.predicted_ttft_s
    return math.inf if predicted is None else predicted


def _limit_cached_prompts(policy: Policy, replicas: Sequence[_Replica]) -> None:
    """Tell the policy's route table (a :class:`PrefixLocations` or ranvier's
    :class:`RouteTable`) how many prompts each replica keeps
    (:attr:`Endpoint.max_cached_prompts`)."""
    table = route_memory(policy)
    if isinstance(table, PrefixLocations | RouteTable):
        for replica in replicas:
            if replica.endpoint.max_cached_prompts is not None:
                table.limit_prompts(replica.replica_id, replica.endpoint.max_cached_prompts)


class OwnedClient:
    """``close`` / ``aclose`` for a framework wrapper holding a :class:`RoutingClient`
    in ``client``: closed only if the wrapper created it (``_owns_client``)."""

    client: RoutingClient | None
    _owns_client: bool

    def close(self) -> None:
        """Close the client if this wrapper created it; a client passed in stays open."""
        if self._owns_client and self.client is not None:
            self.client.close()

    async def aclose(self) -> None:
        """Async :meth:`close` (also closes the connections of the async paths)."""
        if self._owns_client and self.client is not None:
            await self.client.aclose()


def client_source(owner: str, options: Mapping[str, object]) -> RoutingClient | None:
    """Check how a framework wrapper (``owner``) is told its fleet, from its
    constructor ``options``: exactly one of ``client`` (a :class:`RoutingClient`,
    returned) and ``endpoints`` (``None`` is returned: build the client from them, with
    ``model`` and ``policy``; a given client has its own). Raises
    :class:`ConfigError` before anything is created."""
    client, endpoints = options.get("client"), options.get("endpoints")
    model, policy = options.get("model"), options.get("policy")
    if (client is None) == (endpoints is None):
        raise ConfigError(
            f"{owner} needs exactly one of client= (a RoutingClient) or "
            "endpoints= (base URLs it builds its own client for)"
        )
    if client is not None:
        if not isinstance(client, RoutingClient):
            raise ConfigError(f"client must be a RoutingClient, got {type(client).__name__}")
        if model is not None or policy is not None:
            raise ConfigError("model= and policy= go with endpoints=; a given client has its own")
        return client
    if isinstance(endpoints, str):
        raise ConfigError("endpoints must be a list of base URLs, not one string")
    return None


class _Solving:
    """The bookkeeping of one :meth:`RoutingClient.solve`: the attempts so far (each
    round's failed transports included), the pairs to exclude, the clock."""

    def __init__(self, max_attempts: int, metrics: RoutingMetrics | None) -> None:
        if max_attempts < 1:
            raise ConfigError("max_attempts must be >= 1")
        self.metrics = metrics
        self.started = time.monotonic()
        self.logical_id = uuid.uuid4().hex
        self.excluded: frozenset[tuple[str, str]] = frozenset()
        self.attempts: list[Attempt] = []
        self._failures: list[Attempt] = []

    def next_round(self) -> tuple[str, frozenset[tuple[str, str]], int, list[Attempt]]:
        """The ``_run`` arguments of the next answer (it appends failed transports to
        the returned list)."""
        self._adopt_failures()
        return self.logical_id, self.excluded, len(self.attempts), self._failures

    def judged(self, answer: ChatResult, ok: bool) -> SolveResult | None:
        """Record a verified answer; the result when it is accepted."""
        self._adopt_failures()
        self.attempts.append(Attempt(answer.endpoint, answer.model, answer.e2e_s, correct=ok))
        if ok:
            return self.result(answer)
        self.excluded |= {(answer.decision.replica_id, answer.model)}
        return None

    def result(self, answer: ChatResult | None) -> SolveResult:
        self._adopt_failures()
        result = SolveResult(answer, tuple(self.attempts), time.monotonic() - self.started)
        if self.metrics is not None:
            self.metrics.solved(result.ttca_s, result.correct)
        return result

    def _adopt_failures(self) -> None:
        self.attempts += self._failures
        self._failures = []


@dataclass(frozen=True)
class _View:
    now: float
    replicas: tuple[ReplicaState, ...]
