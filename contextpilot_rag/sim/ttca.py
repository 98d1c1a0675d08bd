"""TTCA (time to correct answer) simulation over a fleet of heterogeneous models.

Each logical request is sent, checked, and retried until an answer is correct or
``max_attempts`` were made. A retry is a new :class:`RouteRequest` with
``attempt + 1`` and ``excluded`` holding every ``(replica, model)`` pair tried so
far; it is decided when the previous answer reaches the client. Correctness is
:func:`~contextpilot_rag.sim.accuracy.correct` (fixed per model and logical request).

Service model (a deterministic discrete-event simulation, simpler than
:mod:`~contextpilot_rag.sim.fleet`, which cannot inject retries): per replica one
FIFO prefill unit and unbounded decode concurrency (no batch limit). An attempt
decided at ``t`` reaches the replica at ``t + rtt/2``, starts prefill when the unit
is free, prefills its uncached tokens (block-level LRU :class:`PrefixCacheModel`),
decodes ``expected_output_tokens`` and its answer is back ``rtt/2`` after decode.
The fleet view counts an attempt ``in_flight`` until its answer is back and its
prompt as ``queued_tokens`` until its prefill ends (as in ``sim.fleet``).

TTCA of a logical request = time from its first decision to its first correct
answer. ``ttca_mean_s`` averages successes only; ``ttca_penalized_mean_s`` averages
all, a failure counting as its time to give up plus ``failure_penalty_s``.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import ConfigError, InvalidDecisionError
from ..routing.laar import AccuracyModel
from ..routing.types import Decision, Outcome, Policy, ReplicaState, RouteRequest
from .accuracy import DEFAULT_MODELS, ModelProfile, correct
from .fleet import GORGO_REGIONS, Replica, RequestRecord, SimFleetView, SimSummary
from .prefix_cache import PrefixCacheModel

__all__ = [
    "LogicalRecord",
    "TtcaResult",
    "fit_accuracy",
    "label_requests",
    "run_ttca",
    "synthetic_requests",
    "ttca_fleet",
]


def ttca_fleet(
    models: Sequence[ModelProfile] = DEFAULT_MODELS, replicas_per_model: int = 1
) -> list[Replica]:
    """``replicas_per_model`` replicas per model, rates scaled by the model's speed;
    replica ``k`` of model ``i`` sits in GORGO region ``(i + k) mod 3``. Decoding runs
    at a fixed rate (as :func:`run_ttca` serves it: no prefill-decode interference)."""
    if replicas_per_model < 1 or not models:
        raise ConfigError("ttca_fleet needs at least one model and replicas_per_model >= 1")
    base = Replica("reference")
    fleet = []
    for i, profile in enumerate(models):
        for k in range(replicas_per_model):
            region, rtt_s = GORGO_REGIONS[(i + k) % len(GORGO_REGIONS)]
            fleet.append(
                Replica(
                    replica_id=f"{profile.name}/{k}",
                    model=profile.name,
                    region=region,
                    rtt_s=rtt_s,
                    prefill_tokens_per_s=base.prefill_tokens_per_s * profile.speed,
                    decode_tokens_per_s=base.decode_tokens_per_s * profile.speed,
                    # this simulator's service model has no prefill-decode interference
                    decode_s_per_context_token=0.0,
                    prefill_chunk_tokens=0,
                )
            )
    return fleet


def label_requests(
    requests: Sequence[RouteRequest], models: Sequence[ModelProfile], seed: int = 0
) -> dict[str, list[bool]]:
    """``{model: [correct on request i]}``: training labels for an accuracy model."""
    return {m.name: [correct(m, r, seed) for r in requests] for m in models}


def fit_accuracy(
    requests: Sequence[RouteRequest],
    models: Sequence[ModelProfile] = DEFAULT_MODELS,
    seed: int = 0,
) -> AccuracyModel:
    """An :class:`AccuracyModel` fitted on ``requests`` (a split the evaluation does
    not use) labelled by the simulated models."""
    return AccuracyModel().fit(requests, label_requests(requests, models, seed))


def synthetic_requests(
    n: int, *, seed: int = 0, prefix_groups: int = 0, interarrival_s: float = 0.5
) -> list[RouteRequest]:
    """``n`` KV-lookup-like requests: language en/ja/zh, 3K–64K tokens (log-uniform),
    16-token blocks. With ``prefix_groups > 0`` request ``i`` shares its context
    (all blocks but the last) with the others of group ``i mod prefix_groups``."""
    rng = np.random.default_rng(seed)
    lengths = [int(2 ** rng.uniform(np.log2(3000), 16)) for _ in range(max(prefix_groups, n))]
    requests = []
    for i in range(n):
        group = i % prefix_groups if prefix_groups else i
        tokens = lengths[group]
        language = ("en", "ja", "zh")[int(rng.integers(3))]
        blocks = tokens // 16
        context = tuple(hash((seed, group, b)) for b in range(blocks - 1))
        hashes = (*context, hash((seed, -1, i)))
        requests.append(
            RouteRequest(
                request_id=f"synthetic-{i}",
                prompt_tokens=tokens,
                block_hashes=hashes,
                expected_output_tokens=20,
                boundaries=tuple(b for b in (blocks - 1, blocks) if b > 0),
                session=f"group-{group}",
                arrival_s=i * interarrival_s,
                features={"language": language, "length_bucket": _bucket(tokens), "task": "kv"},
                logical_id=f"synthetic-{i}",
            )
        )
    return requests


def _bucket(tokens: int) -> str:
    for limit_k in (4, 8, 16, 32, 64):
        if tokens <= limit_k * 1024:
            return f"{limit_k}k"
    return "64k+"


@dataclass(frozen=True)
class LogicalRecord:
    """One logical request: attempts made, success, and time to correct answer (or
    to giving up)."""

    logical_id: str
    attempts: int
    success: bool
    ttca_s: float
    models: tuple[str, ...]


@dataclass(frozen=True)
class TtcaResult:
    """Per-logical records (completion order) and their summary."""

    policy: str
    seed: int
    records: tuple[LogicalRecord, ...]
    success_rate: float
    ttca_mean_s: float  # over successes
    ttca_penalized_mean_s: float  # over all; failure = give-up time + penalty
    attempts_mean: float
    hit_ratio: float  # cached prompt tokens / prompt tokens, over attempts
    computed_tokens: int = 0  # prompt tokens prefilled (not cached), warm-ups included
    attempts: tuple[RequestRecord, ...] = ()  # every attempt, in completion order

    @property
    def attempt_summary(self) -> SimSummary:
        """TTFT / E2E percentiles, hit ratio, replica share and decision time over
        all attempts (the fleet simulator's summary fields)."""
        return SimSummary.of(self.attempts)

    def as_dict(self) -> dict[str, float]:
        """The summary fields (for ``--json``)."""
        names = ("success_rate", "ttca_mean_s", "ttca_penalized_mean_s", "attempts_mean")
        return {name: float(getattr(self, name)) for name in (*names, "hit_ratio")}


@dataclass
class _Runtime:
    """Mutable state of one replica; owned by :class:`_TtcaSim`.

    Invariant: ``prefilling`` ends are non-decreasing (FIFO prefill unit)."""

    config: Replica
    cache: PrefixCacheModel
    prefill_free_s: float = 0.0
    prefilling: deque[tuple[float, int]] = field(default_factory=deque)
    answers_due: list[float] = field(default_factory=list)

    def state(self, now: float) -> ReplicaState:
        while self.prefilling and self.prefilling[0][0] <= now:
            self.prefilling.popleft()
        while self.answers_due and self.answers_due[0] <= now:
            heapq.heappop(self.answers_due)
        queued = sum(tokens for _, tokens in self.prefilling)
        return self.config.state(len(self.answers_due), queued)


@dataclass
class _Logical:
    request: RouteRequest
    first_s: float
    tried: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Attempt:
    logical: _Logical
    request: RouteRequest
    decision: Decision
    ttft_s: float
    cached_tokens: int
    decision_us: float


class _TtcaSim:
    """One run: a heap of (time, kind, seq, payload); answers (kind 0) are handled
    before new logical requests (kind 1) at equal times."""

    def __init__(
        self,
        policy: Policy,
        replicas: Sequence[Replica],
        profiles: Mapping[str, ModelProfile],
        max_attempts: int,
        seed: int,
    ) -> None:
        self.policy, self.profiles = policy, profiles
        self.max_attempts, self.seed = max_attempts, seed
        self.runtimes = {
            r.replica_id: _Runtime(r, PrefixCacheModel(block_size=1, capacity_tokens=None))
            for r in replicas
        }
        self.heap: list[tuple[float, int, int, _Logical | _Attempt]] = []
        self.seq = 0
        self.records: list[LogicalRecord] = []
        self.attempts: list[RequestRecord] = []
        self.prompt_tokens = self.cached_tokens = 0
        self.computed_tokens = 0  # prefilled (uncached) tokens, warm-ups included

    def push(self, at: float, kind: int, payload: _Logical | _Attempt) -> None:
        heapq.heappush(self.heap, (at, kind, self.seq, payload))
        self.seq += 1

    def run(self, requests: Sequence[RouteRequest]) -> list[LogicalRecord]:
        for request in requests:
            self.push(request.arrival_s, 1, _Logical(request, request.arrival_s))
        while self.heap:
            now, _, _, payload = heapq.heappop(self.heap)
            if isinstance(payload, _Logical):
                self.issue(now, payload)
            else:
                self.answer(now, payload)
        return self.records

    def view(self, now: float) -> SimFleetView:
        return SimFleetView(now, tuple(rt.state(now) for rt in self.runtimes.values()))

    def issue(self, now: float, logical: _Logical) -> None:
        request = replace(
            logical.request,
            request_id=f"{_logical_id(logical.request)}#{len(logical.tried)}",
            logical_id=_logical_id(logical.request),
            attempt=len(logical.tried),
            excluded=frozenset(logical.tried),
            arrival_s=now,
            max_attempts=self.max_attempts,
        )
        view = self.view(now)
        started = time.perf_counter_ns()
        decision = self.policy.choose(request, view)
        decision_us = (time.perf_counter_ns() - started) / 1000.0
        runtime = self.runtimes.get(decision.replica_id)
        if runtime is None or runtime.config.model != decision.model:
            raise InvalidDecisionError(f"{self.policy.name} chose an unknown replica/model")
        warm: list[_Runtime] = []
        for replica_id in decision.warm:
            target = self.runtimes.get(replica_id)
            if target is None or target is runtime:
                raise InvalidDecisionError(f"{self.policy.name} asked to warm an unknown replica")
            warm.append(target)
        logical.tried.append((decision.replica_id, decision.model))
        self.serve(now, runtime, logical, request, decision, decision_us)
        for target in warm:
            self.prefill(now, target, request)

    def prefill(self, now: float, runtime: _Runtime, request: RouteRequest) -> tuple[float, int]:
        """Queue ``request``'s prefill on ``runtime`` (FIFO unit, prefix cache): its
        end and the cached tokens. A warm-up is only this: no decode, no answer."""
        config = runtime.config
        start = max(now + config.rtt_s / 2, runtime.prefill_free_s)
        cached = min(
            runtime.cache.lookup(request.block_hashes) * request.block_tokens, request.prompt_tokens
        )
        runtime.cache.admit(request.block_hashes)
        prefill_end = start + (request.prompt_tokens - cached) / config.prefill_tokens_per_s
        runtime.prefill_free_s = prefill_end
        runtime.prefilling.append((prefill_end, request.prompt_tokens))
        self.computed_tokens += request.prompt_tokens - cached
        return prefill_end, cached

    def serve(
        self,
        now: float,
        runtime: _Runtime,
        logical: _Logical,
        request: RouteRequest,
        decision: Decision,
        decision_us: float,
    ) -> None:
        config = runtime.config
        prefill_end, cached = self.prefill(now, runtime, request)
        done = prefill_end + request.expected_output_tokens / config.decode_tokens_per_s
        done += config.rtt_s / 2
        heapq.heappush(runtime.answers_due, done)
        self.prompt_tokens += request.prompt_tokens
        self.cached_tokens += cached
        ttft = prefill_end + config.rtt_s / 2 - now
        self.push(done, 0, _Attempt(logical, request, decision, ttft, cached, decision_us))

    def answer(self, now: float, attempt: _Attempt) -> None:
        logical, request = attempt.logical, attempt.request
        ok = correct(self.profiles[attempt.decision.model], request, self.seed)
        self.attempts.append(
            RequestRecord(
                request_id=request.request_id,
                replica_id=attempt.decision.replica_id,
                model=attempt.decision.model,
                arrival_s=request.arrival_s,
                start_s=request.arrival_s,  # prefill start: not tracked by this simulator
                ttft_s=attempt.ttft_s,
                e2e_s=now - request.arrival_s,
                prompt_tokens=request.prompt_tokens,
                cached_tokens=attempt.cached_tokens,
                decision_us=attempt.decision_us,
            )
        )
        self.policy.observe(
            Outcome(
                request,
                attempt.decision,
                attempt.ttft_s,
                now - request.arrival_s,
                cached_tokens=attempt.cached_tokens,
                correct=ok,
            )
        )
        if ok or len(logical.tried) >= self.max_attempts:
            models = tuple(model for _, model in logical.tried)
            self.records.append(
                LogicalRecord(
                    _logical_id(logical.request),
                    len(logical.tried),
                    ok,
                    now - logical.first_s,
                    models,
                )
            )
        else:
            self.issue(now, logical)


def _logical_id(request: RouteRequest) -> str:
    return request.logical_id if request.logical_id is not None else request.request_id


def run_ttca(
    requests: Sequence[RouteRequest],
    policy: Policy,
    *,
    models: Sequence[ModelProfile] = DEFAULT_MODELS,
    replicas_per_model: int = 1,
    max_attempts: int = 10,
    seed: int = 0,
    failure_penalty_s: float = 60.0,
    replicas: Sequence[Replica] | None = None,
) -> TtcaResult:
    """Run every logical request of ``requests`` through ``policy`` until correct or
    ``max_attempts`` (the fleet: ``replicas``, else :func:`ttca_fleet`). Any policy
    works; baselines simply ignore accuracy."""
    if max_attempts < 1 or failure_penalty_s < 0:
        raise ConfigError("run_ttca needs max_attempts >= 1 and failure_penalty_s >= 0")
    fleet = list(replicas) if replicas is not None else ttca_fleet(models, replicas_per_model)
    profiles = {m.name: m for m in models}
    if any(r.model not in profiles for r in fleet):
        raise ConfigError("every replica's model needs a ModelProfile in models")
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    sim = _TtcaSim(policy, fleet, profiles, max_attempts, seed)
    records = sim.run(ordered)
    return _summarize(policy.name, seed, records, failure_penalty_s, sim)


def _summarize(
    name: str, seed: int, records: Sequence[LogicalRecord], penalty_s: float, sim: _TtcaSim
) -> TtcaResult:
    successes = [r.ttca_s for r in records if r.success]
    penalized = [r.ttca_s + (0.0 if r.success else penalty_s) for r in records]
    count = len(records)
    return TtcaResult(
        policy=name,
        seed=seed,
        records=tuple(records),
        success_rate=len(successes) / count if count else 0.0,
        ttca_mean_s=float(np.mean(successes)) if successes else 0.0,
        ttca_penalized_mean_s=float(np.mean(penalized)) if penalized else 0.0,
        attempts_mean=float(np.mean([r.attempts for r in records])) if records else 0.0,
        hit_ratio=sim.cached_tokens / sim.prompt_tokens if sim.prompt_tokens else 0.0,
        computed_tokens=sim.computed_tokens,
        attempts=tuple(sim.attempts),
    )
