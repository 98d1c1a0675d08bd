"""One router's link to a :class:`~.route_store.RouteStore`: what it learns reaches
routers in other processes, and what they learned and carry reaches its decisions,
without a network round trip in the way of anything but a route-table miss.

- **Read-through on a miss** (:meth:`SharedRoutes.unknown_keys`, then
  :meth:`SharedRoutes.lookup` before the decision, in the caller's thread, or a worker
  thread for an async caller, so a slow store never holds up an event loop): the
  request's boundary keys the route table holds no live entry for (longest first, at
  most ``max_probe_keys``) are looked up in the store, one round trip; a request whose
  prefixes are all known locally costs nothing. The
  routes found are taken into the route table as **peer** entries
  (:meth:`SharedRoutes.adopt`, under the owner's lock): hints of lower trust than
  local ones, as in Ranvier (:mod:`~.route_table`). A router's own published routes
  are never taken back. The route table is the local cache: a key once adopted is
  not looked up again while its entry lives.
- **Write-behind** (:meth:`SharedRoutes.learned`): a dispatch queues the routes it
  taught the route table (a spread of at most ``publish_boundaries`` boundaries,
  the longest always among them) and wakes a background thread, which waits
  ``batch_s`` for the burst to end (so a busy router's changes go out together and
  the thread keeps out of the callers' way), then publishes everything queued in one
  call. The queue is bounded (``max_pending``; the oldest
  are dropped).
- **Load**: the thread reports this router's in-flight requests and queued prompt
  tokens per replica when they change (:meth:`SharedRoutes.load_changed` wakes it; a
  burst of changes is one report) and at least every ``load_ttl_s / 3`` as a heartbeat,
  and reads the other routers' reports every ``load_interval_s`` while this router is
  busy (at the heartbeat when idle); :meth:`SharedRoutes.remote_load` is their sum per
  replica, added to what the policy sees. A dead router's report expires with
  ``load_ttl_s``. By default only the other routers' **in-flight requests** count:
  a request stays in flight for its whole answer, far longer than a report takes to
  spread, while a prompt stays queued only until its first token, often less than
  that, so others' queued tokens would mostly be stale (on a fast fleet they only push
  requests away from the replicas holding their prefixes). ``queued_tokens=True``
  counts them too.
- **Degraded mode**: a store error (every call is bounded by the store's timeouts)
  makes the router route on its own state only: no look-ups, the other routers' load
  forgotten, learned routes kept queued. One warning is logged per outage. The
  background thread tries again every ``retry_s``; once the store answers, the queued
  routes and the load are published (resync) and one info line is logged.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import ConfigError, StoreError
from .gorgo import spread_boundaries
from .route_store import Load, RouteStore, RouteUpdate, SharedRoute
from .route_table import RouteTableBase
from .types import RouteRequest

__all__ = ["SharedRoutes"]

logger = logging.getLogger(__name__)

_ACTIVE_S = 1.0  # a router that dispatched within this long exchanges load at the fast pace


class SharedRoutes:
    """Shares one router's routes and load through ``store``; ``local_load()`` tells
    this router's load per replica (called from the background thread).

    Thread-safe. :meth:`close` stops the thread, publishes what is queued and
    withdraws the load report (the store itself is closed by its owner)."""

    def __init__(
        self,
        store: RouteStore,
        local_load: Callable[[], dict[str, Load]],
        *,
        publish_boundaries: int = 8,
        max_probe_keys: int = 16,
        load_interval_s: float = 0.05,
        batch_s: float = 0.005,
        retry_s: float = 1.0,
        max_pending: int = 10_000,
        queued_tokens: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if publish_boundaries < 2 or max_probe_keys < 1 or max_pending < 1:
            raise ConfigError(
                "SharedRoutes needs publish_boundaries >= 2, max_probe_keys >= 1, max_pending >= 1"
            )
        if not (load_interval_s > 0 and retry_s > 0 and batch_s >= 0):
            raise ConfigError("load_interval_s and retry_s must be > 0, batch_s >= 0")
        self.store = store
        self.publish_boundaries = publish_boundaries
        self.max_probe_keys = max_probe_keys
        self.load_interval_s = load_interval_s
        self.batch_s = batch_s
        self.heartbeat_s = max(load_interval_s, store.load_ttl_s / 3)
        self.retry_s = retry_s
        self.queued_tokens = queued_tokens
        self._local_load = local_load
        self._clock = clock
        self._lock = threading.Lock()  # guards the queue, the outage state and the thread
        self._sync_lock = threading.Lock()  # one sync at a time (thread, flush, close)
        self._pending: deque[RouteUpdate] = deque(maxlen=max_pending)
        self._remote: dict[str, Load] = {}  # replaced whole, never mutated
        self._reported: dict[str, Load] | None = None
        self._reported_at = self._loads_at = self._active_at = -float("inf")
        self._down_until = 0.0
        self._degraded = False
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self.origin = _new_origin()

    @property
    def degraded(self) -> bool:
        """Whether the store failed and has not answered since."""
        return self._degraded

    def unknown_keys(
        self, request: RouteRequest, memory: RouteTableBase[Any] | None, now: float
    ) -> list[int]:
        """The request's boundary keys, longest first, that ``memory`` holds nothing
        live for: what :meth:`lookup` asks the store (at most ``max_probe_keys``; none
        when ``memory`` is ``None`` or while the store is down). No I/O; read without
        the owner's lock: a key learned meanwhile is at worst looked up once more."""
        if memory is None or not request.boundaries or self._down():
            return []
        self._ensure_thread()
        hashes, keys = request.block_hashes, []
        for b in reversed(request.boundaries):
            key = hashes[b - 1]
            if not memory.knows(key, now):
                keys.append(key)
                if len(keys) == self.max_probe_keys:
                    break
        return keys

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        """The routes other routers published for ``keys``: one store call, which
        blocks up to the store's timeouts (none for no keys; a store error enters
        the degraded mode and finds none)."""
        if not keys:
            return []
        try:
            found = self.store.lookup(keys)
        except StoreError as exc:
            self._failed(exc)
            return []
        origin = self.origin
        return [route for route in found if route.origin != origin]

    def probe(
        self, request: RouteRequest, memory: RouteTableBase[Any] | None, now: float
    ) -> list[SharedRoute]:
        """:meth:`lookup` of the :meth:`unknown_keys`, in the calling thread."""
        return self.lookup(self.unknown_keys(request, memory, now))

    @staticmethod
    def adopt(routes: Iterable[SharedRoute], memory: RouteTableBase[Any], now: float) -> int:
        """Take ``routes`` into ``memory`` as peer entries (call under the lock that
        guards ``memory``); how many were taken (a live local entry wins)."""
        taken = 0
        for route in routes:
            learned_s = now - route.age_s
            taken += memory.learn_peer(route.key, route.replica_id, route.blocks, learned_s, now)
        return taken

    def learned(self, request: RouteRequest, replica_id: str) -> None:
        """``request`` was dispatched to ``replica_id``: queue its routes for the
        background thread."""
        if not request.boundaries:
            return
        hashes = request.block_hashes
        updates = [
            RouteUpdate(hashes[b - 1], replica_id, b)
            for b in spread_boundaries(request.boundaries, self.publish_boundaries)
        ]
        with self._lock:
            self._pending.extend(updates)
            self._active_at = self._clock()
        self._ensure_thread()
        self._wake.set()

    def load_changed(self) -> None:
        """This router's load changed (a prompt prefilled, a request ended): wake the
        background thread to report it."""
        if self._thread is not None:
            self._wake.set()

    def remote_load(self) -> dict[str, Load]:
        """The other live routers' load per replica, summed (empty while degraded;
        queued tokens 0 unless ``queued_tokens``)."""
        return self._remote

    def flush(self) -> bool:
        """Publish what is queued and exchange load now, in this thread; whether the
        store answered (tests, and :meth:`close`)."""
        with self._sync_lock:
            return self._sync(force_load=True)

    def close(self) -> None:
        """Stop the thread, publish what is queued and withdraw this router's load."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._sync_lock:
            if not self._down() and self._publish_pending():
                try:
                    self.store.withdraw(self.origin)
                except StoreError:
                    logger.debug("could not withdraw the load report of %s", self.origin)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():  # a forked child: a new router of its own
                self._pid, self.origin, self._thread = os.getpid(), _new_origin(), None
                self._pending.clear()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"contextpilot-routes-{self.origin}", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._wake.wait(self._tick_s()):
                self._stop.wait(self.batch_s)  # let the burst that woke it end first
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._sync_lock:
                self._sync(force_load=False)

    def _tick_s(self) -> float:
        now = self._clock()
        if self._degraded:
            return max(0.0, self._down_until - now)
        return self._load_period_s(now)

    def _sync(self, *, force_load: bool) -> bool:
        """One round: publish the queue, report and read load when due (sync lock
        held). A failure enters the degraded mode; the first success after one
        leaves it."""
        if self._down():
            return False
        try:
            self._publish_pending(raise_errors=True)
            now = self._clock()
            self._report_load(now, force=force_load)
            if force_load or now - self._loads_at >= self._load_period_s(now):
                self._read_loads(now)
        except StoreError as exc:
            self._failed(exc)
            return False
        except Exception as exc:  # a store's bug must not end route sharing for good
            logger.exception("route store %r failed unexpectedly", self.store)
            self._failed(exc)
            return False
        if self._degraded:
            with self._lock:
                self._degraded = False
            logger.info("route store %r answers again: routes and load shared again", self.store)
        return True

    def _load_period_s(self, now: float) -> float:
        """Busy routers exchange load every ``load_interval_s``, idle ones at the
        heartbeat."""
        return self.load_interval_s if now - self._active_at < _ACTIVE_S else self.heartbeat_s

    def _publish_pending(self, *, raise_errors: bool = False) -> bool:
        """Publish the queue in one call; on failure put it back (bounded)."""
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
        if not batch:
            return True
        latest = list({update.key: update for update in batch}.values())
        try:
            self.store.publish(self.origin, latest)
        except Exception:  # kept for the next round, whatever the store raised
            with self._lock:
                self._pending = deque([*batch, *self._pending], maxlen=self._pending.maxlen)
            if raise_errors:
                raise
            return False
        return True

    def _report_load(self, now: float, *, force: bool) -> None:
        """Report this router's load when it changed or the heartbeat is due."""
        load = self._local_load()
        if force or load != self._reported or now - self._reported_at >= self.heartbeat_s:
            self.store.report_load(self.origin, load)
            self._reported, self._reported_at = load, now

    def _read_loads(self, now: float) -> None:
        """The other routers' load, summed per replica."""
        total: dict[str, Load] = {}
        for origin, per_replica in self.store.loads().items():
            if origin == self.origin:
                continue
            for replica_id, (in_flight, queued) in per_replica.items():
                held = total.get(replica_id, (0, 0))
                queued = held[1] + queued if self.queued_tokens else 0
                total[replica_id] = (held[0] + in_flight, queued)
        self._remote, self._loads_at = total, now

    def _down(self) -> bool:
        return self._degraded and self._clock() < self._down_until

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self._down_until = self._clock() + self.retry_s
            self._remote, self._reported = {}, None
            if self._degraded:
                return
            self._degraded = True
        logger.warning(
            "route store %r unavailable (%s): routing on this process's own routes and load "
            "until it answers",
            self.store,
            exc,
        )


def _new_origin() -> str:
    """A router's id in the store: its process and a random part (several routers may
    share a process)."""
    return f"{os.getpid()}-{secrets.token_hex(6)}"
