"""Helpers every policy shares."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from ..errors import ConfigError, NoReplicaAvailableError
from .types import FleetView, ReplicaState, RouteRequest

__all__ = ["Displaced", "PromptBound", "candidate_replicas"]


def candidate_replicas(request: RouteRequest, fleet: FleetView) -> list[ReplicaState]:
    """Healthy replicas not excluded for ``request``, in fleet order; all healthy ones
    when every one is excluded (a retry may go back rather than fail). Raises
    :class:`NoReplicaAvailableError` if none is healthy."""
    replicas = fleet.replicas
    healthy = [replica for replica in replicas if replica.healthy]
    if not healthy:
        raise NoReplicaAvailableError(f"no healthy replica for request {request.request_id!r}")
    if not request.excluded:
        return healthy
    allowed = [r for r in healthy if (r.replica_id, r.model) not in request.excluded]
    return allowed or healthy


class PromptBound:
    """How many prompts' routes a route table keeps per replica (a llama-server slot
    holds only its last prompt: 1). ``limits`` maps the bounded replicas to their
    bound; unbounded replicas are absent and cost nothing.

    Each kept prompt is remembered as its route keys with the prefix length (blocks)
    each ends, its own length and when it was recorded, so a router can tell what
    recording one more prompt would push out (:meth:`displaced`)."""

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self._recent: dict[str, deque[_Kept]] = {}  # oldest kept prompt first

    def limit(self, replica_id: str, max_prompts: int | None) -> None:
        """Bound ``replica_id`` to its ``max_prompts`` latest prompts; ``None`` removes
        the bound. Prompts recorded before the call are not counted."""
        if max_prompts is None:
            self.limits.pop(replica_id, None)
            self._recent.pop(replica_id, None)
            return
        if isinstance(max_prompts, bool) or not isinstance(max_prompts, int) or max_prompts < 1:
            raise ConfigError(f"max_prompts must be an integer >= 1 or None, got {max_prompts!r}")
        self.limits[replica_id] = max_prompts
        self._recent[replica_id] = deque()

    def add(
        self, replica_id: str, ends: dict[int, int], *, blocks: int, at_s: float = 0.0
    ) -> set[int]:
        """Record one prompt on a bounded replica: ``ends`` maps its route keys to the
        prefix length (blocks) each ends, ``blocks`` is its length, ``at_s`` when it was
        sent. Returns the keys of the prompts it pushed out that no kept prompt shares
        (their routes to it are stale)."""
        recent, limit = self._recent[replica_id], self.limits[replica_id]
        recent.append(_Kept(ends, blocks, at_s))
        stale: set[int] = set()
        while len(recent) > limit:
            stale |= set(recent.popleft().ends).difference(*(kept.ends for kept in recent))
        return stale

    def displaced(self, replica_id: str, block_hashes: Sequence[int]) -> Displaced | None:
        """What recording the prompt ``block_hashes`` on ``replica_id`` would push out
        (:class:`Displaced`); ``None`` when the replica is unbounded or keeps fewer
        prompts than its bound."""
        recent = self._recent.get(replica_id)
        if recent is None or len(recent) < self.limits[replica_id]:
            return None
        oldest = recent[0]
        n, shared = len(block_hashes), 0
        for key, b in oldest.ends.items():  # chained hashes: one match names the prefix
            if shared < b <= n and block_hashes[b - 1] == key:
                shared = b
        return Displaced(max(0, oldest.blocks - shared), oldest.at_s, oldest.blocks)


class Displaced(NamedTuple):
    """The oldest prompt a bounded replica keeps, as one more prompt would push it out:
    ``lost``, its blocks beyond the prefix the two share; ``sent_s``, when it was
    recorded (the route table's clock); ``blocks``, its length."""

    lost: int
    sent_s: float
    blocks: int


class _Kept(NamedTuple):
    """One prompt a bounded replica keeps (see :class:`PromptBound`)."""

    ends: dict[int, int]  # route key -> blocks of the prefix it ends
    blocks: int
    at_s: float
