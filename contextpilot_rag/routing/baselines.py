"""Baseline routing policies: random, round-robin, least-request, least-load, session
affinity and prefix-cache (AIBrix-style). Each implements
:class:`~contextpilot_rag.routing.types.Policy`, is deterministic (randomness comes
from an explicit seed) and never picks an unhealthy replica. Replicas whose
``(replica_id, model)`` pair is in ``request.excluded`` are skipped unless every
healthy replica is excluded, in which case the healthy ones are used again (a retry
beats a failure)."""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ..errors import ConfigError, NoReplicaAvailableError
from .common import PromptBound, candidate_replicas
from .types import Decision, FleetView, Outcome, ReplicaState, RouteRequest

__all__ = [
    "LeastLoadPolicy",
    "LeastRequestPolicy",
    "NoReplicaAvailableError",
    "PrefixCachePolicy",
    "PrefixOwners",
    "RandomPolicy",
    "RoundRobinPolicy",
    "SessionAffinityPolicy",
    "candidate_replicas",
    "session_key",
]


def _decide(replica: ReplicaState, reason: str, cached_tokens: int = 0) -> Decision:
    return Decision(replica.replica_id, replica.model, reason, cached_tokens)


class _NoFeedback:
    def observe(self, outcome: Outcome) -> None:
        """Baselines learn nothing from outcomes."""


class RandomPolicy(_NoFeedback):
    """Uniformly random among candidates, from a seeded generator."""

    name = "random"
    route_memory = None

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        return _decide(self._rng.choice(candidate_replicas(request, fleet)), "random")


class RoundRobinPolicy(_NoFeedback):
    """The i-th request goes to candidate ``i mod len(candidates)``: with a stable,
    healthy fleet it cycles through the replicas in fleet order."""

    name = "round-robin"
    route_memory = None

    def __init__(self) -> None:
        self._counter = 0

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        candidates = candidate_replicas(request, fleet)
        replica = candidates[self._counter % len(candidates)]
        self._counter += 1
        return _decide(replica, "round-robin")


class _LeastBy(_NoFeedback):
    """The candidate with the smallest ``key``; ties rotate (a counter picks among the
    tied replicas) so an idle fleet is not routed to its first replica only."""

    name = ""
    _reason = ""
    route_memory = None

    def __init__(self) -> None:
        self._counter = 0

    def _key(self, replica: ReplicaState) -> int:
        raise NotImplementedError

    def pick(self, candidates: Sequence[ReplicaState]) -> ReplicaState:
        """The least-keyed replica among ``candidates`` (rotating among ties)."""
        best = min(self._key(r) for r in candidates)
        tied = [r for r in candidates if self._key(r) == best]
        self._counter += 1
        return tied[(self._counter - 1) % len(tied)]

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        return _decide(self.pick(candidate_replicas(request, fleet)), self._reason)


class LeastRequestPolicy(_LeastBy):
    """Fewest requests in flight."""

    name = "least-request"
    _reason = "least-request"

    def _key(self, replica: ReplicaState) -> int:
        return replica.in_flight


class LeastLoadPolicy(_LeastBy):
    """Fewest prompt tokens queued (sent and not yet prefilled)."""

    name = "least-load"
    _reason = "least-load"

    def _key(self, replica: ReplicaState) -> int:
        return replica.queued_tokens


def _rendezvous_score(key: str, replica_id: str) -> int:
    """A process-independent 64-bit score (Python's ``hash`` of str is salted)."""
    digest = hashlib.blake2b(f"{key}\x00{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def session_key(request: RouteRequest) -> str:
    """The affinity key: the session, else the first block's hash, else the request id."""
    if request.session is not None:
        return f"session:{request.session}"
    if request.block_hashes:
        return f"block:{request.block_hashes[0]}"
    return f"request:{request.request_id}"


class SessionAffinityPolicy(_NoFeedback):
    """Rendezvous (highest-random-weight) hashing of :func:`session_key` over the
    candidates: a key sticks to one replica while it stays a candidate, and when a
    replica leaves only its keys move."""

    name = "session"
    route_memory = None

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        key = session_key(request)
        replica = max(
            candidate_replicas(request, fleet),
            key=lambda r: _rendezvous_score(key, r.replica_id),
        )
        return _decide(replica, "session")


class PrefixOwners:
    """Bounded LRU map: chained block hash → the replica that last received the prefix
    it names (the prefix baseline's route table).

    Invariants: at most ``capacity_blocks`` entries; a replica limited to ``k`` prompts
    (:meth:`limit_prompts`) owns only blocks recorded for one of its ``k`` latest
    prompts."""

    def __init__(self, capacity_blocks: int = 200_000) -> None:
        if capacity_blocks < 1:
            raise ConfigError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._owners: OrderedDict[int, str] = OrderedDict()  # least recently used first
        self._bound = PromptBound()

    def __len__(self) -> int:
        return len(self._owners)

    def limit_prompts(self, replica_id: str, max_prompts: int | None) -> None:
        """``replica_id`` holds only its ``max_prompts`` most recently recorded prompts
        (a llama-server slot: 1); ``None`` removes the bound."""
        self._bound.limit(replica_id, max_prompts)

    def longest_match(
        self, block_hashes: Sequence[int], is_candidate: Callable[[str], bool]
    ) -> tuple[int, str | None]:
        """(matched blocks, owner) of the deepest known block whose owner is a
        candidate; (0, None) when there is none. Block hashes are chained (a block's
        hash names its whole prefix), so a known block past an unknown one is still a
        match: the blocks a client cannot key (:mod:`.prompt_keys` gives them hashes
        unique to the request) do not end the walk at its first boundary."""
        matched, owner = 0, None
        owners = self._owners
        for depth, block_hash in enumerate(block_hashes, start=1):
            replica_id = owners.get(block_hash)
            if replica_id is not None and is_candidate(replica_id):
                matched, owner = depth, replica_id
        return matched, owner

    def record(self, block_hashes: Sequence[int], replica_id: str) -> None:
        """Every block of one prompt now belongs to ``replica_id``."""
        # Tail first, so the head of a prompt is most recently used and evicted last.
        owners = self._owners
        for block_hash in reversed(block_hashes):
            owners[block_hash] = replica_id
            owners.move_to_end(block_hash)
        while len(owners) > self.capacity_blocks:
            owners.popitem(last=False)
        if replica_id in self._bound.limits:
            ends = {block_hash: b for b, block_hash in enumerate(block_hashes, start=1)}
            for block_hash in self._bound.add(replica_id, ends, blocks=len(block_hashes)):
                if owners.get(block_hash) == replica_id:
                    del owners[block_hash]


class PrefixCachePolicy(_NoFeedback):
    """Router-side prefix table (AIBrix ``prefix-cache`` style).

    The table (:class:`PrefixOwners`) maps a chained block hash to the replica that
    last received it, bounded to ``capacity_blocks`` entries with LRU eviction. A
    request goes to the candidate owning its longest matched prefix (its deepest known
    block: hashes are chained), unless that replica's ``in_flight``
    exceeds the fleet minimum by more than ``imbalance_threshold`` (default 8,
    AIBrix's default absolute imbalance count); then, and when nothing matches, it
    falls back to least-request. After each decision every block of the request is
    recorded for the chosen replica."""

    name = "prefix"

    def __init__(self, *, capacity_blocks: int = 200_000, imbalance_threshold: int = 8) -> None:
        if imbalance_threshold < 0:
            raise ConfigError(f"imbalance_threshold must be >= 0, got {imbalance_threshold}")
        self.route_memory = PrefixOwners(capacity_blocks)
        self._imbalance_threshold = imbalance_threshold
        self._fallback = LeastRequestPolicy()

    def __len__(self) -> int:
        return len(self.route_memory)

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        candidates = candidate_replicas(request, fleet)
        by_id = {r.replica_id: r for r in candidates}
        owners = self.route_memory
        matched, owner = owners.longest_match(request.block_hashes, by_id.__contains__)
        min_in_flight = min(r.in_flight for r in candidates)
        if owner is None:
            decision = _decide(self._fallback.pick(candidates), "prefix-miss:least-request")
        elif by_id[owner].in_flight - min_in_flight > self._imbalance_threshold:
            decision = _decide(self._fallback.pick(candidates), "prefix-imbalance:least-request")
        else:
            cached = min(matched * request.block_tokens, request.prompt_tokens)
            # a constant reason (a metrics label); the depth is in the cached tokens
            decision = _decide(by_id[owner], "prefix-match", cached)
        owners.record(request.block_hashes, decision.replica_id)
        return decision
