"""The ASGI application (starlette) of ``contextpilot-rag serve``: routes, the API key,
request bodies, and every error as OpenAI's error JSON.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /metrics`` (the API key applies to these) and ``GET /health`` (open, for load
balancers)."""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .api_errors import ApiError
from .config import ServeConfig
from .proxy import Proxy
from .request_body import Kind, ProxyRequest, parse_json, parse_request

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Handler = Callable[[Request], Awaitable[Response]]


def create_app(config: ServeConfig, *, proxy: Proxy | None = None) -> Starlette:
    """The proxy as an ASGI app (``proxy``: one built already, else built from
    ``config``); ``app.state.proxy`` holds it. Its client closes at shutdown."""
    proxy = proxy or Proxy(config)
    handlers = _Handlers(proxy, config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await proxy.aclose()

    routes = [
        Route("/v1/chat/completions", handlers.guarded(handlers.chat), methods=["POST"]),
        Route("/v1/completions", handlers.guarded(handlers.completion), methods=["POST"]),
        Route("/v1/models", handlers.guarded(handlers.models), methods=["GET"]),
        Route("/metrics", handlers.guarded(handlers.metrics), methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    app.state.proxy = proxy
    return app


class _Handlers:
    """The route handlers of one app."""

    def __init__(self, proxy: Proxy, config: ServeConfig) -> None:
        self.proxy = proxy
        self.max_body_bytes = config.max_body_bytes
        self._key = None if config.api_key is None else config.api_key.encode()

    def guarded(self, handler: Handler) -> Handler:
        """``handler`` behind the API key, its errors answered as OpenAI error JSON."""

        async def guarded_handler(request: Request) -> Response:
            try:
                self._authorize(request)
                return await handler(request)
            except ApiError as error:
                return _error_response(error)
            except Exception:
                logger.exception("unexpected error answering %s", request.url.path)
                return _error_response(ApiError(500, "internal server error", type="server_error"))

        return guarded_handler

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, "chat")

    async def completion(self, request: Request) -> Response:
        return await self._complete(request, "completion")

    async def models(self, _request: Request) -> Response:
        return JSONResponse(self.proxy.models())

    async def metrics(self, _request: Request) -> Response:
        return Response(self.proxy.exposition(), media_type=_PROMETHEUS_TEXT)

    async def health(self, _request: Request) -> Response:
        return JSONResponse(self.proxy.health())

    def _authorize(self, request: Request) -> None:
        """A bearer token equal to the key (compared in constant time), if one is set."""
        if self._key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._key):
            raise ApiError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def _complete(self, http_request: Request, kind: Kind) -> Response:
        mode, status = "invalid", 500
        try:
            request = parse_request(kind, parse_json(await self._body(http_request)))
            mode = "passthrough" if request.pilot is None else "pilot"
            response = await self._respond(request)
            status = response.status_code
            return response
        except ApiError as error:
            status = error.status
            raise
        finally:
            if self.proxy.metrics is not None:
                self.proxy.metrics.answered(kind, mode, status)

    async def _respond(self, request: ProxyRequest) -> Response:
        if request.stream:
            events = await self.proxy.open_stream(request)
            return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)
        return JSONResponse(await self.proxy.answer(request))

    async def _body(self, request: Request) -> bytes:
        """The request body, at most ``max_body_bytes`` (else HTTP 413)."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _http_error(_request: Request, exc: Exception) -> Response:
    """Starlette's own errors (an unknown path, a wrong method) as OpenAI error JSON."""
    if not isinstance(exc, HTTPException):
        return _error_response(ApiError(500, "internal server error", type="server_error"))
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    error = ApiError(exc.status_code, str(exc.detail), type=kind, headers=exc.headers)
    return _error_response(error)
