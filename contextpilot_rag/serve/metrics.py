"""The proxy's own Prometheus counters, registered next to the routing client's
(:class:`~contextpilot_rag.routing.metrics.RoutingMetrics`) so that one ``/metrics``
scrape shows both. Prefix ``contextpilot_proxy_``:

- ``requests_total{route,mode,status}``: answered requests by route
  (``chat``, ``completion``), ``mode`` (``pilot``: with the ``contextpilot`` field,
  ``passthrough``: without, ``invalid``: refused before either) and HTTP status;
- ``stream_failures_total{route}``: streams that failed after their first byte;
- ``blocks_total{outcome}``: documents ``sent`` in full, ``matched`` (of those sent: at
  the front, in a cached order) and ``deduplicated`` (a location note instead);
- ``answers_recorded_total{result}``: answers stored as conversation history (``ok``)
  or not (``failed``: the conversation's store refused them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..prompt import Prompt

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ProxyMetrics"]


class ProxyMetrics:
    """The counters of one proxy worker, on ``registry``."""

    def __init__(self, registry: CollectorRegistry, namespace: str = "contextpilot_proxy") -> None:
        import prometheus_client as prom

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return prom.Counter(name, doc, labels, namespace=namespace, registry=registry)

        self.requests = counter("requests", "Answered requests", ("route", "mode", "status"))
        self.stream_failures = counter(
            "stream_failures", "Streams that failed after their first byte", ("route",)
        )
        self.blocks = counter("blocks", "Documents by what the pilot did", ("outcome",))
        self.answers = counter("answers_recorded", "Answers stored as history", ("result",))

    def answered(self, route: str, mode: str, status: int) -> None:
        self.requests.labels(route, mode, str(status)).inc()

    def stream_failed(self, route: str) -> None:
        self.stream_failures.labels(route).inc()

    def optimized(self, prompt: Prompt) -> None:
        self.blocks.labels("sent").inc(len(prompt.blocks))
        self.blocks.labels("matched").inc(prompt.stats.blocks_matched)
        self.blocks.labels("deduplicated").inc(prompt.stats.blocks_deduplicated)

    def recorded(self, ok: bool) -> None:
        self.answers.labels("ok" if ok else "failed").inc()
