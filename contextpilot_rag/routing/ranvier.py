"""Learned prefix routes (Ranvier): send a request where its longest known prefix went.

A **route** maps a chained block hash to the replica that last received the prefix it
identifies. Because ``block_hashes[i]`` names the whole prefix up to block ``i``, a prefix
is identified by its last hash alone, so a lookup is a handful of dict probes at the
request's boundaries (longest first) rather than a token-by-token walk.

Invariants of :class:`RouteTable`:

- at most ``capacity`` routes are held; when full, the least recently used *peer* route
  is evicted first, then the least recently used *local* route (trust ranks);
- a lookup never returns a route older than ``ttl_s`` (expired routes are dropped when met);
- a local route replaces a peer route for the same prefix; a peer route never replaces a
  local one.

When nothing is learned for a request, :class:`RanvierPolicy` falls back to bounded-load
rendezvous hashing on the first block hash, so independent routers that have learned
nothing still send the same first block to the same replica while no replica takes more
than ``hash_load_factor`` × its fair share of requests in flight.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ..errors import ConfigError
from .common import candidate_replicas
from .route_table import RouteTableBase
from .types import Decision, FleetView, Outcome, ReplicaState, RouteRequest

__all__ = [
    "RanvierConfig",
    "RanvierPolicy",
    "ReplicaCacheModel",
    "Route",
    "RouteMatch",
    "RouteTable",
    "Trust",
    "candidate_replicas",
    "rendezvous_rank",
]

Trust = Literal["local", "peer"]

_MASK64 = (1 << 64) - 1


class Route(NamedTuple):
    """One learned route: the prefix of ``blocks`` blocks went to ``replica_id``.

    A NamedTuple, not a frozen dataclass: ~50 are built per dispatch and construction
    cost dominates the route update."""

    replica_id: str
    blocks: int
    learned_s: float
    trust: Trust = "local"


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """The longest usable route for a request: its key (the prefix's last block hash)."""

    key: int
    route: Route


_Entry = tuple[str, int, float]


class RouteTable(RouteTableBase[_Entry]):
    """Bounded map: chained block hash → :class:`Route`, LRU + TTL + trust ranks."""

    def __init__(self, capacity: int = 100_000, ttl_s: float = 600.0) -> None:
        super().__init__(capacity, ttl_s, ranks=2)
        # values are (replica_id, blocks, learned_s): plain tuples are the cheapest thing
        # to build ~50 times per dispatch; the dict a route lives in is its trust rank,
        # peer routes being evicted first
        self._peer, self._local = self._ranks

    def get(self, key: int, now: float) -> Route | None:
        """The live route for ``key`` (refreshing its LRU position), or ``None``."""
        store, trust = self._local, "local"
        entry = store.get(key)
        if entry is None:
            store, trust = self._peer, "peer"
            entry = store.get(key)
            if entry is None:
                return None
        if now - entry[2] > self.ttl_s:
            del store[key]
            return None
        store.move_to_end(key)
        return Route(entry[0], entry[1], entry[2], trust)  # type: ignore[arg-type]

    def lookup(
        self,
        block_hashes: Sequence[int],
        boundaries: Iterable[int],
        now: float,
        accept: Callable[[int, Route], bool] | None = None,
    ) -> RouteMatch | None:
        """Longest live route over the request's boundaries that ``accept(key, route)``
        allows (e.g. only healthy, non-excluded replicas).

        ``boundaries`` are block counts; they are probed longest first, one dict lookup
        each on ``block_hashes[b - 1]``."""
        n = len(block_hashes)
        local, peer = self._local, self._peer
        for b in sorted(boundaries, reverse=True):
            if b < 1 or b > n:
                continue
            key = block_hashes[b - 1]
            if key not in local and key not in peer:
                continue  # most probes miss: no call, no Route built
            route = self.get(key, now)
            if route is not None and (accept is None or accept(key, route)):
                return RouteMatch(key, route)
        return None

    def learn(
        self,
        block_hashes: Sequence[int],
        boundaries: Iterable[int],
        replica_id: str,
        now: float,
        trust: Trust = "local",
    ) -> None:
        """Record that the prefixes ending at ``boundaries`` went to ``replica_id``."""
        n = len(block_hashes)
        if trust != "local":
            for b in boundaries:
                if 1 <= b <= n:
                    self.put(block_hashes[b - 1], Route(replica_id, b, now, trust))
        else:
            local, peer = self._local, self._peer
            for b in boundaries:
                if 1 <= b <= n:
                    key = block_hashes[b - 1]
                    if peer:
                        peer.pop(key, None)
                    local[key] = (replica_id, b, now)
                    local.move_to_end(key)
            self._evict()
        self._count_prompt(block_hashes, boundaries, replica_id, now)

    def put(self, key: int, route: Route) -> None:
        """Insert one route, honouring trust ranks, then evict down to capacity."""
        if route.trust == "local":
            self._peer.pop(key, None)
            self._local[key] = (route.replica_id, route.blocks, route.learned_s)
            self._local.move_to_end(key)
        elif key not in self._local:
            self._peer[key] = (route.replica_id, route.blocks, route.learned_s)
            self._peer.move_to_end(key)
        self._evict()

    def knows(self, key: int, now: float) -> bool:
        for store in (self._local, self._peer):
            entry = store.get(key)
            if entry is not None and now - entry[2] <= self.ttl_s:
                return True
        return False

    def learn_peer(
        self, key: int, replica_id: str, blocks: int, learned_s: float, now: float
    ) -> bool:
        local = self._local.get(key)
        if local is not None:
            if now - local[2] <= self.ttl_s:
                return False
            del self._local[key]  # expired: the peer's newer route may take its place
        self.put(key, Route(replica_id, blocks, learned_s, "peer"))
        return True

    def import_routes(self, routes: Iterable[tuple[int, Route]]) -> int:
        """Merge routes received from a peer router, as ``peer`` trust; returns how many
        were accepted (local routes for the same prefix win)."""
        accepted = 0
        for key, route in routes:
            if key not in self._local:
                self.put(key, Route(route.replica_id, route.blocks, route.learned_s, "peer"))
                accepted += 1
        return accepted

    def export_routes(self) -> list[tuple[int, Route]]:
        """This table's local routes, oldest first, for sharing with peers."""
        return [(k, Route(*entry, "local")) for k, entry in self._local.items()]

    def forget(self, key: int, replica_id: str | None = None) -> bool:
        """Drop the route for ``key`` (only if it points at ``replica_id``, when given)."""
        for store in (self._local, self._peer):
            entry = store.get(key)
            if entry is not None and (replica_id is None or entry[0] == replica_id):
                del store[key]
                return True
        return False

    def forget_replica(self, replica_id: str) -> int:
        """Drop every route to ``replica_id`` (e.g. it restarted); returns how many."""
        removed = 0
        for store in (self._local, self._peer):
            stale = [k for k, entry in store.items() if entry[0] == replica_id]
            for key in stale:
                del store[key]
            removed += len(stale)
        return removed


class ReplicaCacheModel:
    """Per-replica LRU estimate of which learned prefixes an engine still holds.

    Tracked at boundary granularity: each boundary key holds the tokens between it and
    the previous boundary, so a replica's tokens held never exceed ``capacity_tokens``.
    A route whose key the model has evicted should stop attracting requests."""

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 1:
            raise ConfigError(f"capacity_tokens must be >= 1, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self._held: dict[str, OrderedDict[int, int]] = {}
        self._tokens: dict[str, int] = {}

    def tokens_held(self, replica_id: str) -> int:
        """Estimated KV tokens held by ``replica_id``."""
        return self._tokens.get(replica_id, 0)

    def holds(self, replica_id: str, key: int) -> bool:
        """Whether the prefix ending at block hash ``key`` is believed cached there."""
        held = self._held.get(replica_id)
        return held is not None and key in held

    def touch(self, replica_id: str, segments: Iterable[tuple[int, int]]) -> None:
        """Record ``(key, tokens)`` segments sent to ``replica_id``, then evict LRU."""
        held = self._held.setdefault(replica_id, OrderedDict())
        total = self._tokens.get(replica_id, 0)
        for key, tokens in segments:
            previous = held.pop(key, None)
            total += tokens - (previous or 0)
            held[key] = tokens
        while total > self.capacity_tokens and held:
            total -= held.popitem(last=False)[1]
        self._tokens[replica_id] = total


@dataclass(frozen=True)
class RanvierConfig:
    """Tuning of :class:`RanvierPolicy`.

    ``load_factor`` / ``load_slack``: the preferred replica is "far above the median"
    when its in-flight count exceeds ``load_factor × median + load_slack`` (the slack
    keeps an idle fleet, median 0, from overriding on a single request); the same test
    applies to queued tokens with ``load_slack_tokens``. ``hash_load_factor``: bounded-
    load hashing lets no replica exceed ``ceil(factor × (in_flight + 1) / n)``.
    ``capacity_tokens_per_replica``: enables :class:`ReplicaCacheModel` when set."""

    route_capacity: int = 100_000
    route_ttl_s: float = 600.0
    load_factor: float = 2.0
    load_slack: int = 4
    load_slack_tokens: int = 32_768
    hash_load_factor: float = 1.25
    capacity_tokens_per_replica: int | None = None

    def __post_init__(self) -> None:
        if not self.load_factor >= 1.0:  # NaN included
            raise ConfigError(f"load_factor must be >= 1, got {self.load_factor}")
        if not self.hash_load_factor >= 1.0:
            raise ConfigError(f"hash_load_factor must be >= 1, got {self.hash_load_factor}")
        if self.load_slack < 0 or self.load_slack_tokens < 0:
            raise ConfigError("load_slack and load_slack_tokens must be >= 0")


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread 64-bit integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=4096)
def _stable_id_hash(replica_id: str) -> int:
    """Process-independent hash of a replica id (``hash(str)`` is salted per process)."""
    digest = hashlib.blake2b(replica_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def rendezvous_rank(key: int, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
    """Replicas in highest-random-weight order for ``key`` (same on every router)."""
    return sorted(replicas, key=lambda r: _mix64(key ^ _stable_id_hash(r.replica_id)), reverse=True)


def _request_key(request: RouteRequest) -> int:
    if request.block_hashes:
        return request.block_hashes[0] & _MASK64
    text = request.session or request.request_id
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class RanvierPolicy:
    """Route by the longest learned prefix; fall back to bounded-load rendezvous hashing.

    ``choose`` is the dispatch: it also learns the request's boundaries for the chosen
    replica (the route update after dispatch). ``observe`` trims routes the engine
    disproved (fewer cached tokens than predicted, or an error)."""

    name = "ranvier"

    def __init__(self, config: RanvierConfig | None = None) -> None:
        self.config = config or RanvierConfig()
        self.table = RouteTable(self.config.route_capacity, self.config.route_ttl_s)
        capacity = self.config.capacity_tokens_per_replica
        self.cache_model = ReplicaCacheModel(capacity) if capacity else None

    @property
    def route_memory(self) -> RouteTable:
        """The learned routes (:attr:`table`)."""
        return self.table

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        """Pick a replica for ``request`` and learn its boundaries there."""
        candidates = candidate_replicas(request, fleet)
        by_id = {r.replica_id: r for r in candidates}
        match = self._match(request, by_id, fleet.now)
        if match is not None and not self._overloaded(by_id[match.route.replica_id], candidates):
            chosen, reason = by_id[match.route.replica_id], "route"
            cached = match.route.blocks * request.block_tokens
        elif match is None:
            chosen, reason, cached = self._hash_fallback(request, candidates), "hash", 0
        else:  # the route's replica is overloaded: spread over the others
            others = [r for r in candidates if r.replica_id != match.route.replica_id]
            chosen, reason, cached = self._hash_fallback(request, others), "load-override", 0
        self._learn(request, chosen.replica_id, fleet.now)
        return Decision(chosen.replica_id, chosen.model, reason, min(cached, request.prompt_tokens))

    def observe(self, outcome: Outcome) -> None:
        """Drop routes the engine disproved for the replica that served ``outcome``."""
        self.table.correct(outcome)

    def _match(
        self, request: RouteRequest, by_id: dict[str, ReplicaState], now: float
    ) -> RouteMatch | None:
        model = self.cache_model

        def usable(key: int, route: Route) -> bool:
            # the cache model sees only this router's dispatches: it judges the routes
            # learned here, not those a peer (or a store) shared
            replica_id = route.replica_id
            if replica_id not in by_id:
                return False
            return model is None or route.trust == "peer" or model.holds(replica_id, key)

        return self.table.lookup(request.block_hashes, request.boundaries, now, usable)

    def _overloaded(self, preferred: ReplicaState, candidates: list[ReplicaState]) -> bool:
        if len(candidates) < 2:
            return False
        cfg = self.config
        median_flight = _median([r.in_flight for r in candidates])
        if preferred.in_flight > cfg.load_factor * median_flight + cfg.load_slack:
            return True
        median_queued = _median([r.queued_tokens for r in candidates])
        return preferred.queued_tokens > cfg.load_factor * median_queued + cfg.load_slack_tokens

    def _hash_fallback(self, request: RouteRequest, candidates: list[ReplicaState]) -> ReplicaState:
        ranked = rendezvous_rank(_request_key(request), candidates)
        total = sum(r.in_flight for r in candidates) + 1
        bound = math.ceil(self.config.hash_load_factor * total / len(candidates))
        for replica in ranked:
            if replica.in_flight + 1 <= bound:
                return replica
        return min(ranked, key=lambda r: r.in_flight)

    def _learn(self, request: RouteRequest, replica_id: str, now: float) -> None:
        hashes = request.block_hashes
        if not hashes:
            return
        self.table.learn(hashes, request.boundaries, replica_id, now)
        if self.cache_model is not None:
            self.cache_model.touch(replica_id, self._segments(request))

    @staticmethod
    def _segments(request: RouteRequest) -> list[tuple[int, int]]:
        """``(boundary key, tokens since the previous boundary)``, first block included
        so the model can tell whether any of the request's prefix is still held."""
        hashes, tokens = request.block_hashes, request.block_tokens
        segments = [(hashes[0], tokens)]
        previous = 1
        for b in sorted(request.boundaries):
            if previous < b <= len(hashes):
                segments.append((hashes[b - 1], (b - previous) * tokens))
                previous = b
        return segments
