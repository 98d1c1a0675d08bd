"""Helpers every policy shares."""

from __future__ import annotations

from ..errors import NoReplicaAvailableError
from .types import FleetView, ReplicaState, RouteRequest

__all__ = ["candidate_replicas"]


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
