"""Cost routing (GORGO): pick the replica with the lowest expected time to first token.

Per replica ``u``::

    cost(u) = prefill_weight · uncached_tokens(u) / prefill_rate(u)
            + rtt_weight     · rtt_s(u)
            + queue_weight   · queued_tokens(u) / prefill_rate(u)

Every term is in seconds, so weights of 1.0 make ``cost`` the physical TTFT estimate
(network + queue drain + own prefill). ``uncached_tokens`` comes from a router-side
estimate, :class:`PrefixLocations`: which replicas were sent which boundary prefixes.
Each dispatch records at most ``recorded_boundaries`` of the prompt's boundaries (the
longest, the first and evenly spaced ones between, plus the prefix the decision relied
on), so the route update costs O(1) rather than O(boundaries): a later request sharing
a prefix is credited the longest recorded boundary inside it, an underestimate of at
most one spacing.
A replica that keeps only its last few prompts (a llama-server slot keeps one) can be
given that bound (:meth:`PrefixLocations.limit_prompts`): a prefix it was sent stops
attracting requests once newer prompts have overwritten it.
Weights are fixed, or tuned online by :class:`~contextpilot_rag.routing.tuner.WeightTuner`
and then frozen.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from ..errors import ConfigError
from .common import candidate_replicas
from .route_table import RouteTableBase
from .tuner import CostWeights, WeightTuner
from .types import Decision, FleetView, Outcome, ReplicaState, RouteRequest

__all__ = ["CostPolicy", "PrefixLocations", "spread_boundaries"]


def spread_boundaries(boundaries: Sequence[int], keep: int) -> list[int]:
    """At most ``keep`` (>= 2) of ``boundaries`` (ascending, distinct, as a
    :class:`~.types.RouteRequest` holds them): all of them if few enough, else the
    first, the last and evenly spaced ones between."""
    last = len(boundaries) - 1
    if last < keep:
        return list(boundaries)
    picked = [boundaries[i * last // (keep - 1)] for i in range(keep)]
    return picked if len(set(picked)) == keep else sorted(set(picked))


class _Holders:
    """Replicas sent one boundary prefix, and when it was last sent anywhere."""

    __slots__ = ("replicas", "stamp")

    def __init__(self, stamp: float, replicas: dict[str, int]) -> None:
        self.stamp = stamp
        self.replicas = replicas


class PrefixLocations(RouteTableBase[_Holders]):
    """Bounded LRU map: boundary block hash → {replica_id: blocks} of replicas sent it.

    The invariants of :class:`~.route_table.RouteTableBase` hold (``capacity`` keys,
    ``ttl_s``, prompt bounds, peer entries as hints of lower trust); an entry's stamp
    is when its prefix was last sent anywhere, and a stale entry's replicas are dropped
    when it is recorded again. A peer entry is consulted only where no live local entry
    is held, so a prefix this router sent (or saw disproved) follows its own record."""

    def __init__(self, capacity: int = 100_000, ttl_s: float = 600.0) -> None:
        super().__init__(capacity, ttl_s, ranks=2)
        self._peer, self._entries = self._ranks

    def cached_blocks(
        self, request: RouteRequest, now: float, replicas: Collection[str] | None = None
    ) -> dict[str, int]:
        """Longest known cached prefix (in blocks) of ``request`` per replica, probing
        its boundaries longest first; replicas absent from the result have nothing
        cached. With ``replicas`` (the ids the caller reads; a set is fastest) the
        probe stops once each of them has a match, and other replicas' shorter matches
        may be missing. Only those named count: routes to replicas that have left the
        fleet stay until they expire, and counting them stopped the probe before a
        replica still in the fleet had its shorter match."""
        hashes = request.block_hashes
        lookup, oldest = self._entries.get, now - self.ttl_s
        peer = self._peer.get if self._peer else None
        found: dict[str, int] = {}
        wanted: Collection[str] = () if replicas is None else replicas
        unmatched = -1 if replicas is None else len(wanted)  # -1: probe every boundary
        for b in reversed(request.boundaries):  # validated: ascending, in 1..len(hashes)
            entry = lookup(hashes[b - 1])
            if entry is None or entry.stamp < oldest:
                if peer is None:
                    continue
                entry = peer(hashes[b - 1])
                if entry is None or entry.stamp < oldest:
                    continue
            for replica_id in entry.replicas:
                if replica_id not in found:
                    found[replica_id] = b
                    if unmatched > 0 and replica_id in wanted:
                        unmatched -= 1
            if not unmatched:
                break
        return found

    def record(
        self, block_hashes: Sequence[int], boundaries: Sequence[int], replica_id: str, now: float
    ) -> None:
        """Note that ``replica_id`` was sent the prefixes ending at ``boundaries`` (one
        prompt: on a replica limited by :meth:`limit_prompts`, its oldest prompt's routes
        go when this one makes it one too many)."""
        n = len(block_hashes)
        entries, oldest = self._entries, now - self.ttl_s
        for b in boundaries:
            if not 1 <= b <= n:
                continue
            key = block_hashes[b - 1]
            entry = entries.get(key)
            if entry is None:
                entries[key] = _Holders(now, {replica_id: b})  # new keys go last
                continue
            if entry.stamp < oldest:
                entry.replicas.clear()
            entry.stamp = now
            entry.replicas[replica_id] = b
            entries.move_to_end(key)
        self._evict()
        self._count_prompt(block_hashes, boundaries, replica_id, now)

    def record_route(
        self, request: RouteRequest, replica_id: str, relied_on: int, now: float, keep: int
    ) -> None:
        """Record a bounded spread of ``keep`` boundaries (:func:`spread_boundaries`)
        and the prefix (``relied_on`` blocks) the decision counted as cached, so the
        reused route stays fresh; O(keep), not O(boundaries)."""
        hashes = request.block_hashes
        recorded = spread_boundaries(request.boundaries, keep)
        if relied_on and relied_on not in recorded:
            recorded.append(relied_on)
        self.record(hashes, recorded, replica_id, now)

    def forget(self, key: int, replica_id: str) -> None:
        """The engine disproved ``replica_id`` holding the prefix ending at ``key``
        (a peer's claim included)."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.replicas.pop(replica_id, None)
        if self._peer:
            hint = self._peer.get(key)
            if hint is not None and hint.replicas.pop(replica_id, None) is not None:
                del self._peer[key]

    def knows(self, key: int, now: float) -> bool:
        oldest = now - self.ttl_s
        entry = self._entries.get(key)
        if entry is not None and entry.stamp >= oldest:
            return True
        hint = self._peer.get(key)
        return hint is not None and hint.stamp >= oldest

    def learn_peer(
        self, key: int, replica_id: str, blocks: int, learned_s: float, now: float
    ) -> bool:
        entry = self._entries.get(key)
        if entry is not None and entry.stamp >= now - self.ttl_s:
            return False
        self._peer[key] = _Holders(learned_s, {replica_id: blocks})
        self._peer.move_to_end(key)
        self._evict()
        return True

    def _release(self, key: int, replica_id: str) -> None:
        self.forget(key, replica_id)
        entry = self._entries.get(key)
        if entry is not None and not entry.replicas:
            del self._entries[key]


_MAX_DECIDED = 65_536  # requests in flight whose deciding weights are remembered


class CostPolicy:
    """Minimum-cost replica; weights from ``weights`` or, while tuning, from ``tuner``."""

    name = "gorgo"

    def __init__(
        self,
        weights: CostWeights | None = None,
        *,
        tuner: WeightTuner | None = None,
        locations: PrefixLocations | None = None,
        recorded_boundaries: int = 8,
    ) -> None:
        if recorded_boundaries < 2:
            raise ConfigError(f"recorded_boundaries must be >= 2, got {recorded_boundaries}")
        self.recorded_boundaries = recorded_boundaries
        self.tuner = tuner
        # while tuning: the weights each request in flight was decided with, so that
        # its outcome counts for the trial that chose it (bounded: oldest dropped)
        self._decided_with: OrderedDict[str, CostWeights] = OrderedDict()
        self._fixed = weights or CostWeights()
        self.locations = locations if locations is not None else PrefixLocations()

    @property
    def route_memory(self) -> PrefixLocations:
        """Where prefixes were sent (:attr:`locations`)."""
        return self.locations

    @property
    def weights(self) -> CostWeights:
        """The weights the next decision uses."""
        return self.tuner.weights if self.tuner is not None else self._fixed

    def freeze(self) -> CostWeights:
        """Stop tuning; route with the best weights found (or the fixed ones)."""
        if self.tuner is not None:
            self._fixed = self.tuner.freeze()
            self.tuner = None
            self._decided_with.clear()
        return self._fixed

    def costs(
        self, request: RouteRequest, replicas: Sequence[ReplicaState], now: float
    ) -> dict[str, tuple[float, int]]:
        """``replica_id → (cost_s, predicted cached tokens)`` for each replica."""
        w = self.weights
        wp, wr, wq = w.prefill_weight, w.rtt_weight, w.queue_weight
        tokens, block_tokens = request.prompt_tokens, request.block_tokens
        known = self.locations.cached_blocks(request, now)
        result: dict[str, tuple[float, int]] = {}
        for r in replicas:
            cached = min(known.get(r.replica_id, 0) * block_tokens, tokens)
            cost = (wp * (tokens - cached) + wq * r.queued_tokens) / r.prefill_tokens_per_s
            result[r.replica_id] = (cost + wr * r.rtt_s, cached)
        return result

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        """The cheapest healthy, non-excluded replica (ties: first in fleet order);
        the same costs as :meth:`costs`, computed in one pass without the dict."""
        candidates = candidate_replicas(request, fleet)
        w = self.weights
        wp, wr, wq = w.prefill_weight, w.rtt_weight, w.queue_weight
        tokens, block_tokens = request.prompt_tokens, request.block_tokens
        known = self.locations.cached_blocks(request, fleet.now)
        best, best_cost, best_cached = candidates[0], float("inf"), 0
        for r in candidates:
            cached = min(known.get(r.replica_id, 0) * block_tokens, tokens)
            cost = (wp * (tokens - cached) + wq * r.queued_tokens) / r.prefill_tokens_per_s
            cost += wr * r.rtt_s
            if cost < best_cost:
                best, best_cost, best_cached = r, cost, cached
        relied_on = known.get(best.replica_id, 0)
        self.locations.record_route(
            request, best.replica_id, relied_on, fleet.now, self.recorded_boundaries
        )
        if self.tuner is not None:
            self._decided_with[request.request_id] = w
            self._decided_with.move_to_end(request.request_id)
            while len(self._decided_with) > _MAX_DECIDED:
                self._decided_with.popitem(last=False)
        return Decision(best.replica_id, best.model, "min-cost", best_cached, best_cost)

    def observe(self, outcome: Outcome) -> None:
        """Feed the tuner (the outcome counts for the weights that decided it);
        forget prefixes the engine reported as not cached."""
        used = self._decided_with.pop(outcome.request.request_id, None)
        if self.tuner is not None and outcome.error is None and used is not None:
            self.tuner.record(outcome.ttft_s, outcome.e2e_s, weights=used)
        self.locations.correct(outcome)
