"""Means with bootstrap confidence intervals, and paired differences between arms.

The bootstrap resamples *clusters* — the turns of one conversation together, every
other task alone — because turns of one conversation share documents and history, so
their scores are not independent; resampling them as a unit keeps the interval honest
(for single-turn tasks it is the ordinary bootstrap). Intervals are percentile
intervals of ``resamples`` resampled means, drawn from ``numpy.random.default_rng(seed)``:
the same scores and seed give the same interval.

A *paired* difference compares two arms on the same tasks (the arms send the same
questions): the per-task difference ``arm − baseline`` is bootstrapped, which removes
the spread between easy and hard tasks that two separate intervals would carry.

A percentile bootstrap over few clusters gives intervals far too narrow (one cluster:
every resample is the same, an interval of zero width), so no drop is called on fewer
than :data:`MIN_CLUSTERS` clusters: such a run can show a difference, not decide it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = [
    "MIN_CLUSTERS",
    "MIN_RESAMPLES",
    "Estimate",
    "bootstrap_mean",
    "check_options",
    "paired_difference",
    "significant_drop",
    "too_few_clusters",
]


MIN_CLUSTERS = 10
"""The fewest clusters (conversations, single-turn tasks) on which a drop is called:
below it the percentile bootstrap's intervals are too narrow to trust (simulated with
no real difference, seven turns per conversation: 1 conversation flags a drop in about
half the runs, 4 in one of ten, at a nominal 2.5%)."""

MIN_RESAMPLES = 100
"""The fewest bootstrap resamples accepted: fewer make the percentile bounds noise."""


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` scores (in ``clusters`` clusters) and its ``confidence``
    interval ``[low, high]``."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    clusters: int = 0


def check_options(resamples: int, confidence: float = 0.95, tolerance: float = 0.0) -> None:
    """Raise :class:`~contextpilot_rag.errors.ConfigError` for unusable bootstrap
    options (checked before a run, not after it)."""
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < MIN_RESAMPLES:
        raise ConfigError(f"resamples must be an integer >= {MIN_RESAMPLES}, got {resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    if not tolerance >= 0.0:
        raise ConfigError(f"tolerance must be >= 0, got {tolerance!r}")


def bootstrap_mean(
    values: Sequence[float],
    clusters: Sequence[str] | None = None,
    *,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Estimate | None:
    """The mean of ``values`` with a cluster-bootstrap interval (``clusters[i]`` is
    the cluster of ``values[i]``; ``None``: each value its own). ``None`` for no
    values."""
    check_options(resamples, confidence)
    if clusters is not None and len(clusters) != len(values):
        raise ConfigError("values and clusters must have the same length")
    if not values:
        return None
    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    names = list(range(len(values))) if clusters is None else list(clusters)
    keys = {name: index for index, name in enumerate(dict.fromkeys(names))}
    codes = np.fromiter((keys[name] for name in names), dtype=np.int64, count=len(names))
    sums = np.bincount(codes, weights=data, minlength=len(keys))
    counts = np.bincount(codes, minlength=len(keys)).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(keys), size=(resamples, len(keys)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    # the percentile bounds can miss the mean by rounding when every resample is equal
    return Estimate(
        mean, min(float(low), mean), max(float(high), mean), len(values), confidence, len(keys)
    )


def paired_difference(
    baseline: Sequence[float | None],
    arm: Sequence[float | None],
    clusters: Sequence[str],
    *,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Estimate | None:
    """The mean of ``arm[i] − baseline[i]`` over the tasks where both have a score,
    with a cluster-bootstrap interval; ``None`` when no task has both."""
    if not len(baseline) == len(arm) == len(clusters):
        raise ConfigError("baseline, arm and clusters must have the same length")
    pairs = [
        (b, a, c) for b, a, c in zip(baseline, arm, clusters, strict=True) if None not in (a, b)
    ]
    return bootstrap_mean(
        [a - b for b, a, _ in pairs],  # type: ignore[operator]
        [c for _, _, c in pairs],
        resamples=resamples,
        seed=seed,
        confidence=confidence,
    )


def significant_drop(difference: Estimate | None, tolerance: float = 0.0) -> bool:
    """A drop the data can tell from noise: the whole interval of ``arm − baseline``
    lies below ``−tolerance`` (``tolerance`` > 0 ignores drops smaller than that), over
    at least :data:`MIN_CLUSTERS` clusters (:func:`too_few_clusters`)."""
    check_options(MIN_RESAMPLES, tolerance=tolerance)
    if difference is None or too_few_clusters(difference):
        return False
    return difference.high < -tolerance


def too_few_clusters(estimate: Estimate | None) -> bool:
    """Whether ``estimate`` rests on fewer than :data:`MIN_CLUSTERS` clusters, too few
    for its interval to decide a drop."""
    return estimate is not None and estimate.clusters < MIN_CLUSTERS
