"""Helpers every policy shares."""

from __future__ import annotations

from collections import deque

from ..errors import ConfigError, NoReplicaAvailableError
from .types import FleetView, ReplicaState, RouteRequest

__all__ = ["PromptBound", "candidate_replicas"]


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
    bound; unbounded replicas are absent and cost nothing."""

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self._recent: dict[str, deque[frozenset[int]]] = {}  # keys of each kept prompt

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

    def add(self, replica_id: str, keys: frozenset[int]) -> set[int]:
        """Record one prompt's route keys on a bounded replica; the keys of the prompts
        it pushed out that no kept prompt shares (their routes to it are stale)."""
        recent, limit = self._recent[replica_id], self.limits[replica_id]
        recent.append(keys)
        stale: set[int] = set()
        while len(recent) > limit:
            stale |= recent.popleft().difference(*recent)
        return stale
