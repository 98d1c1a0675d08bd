"""Routing: policies that pick the replica (and model) for each request, and the
protocol they share (:mod:`contextpilot_rag.routing.types`)."""

from .types import Decision, FleetView, Outcome, Policy, ReplicaState, RouteRequest

__all__ = ["Decision", "FleetView", "Outcome", "Policy", "ReplicaState", "RouteRequest"]
