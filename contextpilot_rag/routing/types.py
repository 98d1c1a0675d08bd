"""The routing protocol: what a policy sees (a request and the fleet's state), what it
decides, and what it learns from afterwards.

A policy is any object with ``name``, ``route_memory`` (its route table, or ``None``),
``choose(request, fleet) -> Decision`` and ``observe(outcome)``. The fleet simulator
(``contextpilot_rag.sim.fleet``) and the routing client drive policies only through this
protocol, so built-in and external policies (e.g. a wrapper around ``gorgo-lb``) plug in
the same way.

Prompts are described by **chained block hashes**: ``block_hashes[i]`` identifies the
whole prefix up to and including block ``i`` (``block_tokens`` tokens per block), so
equal hashes mean equal prefixes. For a real prompt they come from its tokens (the
engine's block size); for a Mooncake trace they are the trace's ``hash_ids``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._numbers import is_finite_at_least, is_finite_positive
from ..errors import ConfigError, InvalidInputError, InvalidRouteRequestError

if TYPE_CHECKING:
    from ..prompt import Prompt

__all__ = [
    "CacheFeedback",
    "Decision",
    "FleetView",
    "Outcome",
    "Policy",
    "ReplicaState",
    "RouteMemory",
    "RouteRequest",
]


@dataclass(frozen=True)
class RouteRequest:
    """One request to place.

    ``block_hashes``: chained hashes of the prompt's full blocks, first block first.
    ``boundaries``: block counts at which the client knows a block/message boundary
    exactly (e.g. after the system prompt, after each context block, aligned down to
    the engine block) — where learned routes may be recorded. ``session``: a session
    key for affinity policies. ``features``: cheap request features for accuracy
    models (e.g. ``language``, ``task``, ``length_bucket``). ``logical_id`` and
    ``attempt`` identify retries of one logical request; ``excluded`` holds the
    ``(replica_id, model)`` pairs already tried for it; ``max_attempts`` is how many
    answers the caller may ask for it (1: a wrong answer is not retried).
    ``may_hold``: the caller can keep the request back when the policy answers with a
    hold (:attr:`Decision.hold_s`) and offer it again later (late binding); a
    policy never holds a request without it.

    Construction validates the counts and every boundary (``1..len(block_hashes)``,
    else :class:`~contextpilot_rag.errors.InvalidRouteRequestError`) and stores the
    boundaries ascending without duplicates, so policies probe them without checks."""

    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    block_tokens: int = 16
    expected_output_tokens: int = 128
    boundaries: tuple[int, ...] = ()
    session: str | None = None
    arrival_s: float = 0.0
    features: Mapping[str, str | float] = field(default_factory=dict)
    logical_id: str | None = None
    attempt: int = 0
    excluded: frozenset[tuple[str, str]] = frozenset()
    max_attempts: int = 1
    may_hold: bool = False

    def __post_init__(self) -> None:
        counts = (self.prompt_tokens, self.expected_output_tokens, self.block_tokens - 1)
        if not (all(is_finite_at_least(count, 0) for count in counts)):
            raise InvalidRouteRequestError(
                f"request {self.request_id!r}: prompt_tokens and expected_output_tokens must "
                f"be finite and >= 0 and block_tokens >= 1, got {self.prompt_tokens}, "
                f"{self.expected_output_tokens}, {self.block_tokens}"
            )
        if not is_finite_at_least(self.arrival_s, -math.inf):
            raise InvalidRouteRequestError(
                f"request {self.request_id!r}: arrival_s must be finite, got {self.arrival_s!r}"
            )
        if self.max_attempts < 1:
            raise InvalidRouteRequestError(
                f"request {self.request_id!r}: max_attempts must be >= 1, got {self.max_attempts}"
            )
        boundaries = self.boundaries
        if not boundaries:
            return
        ordered = sorted(set(boundaries))
        if ordered[0] < 1 or ordered[-1] > len(self.block_hashes):
            raise InvalidRouteRequestError(
                f"request {self.request_id!r}: boundaries must lie in 1..{len(self.block_hashes)}"
                f" (the number of block hashes), got {ordered[0]}..{ordered[-1]}"
            )
        if not isinstance(boundaries, tuple) or list(boundaries) != ordered:
            object.__setattr__(self, "boundaries", tuple(ordered))


@dataclass(frozen=True)
class ReplicaState:
    """What the router knows of one replica (one model served by one engine) now."""

    replica_id: str
    model: str
    region: str = "local"
    rtt_s: float = 0.0  # smoothed network round trip from the client
    in_flight: int = 0  # requests sent and not finished
    queued_tokens: int = 0  # prompt tokens sent and not yet prefilled (estimate)
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0  # one request with an empty context
    decode_s_per_context_token: float = 0.0  # step-time growth with the batch's context
    prefill_chunk_tokens: int = 0  # chunked prefill (steps decode shares with a prefill)
    healthy: bool = True
    max_batch: int | None = None  # requests served at once, if known; more wait for a slot

    def __post_init__(self) -> None:
        limit = self.max_batch
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ConfigError(
                f"replica {self.replica_id!r}: max_batch must be None or an integer >= 1, "
                f"got {limit!r}"
            )
        at_least = (
            (self.rtt_s, 0),
            (self.in_flight, 0),
            (self.queued_tokens, 0),
            (self.decode_s_per_context_token, 0),
            (self.prefill_chunk_tokens, 0),
        )
        rates = (self.prefill_tokens_per_s, self.decode_tokens_per_s)
        if not all(is_finite_at_least(value, low) for value, low in at_least) or not all(
            is_finite_positive(rate) for rate in rates
        ):
            raise ConfigError(
                f"replica {self.replica_id!r}: rtt_s, in_flight, queued_tokens, "
                "decode_s_per_context_token and prefill_chunk_tokens must be finite and "
                ">= 0, and the prefill and decode rates finite and > 0"
            )


class FleetView(Protocol):
    """The fleet as the router sees it at decision time."""

    @property
    def now(self) -> float: ...

    @property
    def replicas(self) -> Sequence[ReplicaState]: ...


@dataclass(frozen=True)
class Decision:
    """Where to send a request, why, and what the policy expected (for feedback).

    ``warm``: other replicas (serving other models) where the policy asks for the
    prompt to be prefilled now, its answer discarded, because a retry is likely to go
    there (see :class:`~contextpilot_rag.routing.combined.CombinedPolicy`); a driver
    that cannot warm may ignore it.

    ``hold_s`` > 0 (only for a request with ``may_hold``): do not send the request
    yet; the router keeps it and offers it to ``choose`` again when the fleet's
    state changes (a prefill ends) and at the latest after ``hold_s`` seconds.
    ``replica_id`` then names the replica it is waiting for, ``predicted_ttft_s``
    its TTFT there if it were sent now (drivers offer held requests again smallest
    first), and nothing has been booked: a hold is not a dispatch."""

    replica_id: str
    model: str
    reason: str
    predicted_cached_tokens: int = 0
    predicted_ttft_s: float | None = None
    warm: tuple[str, ...] = ()
    hold_s: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """What happened: measured TTFT / end-to-end latency, the cached prompt tokens the
    engine reported, correctness when known (TTCA experiments), or an error.
    ``cancelled``: the caller gave up (with ``error`` set); no evidence about the
    replica's cache or health, so policies only release what they track for it."""

    request: RouteRequest
    decision: Decision
    ttft_s: float
    e2e_s: float
    cached_tokens: int = 0
    correct: bool | None = None
    error: str | None = None
    cancelled: bool = False

    def __post_init__(self) -> None:
        # one NaN or infinite latency would poison every policy's running estimates
        if not (is_finite_at_least(self.ttft_s, 0) and is_finite_at_least(self.e2e_s, 0)):
            raise InvalidInputError(
                f"outcome of {self.request.request_id!r}: ttft_s and e2e_s must be finite "
                f"and >= 0, got {self.ttft_s!r}, {self.e2e_s!r}"
            )
        if not (is_finite_at_least(self.cached_tokens, 0)):
            raise InvalidInputError(
                f"outcome of {self.request.request_id!r}: cached_tokens must be >= 0, "
                f"got {self.cached_tokens!r}"
            )


@runtime_checkable
class RouteMemory(Protocol):
    """A policy's bounded record of which replica holds which prompt prefixes (its
    route table). ``len``: the routes it holds now. ``limit_prompts``: the replica
    keeps only its ``max_prompts`` latest prompts (a llama-server slot: 1), so older
    routes to it are stale; ``None`` removes the bound."""

    def __len__(self) -> int: ...

    def limit_prompts(self, replica_id: str, max_prompts: int | None) -> None: ...


@runtime_checkable
class Policy(Protocol):
    """A routing policy. ``choose`` must be cheap (it runs on every request) and must
    return a healthy replica not in ``request.excluded`` when one exists;
    ``observe`` receives every outcome, in completion order. ``route_memory`` is
    the policy's route table (``None`` for a policy that keeps none), an attribute or
    a read-only property."""

    name: str

    @property
    def route_memory(self) -> RouteMemory | None: ...

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision: ...

    def observe(self, outcome: Outcome) -> None: ...


class CacheFeedback(Protocol):
    """Who learns what an engine served from its prefix cache for a prompt it was
    sent (:meth:`contextpilot_rag.ContextPilot.observe_cache` implements it): the
    routing client reports each answer's cached and total prompt tokens."""

    def observe_cache(self, prompt: Prompt, cached_tokens: int, prompt_tokens: int) -> object: ...
