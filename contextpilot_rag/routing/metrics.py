"""Prometheus metrics and structured decision logs of a :class:`RoutingClient`.

Metrics are opt-in (``RoutingClient(..., metrics=True)`` or a :class:`RoutingMetrics`
of your own) and need ``prometheus-client`` (``pip install "contextpilot-rag[metrics]"``).
Each :class:`RoutingMetrics` has its own registry unless you pass one (e.g.
``prometheus_client.REGISTRY`` to export next to your application's metrics)::

    client = RoutingClient(urls, model="m", metrics=True)
    client.metrics.exposition()                    # the text format, on request
    client.metrics.serve(9464)                     # or a /metrics HTTP endpoint

What is exported (prefix ``contextpilot_routing_``):

- ``decisions_total{policy,reason}``: every routing decision, by the policy's reason.
- ``attempts_total{endpoint,model,result}``: attempts that ended ``ok``, ``error``
  (retried elsewhere), ``cancelled`` (by the caller), ``rejected`` (a 4xx answer),
  ``deadline`` (the call's ``deadline_s`` passed) or ``stale`` (a pooled connection the
  server had closed; retried on the same endpoint).
- ``cache_predictions_total{endpoint,verdict}``: predicted against observed cache hit
  per answered attempt — ``hit`` (predicted and served), ``missed`` (a predicted hit
  the engine did not serve), ``unexpected`` (a hit nobody predicted), ``cold``
  (neither), ``unreported`` (the engine reported no cached tokens).
- ``predicted_cached_tokens_total`` / ``observed_cached_tokens_total`` /
  ``prompt_tokens_total`` ``{endpoint}``: token sums, so hit ratios and the prediction
  error can be computed over any window.
- ``ttft_seconds`` / ``e2e_seconds`` ``{endpoint}`` histograms (from dispatch);
  ``held_seconds`` histogram: the time answered attempts waited at the client before
  dispatch (late binding; ``decisions_total{reason="hold"}`` counts each offer held);
  ``ttca_seconds`` histogram and ``solves_total{correct}`` for
  :meth:`RoutingClient.solve`.
- gauges read at scrape time: ``route_table_entries`` (the policy's route memory),
  ``in_flight`` / ``queued_tokens`` / ``healthy`` ``{endpoint,model}`` (``endpoint``:
  the routing target, ``url#slot<n>`` for a slot endpoint).

Structured logs need no dependency: every finished attempt is logged on the
``contextpilot_rag.routing.decisions`` logger at INFO as one JSON object (also in the
record's ``routing`` attribute for structured handlers), with the decision's reason,
the predicted and observed cached tokens, the latencies and the outcome.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .types import Decision, Outcome, Policy, ReplicaState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DECISION_LOGGER", "DecisionRecord", "RoutingMetrics", "route_table_entries"]

DECISION_LOGGER = "contextpilot_rag.routing.decisions"
decision_log = logging.getLogger(DECISION_LOGGER)

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def route_table_entries(policy: Policy) -> int | None:
    """How many routes ``policy`` remembers (``len`` of its :attr:`~.types.Policy.route_memory`),
    or ``None`` for a policy without route memory."""
    memory = policy.route_memory
    return None if memory is None else len(memory)


def cache_verdict(predicted: int, observed: int | None) -> str:
    """``hit``, ``missed``, ``unexpected``, ``cold`` or ``unreported`` (see the module)."""
    if observed is None:
        return "unreported"
    if predicted > 0:
        return "hit" if observed > 0 else "missed"
    return "unexpected" if observed > 0 else "cold"


@dataclass(frozen=True)
class DecisionRecord:
    """One finished attempt, as logged on :data:`DECISION_LOGGER`."""

    request_id: str
    logical_id: str | None
    attempt: int
    policy: str
    endpoint: str
    model: str
    reason: str
    predicted_cached_tokens: int
    predicted_ttft_s: float | None
    observed_cached_tokens: int | None
    prompt_tokens: int | None
    ttft_s: float
    e2e_s: float
    result: str  # ok, error (retried elsewhere), cancelled, rejected (a 4xx), deadline, stale
    error: str | None
    held_s: float = 0.0  # waited at the client before dispatch (late binding)

    @classmethod
    def of(
        cls,
        policy: str,
        endpoint: str,
        outcome: Outcome,
        observed_cached: int | None,
        prompt_tokens: int | None,
        *,
        held_s: float = 0.0,
    ) -> DecisionRecord:
        decision: Decision = outcome.decision
        request = outcome.request
        result = "cancelled" if outcome.cancelled else "error" if outcome.error else "ok"
        return cls(
            request.request_id,
            request.logical_id,
            request.attempt,
            policy,
            endpoint,
            decision.model,
            decision.reason,
            decision.predicted_cached_tokens,
            decision.predicted_ttft_s,
            observed_cached,
            prompt_tokens,
            round(outcome.ttft_s, 6),
            round(outcome.e2e_s, 6),
            result,
            outcome.error,
            round(held_s, 6),
        )

    def log(self) -> None:
        """Emit the record at INFO (a no-op unless the logger is enabled)."""
        if decision_log.isEnabledFor(logging.INFO):
            fields = asdict(self)
            decision_log.info(json.dumps(fields), extra={"routing": fields})


class RoutingMetrics:
    """The Prometheus metrics of one client (see the module for the list).

    ``registry``: where to register (default: a registry of its own, so several
    clients in one process do not collide). ``namespace`` prefixes every name."""

    def __init__(
        self, registry: CollectorRegistry | None = None, namespace: str = "contextpilot_routing"
    ) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError(
                'metrics need prometheus-client: pip install "contextpilot-rag[metrics]"'
            ) from None
        self._prom = prom
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self._state: Callable[[], tuple[Sequence[ReplicaState], int | None]] | None = None

        def counter(name: str, doc: str, labels: Sequence[str]) -> Any:
            return prom.Counter(name, doc, labels, namespace=namespace, registry=self.registry)

        def histogram(name: str, doc: str, labels: Sequence[str]) -> Any:
            return prom.Histogram(
                name,
                doc,
                labels,
                namespace=namespace,
                registry=self.registry,
                buckets=_LATENCY_BUCKETS,
            )

        self.decisions = counter("decisions", "Routing decisions by reason", ("policy", "reason"))
        self.attempts = counter("attempts", "Finished attempts", ("endpoint", "model", "result"))
        self.cache_predictions = counter(
            "cache_predictions", "Predicted vs observed cache hit", ("endpoint", "verdict")
        )
        self.predicted_tokens = counter(
            "predicted_cached_tokens", "Prompt tokens predicted cached", ("endpoint",)
        )
        self.observed_tokens = counter(
            "observed_cached_tokens", "Prompt tokens the engine served from cache", ("endpoint",)
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens sent", ("endpoint",))
        self.ttft = histogram("ttft_seconds", "Time to first token", ("endpoint",))
        self.e2e = histogram("e2e_seconds", "Request latency to the last token", ("endpoint",))
        self.held = histogram("held_seconds", "Time held at the client before dispatch", ())
        self.ttca = histogram("ttca_seconds", "Time to a correct answer (solve)", ())
        self.solves = counter("solves", "solve() calls by whether one answer passed", ("correct",))
        self._namespace = namespace
        self.registry.register(self)  # the scrape-time gauges: see collect()

    @property
    def bound(self) -> bool:
        """Whether a client reads its state into these metrics already."""
        return self._state is not None

    def bind(self, state: Callable[[], tuple[Sequence[ReplicaState], int | None]]) -> None:
        """Read live replica states and the route-table size from ``state`` at scrape
        time (the client does this; one client per metrics object)."""
        if self.bound:
            raise ConfigError("this RoutingMetrics is already bound to a client")
        self._state = state

    def decided(self, policy: str, decision: Decision) -> None:
        self.decisions.labels(policy, decision.reason).inc()

    def finished(self, record: DecisionRecord, *, answered: bool) -> None:
        """Count one finished attempt; cache and latency metrics only when ``answered``."""
        endpoint = record.endpoint
        self.attempts.labels(endpoint, record.model, record.result).inc()
        if not answered:
            return
        predicted, observed = record.predicted_cached_tokens, record.observed_cached_tokens
        self.cache_predictions.labels(endpoint, cache_verdict(predicted, observed)).inc()
        self.predicted_tokens.labels(endpoint).inc(predicted)
        if observed is not None:
            self.observed_tokens.labels(endpoint).inc(observed)
        if record.prompt_tokens is not None:
            self.prompt_tokens.labels(endpoint).inc(record.prompt_tokens)
        self.ttft.labels(endpoint).observe(record.ttft_s)
        self.e2e.labels(endpoint).observe(record.e2e_s)
        self.held.observe(record.held_s)

    def solved(self, ttca_s: float, correct: bool) -> None:
        self.ttca.observe(ttca_s)
        self.solves.labels(str(correct).lower()).inc()

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return bytes(self._prom.generate_latest(self.registry))

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns
        ``(server, thread)`` (``server.shutdown()`` stops it)."""
        return self._prom.start_http_server(port, addr=addr, registry=self.registry)

    def collect(self) -> Iterator[Any]:
        """Scrape-time gauges (the registry calls this)."""
        if self._state is None:
            return
        from prometheus_client.core import GaugeMetricFamily

        replicas, routes = self._state()
        name = self._namespace + "_"
        families = {
            "in_flight": GaugeMetricFamily(
                name + "in_flight", "Requests in flight", labels=["endpoint", "model"]
            ),
            "queued_tokens": GaugeMetricFamily(
                name + "queued_tokens",
                "Prompt tokens sent, not prefilled",
                labels=["endpoint", "model"],
            ),
            "healthy": GaugeMetricFamily(
                name + "healthy",
                "1 unless the circuit breaker is open",
                labels=["endpoint", "model"],
            ),
        }
        for state in replicas:
            # the target (a slot's URL keeps its ``#slot<n>``), not the model suffix
            labels = [state.replica_id.removesuffix(f"#{state.model}"), state.model]
            families["in_flight"].add_metric(labels, state.in_flight)
            families["queued_tokens"].add_metric(labels, state.queued_tokens)
            families["healthy"].add_metric(labels, 1.0 if state.healthy else 0.0)
        yield from families.values()
        if routes is not None:
            yield GaugeMetricFamily(
                name + "route_table_entries", "Routes the policy remembers", value=routes
            )

    def describe(self) -> list[Any]:
        return []  # collect() reads live state: do not call it at registration
