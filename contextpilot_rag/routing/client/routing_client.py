""":class:`RoutingClient`, the public face of the package: configuration in, the sync
and async calls out, each a one-line hand-over to a driver (:mod:`.sync`, :mod:`.aio`)
running the attempt loop (:mod:`.attempts`) over the client's
:class:`~.dispatch.Dispatcher`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import httpx

from ...errors import ConfigError, RoutingError
from ..metrics import RoutingMetrics
from ..prompt_keys import PromptInput
from ..registry import make_policy
from ..route_store import resolve_route_store
from ..shared_routes import SharedRoutes
from ..types import Policy, ReplicaState
from . import aio, sync
from .attempts import CallSpec
from .config import ClientConfig
from .dispatch import Dispatcher
from .endpoints import Endpoint, replicas_of
from .holding import Waiter
from .results import AsyncChatStream, ChatResult, ChatStream, SolveResult
from .solving import Solving
from .sse import Kind

if TYPE_CHECKING:
    from typing import Unpack

    from .config import ClientOptions

__all__ = ["RoutingClient"]


class RoutingClient:
    """Routes OpenAI-compatible chat/completion requests over ``endpoints``: base URLs
    (``http://host:port/v1``) or :class:`Endpoint` objects.

    Options: a :class:`ClientConfig` as ``config``, or its fields as keywords
    (``RoutingClient(urls, model="m", policy="combined", timeout_s=30)``); keywords given
    with ``config`` replace its fields. :attr:`metrics` holds the Prometheus metrics
    when asked for (:mod:`~contextpilot_rag.routing.metrics`); every finished attempt is
    also logged as JSON on ``contextpilot_rag.routing.decisions``. With ``pilot``, each
    answer's cache hit goes back to its index (:meth:`ContextPilot.observe_cache`), so a
    predicted hit the engine did not serve is trimmed from the index.

    Tenants: a Prompt with a :attr:`~contextpilot_rag.prompt.Prompt.cache_salt` (a
    tenant's, ``docs/tenants.md``) is sent with it as the body's top-level
    ``cache_salt`` (vLLM's; ``send_cache_salt`` turns that off per fleet or
    :class:`Endpoint`), and its route keys are that salt's: it never follows a route
    learned from a prompt of another salt or of none. A ``cache_salt`` parameter
    overrides the Prompt's (``None``: none); a prompt without a salt is sent and
    routed as before.

    Time bounds: ``timeout_s`` bounds each attempt's every wait for progress — to
    connect, for the answer's first stream event (TTFT) and between two events; an SSE
    comment (``: ping``) or blank keep-alive line does not count, and each network read
    is bounded by it too. An attempt past it fails over (the endpoint's fault).
    ``deadline_s`` (default ``None``: unbounded) bounds a whole call — every attempt, the
    time held at the client and, for a stream, the time its consumer takes — by wall
    time from the call; past it the call raises :class:`RoutingError` and the endpoint's
    breaker is left alone (the caller's budget ran out, not the endpoint). In
    :meth:`solve` it bounds each answer. ``max_backoff_s`` also caps ``Retry-After``.

    Shared state: with ``store`` (a ``redis://`` or ``sqlite:///`` URL, or a
    :class:`~contextpilot_rag.routing.route_store.RouteStore`), clients in several
    processes route as one: each one's learned routes reach the others (as hints of
    lower trust than their own) and each sees the others' load. A decision waits on
    the store only when the request's prefixes are unknown to this client (one
    look-up); everything else is published in the background. With the store down the
    client routes on its own state and logs it once (:mod:`~..shared_routes`).
    Thread-safe; one client serves sync and async callers."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        config: ClientConfig | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        config = config or ClientConfig()
        self.config = config = replace(config, **options) if options else config
        replicas = replicas_of(endpoints, config.model)
        self.model = config.model
        policy = config.policy
        self.policy: Policy = make_policy(policy) if isinstance(policy, str) else policy
        self.metrics: RoutingMetrics | None = None
        if config.metrics:
            metrics = config.metrics
            self.metrics = metrics if isinstance(metrics, RoutingMetrics) else RoutingMetrics()
            if self.metrics.bound:  # refused before a store or a connection is opened
                raise ConfigError("this RoutingMetrics is already bound to a client")
        self._owned_store = isinstance(config.store, str)
        store = resolve_route_store(config.store)
        self._dispatcher = Dispatcher(replicas, self.policy, config, self.metrics, store)
        self._http = httpx.Client(
            timeout=httpx.Timeout(config.timeout_s), transport=config.transport
        )
        self._async_http = aio.LoopClients(config.timeout_s, config.async_transport)
        if self.metrics is not None:
            self.metrics.bind(self._dispatcher.metrics_state)

    @property
    def replicas(self) -> list[ReplicaState]:
        """The fleet as the policy sees it now (counters, health; with a ``store``,
        other routers' load included)."""
        return self._dispatcher.states()

    @property
    def shared(self) -> SharedRoutes | None:
        """The link to the shared routing state (``None`` without a ``store``): its
        ``degraded`` flag, ``flush()`` to publish now."""
        return self._dispatcher.shared

    def chat(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Route and answer a chat request (a Prompt, OpenAI messages, or a string sent
        as one user message). ``params`` go to the engine (``max_tokens``, ...)."""
        return self._answer(CallSpec("chat", prompt, params))

    def complete(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Route and answer a ``/completions`` request (base models); a Prompt is
        sent as its :attr:`~contextpilot_rag.prompt.Prompt.text`."""
        return self._answer(CallSpec("completion", prompt, params))

    def stream(self, prompt: PromptInput, *, kind: Kind = "chat", **params: Any) -> ChatStream:
        """Route a request and iterate its text deltas as they arrive."""
        self._check_sync()
        spec = CallSpec(kind, prompt, params, streaming=True)
        return ChatStream(sync.drive(self._dispatcher, spec, self._http), spec.holder)

    async def achat(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Async :meth:`chat`."""
        return await self._aanswer(CallSpec("chat", prompt, params))

    async def acomplete(self, prompt: PromptInput, **params: Any) -> ChatResult:
        """Async :meth:`complete`."""
        return await self._aanswer(CallSpec("completion", prompt, params))

    def astream(
        self, prompt: PromptInput, *, kind: Kind = "chat", **params: Any
    ) -> AsyncChatStream:
        """Async :meth:`stream`."""
        spec = CallSpec(kind, prompt, params, streaming=True)
        return AsyncChatStream(aio.drive(self._dispatcher, spec, self._async_http), spec.holder)

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
        solving = Solving(max_attempts, self.metrics)
        for spec in solving.rounds(kind, prompt, params):
            with solving.round():
                answer = self._answer(spec)
                solving.judged(answer, bool(verify(answer.text)))
        return solving.result()

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
        solving = Solving(max_attempts, self.metrics)
        for spec in solving.rounds(kind, prompt, params):
            with solving.round():
                answer = await self._aanswer(spec)
                solving.judged(answer, await _verdict(verify, answer.text))
        return solving.result()

    def probe(self) -> dict[str, float | None]:
        """``GET /models`` on every endpoint: sets its RTT (a failure opens its
        breaker). Returns base URL → RTT in seconds (``None`` if unreachable)."""
        self._check_sync()
        return sync.probe(self._dispatcher, self._http)

    def close(self) -> None:
        """Close the HTTP connections (the async client is closed by :meth:`aclose`)
        and the link to the shared routing state (publishing what is queued). Every
        call made after, and every request still held or retrying, raises
        :class:`~contextpilot_rag.errors.RoutingError`."""
        self._dispatcher.close()
        self._http.close()
        self._close_shared()

    async def aclose(self) -> None:
        """Close the running event loop's connections (another loop's call opens its
        own again), the synchronous ones (a synchronous call after it raises
        :class:`~contextpilot_rag.errors.RoutingError`) and the link to the shared
        routing state."""
        self._http.close()
        await self._async_http.aclose()
        self._close_shared()

    def _close_shared(self) -> None:
        shared = self._dispatcher.shared
        if shared is not None:
            shared.close()
            if self._owned_store:
                shared.store.close()

    def __enter__(self) -> RoutingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RoutingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_sync(self) -> None:
        """:class:`RoutingError` once :meth:`close` or :meth:`aclose` closed the
        synchronous connections."""
        if self._http.is_closed:
            raise RoutingError("this RoutingClient is closed")

    def _answer(self, spec: CallSpec) -> ChatResult:
        self._check_sync()
        for _ in sync.drive(self._dispatcher, spec, self._http):
            pass
        return spec.holder[0]

    async def _aanswer(self, spec: CallSpec) -> ChatResult:
        deltas: AsyncIterator[str] = aio.drive(self._dispatcher, spec, self._async_http)
        async for _ in deltas:
            pass
        return spec.holder[0]

    @property
    def _held(self) -> dict[str, Waiter]:  # the requests held at the client (tests wait on it)
        return self._dispatcher.held.waiting


async def _verdict(verify: Callable[[str], bool | Awaitable[bool]], text: str) -> bool:
    """``verify(text)``, awaited when it is a coroutine."""
    verdict = verify(text)
    return bool(await verdict) if asyncio.iscoroutine(verdict) else bool(verdict)
