"""A deterministic discrete-event simulator of a fleet of LLM replicas, to compare
routing policies without a GPU fleet.

Service model (every replica, per request):

- The client decides at ``arrival_s`` (``policy.choose``); the request reaches the
  replica ``rtt_s / 2`` later and joins the replica's FIFO queue.
- The head of the queue starts when a batch slot is free (at most ``max_batch``
  requests in service) **and** the replica's prefill unit is idle: prefill is
  compute-bound, so one prompt is prefilled at a time (as with chunked prefill, the
  replica's prefill throughput is shared, not multiplied by the batch).
- ``cached_tokens`` is the longest cached prefix of the request's blocks at the start
  of prefill (:class:`PrefixCacheModel` over block hashes, ``block_size=1``; as in
  vLLM the last block is always recomputed), capped at ``prompt_tokens``.
- Continuous batching with chunked prefill (vLLM / SGLang style): every engine step
  produces one token for each decoding request and, while a prompt is being
  prefilled, processes a chunk of ``prefill_chunk_tokens`` of it. A step takes
  ``1/decode_tokens_per_s + decode_s_per_context_token · Σ context of the decoding
  requests`` (weights + KV reads) plus ``chunk / prefill_tokens_per_s`` while a
  prefill runs. So decoding slows down with the batch's context and, much more,
  while the replica prefills (prefill-decode interference); all decoding requests
  of a replica advance at the same rate (processor sharing, exact between events).
- ``prefill_s = uncached / prefill_tokens_per_s + ceil(uncached / chunk) · decode
  part of a step`` (the decode batch at prefill start); the blocks enter the
  replica's cache when prefill ends. ``prefill_chunk_tokens=0`` and
  ``decode_s_per_context_token=0`` give the plain model: prefill at full rate, every
  request decoding at ``decode_tokens_per_s`` side by side.
- ``TTFT = rtt_s/2 + queue_wait + prefill_s + rtt_s/2`` and ``E2E = TTFT + decode
  time`` (decode time as above; the last token, like the first, reaches the client
  ``rtt_s/2`` after it is produced; the batch slot is held until decode ends).

Late binding (``late_binding=True``, the default): every request is offered with
``may_hold``, and a policy may answer with a hold (``Decision.hold_s > 0``). The
simulator then keeps the request at the router (no RTT, nothing queued or in flight)
and offers it again after every prefill end, held requests in order of their last
predicted TTFT (smallest first, then arrival), and at the latest ``hold_s`` later.
Its TTFT and E2E count from its arrival, so time held is time waited.

The fleet state shown to the policy (:class:`SimFleetView`) counts a request as
``in_flight`` from the decision until its last token reaches the client, and its
prompt as ``queued_tokens`` from the decision until its prefill ends.
``policy.observe`` receives every outcome when its last token reaches the client.
Nothing in the service model is random; ``seed`` is recorded for the stochastic
parts still to come (accuracy draws for TTCA runs).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from ..errors import ConfigError, InvalidDecisionError
from ..routing.holding import release_order
from ..routing.types import Decision, Outcome, Policy, ReplicaState, RouteRequest
from .block_hashes import iter_block_hashes
from .prefix_cache import PrefixCacheModel

__all__ = [
    "GORGO_REGIONS",
    "Replica",
    "RequestRecord",
    "SimFleetView",
    "SimResult",
    "SimSummary",
    "cached_tokens_bound",
    "default_fleet",
    "latency_floor",
    "simulate",
]

# Client-to-region round trips measured by GORGO (seconds): near, mid, far.
GORGO_REGIONS: tuple[tuple[str, float], ...] = (
    ("region-near", 0.037),
    ("region-mid", 0.279),
    ("region-far", 0.456),
)


@dataclass(frozen=True)
class Replica:
    """One simulated replica (one model on one engine). Validated on construction."""

    replica_id: str
    model: str = "sim-8b"
    region: str = "local"
    rtt_s: float = 0.0
    prefill_tokens_per_s: float = 20_000.0
    decode_tokens_per_s: float = 100.0  # one request, empty context: 10 ms per step
    decode_s_per_context_token: float = 4e-8  # KV reads: +4 ms per step per 100k tokens
    prefill_chunk_tokens: int = 2048  # chunked prefill; 0: decode unaffected by prefill
    kv_capacity_tokens: int = 5_000_000
    max_batch: int = 32  # ~ the sequences of 15k tokens whose KV fits an 80 GB GPU (8B)
    block_tokens: int = 16
    healthy: bool = True

    def __post_init__(self) -> None:
        if not self.replica_id:
            raise ConfigError("replica_id must be a non-empty string")
        if self.rtt_s < 0:
            raise ConfigError(f"rtt_s must be >= 0, got {self.rtt_s!r}")
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ConfigError("prefill_tokens_per_s and decode_tokens_per_s must be > 0")
        if self.decode_s_per_context_token < 0 or self.prefill_chunk_tokens < 0:
            raise ConfigError("decode_s_per_context_token and prefill_chunk_tokens must be >= 0")
        if self.kv_capacity_tokens < 0:
            raise ConfigError(f"kv_capacity_tokens must be >= 0, got {self.kv_capacity_tokens}")
        if self.max_batch < 1 or self.block_tokens < 1:
            raise ConfigError("max_batch and block_tokens must be >= 1")

    def state(self, in_flight: int, queued_tokens: int) -> ReplicaState:
        """What a router sees of this replica with the given load."""
        return ReplicaState(
            replica_id=self.replica_id,
            model=self.model,
            region=self.region,
            rtt_s=self.rtt_s,
            in_flight=in_flight,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            decode_s_per_context_token=self.decode_s_per_context_token,
            prefill_chunk_tokens=self.prefill_chunk_tokens,
            healthy=self.healthy,
            max_batch=self.max_batch,
        )


def default_fleet(
    regions: int = 3, replicas_per_region: int = 1, *, block_tokens: int = 16, model: str = "sim-8b"
) -> list[Replica]:
    """``regions`` × ``replicas_per_region`` identical replicas, with the GORGO RTTs
    (37 / 279 / 456 ms; regions beyond the third reuse them cyclically)."""
    if regions < 1 or replicas_per_region < 1:
        raise ConfigError("regions and replicas_per_region must be >= 1")
    fleet = []
    for r in range(regions):
        name, rtt_s = GORGO_REGIONS[r % len(GORGO_REGIONS)]
        region = name if r < len(GORGO_REGIONS) else f"{name}-{r}"
        for k in range(replicas_per_region):
            fleet.append(
                Replica(
                    replica_id=f"{region}/{k}",
                    model=model,
                    region=region,
                    rtt_s=rtt_s,
                    block_tokens=block_tokens,
                )
            )
    return fleet


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request. Times in seconds, ``decision_us`` wall-clock."""

    request_id: str
    replica_id: str
    model: str
    arrival_s: float
    start_s: float  # prefill start, at the replica
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    decision_us: float


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); 0.0 for no values."""
    return float(np.percentile(values, q)) if len(values) else 0.0


@dataclass(frozen=True)
class SimSummary:
    """The benchmark's JSON fields for one run (percentiles interpolate linearly)."""

    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    e2e_p95_s: float
    hit_ratio: float  # cached prompt tokens / prompt tokens
    max_replica_share: float  # largest share of requests sent to one replica
    decision_us_p50: float

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> SimSummary:
        """Summary metrics of ``records`` (all zero for an empty run)."""
        ttft_ms = [r.ttft_s * 1000.0 for r in records]
        prompt = sum(r.prompt_tokens for r in records)
        shares = Counter(r.replica_id for r in records)
        return cls(
            ttft_p50_ms=_percentile(ttft_ms, 50),
            ttft_p95_ms=_percentile(ttft_ms, 95),
            ttft_p99_ms=_percentile(ttft_ms, 99),
            e2e_p95_s=_percentile([r.e2e_s for r in records], 95),
            hit_ratio=sum(r.cached_tokens for r in records) / prompt if prompt else 0.0,
            max_replica_share=max(shares.values()) / len(records) if records else 0.0,
            decision_us_p50=_percentile([r.decision_us for r in records], 50),
        )

    def as_dict(self) -> dict[str, float]:
        """The fields as a plain dict (for ``--json`` output)."""
        return {name: float(getattr(self, name)) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class SimResult:
    """Per-request records in completion order, and their summary."""

    policy: str
    seed: int
    records: tuple[RequestRecord, ...]
    summary: SimSummary


@dataclass(frozen=True)
class _Job:
    request: RouteRequest
    decision: Decision
    decision_us: float
    start_s: float = 0.0
    cached_tokens: int = 0
    prefill_end_s: float = 0.0


@dataclass(frozen=True)
class _DecodeTick:
    """A scheduled decode completion, valid while the replica's version is unchanged."""

    version: int


@dataclass
class _ReplicaRuntime:
    """Mutable state of one replica; owned by :func:`simulate`.

    Invariants: ``in_service <= config.max_batch``; at most one prefill runs at a
    time; ``decoding`` holds ``(virtual finish, seq, job)`` and ``virtual`` counts the
    tokens every decoding request has produced since the replica started (all
    decoding requests advance together), valid at ``virtual_at``; ``context_tokens``
    is the prompt tokens of the decoding requests; ``version`` invalidates a
    scheduled decode event when the step time changes."""

    config: Replica
    cache: PrefixCacheModel
    queue: deque[_Job] = field(default_factory=deque)
    in_service: int = 0
    prefilling: bool = False
    in_flight: int = 0
    queued_tokens: int = 0
    decoding: list[tuple[float, int, _Job]] = field(default_factory=list)
    virtual: float = 0.0
    virtual_at: float = 0.0
    context_tokens: int = 0
    version: int = 0

    def decode_step_s(self) -> float:
        """Time of one step's decode part (weights + KV reads of the batch)."""
        c = self.config
        return 1.0 / c.decode_tokens_per_s + c.decode_s_per_context_token * self.context_tokens

    def step_s(self) -> float:
        """Time of one engine step now (one token for every decoding request)."""
        c = self.config
        chunk = c.prefill_chunk_tokens / c.prefill_tokens_per_s if self.prefilling else 0.0
        return self.decode_step_s() + chunk

    def advance(self, now: float) -> None:
        """Bring ``virtual`` to ``now`` (call before the step time changes)."""
        if self.decoding:
            self.virtual += (now - self.virtual_at) / self.step_s()
        self.virtual_at = now

    def state(self) -> ReplicaState:
        return self.config.state(self.in_flight, self.queued_tokens)


@dataclass(frozen=True)
class SimFleetView:
    """A snapshot of the fleet at one decision (implements ``FleetView``)."""

    now: float
    replicas: tuple[ReplicaState, ...]


@dataclass(frozen=True)
class _HoldTimer:
    """The latest time to offer a held request again (stale once the request was
    offered again since: ``token`` no longer matches its hold)."""

    request_id: str
    token: int


class _Event(IntEnum):
    # At equal times, work that frees capacity runs before work that uses it.
    COMPLETE = 0
    DECODE_DONE = 1
    PREFILL_DONE = 2
    ENQUEUE = 3
    ARRIVE = 4
    HOLD_TIMER = 5


_Item = _Job | RouteRequest | _DecodeTick | _HoldTimer


class _Simulation:
    """One run: an event heap ordered by (time, event kind, sequence number)."""

    def __init__(
        self,
        policy: Policy,
        replicas: Sequence[Replica],
        clock_ns: Callable[[], int],
        late_binding: bool = True,
    ) -> None:
        self.policy = policy
        self.clock_ns = clock_ns
        self.late_binding = late_binding
        # request_id -> (request, its last hold decision, its timer's token)
        self.held: dict[str, tuple[RouteRequest, Decision, int]] = {}
        self.runtimes = {
            r.replica_id: _ReplicaRuntime(
                r,
                PrefixCacheModel(
                    block_size=1, capacity_tokens=r.kv_capacity_tokens // r.block_tokens
                ),
            )
            for r in replicas
        }
        self.heap: list[tuple[float, int, int, str, _Item]] = []
        self.seq = 0
        self.records: list[RequestRecord] = []

    def push(self, at_s: float, kind: _Event, replica_id: str, item: _Item) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at_s, int(kind), self.seq, replica_id, item))

    def run(self, requests: Sequence[RouteRequest]) -> list[RequestRecord]:
        for request in requests:
            self.push(request.arrival_s, _Event.ARRIVE, "", request)
        handlers: dict[int, Callable[[float, str, _Job], None]] = {
            _Event.COMPLETE: self.complete,
            _Event.PREFILL_DONE: self.prefill_done,
            _Event.ENQUEUE: self.enqueue,
        }
        while self.heap:
            now, kind, _, replica_id, item = heapq.heappop(self.heap)
            if isinstance(item, RouteRequest):
                self.arrive(now, item)
            elif isinstance(item, _DecodeTick):
                self.decode_done(now, replica_id, item)
            elif isinstance(item, _HoldTimer):
                entry = self.held.get(item.request_id)
                if entry is not None and entry[2] == item.token:
                    del self.held[item.request_id]
                    self.offer(now, entry[0])
            else:
                handlers[kind](now, replica_id, item)
        return self.records

    def arrive(self, now: float, request: RouteRequest) -> None:
        if self.late_binding and not request.may_hold:
            request = replace(request, may_hold=True)
        self.offer(now, request)

    def offer(self, now: float, request: RouteRequest) -> None:
        """Ask the policy where ``request`` goes; send it, or hold it."""
        view = SimFleetView(now, tuple(rt.state() for rt in self.runtimes.values()))
        started = self.clock_ns()
        decision = self.policy.choose(request, view)
        decision_us = (self.clock_ns() - started) / 1000.0
        if decision.hold_s > 0:
            if not request.may_hold:
                raise InvalidDecisionError(
                    f"policy {self.policy.name!r} held request {request.request_id!r}, "
                    "which was not offered with may_hold"
                )
            token = self.seq + 1  # the timer's sequence number
            self.held[request.request_id] = (request, decision, token)
            self.push(
                now + decision.hold_s, _Event.HOLD_TIMER, "", _HoldTimer(request.request_id, token)
            )
            return
        runtime = self._validated(request, decision)
        runtime.in_flight += 1
        runtime.queued_tokens += request.prompt_tokens
        job = _Job(request, decision, decision_us)
        self.push(now + runtime.config.rtt_s / 2, _Event.ENQUEUE, runtime.config.replica_id, job)

    def release(self, now: float) -> None:
        """Offer every held request again in :func:`release_order` (as the client does):
        smallest last predicted TTFT first, no prediction before any, ties in the order
        held (the timer tokens count up)."""
        if not self.held:
            return
        order = sorted(
            self.held.values(), key=lambda entry: release_order(entry[1].predicted_ttft_s, entry[2])
        )
        self.held = {}
        for request, _, _ in order:
            self.offer(now, request)

    def _validated(self, request: RouteRequest, decision: Decision) -> _ReplicaRuntime:
        runtime = self.runtimes.get(decision.replica_id)
        if runtime is None or not runtime.config.healthy:
            raise InvalidDecisionError(
                f"policy {self.policy.name!r} chose unknown or unhealthy replica "
                f"{decision.replica_id!r} for request {request.request_id!r}"
            )
        if decision.model != runtime.config.model:
            raise InvalidDecisionError(
                f"replica {decision.replica_id!r} serves {runtime.config.model!r}, "
                f"not {decision.model!r}"
            )
        if decision.warm:
            raise InvalidDecisionError(
                f"policy {self.policy.name!r} asked for warm-ups; this simulator replays "
                "single answers (warm-ups are served by sim.ttca.run_ttca)"
            )
        pair = (decision.replica_id, decision.model)
        if pair in request.excluded and any(
            rt.config.healthy and (rt.config.replica_id, rt.config.model) not in request.excluded
            for rt in self.runtimes.values()
        ):
            raise InvalidDecisionError(
                f"policy {self.policy.name!r} chose excluded {pair!r} for "
                f"request {request.request_id!r} although another replica was available"
            )
        return runtime

    def enqueue(self, now: float, replica_id: str, job: _Job) -> None:
        runtime = self.runtimes[replica_id]
        runtime.queue.append(job)
        self.try_start(now, runtime)

    def try_start(self, now: float, runtime: _ReplicaRuntime) -> None:
        config = runtime.config
        if runtime.prefilling or runtime.in_service >= config.max_batch or not runtime.queue:
            return
        job = runtime.queue.popleft()
        request = job.request
        cached_blocks = runtime.cache.lookup(request.block_hashes)
        cached = min(cached_blocks * request.block_tokens, request.prompt_tokens)
        uncached = request.prompt_tokens - cached
        prefill_s = uncached / config.prefill_tokens_per_s
        if config.prefill_chunk_tokens and runtime.decoding:
            steps = math.ceil(uncached / config.prefill_chunk_tokens)
            prefill_s += steps * runtime.decode_step_s()
        runtime.advance(now)
        runtime.prefilling = True
        runtime.in_service += 1
        self.reschedule_decode(now, runtime)
        started = _Job(request, job.decision, job.decision_us, now, cached, now + prefill_s)
        self.push(now + prefill_s, _Event.PREFILL_DONE, config.replica_id, started)

    def reschedule_decode(self, now: float, runtime: _ReplicaRuntime) -> None:
        """Schedule the next decode completion at the current step time (older
        scheduled completions become stale)."""
        runtime.version += 1
        if runtime.decoding:
            tokens_left = max(0.0, runtime.decoding[0][0] - runtime.virtual)
            self.push(
                now + tokens_left * runtime.step_s(),
                _Event.DECODE_DONE,
                runtime.config.replica_id,
                _DecodeTick(runtime.version),
            )

    def prefill_done(self, now: float, replica_id: str, job: _Job) -> None:
        runtime = self.runtimes[replica_id]
        runtime.cache.admit(job.request.block_hashes)
        runtime.advance(now)
        runtime.prefilling = False
        runtime.queued_tokens -= job.request.prompt_tokens
        self.seq += 1
        finish = runtime.virtual + job.request.expected_output_tokens
        heapq.heappush(runtime.decoding, (finish, self.seq, job))
        runtime.context_tokens += job.request.prompt_tokens
        self.reschedule_decode(now, runtime)
        self.try_start(now, runtime)
        self.release(now)

    def decode_done(self, now: float, replica_id: str, tick: _DecodeTick) -> None:
        runtime = self.runtimes[replica_id]
        if tick.version != runtime.version:
            return  # the step time changed since this completion was scheduled
        runtime.advance(now)
        while runtime.decoding and runtime.decoding[0][0] <= runtime.virtual + 1e-9:
            _, _, job = heapq.heappop(runtime.decoding)
            runtime.in_service -= 1
            runtime.context_tokens -= job.request.prompt_tokens
            self.push(now + runtime.config.rtt_s / 2, _Event.COMPLETE, replica_id, job)
        self.reschedule_decode(now, runtime)
        self.try_start(now, runtime)

    def complete(self, now: float, replica_id: str, job: _Job) -> None:
        runtime = self.runtimes[replica_id]
        runtime.in_flight -= 1
        config = runtime.config
        request = job.request
        ttft_s = job.prefill_end_s + config.rtt_s / 2 - request.arrival_s
        record = RequestRecord(
            request_id=request.request_id,
            replica_id=replica_id,
            model=config.model,
            arrival_s=request.arrival_s,
            start_s=job.start_s,
            ttft_s=ttft_s,
            e2e_s=now - request.arrival_s,
            prompt_tokens=request.prompt_tokens,
            cached_tokens=job.cached_tokens,
            decision_us=job.decision_us,
        )
        self.records.append(record)
        self.policy.observe(
            Outcome(request, job.decision, ttft_s, record.e2e_s, cached_tokens=job.cached_tokens)
        )


def _validate_inputs(requests: Sequence[RouteRequest], replicas: Sequence[Replica]) -> None:
    ids = [r.replica_id for r in replicas]
    if not ids:
        raise ConfigError("the fleet needs at least one replica")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"replica ids must be unique, got {ids}")
    request_ids = [r.request_id for r in requests]
    if len(set(request_ids)) != len(request_ids):
        raise ConfigError("request ids must be unique within one simulation")
    block_sizes = {r.block_tokens for r in replicas} | {r.block_tokens for r in requests}
    if len(block_sizes) > 1:
        raise ConfigError(
            f"requests and replicas must share one block size, got {sorted(block_sizes)}"
        )


def simulate(
    requests: Iterable[RouteRequest],
    policy: Policy,
    replicas: Sequence[Replica],
    *,
    seed: int = 0,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
    late_binding: bool = True,
) -> SimResult:
    """Replay ``requests`` (in arrival order; ties keep input order) through
    ``replicas``, routed by ``policy``. Every request completes exactly once.

    ``clock_ns`` times ``policy.choose`` (wall clock, nanoseconds); inject a fake
    clock to make ``decision_us`` deterministic. ``late_binding``: requests are
    offered with ``may_hold`` and held ones kept at the router (module docstring).
    Raises :class:`ConfigError` for an invalid fleet or request set and
    :class:`~contextpilot_rag.errors.InvalidDecisionError` for a decision that breaks
    the policy contract (the type the routing client raises for the same violation)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    _validate_inputs(ordered, replicas)
    records = _Simulation(policy, replicas, clock_ns, late_binding).run(ordered)
    return SimResult(policy.name, seed, tuple(records), SimSummary.of(records))


def latency_floor(
    requests: Sequence[RouteRequest], replicas: Sequence[Replica]
) -> list[tuple[float, float]]:
    """Per request (in the order given), a TTFT and an E2E no routing policy can beat
    in :func:`simulate` on ``replicas`` (caches cold at the start), in seconds.

    Each is the best over the replicas of the request alone on an idle replica: the
    replica's round trip, the prefill of the tokens no cache can hold for it (every
    block that no *other* request of ``requests`` carries — which request goes first
    is up to the policy, so any other may have left it in a cache), and for E2E the
    decode of its output with the batch holding only itself (``1/decode_tokens_per_s +
    decode_s_per_context_token · prompt_tokens`` per token). Queueing, other requests'
    decoding and prefill interference only add to each, and the TTFT and E2E floors
    may come from different replicas; so every request's simulated TTFT and E2E are at
    least these, and so is every percentile over the requests."""
    if not replicas:
        raise ConfigError("latency_floor needs at least one replica")
    carriers: Counter[int] = Counter()
    for request in requests:
        carriers.update(set(request.block_hashes))
    floors = []
    for request in requests:
        cached_blocks = 0
        for block in request.block_hashes:  # chained: a prefix of shared blocks
            if carriers[block] < 2:
                break
            cached_blocks += 1
        uncached = request.prompt_tokens - min(
            cached_blocks * request.block_tokens, request.prompt_tokens
        )
        ttft = min(r.rtt_s + uncached / r.prefill_tokens_per_s for r in replicas)
        e2e = min(
            r.rtt_s
            + uncached / r.prefill_tokens_per_s
            + request.expected_output_tokens
            * (1.0 / r.decode_tokens_per_s + r.decode_s_per_context_token * request.prompt_tokens)
            for r in replicas
        )
        floors.append((ttft, e2e))
    return floors


def cached_tokens_bound(requests: Sequence[RouteRequest]) -> list[int]:
    """Per request (in the order given), the most of its prompt tokens any routing
    policy can have served from cache in :func:`simulate` (caches cold at the start).

    A replica's cache holds only blocks of requests whose prefill ended before, and all
    of them arrived no later; so a request reads at most the leading run of its blocks
    that some other request arriving no later carries (one unbounded cache holding every
    earlier request, with requests that arrive together counting as earlier than each
    other), capped as the simulator caps it: the last block recomputed, no more than
    ``prompt_tokens``. Over all requests this is the highest hit ratio a routing policy
    can reach; the gap to a policy's is the prefill no placement or capacity can save."""
    by_arrival = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    seen: set[int] = set()  # chained block keys of the requests of earlier instants
    bounds = [0] * len(requests)
    start = 0
    while start < len(by_arrival):
        end = start
        at = requests[by_arrival[start]].arrival_s
        while end < len(by_arrival) and requests[by_arrival[end]].arrival_s == at:
            end += 1
        group = by_arrival[start:end]
        keys = {i: list(iter_block_hashes(requests[i].block_hashes, 1)) for i in group}
        together: Counter[int] = Counter()  # how many requests of this instant carry a key
        for i in group:
            together.update(set(keys[i]))
        for i in group:
            request, own = requests[i], set(keys[i])
            hits = 0
            for key in keys[i][: max(len(keys[i]) - 1, 0)]:  # the last block recomputed
                if key not in seen and together[key] - (key in own) < 1:
                    break
                hits += 1
            bounds[i] = min(hits * request.block_tokens, request.prompt_tokens)
        for i in group:
            seen.update(keys[i])
        start = end
    return bounds
