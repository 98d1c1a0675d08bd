"""``RoutingClient``: an OpenAI-compatible client that routes every request over a fleet
of endpoints with a routing policy and feeds what the engines report back to it.

::

    client = RoutingClient(["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"],
                           model="qwen2.5-7b", policy="combined")
    result = client.chat(pilot.optimize(question, blocks))   # a Prompt or chat messages
    result.text, result.endpoint, result.ttft_s, result.cached_tokens

Every request is streamed from the engine (also by :meth:`RoutingClient.chat`), so
TTFT is measured at the first content token. Per endpoint the client keeps live
``in_flight`` and ``queued_tokens`` counters (a prompt is queued from dispatch to its
first token) on every path — success, failure, timeout, cancellation — and a circuit
breaker: a transport error or a 5xx/429 answer opens it for an exponentially growing
backoff, after which one request may try again.

Feedback: the engine's ``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang,
OpenAI) or ``timings.cache_n`` (llama-server) goes to ``policy.observe`` with the
measured TTFT and end-to-end time, which trims routes the engine disproved; its
``usage.prompt_tokens`` refines the character-per-token estimate of the route keys
(:mod:`~contextpilot_rag.routing.prompt_keys`).

Failures: a transport error, a 5xx/429 answer or a stream that ends early makes the
client retry on another ``(endpoint, model)`` (the failed one excluded) up to
``max_attempts``; a stream already partly delivered resumes after the delivered text
when the retry reproduces it, and fails with :class:`RoutingError` when it does not.
Other 4xx answers are the caller's error and raise :class:`EndpointError` at once.
:meth:`RoutingClient.solve` retries until ``verify`` accepts an answer, excluding each
``(endpoint, model)`` already tried, and reports the time to a correct answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import operator
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

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
            raise ConfigError(f"base_url must start with http:// or https://, got {url!r}")
        object.__setattr__(self, "base_url", url.rstrip("/"))
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
    def target(self) -> str:
        """The routing target: ``base_url``, or ``base_url#slot<n>`` for a slot."""
        return self.base_url if self.slot is None else f"{self.base_url}#slot{self.slot}"


@dataclass(frozen=True)
class ChatResult:
    """One answered request. ``endpoint`` is the base URL that answered; token counts
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
    """One try of a logical request: where, how long, and how it ended."""

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


def _delta(kind: Kind, chunk: Mapping[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if kind == "chat":
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


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
    if chunk.get("usage"):
        reply.usage = chunk["usage"]
    if chunk.get("timings"):
        reply.timings = chunk["timings"]
    choices = chunk.get("choices") or []
    if choices and choices[0].get("finish_reason"):
        reply.finish_reason = choices[0]["finish_reason"]
    if kind == "chat" and choices:
        for fragment in (choices[0].get("delta") or {}).get("tool_calls") or ():
            _join_tool_call(reply.tool_calls, fragment)
    return _delta(kind, chunk)


def _join_tool_call(calls: dict[int, dict[str, Any]], fragment: Mapping[str, Any]) -> None:
    """Add one streamed tool-call fragment (OpenAI: the first of a call carries its
    ``id``, ``type`` and name; later ones pieces of ``arguments``) to ``calls``."""
    index = fragment.get("index", 0)
    call = calls.setdefault(
        index if isinstance(index, int) else 0,
        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
    )
    if fragment.get("id"):
        call["id"] = str(fragment["id"])
    if fragment.get("type"):
        call["type"] = str(fragment["type"])
    function = fragment.get("function") or {}
    call["function"]["name"] += str(function.get("name") or "")
    call["function"]["arguments"] += str(function.get("arguments") or "")


def _cached_tokens(reply: _Reply) -> int | None:
    usage = reply.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    timings = reply.timings or {}
    if isinstance(timings.get("cache_n"), int):
        return int(timings["cache_n"])
    return None


def _prompt_tokens(reply: _Reply) -> int | None:
    usage = reply.usage or {}
    if isinstance(usage.get("prompt_tokens"), int):
        return int(usage["prompt_tokens"])
    timings = reply.timings or {}
    if isinstance(timings.get("prompt_n"), int):
        return int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)
    return None


class _Resume:
    """Delivers a logical stream across retries: text already delivered is skipped
    when a retry reproduces it; a divergent retry is an error."""

    def __init__(self) -> None:
        self.delivered = ""
        self.current = ""
        self.stale_retry = True  # one retry on the same endpoint after a stale connection

    def restart(self) -> None:
        self.current = ""

    def feed(self, piece: str) -> str:
        start = len(self.current)
        self.current += piece
        overlap = self.delivered[start : len(self.current)]
        if overlap and not self.current.startswith(self.delivered[: len(self.current)]):
            raise RoutingError("a retried stream diverged from the text already delivered")
        new = self.current[len(self.delivered) :] if len(self.current) > len(self.delivered) else ""
        if new:
            self.delivered += new
        return new


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
    Thread-safe; one client serves sync and async callers."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        model: str | None = None,
        policy: str | Policy = "combined",
        timeout_s: float = 120.0,
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
        parsed = [e if isinstance(e, Endpoint) else Endpoint(e) for e in endpoints]
        if len({e.target for e in parsed}) != len(parsed):
            raise ConfigError("endpoints must be distinct (base URL and slot)")
        replicas: list[_Replica] = []
        for endpoint in parsed:
            models = endpoint.models or ((model,) if model else ())
            if not models:
                raise ConfigError(f"{endpoint.base_url}: no model; pass model= or Endpoint.models")
            replicas += [_Replica(endpoint, m) for m in models if model is None or m == model]
        if not replicas:
            raise ConfigError(f"no endpoint serves model {model!r}")
        self.model = model
        from . import make_policy  # the package imports this module

        self.policy: Policy = make_policy(policy) if isinstance(policy, str) else policy
        self.max_attempts = max_attempts
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
        return ChatStream(self._run(kind, prompt, params, holder), holder)

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
        return AsyncChatStream(self._arun(kind, prompt, params, holder), holder)

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
                self._http.get(f"{endpoint.base_url}/models", headers=self._headers(endpoint))
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
        url = f"{replica.endpoint.base_url}/{path}"
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

    def _trip(self, replica: _Replica, now: float) -> None:
        replica.failures += 1
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (replica.failures - 1))
        replica.open_until = now + backoff

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
                self._trip(plan.replica, now)
            elif error is None:
                plan.replica.failures, plan.replica.open_until = 0, 0.0
            prompt_tokens = _prompt_tokens(reply) if reply else None
            if error is None and prompt_tokens:
                self.keys.observe_tokens(plan.characters, prompt_tokens)
                if self.learn_rates and reply is not None:
                    generated = (reply.usage or {}).get("completion_tokens")
                    plan.replica.learn(
                        prompt_tokens - (cached or 0),
                        ttft,
                        generated if isinstance(generated, int) else 0,
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
        usage = reply.usage or {}
        held_s = plan.held_s
        return ChatResult(
            text="".join(reply.text),
            endpoint=plan.replica.endpoint.base_url,
            model=plan.replica.model,
            ttft_s=held_s + ttft,
            e2e_s=held_s + now - plan.started,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=reply.finish_reason,
            decision=plan.decision,
            attempts=plan.request.attempt + 1,
            tool_calls=tuple(reply.tool_calls[i] for i in sorted(reply.tool_calls)),
        )

    def _request_args(self, plan: _Plan) -> dict[str, Any]:
        headers = self._headers(plan.replica.endpoint)
        return {"method": "POST", "url": plan.url, "json": plan.body, "headers": headers}

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

    # _run and _arun are twins (sync / async HTTP); the shared steps live in helpers.

    def _on_line(self, kind: Kind, line: str, plan: _Plan, reply: _Reply, resume: _Resume) -> str:
        """Fold one stream line into ``reply``; the text to deliver (may be empty)."""
        piece = _parse_line(kind, line, reply)
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
        error = f"{type(exc).__name__}: {exc}"
        stale = isinstance(exc, httpx.RemoteProtocolError) and not reply.responded
        if stale and resume.stale_retry:
            resume.stale_retry = False
            self._finish(plan, reply, error, cancelled=True, result="stale")
        else:
            stale = False
            self._finish(plan, reply, error)
        latency = time.monotonic() - plan.started
        errors.append(Attempt(plan.replica.endpoint.base_url, plan.replica.model, latency, error))
        return (
            frozenset() if stale else frozenset({(plan.decision.replica_id, plan.decision.model)})
        )

    def _headers(self, endpoint: Endpoint) -> dict[str, str]:
        return {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}

    def _check_status(self, status: int, text: str, plan: _Plan) -> None:
        if status in _RETRY_STATUS:
            raise _AttemptFailed(f"HTTP {status} from {plan.url}")
        if status >= 400:
            self._finish(plan, None, f"HTTP {status}", cancelled=True, result="rejected")
            raise EndpointError(f"{plan.url} answered HTTP {status}: {text[:200]}", status)

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
    ) -> Iterator[str]:
        text = self._text(kind, prompt)
        logical_id = logical_id or uuid.uuid4().hex
        resume, errors = _Resume(), failures if failures is not None else []
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            plan = self._plan(kind, text, params, logical_id, attempt, excluded)
            try:
                while isinstance(plan, _Held):  # late binding: wait at the client
                    cast(_ThreadWaiter, plan.waiter).wait(plan.wait_s)
                    plan = self._resume(kind, text, params, plan)
            except BaseException:
                if isinstance(plan, _Held):
                    self._abandon(kind, text, params, plan)
                raise
            reply = _Reply()
            resume.restart()
            try:
                with self._http.stream(**self._request_args(plan)) as response:
                    reply.responded = True
                    if response.status_code >= 400:
                        self._check_status(
                            response.status_code, response.read().decode(errors="replace"), plan
                        )
                    for line in response.iter_lines():
                        new = self._on_line(kind, line, plan, reply, resume)
                        if new:
                            yield new
                    if not reply.done:
                        raise _AttemptFailed("the stream ended before [DONE]")
            except (httpx.TransportError, _AttemptFailed) as exc:
                excluded |= self._failed(plan, reply, exc, errors, resume)
                continue
            except BaseException:
                self._finish(plan, reply, "cancelled", cancelled=True)
                raise
            holder.append(self._succeeded(plan, reply, prompt))
            return
        raise self._exhausted(errors)

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
    ) -> AsyncIterator[str]:
        text = self._text(kind, prompt)
        logical_id = logical_id or uuid.uuid4().hex
        resume, errors = _Resume(), failures if failures is not None else []
        ahttp = self._async_http()
        loop = asyncio.get_running_loop()
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            plan = self._plan(kind, text, params, logical_id, attempt, excluded, loop)
            try:
                while isinstance(plan, _Held):
                    await cast(_TaskWaiter, plan.waiter).wait(plan.wait_s)
                    plan = self._resume(kind, text, params, plan)
            except BaseException:
                if isinstance(plan, _Held):
                    self._abandon(kind, text, params, plan)
                raise
            reply = _Reply()
            resume.restart()
            try:
                async with ahttp.stream(**self._request_args(plan)) as response:
                    reply.responded = True
                    if response.status_code >= 400:
                        body = (await response.aread()).decode(errors="replace")
                        self._check_status(response.status_code, body, plan)
                    async for line in response.aiter_lines():
                        new = self._on_line(kind, line, plan, reply, resume)
                        if new:
                            yield new
                    if not reply.done:
                        raise _AttemptFailed("the stream ended before [DONE]")
            except (httpx.TransportError, _AttemptFailed) as exc:
                excluded |= self._failed(plan, reply, exc, errors, resume)
                continue
            except BaseException:
                self._finish(plan, reply, "cancelled", cancelled=True)
                raise
            holder.append(self._succeeded(plan, reply, prompt))
            return
        raise self._exhausted(errors)


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
