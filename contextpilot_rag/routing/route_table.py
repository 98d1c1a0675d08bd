"""What every learned route table shares: prefix keys → who was sent them, bounded.

A route table remembers, per **key**, which replica was sent a prefix and when. The key
is the chained block hash of the prefix's last block (``block_hashes[b - 1]`` for a
boundary of ``b`` blocks), so one dict probe names a whole prefix. What a key holds is
the policy's: one route with a trust rank (:class:`~.ranvier.RouteTable`), or every
replica sent the prefix (:class:`~.gorgo.PrefixLocations`).

Invariants of :class:`RouteTableBase`:

- at most ``capacity`` keys are held, over all ranks; when full, the least recently
  used key of the lowest non-empty rank is evicted first;
- an entry older than ``ttl_s`` is never used;
- a replica limited to ``k`` prompts (:meth:`RouteTableBase.limit_prompts`) keeps its
  routes only under keys recorded for one of its ``k`` latest prompts;
- a **peer** entry (a route another router learned, :meth:`RouteTableBase.learn_peer`,
  shared through a :class:`~.route_store.RouteStore`) is a hint with lower trust than
  what this router saw itself: it is used only for a prefix this router holds no live
  local entry for, never replaces a local entry, and is evicted first (rank 0).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Generic, TypeVar

from ..errors import ConfigError
from .common import Displaced, PromptBound
from .types import Outcome, RouteRequest

__all__ = ["RouteTableBase"]

Entry = TypeVar("Entry")


class RouteTableBase(ABC, Generic[Entry]):
    """Bounded LRU ranks of ``key → Entry``, with a TTL and per-replica prompt bounds.

    ``ranks`` ordered dicts hold the entries, least recently used first; rank 0 is
    evicted before rank 1. Subclasses own what an entry means and say how a replica
    is dropped from one (:meth:`forget`)."""

    def __init__(self, capacity: int, ttl_s: float, *, ranks: int = 1) -> None:
        if capacity < 1:
            raise ConfigError(f"{type(self).__name__} capacity must be >= 1, got {capacity}")
        if not ttl_s > 0:  # NaN included: routes would never expire
            raise ConfigError(f"{type(self).__name__} ttl_s must be > 0, got {ttl_s}")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._ranks: tuple[OrderedDict[int, Entry], ...] = tuple(
            OrderedDict() for _ in range(ranks)
        )
        self._bound = PromptBound()

    def __len__(self) -> int:
        ranks = self._ranks  # on every record: one rank (gorgo) is the common case
        return len(ranks[0]) if len(ranks) == 1 else sum(map(len, ranks))

    def limit_prompts(self, replica_id: str, max_prompts: int | None) -> None:
        """``replica_id`` holds only its ``max_prompts`` most recently recorded prompts
        (a llama-server slot: 1): its routes that only older prompts had are dropped.
        ``None`` removes the bound. Prompts recorded before the call are not counted."""
        self._bound.limit(replica_id, max_prompts)

    @property
    def bounded(self) -> Mapping[str, int]:
        """The replicas limited by :meth:`limit_prompts`, with their bound (read-only)."""
        return MappingProxyType(self._bound.limits)

    def displaced(self, replica_id: str, block_hashes: Sequence[int]) -> Displaced | None:
        """What sending the prompt ``block_hashes`` to ``replica_id`` would push out of
        it (:class:`~.common.Displaced`: the oldest kept prompt's blocks beyond the
        prefix the two share, when it was recorded on this table's clock, its length).
        ``None`` for a replica without a prompt bound, or one that keeps fewer prompts
        than its bound (nothing is pushed out)."""
        return self._bound.displaced(replica_id, block_hashes)

    @abstractmethod
    def forget(self, key: int, replica_id: str) -> object:
        """The engine disproved ``replica_id`` holding the prefix ending at ``key``."""

    @abstractmethod
    def knows(self, key: int, now: float) -> bool:
        """Whether a live entry (local or peer) is held for ``key``."""

    @abstractmethod
    def learn_peer(
        self, key: int, replica_id: str, blocks: int, learned_s: float, now: float
    ) -> bool:
        """Take another router's route (the prefix of ``blocks`` blocks ending at
        ``key`` went to ``replica_id`` at ``learned_s`` on this table's clock, which
        reads ``now``) as a peer entry; ``False`` when a live local entry for ``key``
        overrides it."""

    def correct(self, outcome: Outcome) -> None:
        """Forget the prefixes the engine showed ``outcome``'s replica did not hold: the
        boundaries the decision counted as cached beyond the cached tokens the engine
        reported (every boundary on error: nothing was served). The request's own
        boundaries beyond what the decision counted on stay: the replica has just
        prefilled them, so nothing shows it lacks them (forgetting them hid a
        conversation's prompt from the route table whenever its first turn was predicted
        a cached system prompt the engine did not have, and its next turn went wherever
        the load pointed). A cancelled request, or one served at least as well as
        predicted, changes nothing."""
        request, decision = outcome.request, outcome.decision
        if outcome.cancelled or (
            outcome.error is None and outcome.cached_tokens >= decision.predicted_cached_tokens
        ):
            return
        block, failed = request.block_tokens, outcome.error is not None
        kept = 0 if failed else outcome.cached_tokens // block
        relied_on = (
            len(request.block_hashes) if failed else -(-decision.predicted_cached_tokens // block)
        )
        self.forget_between(request, decision.replica_id, kept, relied_on)

    def forget_between(
        self, request: RouteRequest, replica_id: str, kept_blocks: int, up_to_blocks: int
    ) -> None:
        """:meth:`forget` ``replica_id`` at every boundary of ``request`` longer than
        ``kept_blocks`` blocks and at most ``up_to_blocks``."""
        hashes = request.block_hashes
        last = min(up_to_blocks, len(hashes))
        for b in request.boundaries:
            if kept_blocks < b <= last:
                self.forget(hashes[b - 1], replica_id)

    def _evict(self) -> None:
        """Drop least recently used keys, lowest rank first, until within capacity."""
        excess = len(self) - self.capacity
        if excess <= 0:
            return
        for rank in self._ranks:
            while excess > 0 and rank:
                rank.popitem(last=False)
                excess -= 1

    def _count_prompt(
        self,
        block_hashes: Sequence[int],
        boundaries: Iterable[int],
        replica_id: str,
        now: float,
    ) -> None:
        """Count one prompt recorded on ``replica_id`` at ``boundaries`` at ``now``; on
        a replica limited by :meth:`limit_prompts`, release it from the keys of the
        prompts this one pushed out."""
        if replica_id not in self._bound.limits:
            return
        n = len(block_hashes)
        ends = {block_hashes[b - 1]: b for b in boundaries if 1 <= b <= n}
        for key in self._bound.add(replica_id, ends, blocks=n, at_s=now):
            self._release(key, replica_id)

    def _release(self, key: int, replica_id: str) -> None:
        """``replica_id`` no longer holds the prefix ending at ``key``: newer prompts
        pushed it out. :meth:`forget` unless a subclass drops more."""
        self.forget(key, replica_id)
