"""Per-model accuracy profiles for TTCA (time to correct answer) experiments.

A :class:`ModelProfile` gives a model's relative cost ``c(m)``, its speed relative to
an 8B reference engine, and ``accuracy(language, tokens)``: the probability that it
answers a long-context lookup correctly. Correctness of one model on one logical
request is drawn **once** from a stable hash (:func:`correct`), as under greedy
decoding: retrying the same model on the same request fails again.

Assumptions (shaped on the LAAR paper's qualitative findings, not its numbers):

- no single model is best for every (language, length);
- a small (1.5B) model is strongest at mid lengths (8K–16K) and weak at both ends;
- a 2B model overtakes its 8B sibling at 32K and beyond;
- one 8B model collapses beyond 16K;
- the language (en / ja / zh) shifts the ranking (additive per-language offsets).

Accuracies are interpolated linearly in ``log2(tokens)`` between anchor lengths
4K, 8K, 16K, 32K, 64K (held constant outside), then shifted by the language offset
and clipped to ``[0.01, 0.99]``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..routing.types import RouteRequest

__all__ = ["ANCHOR_TOKENS", "DEFAULT_MODELS", "ModelProfile", "correct"]

ANCHOR_TOKENS: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536)
_LOG_ANCHORS = tuple(math.log2(t) for t in ANCHOR_TOKENS)


@dataclass(frozen=True)
class ModelProfile:
    """One model: ``cost`` (relative c(m)), ``speed`` (prefill and decode rate
    multiplier vs. the 8B reference), ``accuracy_at`` (accuracy at each of
    :data:`ANCHOR_TOKENS`) and ``language_shift`` (added per language; missing = 0)."""

    name: str
    cost: float
    speed: float
    accuracy_at: tuple[float, ...]
    language_shift: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or self.cost <= 0 or self.speed <= 0:
            raise ConfigError("a ModelProfile needs a name and cost, speed > 0")
        if len(self.accuracy_at) != len(ANCHOR_TOKENS):
            raise ConfigError(f"accuracy_at needs {len(ANCHOR_TOKENS)} values (4K..64K)")
        if not all(0.0 <= a <= 1.0 for a in self.accuracy_at):
            raise ConfigError("accuracy_at values must lie in [0, 1]")

    def accuracy(self, language: str, tokens: int) -> float:
        """Probability of a correct answer for a ``tokens``-long prompt in ``language``."""
        base = _interpolate(self.accuracy_at, math.log2(max(tokens, 1)))
        return min(0.99, max(0.01, base + self.language_shift.get(language, 0.0)))


def _interpolate(values: tuple[float, ...], x: float) -> float:
    if x <= _LOG_ANCHORS[0]:
        return values[0]
    for i in range(1, len(_LOG_ANCHORS)):
        if x <= _LOG_ANCHORS[i]:
            t = (x - _LOG_ANCHORS[i - 1]) / (_LOG_ANCHORS[i] - _LOG_ANCHORS[i - 1])
            return values[i - 1] + t * (values[i] - values[i - 1])
    return values[-1]


DEFAULT_MODELS: tuple[ModelProfile, ...] = (
    ModelProfile(
        "small-1.5b",
        cost=0.2,
        speed=3.0,
        accuracy_at=(0.45, 0.80, 0.78, 0.40, 0.25),
        language_shift={"ja": -0.10, "zh": 0.05},
    ),
    ModelProfile(
        "family-2b",
        cost=0.3,
        speed=2.5,
        accuracy_at=(0.50, 0.52, 0.56, 0.62, 0.58),
        language_shift={"ja": 0.05, "zh": -0.05},
    ),
    ModelProfile(
        "family-8b",
        cost=1.0,
        speed=1.0,
        accuracy_at=(0.74, 0.72, 0.66, 0.50, 0.38),
        language_shift={"ja": 0.05, "zh": 0.10},
    ),
    ModelProfile(
        "collapse-8b",
        cost=0.9,
        speed=1.1,
        accuracy_at=(0.80, 0.76, 0.70, 0.12, 0.05),
        language_shift={"ja": -0.15, "zh": -0.10},
    ),
    ModelProfile(
        "large-14b",
        cost=2.0,
        speed=0.5,
        accuracy_at=(0.70, 0.68, 0.64, 0.56, 0.50),
        language_shift={"en": -0.05, "ja": 0.12, "zh": 0.08},
    ),
)


def _uniform(*parts: object) -> float:
    """A process-independent uniform draw in [0, 1) keyed by ``parts``."""
    key = "\x00".join(str(p) for p in parts).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def correct(model: ModelProfile, request: RouteRequest, seed: int = 0) -> bool:
    """Whether ``model`` answers ``request`` correctly: fixed per (model, logical
    request, seed) — retries of one logical request share ``logical_id``."""
    language = str(request.features.get("language", "en"))
    logical = request.logical_id if request.logical_id is not None else request.request_id
    return _uniform(seed, model.name, logical) < model.accuracy(language, request.prompt_tokens)
