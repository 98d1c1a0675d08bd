"""The ``combined`` policy: each request goes to the (replica, model) with the lowest
expected time to a correct answer.

Per candidate replica ``u`` serving model ``m`` (all terms in seconds)::

    cost(u) = (TTFT(u, x) + decode(u, x) + e · harm(u, x) + g · queue_harm(u, x)
               + v · evict(u, x)) / Q(m, x)

    TTFT(u, x)   = RTT(u) + wait(u) + prefill(u, x)
    prefill(u, x) = uncached(u, x) / prefill_rate(u)
                    + ceil(uncached / chunk) · decode step(u)      (chunked prefill)
    decode(u, x) = output_tokens(x) · step(u) · (step(u) + c(u))
                                    / (step(u) + (1 - duty(u)) · c(u))
    harm(u, x)   = decoders on u still running when x's prefill starts
                   · uncached(u, x) / prefill_rate(u)
    queue_harm(u, x) = prefill(u, x) · λ · (wait(u) + prefill(u, x))
    evict(u, x)  = lost(u, x) / prefill_rate(u) · wanted(age(u))        (bounded u only)

- ``uncached`` comes from the router-side prefix estimate
  :class:`~contextpilot_rag.routing.gorgo.PrefixLocations`.
- ``wait`` is the predicted drain time of the prompts this router sent to ``u`` that
  have not finished prefill: a FIFO of (prompt tokens, predicted prefill time) per
  replica, reconciled on every decision with the fleet view's ``queued_tokens``
  (prompt tokens sent and not yet prefilled, which the client knows exactly: a
  prompt leaves it when its first token arrives). Prefill is FIFO, so when the view
  shows fewer queued tokens than the FIFO holds, its oldest entries are done; queued
  tokens beyond the FIFO (sent by other clients) count as uncached prefill.
- ``decode step`` = ``1/decode_rate + decode_s_per_context_token · context`` of the
  requests decoding on ``u`` (this router's in-flight prompts minus the queued ones).
  ``duty`` is the fraction of time ``u`` spends prefilling (an exponentially decayed
  sum of the prefill time this router booked on it, at most 1), during which every
  decode step also carries a prefill chunk taking ``c(u) = chunk / prefill_rate``
  (prefill–decode interference) and still yields one token per decoder. So a decode
  runs a share ``duty`` of its time at ``step + c`` per token and the rest at
  ``step``: the harmonic mix above, ``step`` on an idle prefill unit and ``step + c``
  on one always busy. (``step / (1 - duty)``, which counts a prefill's time as
  yielding no token, grew without bound at high duty: 20x the step at 95%, where the
  engine runs about 5x.)
- **Batch slots** (when the fleet view gives ``max_batch``): a replica serves at most
  that many requests at once and the next waits for one to end, however idle its
  prefill unit. With ``in_flight`` at the limit, ``wait(u)`` is at least the time until
  enough of them end: the later of this router's predicted decode ends and the
  replica's observed pace (``max_batch`` answers per observed decode time, Little's
  law; predictions go stale exactly when slots saturate). Without it a saturated
  replica looked idle to the queue model and kept taking requests that waited a
  minute for a slot.
- **Calibration**: every answer's observed decode time, over what the step model
  predicted for it, moves the replica's ``decode_scale`` (an EWMA, clipped to
  ``[0.5, 20]``), which multiplies its decode steps: what the model misses (other
  routers' prefills, a batch outgrowing it) is learned per replica.
- ``harm`` is the delay ``x``'s prefill imposes on requests already decoding on ``u``
  (each step carries a chunk of ``x``), weighted by ``externality_weight`` ``e``: the
  router minimises the fleet's time, not only ``x``'s.
- ``queue_harm`` is the delay ``x``'s prefill imposes on the requests that will queue
  behind it on ``u`` (prefill is FIFO): each of them waits ``prefill(u, x)`` longer,
  and about ``λ · (wait(u) + prefill(u, x))`` arrive before ``u``'s backlog including
  ``x`` is drained, ``λ`` being the router's recent request rate per candidate
  replica (an exponentially decayed count over ``duty_tau_s``), weighted by
  ``queue_externality_weight`` ``g`` (1: seconds of other requests' TTFT count as
  much as ``x``'s own). It vanishes on an idle fleet; in an overload it makes every
  uncached token cost what it costs the queue, so prefixes stay where they are cached.
- ``evict`` is the prefill a target that keeps only its last few prompts (a
  llama-server slot: ``Endpoint(max_cached_prompts=1)``, the route table's
  :meth:`~.route_table.RouteTableBase.limit_prompts`) would lose by taking ``x``:
  ``lost`` is the tokens of the oldest prompt it keeps beyond the prefix ``x`` shares
  with it (:meth:`~.route_table.RouteTableBase.displaced`), which that prompt's
  conversation computes again when it comes back, weighted by ``eviction_weight``
  ``v``. ``wanted(age)`` is how likely a prompt sent ``age`` seconds ago is still
  extended later, from the last ``_GAPS_WINDOW`` prompts sent to bounded targets:
  with ``r`` the share of them that extended the prompt their target kept (a
  *return*) and ``S(age)`` the share of those returns that came more than ``age``
  after the kept prompt (``exp(-age / H)``, ``H`` = ``eviction_horizon_s``, until
  ``_GAPS_MIN`` returns were seen), ``wanted = r·S / (1 − r + r·S)``, the chance of
  a return given none came in ``age``. So a conversation silent for longer than
  conversations here take between turns is likely over, and where prompts never
  return (single-turn traffic) pushing one out costs almost nothing. ``evict`` is 0
  for a target that keeps fewer prompts than its bound, for a next turn that extends
  the kept prompt, and on every unbounded replica. Without it, every prompt sharing
  the system prompt with every slot, a new conversation took the first idle slot in
  fleet order even while that slot's conversation was between two turns, and the
  conversations kept overwriting each other's slots. On by default:
  ``eviction_weight=1`` counts the lost prefill as seconds, and repeated open-loop
  conversation runs on llama-server read more from the slots with it than without
  (docs/routing.md, Open-loop conversations); ``eviction_weight=0`` turns it off.
- ``Q(m, x)`` from a fitted :class:`~contextpilot_rag.routing.laar.AccuracyModel`,
  clipped to ``[q_floor, 1]`` and 1 for requests without features or unknown models;
  dividing by it is the expected number of attempts if they were independent.
- **TTFT budget** (``ttft_budget_percentile``, off by default). When every candidate
  has the same ``Q`` (a single-model fleet), only replicas whose predicted TTFT is
  within ``max(min · (1 + ttft_slack) + ttft_slack_s, budget)`` compete, where
  ``budget`` is the ``ttft_budget_percentile`` of the TTFTs observed recently:
  trading a request's TTFT for the fleet's decode time is allowed only up to the
  current tail.

**E2E tail weighting** (``tail_quantile``, off by default). The cost above adds up
seconds of every request alike: it minimises the mean. A p95 end-to-end latency is made
by the requests with the longest answers, so with ``tail_quantile`` set, a request whose
``expected_output_tokens`` is at least that quantile of the recent requests' (the *tail*
requests) counts in full, and every other request's decode time counts
``tail_discount`` of it: in its own cost, and as a decoder ``x``'s prefill would delay
(``harm`` counts the running tail decoders, plus ``tail_discount`` per other one). TTFT
and ``queue_harm`` always count in full. Short answers then go where they delay no long
one, and long answers go where few prefills will interrupt them.

**Late binding** (``hold_wait_s``): when the caller can hold a request
(``RouteRequest.may_hold``) and even its best option would wait more than
``hold_wait_s`` for the replica's prefill unit, the decision is a hold
(``Decision.hold_s`` > 0) and the caller offers the request again when a prefill ends
(or after ``hold_s``), smallest predicted TTFT first. Requests then wait at the router
instead of in a replica's FIFO queue: the replica that drains first takes the request
that is cheapest *then*, with the caches and queues of that moment, and short prefills
are not stuck behind long ones. A hold waits for a prefill unit, never for a batch
slot (a slot frees on its own): a request whose best replica has every slot taken is
dispatched, since that replica's queued prompts wait for slots while its prefill unit
idles, and holding for them would keep every later request at the router until
``max_hold_s``. A hold is never shorter than a tick (``_HOLD_TICK_S``): a request within
a tick of ``max_hold_s`` is dispatched.

**Retry warm-ups** (``warm_retries``): when the caller may retry a wrong answer, the
decision also names in ``Decision.warm`` the replica a retry would take if that
replica's prefill unit has no queue and ``(1 − Q) ·`` the prefill there exceeds
``Q ·`` the delay it imposes on others.

Invariants:

- a hold dispatches and books nothing (the queue model and the prefix estimate are
  unchanged until the request is dispatched), and a request held ``max_hold_s`` is
  dispatched regardless;
- models already tried for the logical request are skipped while another is left;
- with one model, no features and no engine interference parameters the cost is a
  cache + queue + network cost (GORGO's), with a router-side queue model.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque
from dataclasses import dataclass, fields, replace
from operator import itemgetter
from typing import TYPE_CHECKING, TypedDict

from ..errors import ConfigError
from .common import candidate_replicas
from .gorgo import PrefixLocations
from .laar import AccuracyModel, untried_models
from .types import Decision, FleetView, Outcome, ReplicaState, RouteRequest

if TYPE_CHECKING:
    from typing import Unpack

__all__ = ["CombinedConfig", "CombinedOptions", "CombinedPolicy"]


@dataclass(frozen=True)
class CombinedConfig:
    """Tuning of :class:`CombinedPolicy` (the terms are those of the module docstring).

    ``externality_weight`` ``e`` and ``queue_externality_weight`` ``g`` weigh the delay
    a prefill imposes on running and on queued requests. ``ttft_budget_percentile``
    (``None``: off), ``ttft_slack``, ``ttft_slack_s`` and ``ttft_window`` (outcomes)
    define the TTFT budget. ``duty_tau_s``: time constant of the prefill duty and the
    request rate. ``q_floor``: the least ``Q``. ``max_tracked``: in-flight requests
    remembered (outcomes lost beyond it). ``recorded_boundaries``: boundaries recorded
    per dispatch. ``warm_retries``: warm the likely retry's replica. ``hold_wait_s``
    (``None``: no late binding) and ``max_hold_s``: when to hold a request, and how
    long at most. ``tail_quantile`` (``None``: off) and ``tail_discount``: the E2E
    tail weighting. ``eviction_weight`` ``v`` and ``eviction_horizon_s`` ``H``: the
    cost of pushing a kept prompt out of a bounded target."""

    externality_weight: float = 1.0
    queue_externality_weight: float = 1.0
    ttft_budget_percentile: float | None = None
    ttft_slack: float = 0.1
    ttft_slack_s: float = 0.1
    duty_tau_s: float = 30.0
    q_floor: float = 0.02
    max_tracked: int = 100_000
    ttft_window: int = 200
    recorded_boundaries: int = 8
    warm_retries: bool = True
    hold_wait_s: float | None = 1.0
    max_hold_s: float = 60.0
    tail_quantile: float | None = None
    tail_discount: float = 0.2
    eviction_weight: float = 1.0
    eviction_horizon_s: float = 30.0

    def __post_init__(self) -> None:
        nan = [f.name for f in fields(self) if _is_nan(getattr(self, f.name))]
        if nan:  # NaN passes every range check below, and then every cost is NaN
            raise ConfigError(f"CombinedConfig fields must be numbers, got NaN for {nan}")
        if self.externality_weight < 0 or self.queue_externality_weight < 0:
            raise ConfigError("externality_weight and queue_externality_weight must be >= 0")
        if not 0 < self.q_floor <= 1:
            raise ConfigError(f"q_floor must be in (0, 1], got {self.q_floor}")
        percentile = self.ttft_budget_percentile
        if percentile is not None and not 0 < percentile <= 100:
            raise ConfigError("ttft_budget_percentile must be in (0, 100] or None")
        if self.ttft_slack < 0 or self.ttft_slack_s < 0 or self.duty_tau_s <= 0:
            raise ConfigError("ttft_slack and ttft_slack_s must be >= 0, duty_tau_s > 0")
        if self.max_tracked < 1 or self.ttft_window < 1 or self.recorded_boundaries < 2:
            raise ConfigError("max_tracked, ttft_window >= 1 and recorded_boundaries >= 2 needed")
        if (self.hold_wait_s is not None and self.hold_wait_s < 0) or self.max_hold_s < 0:
            raise ConfigError("hold_wait_s (or None) and max_hold_s must be >= 0")
        if self.tail_quantile is not None and not 0 < self.tail_quantile < 1:
            raise ConfigError("tail_quantile must be in (0, 1) or None")
        if not 0 <= self.tail_discount <= 1:
            raise ConfigError(f"tail_discount must be in [0, 1], got {self.tail_discount}")
        if self.eviction_weight < 0 or self.eviction_horizon_s <= 0:
            raise ConfigError("eviction_weight must be >= 0 and eviction_horizon_s > 0")


class CombinedOptions(TypedDict, total=False):
    """:class:`CombinedConfig`'s fields as keywords of :class:`CombinedPolicy` (the
    same names and types; a test keeps the two equal)."""

    externality_weight: float
    queue_externality_weight: float
    ttft_budget_percentile: float | None
    ttft_slack: float
    ttft_slack_s: float
    duty_tau_s: float
    q_floor: float
    max_tracked: int
    ttft_window: int
    recorded_boundaries: int
    warm_retries: bool
    hold_wait_s: float | None
    max_hold_s: float
    tail_quantile: float | None
    tail_discount: float
    eviction_weight: float
    eviction_horizon_s: float


_CONFIG_FIELDS = frozenset(f.name for f in fields(CombinedConfig))


def _configured(config: CombinedConfig | None, options: CombinedOptions) -> CombinedConfig:
    """``config`` (default: :class:`CombinedConfig`) with ``options`` set over it."""
    unknown = sorted(set(options) - _CONFIG_FIELDS)
    if unknown:
        raise ConfigError(f"unknown CombinedPolicy options {unknown}; see CombinedConfig")
    base = config if config is not None else CombinedConfig()
    return replace(base, **options) if options else base


class _ReplicaModel:
    """The router's model of one replica, from its own dispatches.

    Invariants: ``pending_tokens`` is the sum of prompt tokens in ``pending``;
    ``decode_ends`` and ``tail_ends`` (the tail requests' among them) are sorted;
    ``context_tokens`` is the prompt tokens of this router's in-flight requests on the
    replica."""

    __slots__ = (
        "context_tokens",
        "decode_ends",
        "decode_mean_s",
        "decode_scale",
        "duty",
        "duty_at",
        "head_since",
        "pending",
        "pending_s",
        "pending_tokens",
        "tail_ends",
    )

    def __init__(self) -> None:
        self.pending: deque[tuple[int, float]] = deque()  # (prompt tokens, prefill s)
        self.pending_tokens = 0
        self.pending_s = 0.0
        self.head_since = 0.0  # when the oldest pending prompt started prefilling (estimate)
        self.context_tokens = 0
        self.decode_ends: list[float] = []
        self.decode_scale = 1.0  # observed / predicted decode time (interference model)
        self.decode_mean_s = 0.0  # observed decode time of an answer (EWMA; 0: none yet)
        self.tail_ends: list[float] = []
        self.duty = 0.0  # decayed booked prefill seconds
        self.duty_at = 0.0

    def reconcile(self, queued_tokens: int, now: float) -> None:
        """Drop the oldest pending prompts the fleet view shows as prefilled (all of
        them when it shows none queued: prompts of 0 tokens included)."""
        pending = self.pending
        while pending and (self.pending_tokens > queued_tokens or not queued_tokens):
            tokens, seconds = pending.popleft()
            self.pending_tokens -= tokens
            self.pending_s -= seconds
            self.head_since = now
        if not pending:
            self.pending_tokens, self.pending_s = 0, 0.0

    def duty_now(self, now: float, tau_s: float) -> float:
        return self.duty * math.exp(-max(0.0, now - self.duty_at) / tau_s)


# (cost, ttft_s, quality, replica, cached tokens, prefill_s, decode_s)
_Option = tuple[float, float, float, ReplicaState, int, float, float]
_COST = itemgetter(0)
_HOLD_TICK_S = 0.05  # a held request is offered again at most this often (by timer)
_TAIL_WINDOW = 1000  # recent expected outputs the tail quantile is taken over
_TAIL_EVERY = 50  # dispatches between two updates of the tail threshold
_SCALE_ALPHA = 0.05  # weight of one answer in a replica's decode_scale
_SCALE_MIN, _SCALE_MAX = 0.5, 20.0
_GAPS_WINDOW = 200  # returns to bounded targets whose gaps are kept
_GAPS_MIN = 8  # returns seen before their gaps replace exp(-age / eviction_horizon_s)
# an in-flight request: (replica_id, predicted decode end, prompt tokens, tail request,
# its decode time as the step model predicts it, unscaled; 0: no step model)
_Tracked = tuple[str, float, int, bool, float]


class CombinedPolicy:
    """Minimum expected time to a correct answer (ties: fleet order).

    Tuned by ``config`` (:class:`CombinedConfig`); its fields may also be given as
    keywords (``CombinedPolicy(hold_wait_s=None)``), which override ``config``'s.
    ``locations``: the route table to learn in (default: a new one)."""

    name = "combined"

    def __init__(
        self,
        accuracy: AccuracyModel | None = None,
        *,
        config: CombinedConfig | None = None,
        locations: PrefixLocations | None = None,
        **options: Unpack[CombinedOptions],
    ) -> None:
        self.config = _configured(config, options)
        self.accuracy = accuracy
        self.locations = locations if locations is not None else PrefixLocations()
        self._models: dict[str, _ReplicaModel] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._ttfts: deque[float] = deque(maxlen=self.config.ttft_window)
        self._observed = 0
        self.ttft_budget_s = 0.0
        self._arrivals = 0.0  # decisions, decayed with duty_tau_s, as of _arrivals_at
        self._arrivals_at = 0.0
        self._outputs: deque[int] = deque(maxlen=_TAIL_WINDOW)
        self._tail_from = 0  # expected output tokens from which a request is a tail one
        self._tail_dispatches = 0
        self._gaps = _ReturnGaps()

    @property
    def route_memory(self) -> PrefixLocations:
        """Where prefixes were sent (:attr:`locations`)."""
        return self.locations

    def quality(self, model: str, request: RouteRequest) -> float:
        """``Q(m, x)`` clipped to ``[q_floor, 1]``; 1 when unknown."""
        q = None if self.accuracy is None else self.accuracy.predict(model, request)
        return 1.0 if q is None else max(self.config.q_floor, q)

    def _model(self, replica_id: str) -> _ReplicaModel:
        model = self._models.get(replica_id)
        if model is None:
            model = self._models[replica_id] = _ReplicaModel()
        return model

    def _options(
        self, request: RouteRequest, fleet: FleetView
    ) -> tuple[list[_Option], float, bool]:
        """One option per candidate replica (see the module docstring for the terms),
        the fastest predicted TTFT and whether every option has the same ``Q``; written
        as one tight loop because it runs for every replica on every request."""
        now = fleet.now
        candidates = untried_models(request, candidate_replicas(request, fleet))
        candidate_ids = {replica.replica_id for replica in candidates}
        known = self.locations.cached_blocks(request, now, candidate_ids)
        known_get = known.get if known else None
        config = self.config
        tokens, block_tokens = request.prompt_tokens, request.block_tokens
        output_tokens, weight, tau = (
            request.expected_output_tokens,
            config.externality_weight,
            config.duty_tau_s,
        )
        models, exp = self._models, math.exp
        quality = self.quality if self.accuracy is not None else None
        # requests per second and candidate replica (recent), for queue_harm
        per_replica_rate = (
            config.queue_externality_weight
            * self._arrivals
            * exp((self._arrivals_at - now) / tau)
            / (tau * len(candidates))
        )
        options: list[_Option] = []
        fastest, first_q, same_q = math.inf, -1.0, True
        # E2E tail weighting: what a decode second of x and of another decoder counts
        tailed = config.tail_quantile is not None
        discount = config.tail_discount if tailed else 1.0
        own_weight = self._decode_weight(output_tokens)
        # targets that keep only their last prompts (slots): the cost of pushing one out
        bounded = self.locations.bounded if config.eviction_weight else None
        hashes, wanted = request.block_hashes, self._gaps.wanted
        for replica in candidates:
            replica_id = replica.replica_id
            state = models.get(replica_id) or self._model(replica_id)
            queued_tokens = replica.queued_tokens
            pending = state.pending
            if pending and (state.pending_tokens > queued_tokens or not queued_tokens):
                state.reconcile(queued_tokens, now)
            cached = 0
            if known_get is not None:
                cached = known_get(replica_id, 0) * block_tokens
                if cached > tokens:
                    cached = tokens
            uncached = tokens - cached
            rate = replica.prefill_tokens_per_s
            half_rtt = replica.rtt_s / 2
            step_s = 1.0 / replica.decode_tokens_per_s
            prefill_s = uncached / rate
            wait_s = (queued_tokens - state.pending_tokens) / rate - half_rtt
            if pending:
                elapsed = now - state.head_since
                left = state.pending_s - elapsed if elapsed > 0.0 else state.pending_s
                if left > 0.0:
                    wait_s += left
            if wait_s < 0.0:
                wait_s = 0.0
            limit = replica.max_batch
            if limit is not None and replica.in_flight >= limit:
                needed = replica.in_flight + 1 - limit
                slot_s = self._slot_wait(state, needed, limit, now) - half_rtt
                if slot_s > wait_s:
                    wait_s = slot_s
            per_context = replica.decode_s_per_context_token
            chunk = replica.prefill_chunk_tokens
            harm_s = 0.0
            if per_context or chunk:  # an engine with prefill/decode interference
                if per_context:
                    step_s += per_context * (state.context_tokens - state.pending_tokens)
                if chunk and replica.in_flight > len(pending):
                    prefill_s += -(-uncached // chunk) * step_s
                decode_step_s = (step_s + per_context * tokens) * state.decode_scale
                if chunk:
                    duty = state.duty * exp((state.duty_at - now) / tau) / tau
                    if duty > 1.0:
                        duty = 1.0
                    # a share ``duty`` of x's decode runs in steps that carry a chunk
                    # (one token per step + chunk), the rest in plain steps
                    decode_step_s = (
                        decode_step_s
                        * (decode_step_s + chunk / rate)
                        / (decode_step_s + (1.0 - duty) * chunk / rate)
                    )
                    ends = state.decode_ends
                    if ends:
                        starts_at = now + half_rtt + wait_s
                        running: float = len(ends) - bisect_right(ends, starts_at)
                        if tailed:
                            tails = state.tail_ends
                            in_tail = len(tails) - bisect_right(tails, starts_at)
                            running = in_tail + discount * (running - in_tail)
                        harm_s = running * uncached / rate
            else:
                decode_step_s = step_s
            ttft_s = 2 * half_rtt + wait_s + prefill_s
            if ttft_s < fastest:
                fastest = ttft_s
            decode_s = output_tokens * decode_step_s
            q = 1.0 if quality is None else quality(replica.model, request)
            if q != first_q:
                same_q = first_q < 0.0
                first_q = q
            cost = ttft_s + own_weight * decode_s + weight * harm_s
            if per_replica_rate:
                cost += per_replica_rate * prefill_s * (wait_s + prefill_s)
            if bounded and replica_id in bounded:
                pushed_out = self.locations.displaced(replica_id, hashes)
                if pushed_out is not None and pushed_out.lost:
                    lost_s = pushed_out.lost * block_tokens / rate
                    lost_s *= wanted(now - pushed_out.sent_s, config.eviction_horizon_s)
                    cost += config.eviction_weight * lost_s
            cost /= q
            options.append((cost, ttft_s, q, replica, cached, prefill_s, decode_s))
        return options, fastest, same_q

    @staticmethod
    def _slot_wait(state: _ReplicaModel, needed: int, limit: int, now: float) -> float:
        """Seconds until ``needed`` of the replica's ``limit`` batch slots free up: the
        later of this router's predicted decode ends (a request past its predicted
        end taken to end now) and the replica's observed pace (``limit`` answers per
        observed decode time, Little's law), which holds when the predictions are
        stale."""
        ends = state.decode_ends
        wait_s = state.decode_mean_s * needed / limit
        if ends:
            free_at = ends[min(needed, len(ends)) - 1] - now
            if free_at > wait_s:
                wait_s = free_at
        return wait_s

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        options, fastest, same_q = self._options(request, fleet)
        config = self.config
        best = options[0]
        if config.ttft_budget_percentile is not None and same_q:
            slack = fastest * (1 + config.ttft_slack) + config.ttft_slack_s
            limit = max(slack, self.ttft_budget_s)
            best_cost = math.inf
            for option in options:  # the fastest option is always within the limit
                if option[0] < best_cost and option[1] <= limit:
                    best, best_cost = option, option[0]
        else:
            best = min(options, key=_COST)  # first minimum: fleet order breaks ties
        _, ttft_s, _, replica, cached, prefill_s, decode_s = best
        now = fleet.now
        hold_wait_s, max_hold_s = config.hold_wait_s, config.max_hold_s
        slots = replica.max_batch
        saturated = slots is not None and replica.in_flight >= slots
        if request.may_hold and hold_wait_s is not None and not saturated:
            # a hold waits for the prefill unit; a batch slot frees on its own (and a
            # full replica's queue waits for slots, not for its prefill unit), so a
            # replica with a slot free has no slot wait in its TTFT
            wait_s = ttft_s - replica.rtt_s - prefill_s
            left_s = max_hold_s - (now - request.arrival_s)
            # a hold shorter than a tick would not move the clock (a request held for
            # 1e-14 s at t = 900 s is offered again at the same instant, for ever)
            if wait_s > hold_wait_s and left_s >= _HOLD_TICK_S:
                hold_s = min(max(wait_s - hold_wait_s, _HOLD_TICK_S), left_s)
                return Decision(
                    replica.replica_id, replica.model, "hold", cached, ttft_s, hold_s=hold_s
                )
        self._dispatch(request, replica, prefill_s, ttft_s, decode_s, cached, now)
        warm: tuple[str, ...] = ()
        retry_follows = request.attempt + 1 < request.max_attempts
        target = (
            _retry_target(options, best, self._decode_weight(request.expected_output_tokens))
            if config.warm_retries and retry_follows
            else None
        )
        if target is not None:
            self._book_prefill(request, target[3], target[5], target[4], now)
            warm = (target[3].replica_id,)
        return Decision(
            replica.replica_id, replica.model, "min-expected-ttca", cached, ttft_s, warm
        )

    def _book_prefill(
        self,
        request: RouteRequest,
        replica: ReplicaState,
        prefill_s: float,
        cached: int,
        now: float,
    ) -> _ReplicaModel:
        """Book ``request``'s prefill on ``replica`` (queue model, duty) and record the
        route, for a dispatch and for a warm-up alike; the replica's model."""
        replica_id = replica.replica_id
        state = self._model(replica_id)
        if not state.pending:
            state.head_since = now + replica.rtt_s / 2
        state.pending.append((request.prompt_tokens, prefill_s))
        state.pending_tokens += request.prompt_tokens
        state.pending_s += prefill_s
        state.duty = state.duty_now(now, self.config.duty_tau_s) + prefill_s
        state.duty_at = now
        relied_on = cached // request.block_tokens
        keep = self.config.recorded_boundaries
        self.locations.record_route(request, replica_id, relied_on, now, keep)
        return state

    def _dispatch(
        self,
        request: RouteRequest,
        replica: ReplicaState,
        prefill_s: float,
        ttft_s: float,
        decode_s: float,
        cached: int,
        now: float,
    ) -> None:
        replica_id = replica.replica_id
        # the returns the eviction cost learns from (before the route update below)
        if self.config.eviction_weight and replica_id in self.locations.bounded:
            kept = self.locations.displaced(replica_id, request.block_hashes)
            # x extends the kept prompt (but for the blocks after its last shared boundary)
            extends = kept is not None and 2 * kept.lost <= kept.blocks
            self._gaps.dispatched(now - kept.sent_s if kept is not None and extends else None)
        state = self._book_prefill(request, replica, prefill_s, cached, now)
        state.context_tokens += request.prompt_tokens
        decay = math.exp((self._arrivals_at - now) / self.config.duty_tau_s)
        self._arrivals = self._arrivals * decay + 1
        self._arrivals_at = now
        ends_at = now + ttft_s + decode_s
        insort(state.decode_ends, ends_at)
        in_tail = self._in_tail(request.expected_output_tokens)
        if in_tail:
            insort(state.tail_ends, ends_at)
        interfering = bool(replica.decode_s_per_context_token or replica.prefill_chunk_tokens)
        modelled_s = decode_s / state.decode_scale if interfering else 0.0
        entry = (replica.replica_id, ends_at, request.prompt_tokens, in_tail, modelled_s)
        self._track(request.request_id, entry)

    def _decode_weight(self, output_tokens: int) -> float:
        """What a second of a request's own decode counts in its cost: 1, or
        ``tail_discount`` for a request outside the E2E tail (module docstring)."""
        config = self.config
        if config.tail_quantile is None or output_tokens >= self._tail_from:
            return 1.0
        return config.tail_discount

    def _in_tail(self, output_tokens: int) -> bool:
        """Whether a dispatched request is a tail one (see the module docstring; the
        threshold is updated every ``_TAIL_EVERY`` dispatches, after this one is
        judged); ``False`` when the weighting is off."""
        quantile = self.config.tail_quantile
        if quantile is None:
            return False
        in_tail = output_tokens >= self._tail_from
        outputs = self._outputs
        outputs.append(output_tokens)
        self._tail_dispatches += 1
        if self._tail_dispatches % _TAIL_EVERY == 0:
            ordered = sorted(outputs)
            self._tail_from = ordered[int(quantile * (len(ordered) - 1))]
        return in_tail

    def _track(self, request_id: str, entry: _Tracked) -> None:
        """Remember an in-flight request; beyond ``max_tracked`` (outcomes lost), the
        oldest are forgotten so memory stays bounded."""
        self._untrack(request_id)
        self._tracked[request_id] = entry
        while len(self._tracked) > self.config.max_tracked:
            self._untrack(next(iter(self._tracked)))

    def _untrack(self, request_id: str) -> _Tracked | None:
        entry = self._tracked.pop(request_id, None)
        if entry is None:
            return None
        replica_id, ends_at, prompt_tokens, in_tail, _ = entry
        state = self._model(replica_id)
        state.context_tokens -= prompt_tokens
        _remove(state.decode_ends, ends_at)
        if in_tail:
            _remove(state.tail_ends, ends_at)
        return entry

    def observe(self, outcome: Outcome) -> None:
        """Close the request's in-flight entry, update the TTFT budget and forget
        prefixes the engine reported as not cached (as :class:`CostPolicy`)."""
        entry = self._untrack(outcome.request.request_id)
        if outcome.error is None and entry is not None:
            self._calibrate(entry, outcome.e2e_s - outcome.ttft_s)
        if outcome.error is None:
            self._ttfts.append(outcome.ttft_s)
            self._observed += 1
            percentile = self.config.ttft_budget_percentile
            if percentile is not None and self._observed % 20 == 0:
                ordered = sorted(self._ttfts)
                rank = percentile / 100 * (len(ordered) - 1)
                self.ttft_budget_s = ordered[round(rank)]
        self.locations.correct(outcome)

    def _calibrate(self, entry: _Tracked, decoded_s: float) -> None:
        """Fold an answer's decode time into its replica's ``decode_scale``: the
        step model (context reads, prefill duty) predicts the decode, the scale
        carries what it misses, such as the prefills other routers send or a batch
        whose steps outgrow the model (EWMA of the ratio, clipped)."""
        state = self._model(entry[0])
        mean = state.decode_mean_s
        state.decode_mean_s = decoded_s if mean == 0.0 else mean + _SCALE_ALPHA * (decoded_s - mean)
        if entry[4] <= 0.0:
            return
        ratio = decoded_s / entry[4]
        ratio = min(max(ratio, _SCALE_MIN), _SCALE_MAX)
        state.decode_scale += _SCALE_ALPHA * (ratio - state.decode_scale)


class _ReturnGaps:
    """Which of the last ``_GAPS_WINDOW`` prompts sent to bounded targets were extended
    there later, and after how many seconds: how likely a kept prompt still comes
    back (module docstring)."""

    __slots__ = ("_ordered", "_outcomes", "_recent", "_returned")

    def __init__(self) -> None:
        self._recent: deque[float] = deque()  # gaps of the last returns, oldest first
        self._ordered: list[float] = []  # the same, sorted
        self._outcomes: deque[bool] = deque()  # per dispatch: did it return to a kept prompt
        self._returned = 0

    def dispatched(self, gap_s: float | None) -> None:
        """One prompt sent to a bounded target; ``gap_s``: seconds since the kept prompt
        it extends was sent (``None``: it extends none)."""
        outcomes = self._outcomes
        outcomes.append(gap_s is not None)
        self._returned += gap_s is not None
        if len(outcomes) > _GAPS_WINDOW:
            self._returned -= outcomes.popleft()
        if gap_s is None:
            return
        gap_s = max(0.0, gap_s)
        self._recent.append(gap_s)
        insort(self._ordered, gap_s)
        if len(self._recent) > _GAPS_WINDOW:
            _remove(self._ordered, self._recent.popleft())

    def wanted(self, age_s: float, horizon_s: float) -> float:
        """The chance a prompt sent ``age_s`` ago is still extended later."""
        ordered, n = self._ordered, len(self._ordered)
        if n < _GAPS_MIN:
            later = math.exp(-age_s / horizon_s) if age_s > 0.0 else 1.0
        else:
            later = (n - bisect_right(ordered, age_s) + 0.5) / (n + 1)
        share = (self._returned + 1) / (len(self._outcomes) + 2)  # prompts that return
        returning = share * later
        return returning / (1.0 - share + returning)


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _remove(ends: list[float], ends_at: float) -> None:
    """Remove one ``ends_at`` from the sorted ``ends`` (nothing if absent)."""
    i = bisect_right(ends, ends_at) - 1
    if i >= 0 and ends[i] == ends_at:
        del ends[i]


def _retry_target(
    options: list[_Option], best: _Option, decode_weight: float = 1.0
) -> _Option | None:
    """The option a retry would take if ``best`` answers wrongly (the cheapest one
    serving another model), when warming it pays: the retry's prefill it saves,
    ``(1 - Q(best)) · prefill``, exceeds the delay it imposes on others when no retry
    comes, ``Q(best) · externality`` (the option's cost terms beyond its own TTFT
    and its decode, counted at ``decode_weight`` as in the cost). ``None`` when
    ``best`` is sure, no other model is left or nothing is left to prefill."""
    q, model = best[2], best[3].model
    if q >= 1.0:
        return None
    target: _Option | None = None
    for option in options:
        if option[3].model != model and (target is None or option[0] < target[0]):
            target = option
    if target is None or target[5] <= 0.0:
        return None
    if target[1] - target[3].rtt_s - target[5] > 0.0:
        return None  # a queue: warming would only move the prefill ahead of others
    external = target[0] * target[2] - target[1] - decode_weight * target[6]
    return target if (1.0 - q) * target[5] > q * external else None
