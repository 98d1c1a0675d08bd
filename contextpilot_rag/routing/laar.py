"""Accuracy-aware routing (LAAR): route to the model with the lowest expected cost
per correct answer.

Per candidate replica ``u`` serving model ``m``::

    cost(u) = c(m) · (T(u, x) + α · R(m)) / Q(m, x)

``Q(m, x)`` is :class:`AccuracyModel`'s predicted probability that ``m`` answers ``x``
correctly (a per-model logistic regression on cheap features). ``T(u, x)`` is the
expected latency on ``u`` without cache: RTT + queue drain + prefill of the whole
prompt + decode. ``R(m)`` is an exponentially weighted mean of ``m``'s observed
end-to-end latencies (0 until the first outcome): the load signal LAAR uses.
Models already tried for the logical request are skipped while another model is
left (correctness is fixed per model under greedy decoding, so retrying one cannot
help); excluded ``(replica, model)`` pairs are skipped by :func:`candidate_replicas`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from .._numbers import is_finite_at_least, is_finite_positive, is_int
from ..errors import ConfigError, InvalidInputError
from .common import candidate_replicas
from .types import Decision, FleetView, Outcome, ReplicaState, RouteRequest

__all__ = [
    "AccuracyModel",
    "LaarPolicy",
    "argmin_replica",
    "request_features",
    "uncached_latency_s",
    "untried_models",
]

_LANGUAGES = ("en", "ja", "zh")
_BUCKETS = ("4k", "8k", "16k", "32k", "64k", "64k+")
_Vector = npt.NDArray[np.float64]


def _bucket_of(tokens: int) -> str:
    for limit_k, name in zip((4, 8, 16, 32, 64), _BUCKETS, strict=False):
        if tokens <= limit_k * 1024:
            return name
    return "64k+"


def request_features(request: RouteRequest, tasks: Sequence[str]) -> _Vector:
    """Bias, language one-hot, length-bucket one-hot and task one-hot (over
    ``tasks``). The bucket falls back to one computed from ``prompt_tokens``."""
    features = request.features
    language = str(features.get("language", ""))
    bucket = str(features.get("length_bucket", _bucket_of(request.prompt_tokens)))
    task = str(features.get("task", ""))
    row = [1.0]
    row += [float(language == name) for name in _LANGUAGES]
    row += [float(bucket == name) for name in _BUCKETS]
    row += [float(task == name) for name in tasks]
    return np.asarray(row, dtype=np.float64)


def _fit_logistic(x: _Vector, y: _Vector, iterations: int, lr: float, l2: float) -> _Vector:
    """Full-batch gradient descent on mean log loss + ``l2``·|w|² (bias included)."""
    weights = np.zeros(x.shape[1], dtype=np.float64)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ weights)))
        weights -= lr * (x.T @ (p - y) / len(y) + 2.0 * l2 * weights)
    return weights


class AccuracyModel:
    """Per-model logistic regressions ``Q(m, x)``. Unfitted models predict ``None``
    (callers treat that as "unknown": Q = 1). Deterministic: zero init, full batch."""

    def __init__(self, *, iterations: int = 400, learning_rate: float = 0.5, l2: float = 1e-3):
        if not (
            is_int(iterations)
            and iterations >= 1
            and is_finite_positive(learning_rate)
            and is_finite_at_least(l2, 0)
        ):
            raise ConfigError("AccuracyModel needs iterations >= 1, learning_rate > 0, l2 >= 0")
        self.iterations = iterations
        self.learning_rate = learning_rate
        self.l2 = l2
        self.tasks: tuple[str, ...] = ()
        # per model: the task list its features were built on, and its weights (a
        # later fit over other tasks leaves the models it does not refit usable)
        self._weights: dict[str, tuple[tuple[str, ...], _Vector]] = {}

    @property
    def models(self) -> tuple[str, ...]:
        """The models fitted so far (by this and earlier calls of :meth:`fit`)."""
        return tuple(self._weights)

    def fit(
        self, requests: Sequence[RouteRequest], labels: Mapping[str, Sequence[bool]]
    ) -> AccuracyModel:
        """Fit one regression per model; ``labels[m][i]`` is whether ``m`` answered
        ``requests[i]`` correctly. Models fitted by an earlier call and not named in
        ``labels`` keep their regression. Returns ``self``."""
        if not requests:
            raise InvalidInputError("fit needs at least one request")
        for model, outcomes in labels.items():
            if len(outcomes) != len(requests):
                raise InvalidInputError(f"labels for {model!r} must align with the requests")
        tasks = tuple(sorted({str(r.features.get("task", "")) for r in requests}))
        x = np.stack([request_features(r, tasks) for r in requests])
        for model, outcomes in labels.items():
            y = np.asarray(outcomes, dtype=np.float64)
            weights = _fit_logistic(x, y, self.iterations, self.learning_rate, self.l2)
            self._weights[model] = (tasks, weights)
        self.tasks = tasks
        return self

    def predict(self, model: str, request: RouteRequest) -> float | None:
        """``Q(model, request)``, or ``None`` for an unfitted model or a request
        without features."""
        fitted = self._weights.get(model)
        if fitted is None or not request.features:
            return None
        tasks, weights = fitted
        z = float(request_features(request, tasks) @ weights)
        return float(1.0 / (1.0 + np.exp(-z)))


def untried_models(request: RouteRequest, candidates: Sequence[ReplicaState]) -> list[ReplicaState]:
    """``candidates`` whose model was not tried for this logical request; all of
    them when every model was tried."""
    if not request.excluded:
        return list(candidates)
    tried = {model for _, model in request.excluded}
    fresh = [r for r in candidates if r.model not in tried]
    return fresh or list(candidates)


def uncached_latency_s(request: RouteRequest, replica: ReplicaState) -> float:
    """RTT + queue drain + full prefill + decode on ``replica`` (no cache)."""
    prefill_s = (replica.queued_tokens + request.prompt_tokens) / replica.prefill_tokens_per_s
    return replica.rtt_s + prefill_s + request.expected_output_tokens / replica.decode_tokens_per_s


class LaarPolicy:
    """Minimum ``c(m)·(T + α·R(m)) / Q(m, x)`` over untried models (ties: fleet order).

    ``costs`` maps model → relative cost c(m) (missing: 1.0); ``q_floor`` bounds Q
    from below so one pessimistic prediction cannot make a model unreachable."""

    name = "laar"
    route_memory = None  # latency and accuracy only: no prefix routes

    def __init__(
        self,
        accuracy: AccuracyModel | None = None,
        *,
        costs: Mapping[str, float] | None = None,
        alpha: float = 1.0,
        response_smoothing: float = 0.2,
        q_floor: float = 0.02,
    ) -> None:
        if not (
            is_finite_at_least(alpha, 0)
            and is_finite_positive(response_smoothing)
            and response_smoothing <= 1
            and is_finite_positive(q_floor)
            and q_floor <= 1
        ):
            raise ConfigError(
                "LaarPolicy needs alpha >= 0, 0 < response_smoothing <= 1, 0 < q_floor <= 1"
            )
        costs = dict(costs or {})
        for model, cost in costs.items():
            if not is_finite_positive(cost):
                raise ConfigError(f"LaarPolicy cost of model {model!r} must be > 0, got {cost!r}")
        self.accuracy = accuracy or AccuracyModel()
        self.costs = costs
        self.alpha = alpha
        self.response_smoothing = response_smoothing
        self.q_floor = q_floor
        self._response_s: dict[str, float] = {}

    def quality(self, model: str, request: RouteRequest) -> float:
        """``Q(m, x)`` clipped to ``[q_floor, 1]``; 1 when unknown."""
        q = self.accuracy.predict(model, request)
        return 1.0 if q is None else max(self.q_floor, q)

    def cost(self, request: RouteRequest, replica: ReplicaState) -> float:
        """LAAR's cost of sending ``request`` to ``replica``."""
        latency = uncached_latency_s(request, replica)
        recent = self._response_s.get(replica.model, 0.0)
        c = self.costs.get(replica.model, 1.0)
        return c * (latency + self.alpha * recent) / self.quality(replica.model, request)

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        candidates = untried_models(request, candidate_replicas(request, fleet))
        best = argmin_replica(candidates, lambda r: self.cost(request, r))
        return Decision(best.replica_id, best.model, "laar-min-cost")

    def observe(self, outcome: Outcome) -> None:
        """Update the model's recent mean response time ``R(m)``."""
        if outcome.error is not None:
            return
        model, a = outcome.decision.model, self.response_smoothing
        previous = self._response_s.get(model)
        self._response_s[model] = (
            outcome.e2e_s if previous is None else (1 - a) * previous + a * outcome.e2e_s
        )


def argmin_replica(
    candidates: Iterable[ReplicaState], key: Callable[[ReplicaState], float]
) -> ReplicaState:
    """The first candidate with the smallest ``key`` (fleet order breaks ties)."""
    best: ReplicaState | None = None
    best_key = float("inf")
    for replica in candidates:
        value = key(replica)
        if best is None or value < best_key:
            best, best_key = replica, value
    if best is None:
        raise InvalidInputError("no candidate replica")
    return best
