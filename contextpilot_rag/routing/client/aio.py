"""The asyncio driver: performs the attempt loop's commands (:mod:`.attempts`) with an
``httpx.AsyncClient`` of the running event loop, and a :class:`~.attempts.Blocking`
call in a worker thread, so a hung store holds up only the call that waits on it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

import anyio.to_thread
import httpx

from ..types import RouteRequest
from .attempts import (
    READ_BODY,
    READ_TEXT,
    Blocking,
    CallSpec,
    Head,
    Open,
    Raised,
    Steps,
    Wait,
    attempt_loop,
)
from .dispatch import Dispatcher
from .holding import Waiter
from .sync import FAULTS, build_request, translated

if TYPE_CHECKING:
    from .attempts import Command

__all__ = ["LoopClients", "TaskWaiter", "drive"]


class TaskWaiter(Waiter):
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


class LoopClients:
    """One ``httpx.AsyncClient`` per event loop: connections belong to the loop that
    opened them, so each loop gets its own; a client of a loop that is gone is dropped
    (nothing is left to close it with)."""

    def __init__(self, timeout_s: float, transport: httpx.AsyncBaseTransport | None) -> None:
        self._timeout = httpx.Timeout(timeout_s)
        self._transport = transport
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._lock = threading.Lock()  # loops in several threads share the map

    def current(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                self._drop_closed_loops()
                client = httpx.AsyncClient(timeout=self._timeout, transport=self._transport)
                self._clients[loop] = client
            return client

    async def aclose(self) -> None:
        """Close the running loop's client."""
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
            self._drop_closed_loops()
        if client is not None:
            await client.aclose()

    def _drop_closed_loops(self) -> None:
        for loop in [loop for loop in self._clients if loop.is_closed()]:
            del self._clients[loop]


async def drive(dispatcher: Dispatcher, spec: CallSpec, clients: LoopClients) -> AsyncIterator[str]:
    """Run one call, yielding the text it delivers; ``aclose()`` or cancelling the
    consuming task cancels it."""
    new_waiter = functools.partial(TaskWaiter, loop=asyncio.get_running_loop())
    steps = Steps(attempt_loop(dispatcher, spec, new_waiter))
    async with _AsyncIO(clients) as io:
        event: object = None
        while (command := steps.send(event)) is not None:
            try:
                event = (yield command) if isinstance(command, str) else await io.perform(command)
            except BaseException as exc:  # a transport failure, or the caller gave up
                event = Raised(exc)


class _AsyncIO:
    """Performs commands; at most one response open, closed when a command other than
    a read of it comes, when performing one fails, and on exit."""

    __slots__ = ("_clients", "_response", "_texts")

    def __init__(self, clients: LoopClients) -> None:
        self._clients = clients  # the loop's HTTP client is made on the first open (slow)
        self._response: httpx.Response | None = None
        self._texts: AsyncIterator[str] | None = None

    async def __aenter__(self) -> _AsyncIO:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def perform(self, command: Command) -> object:
        try:
            if command is READ_TEXT:
                return await anext(cast(AsyncIterator[str], self._texts), None)
            if command is READ_BODY:
                return await cast(httpx.Response, self._response).aread()
            await self.aclose()
            if isinstance(command, Wait):
                await cast(TaskWaiter, command.waiter).wait(command.timeout_s)
                return None
            if isinstance(command, Blocking):  # off the event loop: it may block
                return await anyio.to_thread.run_sync(command.run)
            return await self._open(cast(Open, command))
        except FAULTS as exc:
            await self.aclose()
            raise translated(exc) from exc

    async def _open(self, command: Open) -> Head:
        http = self._clients.current()
        self._response = response = await http.send(build_request(http, command), stream=True)
        self._texts = response.aiter_text()
        return Head(response.status_code, response.headers)

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()
            self._response, self._texts = None, None
