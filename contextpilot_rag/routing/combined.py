"""Ours, combined: expected time to a correct answer per (replica, model).

Per candidate replica ``u`` serving model ``m``::

    ttca(u) = (RTT(u) + queued_tokens(u) / prefill_rate(u)
               + uncached_tokens(u, x) / prefill_rate(u)
               + output_tokens(x) / decode_rate(u)) / Q(m, x)

Dividing by ``Q`` is the expected number of attempts until a correct answer if
attempts were independent (geometric). ``uncached_tokens`` comes from the
router-side prefix estimate :class:`~contextpilot_rag.routing.gorgo.PrefixLocations`;
``Q`` from a fitted :class:`~contextpilot_rag.routing.laar.AccuracyModel`, and is 1
for requests without features or models it does not know, so on a single-model
fleet (e.g. the Mooncake trace) this is a cache + load + network cost policy.
Models already tried for the logical request are skipped while another is left.
"""

from __future__ import annotations

from ..errors import ConfigError
from .common import candidate_replicas
from .gorgo import PrefixLocations
from .laar import AccuracyModel, argmin_replica, untried_models
from .types import Decision, FleetView, Outcome, ReplicaState, RouteRequest

__all__ = ["CombinedPolicy"]


class CombinedPolicy:
    """Minimum expected time to a correct answer (ties: fleet order)."""

    name = "combined"

    def __init__(
        self,
        accuracy: AccuracyModel | None = None,
        *,
        locations: PrefixLocations | None = None,
        queue_weight: float = 1.0,
        q_floor: float = 0.02,
    ) -> None:
        if queue_weight < 0 or not 0 < q_floor <= 1:
            raise ConfigError("CombinedPolicy needs queue_weight >= 0 and 0 < q_floor <= 1")
        self.accuracy = accuracy
        self.locations = locations or PrefixLocations()
        self.queue_weight = queue_weight
        self.q_floor = q_floor

    def quality(self, model: str, request: RouteRequest) -> float:
        """``Q(m, x)`` clipped to ``[q_floor, 1]``; 1 when unknown."""
        q = None if self.accuracy is None else self.accuracy.predict(model, request)
        return 1.0 if q is None else max(self.q_floor, q)

    def attempt_s(self, request: RouteRequest, replica: ReplicaState, cached: int) -> float:
        """Predicted end-to-end time of one attempt on ``replica``."""
        prefill = self.queue_weight * replica.queued_tokens + request.prompt_tokens - cached
        decode_s = request.expected_output_tokens / replica.decode_tokens_per_s
        return replica.rtt_s + prefill / replica.prefill_tokens_per_s + decode_s

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        candidates = untried_models(request, candidate_replicas(request, fleet))
        known = self.locations.cached_blocks(request.block_hashes, request.boundaries, fleet.now)
        cached = {
            r.replica_id: min(
                known.get(r.replica_id, 0) * request.block_tokens, request.prompt_tokens
            )
            for r in candidates
        }

        def expected_ttca(replica: ReplicaState) -> float:
            attempt = self.attempt_s(request, replica, cached[replica.replica_id])
            return attempt / self.quality(replica.model, request)

        best = argmin_replica(candidates, expected_ttca)
        self.locations.record(request.block_hashes, request.boundaries, best.replica_id, fleet.now)
        return Decision(best.replica_id, best.model, "min-expected-ttca", cached[best.replica_id])

    def observe(self, outcome: Outcome) -> None:
        """Forget prefixes the engine reported as not cached (as :class:`CostPolicy`)."""
        request, decision = outcome.request, outcome.decision
        if outcome.error is None and outcome.cached_tokens >= decision.predicted_cached_tokens:
            return
        kept = 0 if outcome.error is not None else outcome.cached_tokens // request.block_tokens
        hashes = request.block_hashes
        for b in request.boundaries:
            if kept < b <= len(hashes):
                self.locations.forget(hashes[b - 1], decision.replica_id)
