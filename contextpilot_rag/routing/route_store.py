"""Routing state shared by routers in several processes: learned prefix routes and each
process's replica load, behind one small protocol (:class:`RouteStore`).

A **route** is what a router learned at a message boundary (Ranvier): the prefix ending
at chained block hash ``key`` (``blocks`` blocks) was sent to ``replica_id``. A store
keeps the latest route per key, with its age by the store's own clock (so hosts need
not agree on the time), bounded by ``max_routes`` (oldest dropped first) and
``route_ttl_s`` (an older route is never returned).

A **load report** is one router process's in-flight requests and queued prompt tokens
per replica. It expires ``load_ttl_s`` after the process last reported it, so the load
of a process that died disappears without anyone cleaning up after it.

Implementations: :class:`MemoryRouteStore` (routers in one process: tests, threads),
:class:`~contextpilot_rag.stores.sqlite_routes.SQLiteRouteStore` (one host) and
:class:`~contextpilot_rag.stores.redis_routes.RedisRouteStore` (several hosts).
:func:`resolve_route_store` reads a ``store=`` argument: ``None``, a URL
(``redis://HOST:PORT/DB``, ``sqlite:///PATH``, the same URLs as the conversation
stores) or a store object. How a router uses a store (read-through on a miss,
write-behind, trust, degraded mode) is :mod:`~contextpilot_rag.routing.shared_routes`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigError

__all__ = [
    "DEFAULT_LOAD_TTL_S",
    "DEFAULT_MAX_ROUTES",
    "DEFAULT_ROUTE_TTL_S",
    "Load",
    "MemoryRouteStore",
    "RouteStore",
    "RouteUpdate",
    "SharedRoute",
    "check_route_bounds",
    "check_store_argument",
    "open_route_store",
    "resolve_route_store",
]

DEFAULT_MAX_ROUTES = 100_000
DEFAULT_ROUTE_TTL_S = 600.0
DEFAULT_LOAD_TTL_S = 3.0

Load = tuple[int, int]
"""One replica's load as one process sees it: ``(in_flight, queued_tokens)``."""


class RouteUpdate(NamedTuple):
    """A route to publish: the prefix ending at ``key`` (``blocks`` blocks) was just
    sent to ``replica_id``."""

    key: int
    replica_id: str
    blocks: int


@dataclass(frozen=True, slots=True)
class SharedRoute:
    """A route as a store returns it: learned ``age_s`` seconds ago (by the store's
    clock) by the router ``origin``."""

    key: int
    replica_id: str
    blocks: int
    age_s: float
    origin: str


@runtime_checkable
class RouteStore(Protocol):
    """Where routers in several processes share routes and load.

    Every method may raise :class:`~contextpilot_rag.errors.StoreUnavailableError`
    (within the store's timeouts, never after a hang) or another
    :class:`~contextpilot_rag.errors.StoreError`; a router then routes on its own
    state (:mod:`~contextpilot_rag.routing.shared_routes`)."""

    route_ttl_s: float
    load_ttl_s: float

    def publish(self, origin: str, routes: Sequence[RouteUpdate]) -> None:
        """Store ``routes`` (each replaces the route held for its key), learned now by
        ``origin``; then drop routes beyond the bounds."""
        ...

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        """The live routes held for ``keys`` (absent keys are left out)."""
        ...

    def report_load(self, origin: str, load: Mapping[str, Load]) -> None:
        """``origin``'s load per replica now; it replaces ``origin``'s last report and
        expires ``load_ttl_s`` from now."""
        ...

    def loads(self) -> dict[str, dict[str, Load]]:
        """Every live load report: origin → replica → load."""
        ...

    def withdraw(self, origin: str) -> None:
        """Drop ``origin``'s load report (it stops routing)."""
        ...

    def close(self) -> None:
        """Release connections the store opened."""
        ...


def check_route_bounds(max_routes: object, route_ttl_s: object, load_ttl_s: object) -> None:
    """Raise :class:`ConfigError` unless the bounds are a positive int and two
    positive numbers."""
    if isinstance(max_routes, bool) or not isinstance(max_routes, int) or max_routes < 1:
        raise ConfigError(f"max_routes must be an int >= 1, got {max_routes!r}")
    for name, value in (("route_ttl_s", route_ttl_s), ("load_ttl_s", load_ttl_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{name} must be a number > 0, got {value!r}")


class _Held(NamedTuple):
    replica_id: str
    blocks: int
    learned_s: float
    origin: str


class MemoryRouteStore:
    """A :class:`RouteStore` in this process's memory, for routers in one process
    (several clients, threads, tests). Thread-safe; ``clock`` (seconds, monotonic)
    is injectable.

    Invariants: at most ``max_routes`` routes are held, least recently learned
    dropped first; a route older than ``route_ttl_s`` or a load report older than
    ``load_ttl_s`` is never returned."""

    def __init__(
        self,
        *,
        max_routes: int = DEFAULT_MAX_ROUTES,
        route_ttl_s: float = DEFAULT_ROUTE_TTL_S,
        load_ttl_s: float = DEFAULT_LOAD_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_route_bounds(max_routes, route_ttl_s, load_ttl_s)
        self.max_routes = max_routes
        self.route_ttl_s = float(route_ttl_s)
        self.load_ttl_s = float(load_ttl_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._routes: OrderedDict[int, _Held] = OrderedDict()  # oldest learned first
        self._loads: dict[str, tuple[float, dict[str, Load]]] = {}  # origin → (expires, load)

    def __len__(self) -> int:
        with self._lock:
            return len(self._routes)

    def publish(self, origin: str, routes: Sequence[RouteUpdate]) -> None:
        with self._lock:
            now, held = self._clock(), self._routes
            for key, replica_id, blocks in routes:
                held[key] = _Held(replica_id, blocks, now, origin)
                held.move_to_end(key)
            oldest = now - self.route_ttl_s
            while held and (len(held) > self.max_routes or next(iter(held.values()))[2] < oldest):
                held.popitem(last=False)

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        found: list[SharedRoute] = []
        with self._lock:
            now, held = self._clock(), self._routes
            for key in keys:
                route = held.get(key)
                if route is None or now - route.learned_s > self.route_ttl_s:
                    continue
                replica_id, blocks, learned_s, origin = route
                found.append(SharedRoute(key, replica_id, blocks, now - learned_s, origin))
        return found

    def report_load(self, origin: str, load: Mapping[str, Load]) -> None:
        with self._lock:
            self._loads[origin] = (self._clock() + self.load_ttl_s, dict(load))

    def loads(self) -> dict[str, dict[str, Load]]:
        with self._lock:
            now = self._clock()
            for origin in [o for o, (expires, _) in self._loads.items() if expires < now]:
                del self._loads[origin]
            return {origin: dict(load) for origin, (_, load) in self._loads.items()}

    def withdraw(self, origin: str) -> None:
        with self._lock:
            self._loads.pop(origin, None)

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"MemoryRouteStore(max_routes={self.max_routes}, route_ttl_s={self.route_ttl_s})"


def open_route_store(
    url: str,
    *,
    max_routes: int = DEFAULT_MAX_ROUTES,
    route_ttl_s: float = DEFAULT_ROUTE_TTL_S,
    load_ttl_s: float = DEFAULT_LOAD_TTL_S,
) -> RouteStore:
    """The route store ``url`` names (``redis://…``, ``sqlite:///…``: the URLs of
    :func:`~contextpilot_rag.stores.parse_store_url`, checked completely before
    anything is opened). A URL's ``timeout_s`` bounds each Redis command (default
    0.25 s: a router waits on Redis at most that long before routing alone)."""
    from ..stores.url import parse_store_url

    spec = parse_store_url(url)
    check_route_bounds(max_routes, route_ttl_s, load_ttl_s)
    if spec.backend == "redis":
        from ..stores.redis_routes import DEFAULT_TIMEOUT_S, RedisRouteStore

        return RedisRouteStore(
            spec.target,
            max_routes=max_routes,
            route_ttl_s=route_ttl_s,
            load_ttl_s=load_ttl_s,
            key_prefix=spec.options.get("key_prefix", "contextpilot:"),
            timeout_s=spec.number("timeout_s", DEFAULT_TIMEOUT_S),
        )
    from ..stores.sqlite_routes import SQLiteRouteStore

    return SQLiteRouteStore(
        spec.target,
        max_routes=max_routes,
        route_ttl_s=route_ttl_s,
        load_ttl_s=load_ttl_s,
        busy_timeout_s=spec.number("busy_timeout_s", 5.0),
    )


def check_store_argument(store: object) -> None:
    """Raise :class:`ConfigError` unless ``store`` is ``None``, a valid store URL or a
    :class:`RouteStore`; opens nothing."""
    if store is None or isinstance(store, RouteStore):
        return
    if isinstance(store, str):
        from ..stores.url import parse_store_url

        parse_store_url(store)
        return
    raise ConfigError(
        "store must be None, a store URL (redis://HOST:PORT/DB, sqlite:///PATH) or a "
        f"RouteStore, got {type(store).__name__}"
    )


def resolve_route_store(store: str | RouteStore | None) -> RouteStore | None:
    """What a router's ``store=`` means: ``None`` no shared state, a URL the store it
    names (:func:`open_route_store`), a :class:`RouteStore` itself."""
    check_store_argument(store)
    if isinstance(store, str):
        return open_route_store(store)
    return store
