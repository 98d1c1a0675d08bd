"""The policy registry: every built-in policy by its contract name.

The names are a contract (configuration files, the CLI and benchmarks use them):
``random``, ``round-robin``, ``least-request``, ``least-load``, ``session``, ``prefix``
(baselines), ``ranvier`` (learned prefix routes), ``gorgo`` (cache + RTT + queue cost,
optionally tuned), ``gorgo-lb`` (the original GORGO package, if installed), ``laar``
(accuracy-aware) and ``combined`` (expected time to a correct answer).
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
from .laar import LaarPolicy
from .ranvier import RanvierPolicy
from .types import Policy

__all__ = ["POLICY_NAMES", "make_policy"]


def _gorgo_lb(**options: Any) -> Policy:
    from .external import GorgoLbPolicy  # the optional gorgo-lb package, only when asked for

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
POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_policy(name: str, **options: Any) -> Policy:
    """A new policy by its contract name; ``options`` go to its constructor. Raises
    :class:`~contextpilot_rag.errors.ConfigError` for an unknown name."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown routing policy {name!r}; choose one of {list(POLICY_NAMES)}")
    return factory(**options)
