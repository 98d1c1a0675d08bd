"""Routing: policies that pick the replica (and model) for each request, and the
protocol they share (:mod:`contextpilot_rag.routing.types`).

Policies by name (the names are a contract): ``random``, ``round-robin``,
``least-request``, ``least-load``, ``session``, ``prefix`` (baselines), ``ranvier``
(learned prefix routes), ``gorgo`` (cache + RTT + queue cost, optionally tuned) and
``gorgo-lb`` (the original GORGO package, if installed), ``laar`` (accuracy-aware:
latency / predicted accuracy per model) and ``combined`` (expected time to a correct
answer: RTT + queue + uncached prefill + decode, divided by predicted accuracy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from .baselines import (
    LeastLoadPolicy,
    LeastRequestPolicy,
    PrefixCachePolicy,
    RandomPolicy,
    RoundRobinPolicy,
    SessionAffinityPolicy,
)
from .combined import CombinedPolicy
from .gorgo import CostPolicy
from .laar import AccuracyModel, LaarPolicy
from .ranvier import RanvierConfig, RanvierPolicy, RouteTable
from .tuner import CostWeights, TunerBounds, WeightTuner
from .types import Decision, FleetView, Outcome, Policy, ReplicaState, RouteRequest

__all__ = [
    "POLICY_NAMES",
    "AccuracyModel",
    "AsyncChatStream",
    "Attempt",
    "ChatResult",
    "ChatStream",
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


def _gorgo_lb(**options: Any) -> Policy:
    from .external import GorgoLbPolicy

    return GorgoLbPolicy(**options)


_FACTORIES: dict[str, Callable[..., Policy]] = {
    "random": RandomPolicy,
    "round-robin": RoundRobinPolicy,
    "least-request": LeastRequestPolicy,
    "least-load": LeastLoadPolicy,
    "session": SessionAffinityPolicy,
    "prefix": PrefixCachePolicy,
    "ranvier": RanvierPolicy,
    "gorgo": CostPolicy,
    "gorgo-lb": _gorgo_lb,
    "laar": LaarPolicy,
    "combined": CombinedPolicy,
}
POLICY_NAMES = tuple(_FACTORIES)


def make_policy(name: str, **options: Any) -> Policy:
    """A new policy by its contract name; ``options`` go to its constructor."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown routing policy {name!r}; choose one of {list(POLICY_NAMES)}")
    return factory(**options)


from .client import (  # noqa: E402  (the client builds policies with make_policy)
    AsyncChatStream,
    Attempt,
    ChatResult,
    ChatStream,
    Endpoint,
    EndpointError,
    RoutingClient,
    RoutingError,
    SolveResult,
)
from .metrics import RoutingMetrics  # noqa: E402
