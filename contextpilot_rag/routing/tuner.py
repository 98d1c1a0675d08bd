"""Safe online tuning of the cost-routing weights: a (1+1)-ES with the 1/5 success rule.

The tuner searches the log of ``(prefill_weight, rtt_weight, queue_weight)``. Each trial
runs one candidate for ``window`` outcomes and scores it by the window's mean of
``ttft_s + e2e_weight · e2e_s`` (lower is better); a candidate better than the parent
replaces it. The step size grows by ``exp(1/3)`` on success and shrinks by ``exp(-1/12)``
on failure, which holds steady exactly at a 1/5 success rate (Kern et al., 2004).

Invariant: every weight the tuner ever proposes lies inside :class:`TunerBounds`. The
library defaults put a **floor on the queue weight** and a **cap on the RTT weight**:
scored on TTFT alone, the search otherwise learns to send everything to the nearest
replica and the fleet collapses onto it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, replace

from .._numbers import is_finite_at_least, is_finite_positive
from ..errors import ConfigError

__all__ = ["CostWeights", "TunerBounds", "WeightTuner"]


@dataclass(frozen=True)
class CostWeights:
    """Dimensionless multipliers of the physical cost terms (1.0 = the physical value)."""

    prefill_weight: float = 1.0
    rtt_weight: float = 1.0
    queue_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill_weight", "rtt_weight", "queue_weight"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be a positive finite number, got {value}")


@dataclass(frozen=True)
class TunerBounds:
    """The box the tuner searches; ``queue_weight_floor`` and ``rtt_weight_cap`` are the
    safety constraints (see the module docstring)."""

    prefill_weight_min: float = 0.25
    prefill_weight_max: float = 4.0
    rtt_weight_min: float = 0.05
    rtt_weight_cap: float = 2.0
    queue_weight_floor: float = 0.5
    queue_weight_max: float = 8.0

    def __post_init__(self) -> None:
        pairs = [
            (self.prefill_weight_min, self.prefill_weight_max),
            (self.rtt_weight_min, self.rtt_weight_cap),
            (self.queue_weight_floor, self.queue_weight_max),
        ]
        for low, high in pairs:
            if not 0 < low <= high:
                raise ConfigError(f"tuner bounds must satisfy 0 < low <= high, got {low}, {high}")

    def clip(self, weights: CostWeights) -> CostWeights:
        """``weights`` moved into the box."""
        return CostWeights(
            prefill_weight=min(max(weights.prefill_weight, self.prefill_weight_min),
                               self.prefill_weight_max),
            rtt_weight=min(max(weights.rtt_weight, self.rtt_weight_min), self.rtt_weight_cap),
            queue_weight=min(max(weights.queue_weight, self.queue_weight_floor),
                             self.queue_weight_max),
        )  # fmt: skip


class WeightTuner:
    """(1+1)-ES over log-weights; deterministic for a given ``seed`` and outcome stream.

    Drive it with :meth:`record` (one call per completed request); read the weights to
    route with from :attr:`weights`. :meth:`freeze` ends exploration for production."""

    def __init__(
        self,
        initial: CostWeights | None = None,
        *,
        bounds: TunerBounds | None = None,
        window: int = 64,
        e2e_weight: float = 0.5,
        sigma: float = 0.3,
        seed: int = 0,
    ) -> None:
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window}")
        if not is_finite_at_least(e2e_weight, 0):
            raise ConfigError(f"e2e_weight must be a finite number >= 0, got {e2e_weight!r}")
        if not is_finite_positive(sigma):
            raise ConfigError(f"sigma must be a finite number > 0, got {sigma!r}")
        self.bounds = bounds or TunerBounds()
        self.window = window
        self.e2e_weight = e2e_weight
        self.sigma = sigma
        self._rng = random.Random(seed)
        self.parent = self.bounds.clip(initial or CostWeights())
        self.parent_score: float | None = None
        self.weights = self.parent
        self.frozen = False
        self.trials = 0
        self.successes = 0
        self._samples: deque[float] = deque(maxlen=window)

    def record(self, ttft_s: float, e2e_s: float, *, weights: CostWeights | None = None) -> None:
        """Add one outcome of the weights in use; ends a trial every ``window`` outcomes.
        ``weights``: the weights the outcome's decision was made with; an outcome of
        other weights than the current trial's (a request decided before the last
        trial ended, finishing during this one) is not this trial's evidence and is
        left out."""
        if self.frozen or (weights is not None and weights is not self.weights):
            return
        self._samples.append(ttft_s + self.e2e_weight * e2e_s)
        if len(self._samples) == self.window:
            self._end_trial(sum(self._samples) / self.window)
            self._samples.clear()

    def freeze(self) -> CostWeights:
        """Stop exploring and route with the best weights found; returns them."""
        self.frozen = True
        self.weights = self.parent
        return self.parent

    def _end_trial(self, score: float) -> None:
        if self.parent_score is None:
            self.parent_score = score
        elif self.weights is not self.parent:
            self.trials += 1
            if score < self.parent_score:
                self.parent, self.parent_score = self.weights, score
                self.successes += 1
                self.sigma *= math.exp(1 / 3)
            else:
                self.sigma *= math.exp(-1 / 12)
            self.sigma = min(max(self.sigma, 1e-3), 2.0)
        self.weights = self._mutate(self.parent)

    def _mutate(self, parent: CostWeights) -> CostWeights:
        def step(value: float) -> float:
            return math.exp(math.log(value) + self.sigma * self._rng.gauss(0.0, 1.0))

        candidate = replace(
            parent,
            prefill_weight=step(parent.prefill_weight),
            rtt_weight=step(parent.rtt_weight),
            queue_weight=step(parent.queue_weight),
        )
        return self.bounds.clip(candidate)
