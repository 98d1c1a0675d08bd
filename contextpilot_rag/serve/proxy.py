""":class:`Proxy`: what ``contextpilot-rag serve`` does with a validated request,
independent of the HTTP framework.

A request with the ``contextpilot`` field is built into a prompt by the worker's
:class:`~contextpilot_rag.ContextPilot` (in a thread: tokenizing and a shared store
may block), routed over the fleet by its
:class:`~contextpilot_rag.routing.client.RoutingClient`, and its answer recorded as
the conversation's history **before** the response ends (so the client's next turn
finds it). The client feeds each answer's cache hit back to the pilot (``pilot=``). A
request without the field is routed with its messages as sent.

A request whose field names a ``tenant`` is built by the pilot for that tenant (its own
index, conversations and popularity; ``docs/tenants.md``), and the prompt's
``cache_salt``, when the pilot salts it, is sent to the engine as the top-level
``cache_salt`` field (vLLM's), overriding one the client sent; the routing client keys
the request's routes by that salt, so it never follows another tenant's routes.

When routing fails after the prompt was built, the prompt's request is evicted from the
context index (the engine never cached it); its turn stays in the conversation,
unanswered, so the next turn shows the question with ``PilotConfig.unanswered_text``
("(no answer)") as its answer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from ..errors import ConfigError, ContextPilotError
from ..index_sync import IndexLogConfig
from ..pilot import ContextPilot, PilotConfig, pilot_on_store
from ..prompt import Prompt
from ..routing.client import AsyncChatStream, ChatResult, ClientConfig, RoutingClient
from ..routing.metrics import RoutingMetrics
from ..tenants import TenantConfig
from .api_errors import ApiError, pilot_error_of, routing_error_of
from .config import ServeConfig
from .metrics import ProxyMetrics
from .request_body import PilotRequest, ProxyRequest
from .responses import ChunkWriter, Envelope, pilot_extension, response_object

__all__ = ["Proxy"]

logger = logging.getLogger(__name__)

OWNED_BY = "contextpilot-rag"


@dataclass(frozen=True)
class _Turn:
    """One request on its way: what goes to the fleet (the pilot's prompt or the
    client's payload), the prompt if the pilot built one, and the extension object."""

    request: ProxyRequest
    prompt: Prompt | None = None
    extension: dict[str, Any] | None = None

    @property
    def payload(self) -> Prompt | list[dict[str, Any]] | str:
        return self.prompt if self.prompt is not None else self.request.payload

    @property
    def params(self) -> dict[str, Any]:
        """The engine parameters: the client's, and the prompt's ``cache_salt``."""
        extras = {} if self.prompt is None else self.prompt.request_extras()
        return {**self.request.params, **extras}


class Proxy:
    """The pilot, the routing client and the counters of one proxy worker.

    ``pilot`` and ``client`` are public for inspection (tests, embedding); the proxy
    owns both and closes the client in :meth:`aclose`."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.pilot = _pilot(config)
        routing_metrics = _routing_metrics()
        self.client = RoutingClient(
            list(config.endpoints), config=_client_config(config, self.pilot, routing_metrics)
        )
        self.metrics = None if routing_metrics is None else ProxyMetrics(routing_metrics.registry)

    async def answer(self, request: ProxyRequest) -> dict[str, Any]:
        """The whole response to a non-streamed request."""
        turn = await self._begin(request)
        try:
            if request.kind == "chat":
                result = await self.client.achat(turn.payload, **turn.params)
            else:
                result = await self.client.acomplete(turn.payload, **turn.params)
        except ContextPilotError as exc:
            raise await self._failed(turn, exc) from exc
        await self._record(turn, result.text)
        return response_object(Envelope.new(request.kind, result.model), result, turn.extension)

    async def open_stream(self, request: ProxyRequest) -> AsyncIterator[bytes]:
        """The server-sent events of a streamed request. Routing happens here, up to
        the first text: a fleet that fails before it raises :class:`ApiError` while an
        error status can still be sent."""
        turn = await self._begin(request)
        stream = self.client.astream(turn.payload, kind=request.kind, **turn.params)
        try:
            first = await anext(stream, None)
        except BaseException as exc:
            await stream.aclose()
            if isinstance(exc, ContextPilotError):
                raise await self._failed(turn, exc) from exc
            raise
        return self._events(turn, stream, first)

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the model the fleet serves."""
        model = {"id": self.config.model, "object": "model", "created": 0, "owned_by": OWNED_BY}
        return {"object": "list", "data": [model]}

    def health(self) -> dict[str, Any]:
        """``GET /health``: the worker is up; the replicas as the client sees them."""
        replicas = self.client.replicas
        healthy = sum(state.healthy for state in replicas)
        return {
            "status": "ok" if healthy else "degraded",
            "replicas": len(replicas),
            "healthy_replicas": healthy,
            "worker": os.getpid(),
        }

    def exposition(self) -> bytes:
        """``GET /metrics``: the routing client's and the proxy's metrics."""
        metrics = self.client.metrics
        if metrics is None:
            raise ApiError(
                501,
                'metrics need prometheus-client: pip install "contextpilot-rag[serve]"',
                type="server_error",
            )
        return metrics.exposition()

    async def aclose(self) -> None:
        await self.client.aclose()

    def check_model(self, model: str | None) -> None:
        """A request for another model than the fleet's is HTTP 404, as OpenAI answers."""
        if model is not None and model != self.config.model:
            raise ApiError(
                404,
                f"The model {model!r} does not exist; this proxy serves {self.config.model!r}",
                param="model",
                code="model_not_found",
            )

    async def _begin(self, request: ProxyRequest) -> _Turn:
        """Check the model and, with the field, build the prompt (state changes here)."""
        self.check_model(request.model)
        if request.pilot is None:
            return _Turn(request)
        prompt = await anyio.to_thread.run_sync(self._optimize, request.pilot)
        if self.metrics is not None:
            self.metrics.optimized(prompt)
        fields = request.pilot.fields
        extension = pilot_extension(prompt, fields.conversation_id, fields.tenant)
        return _Turn(request, prompt, extension)

    def _optimize(self, pilot_request: PilotRequest) -> Prompt:
        fields = pilot_request.fields
        try:
            return self.pilot.optimize(
                fields.documents,
                pilot_request.query,
                conversation_id=fields.conversation_id,
                system=pilot_request.system,
                tenant=fields.tenant,
            )
        except ContextPilotError as exc:
            raise pilot_error_of(exc) from exc

    async def _events(
        self, turn: _Turn, stream: AsyncChatStream, first: str | None
    ) -> AsyncIterator[bytes]:
        request = turn.request
        writer = ChunkWriter(Envelope.new(request.kind, self.config.model), turn.extension)
        try:
            if request.kind == "chat":
                yield writer.opening()
            if first is not None:
                yield writer.delta(first)
                async for text in stream:
                    yield writer.delta(text)
            result: ChatResult = stream.result
            await self._record(turn, result.text)
            yield writer.closing(result, include_usage=request.include_usage)
        except ContextPilotError as exc:
            if self.metrics is not None:
                self.metrics.stream_failed(request.kind)
            yield writer.error(await self._failed(turn, exc))
        finally:
            await stream.aclose()

    async def _record(self, turn: _Turn, text: str) -> None:
        """Store the answer as the conversation's history (exact pairing: the Prompt)."""
        prompt = turn.prompt
        if prompt is None or prompt.conversation_id is None:
            return
        try:
            await anyio.to_thread.run_sync(self.pilot.record_answer, prompt, text)
        except ContextPilotError:
            logger.warning("the answer to %s was not recorded", prompt.request_id, exc_info=True)
            ok = False
        else:
            ok = True
        if self.metrics is not None:
            self.metrics.recorded(ok)

    async def _failed(self, turn: _Turn, exc: ContextPilotError) -> ApiError:
        """The answer to a routing failure; the engine never cached the prompt, so it
        leaves the index (in a thread: a shared index log may block)."""
        if turn.prompt is not None:
            await anyio.to_thread.run_sync(self.pilot.evict, [turn.prompt.request_id])
        fleet_down = not any(state.healthy for state in self.client.replicas)
        logger.warning("routing failed: %s", exc)  # the client is told less
        return routing_error_of(exc, fleet_down=fleet_down)


def _pilot(config: ServeConfig) -> ContextPilot:
    """The worker's pilot, on ``config.store`` when given (checked to answer: else
    :class:`ConfigError`, the URL's credentials redacted), salting tenants' prompts as
    ``config.cache_salt`` says under ``config.salt_key``, rendering and keeping
    ``config.max_history_turns`` turns of each conversation, the system prompt in the
    first user message with ``config.system_into_user``."""
    tenants = TenantConfig(cache_salt=config.cache_salt, salt_key=config.salt_key)
    index_log = IndexLogConfig(enabled=config.share_index)
    pilot_config = PilotConfig(
        tenants=tenants,
        index_log=index_log,
        max_history_turns=config.max_history_turns,
        system_into_user=config.system_into_user,
    )
    if config.store is None:
        return ContextPilot(pilot_config)
    return pilot_on_store(pilot_config, config.store)


def _routing_metrics() -> RoutingMetrics | None:
    try:
        return RoutingMetrics()
    except ConfigError:  # prometheus-client is not installed
        logger.warning('no /metrics: pip install "contextpilot-rag[serve]" for prometheus-client')
        return None


def _client_config(
    config: ServeConfig, pilot: ContextPilot, metrics: RoutingMetrics | None
) -> ClientConfig:
    options: dict[str, Any] = {
        "model": config.model,
        "policy": config.policy,
        "timeout_s": config.timeout_s,
        "metrics": metrics if metrics is not None else False,
        "pilot": pilot,
    }
    if config.store is not None:
        options["store"] = config.store
    return ClientConfig(**options)
