"""Routing: policies that pick the replica (and model) for each request, the protocol
they share (:mod:`contextpilot_rag.routing.types`) and the routing client.

Policies by name (the names are a contract, :mod:`~contextpilot_rag.routing.registry`):
``random``, ``round-robin``, ``least-request``, ``least-load``, ``session``, ``prefix``
(baselines), ``ranvier`` (learned prefix routes), ``gorgo`` (cache + RTT + queue cost,
optionally tuned) and ``gorgo-lb`` (the original GORGO package, if installed), ``laar``
(accuracy-aware: latency / predicted accuracy per model) and ``combined`` (expected time
to a correct answer: RTT + queue + uncached prefill + decode, divided by predicted
accuracy).

Policies and types are pure (stdlib + numpy). The client names (``RoutingClient``,
``Endpoint``, ``ChatResult``, ``RoutingMetrics``, ...) are imported on first use, so
importing this package (or the simulator, which uses the policies) does not import
httpx or the pilot.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..errors import EndpointError, RoutingError
from .baselines import (
    LeastLoadPolicy,
    LeastRequestPolicy,
    PrefixCachePolicy,
    RandomPolicy,
    RoundRobinPolicy,
    SessionAffinityPolicy,
)
from .combined import CombinedConfig, CombinedPolicy
from .gorgo import CostPolicy
from .laar import AccuracyModel, LaarPolicy
from .ranvier import RanvierConfig, RanvierPolicy, RouteTable
from .registry import POLICY_NAMES, make_policy
from .tuner import CostWeights, TunerBounds, WeightTuner
from .types import (
    Decision,
    FleetView,
    Outcome,
    Policy,
    ReplicaState,
    RouteMemory,
    RouteRequest,
)

if TYPE_CHECKING:
    from .client import (
        AsyncChatStream,
        Attempt,
        ChatResult,
        ChatStream,
        ClientConfig,
        Endpoint,
        RoutingClient,
        SolveResult,
    )
    from .metrics import RoutingMetrics

__all__ = [
    "POLICY_NAMES",
    "AccuracyModel",
    "AsyncChatStream",
    "Attempt",
    "ChatResult",
    "ChatStream",
    "ClientConfig",
    "CombinedConfig",
    "CombinedPolicy",
    "CostPolicy",
    "CostWeights",
    "Decision",
    "Endpoint",
    "EndpointError",
    "FleetView",
    "LaarPolicy",
    "LeastLoadPolicy",
    "LeastRequestPolicy",
    "Outcome",
    "Policy",
    "PrefixCachePolicy",
    "RandomPolicy",
    "RanvierConfig",
    "RanvierPolicy",
    "ReplicaState",
    "RoundRobinPolicy",
    "RouteMemory",
    "RouteRequest",
    "RouteTable",
    "RoutingClient",
    "RoutingError",
    "RoutingMetrics",
    "SessionAffinityPolicy",
    "SolveResult",
    "TunerBounds",
    "WeightTuner",
    "make_policy",
]

# The client layer (httpx, the pilot), imported on first access: name -> module.
_LAZY = {
    "AsyncChatStream": ".client",
    "Attempt": ".client",
    "ChatResult": ".client",
    "ChatStream": ".client",
    "ClientConfig": ".client",
    "Endpoint": ".client",
    "RoutingClient": ".client",
    "SolveResult": ".client",
    "RoutingMetrics": ".metrics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
