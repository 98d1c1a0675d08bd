"""The blocking driver: performs the attempt loop's commands (:mod:`.attempts`) with an
``httpx.Client`` in the calling thread, and probes endpoints."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import cast

import httpx

from ..types import RouteRequest
from .attempts import (
    READ_BODY,
    READ_TEXT,
    Blocking,
    CallSpec,
    Command,
    Head,
    Open,
    Raised,
    Steps,
    TransportFailed,
    Wait,
    attempt_loop,
)
from .dispatch import Dispatcher
from .endpoints import Credentials
from .holding import Waiter
from .sse import AttemptFailed

__all__ = ["FAULTS", "ThreadWaiter", "build_request", "drive", "probe", "translated"]


class ThreadWaiter(Waiter):
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


def translated(exc: httpx.TransportError | httpx.DecodingError) -> AttemptFailed:
    """An httpx error in the attempt loop's terms: a transport error (no exchange) is
    :class:`TransportFailed`; a reply that does not decode (a broken
    ``Content-Encoding``) is a malformed reply. Both are the endpoint's fault."""
    if isinstance(exc, httpx.DecodingError):
        failure = AttemptFailed(f"malformed reply: {type(exc).__name__}: {exc}")
    else:
        failure = TransportFailed(
            f"{type(exc).__name__}: {exc}",
            timed_out=isinstance(exc, httpx.TimeoutException),
            remote_protocol=isinstance(exc, httpx.RemoteProtocolError),
        )
    failure.__cause__ = exc
    return failure


FAULTS = (httpx.TransportError, httpx.DecodingError)
"""The httpx errors that are the endpoint's fault (:func:`translated`)."""


def build_request(http: httpx.Client | httpx.AsyncClient, command: Open) -> httpx.Request:
    return http.build_request(
        "POST", command.url, json=command.body, headers=command.headers, timeout=command.timeout_s
    )


def drive(dispatcher: Dispatcher, spec: CallSpec, http: httpx.Client) -> Iterator[str]:
    """Run one call, yielding the text it delivers; closing the iterator cancels it."""
    steps = Steps(attempt_loop(dispatcher, spec, ThreadWaiter))
    with _BlockingIO(http) as io:
        event: object = None
        while (command := steps.send(event)) is not None:
            try:
                event = (yield command) if isinstance(command, str) else io.perform(command)
            except BaseException as exc:  # a transport failure, or the caller gave up
                event = Raised(exc)


class _BlockingIO:
    """Performs commands; at most one response open, closed when a command other than
    a read of it comes, when performing one fails, and on exit."""

    __slots__ = ("_http", "_response", "_texts")

    def __init__(self, http: httpx.Client) -> None:
        self._http = http
        self._response: httpx.Response | None = None
        self._texts: Iterator[str] = iter(())

    def __enter__(self) -> _BlockingIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def perform(self, command: Command) -> object:
        try:
            if command is READ_TEXT:
                return next(self._texts, None)
            if command is READ_BODY:
                return cast(httpx.Response, self._response).read()
            self.close()
            if isinstance(command, Wait):
                cast(ThreadWaiter, command.waiter).wait(command.timeout_s)
                return None
            if isinstance(command, Blocking):
                return command.run()
            return self._open(cast(Open, command))
        except FAULTS as exc:
            self.close()
            raise translated(exc) from exc

    def _open(self, command: Open) -> Head:
        self._response = response = self._http.send(build_request(self._http, command), stream=True)
        self._texts = response.iter_text()
        return Head(response.status_code, response.headers)

    def close(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response, self._texts = None, iter(())


def probe(dispatcher: Dispatcher, http: httpx.Client) -> dict[str, float | None]:
    """``GET /models`` on every server: sets its RTT (a failure opens its breakers).
    Returns base URL -> RTT in seconds (``None`` if unreachable)."""
    rtts: dict[str, float | None] = {}  # slots of one server share its RTT
    endpoints = {r.endpoint.base_url: r.endpoint for r in dispatcher.replicas.values()}
    for base_url, endpoint in endpoints.items():
        credentials = Credentials.of(endpoint)
        started = time.monotonic()
        try:
            http.get(f"{credentials.request_url}/models", headers=credentials.headers)
            rtts[base_url] = time.monotonic() - started
        except FAULTS:
            rtts[base_url] = None
        dispatcher.probed(base_url, rtts[base_url])
    return rtts
