"""The deployments of a LiteLLM Router as the routing policy sees them: one replica per
deployment (its ``model_info.id``), with live counters, a circuit breaker and learned
prefill and decode rates, and the routes dispatched to them that have not ended yet.

Not thread-safe on its own: its owner (the strategy) serialises every call with its
lock. Invariants: a replica's ``in_flight`` and ``queued_tokens`` are the sums over its
open routes; a route is closed once (answer, failure or expiry), and no route stays
open longer than ``route_ttl_s`` (a call whose end LiteLLM never reports is released
then, so counters never leak).
"""

from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import Decision, ReplicaState, RouteRequest
from contextpilot_rag.routing.route_store import Load

__all__ = ["Fleet", "FleetConfig", "Route", "deployment_key", "deployment_model"]

_MIN_RATE_TOKENS = 64  # shorter prefills say more about overheads than about the rate
_RATE_ALPHA = 0.3


@dataclass(frozen=True)
class FleetConfig:
    """Starting rates of a deployment, the breaker's backoff after a failure (doubled
    per failure in a row, at most ``max_backoff_s``) and how long a route may stay open.

    With ``learn_rates`` the first measured rates replace the starting ones and later
    measurements are averaged in. The starting prefill rate is deliberately low (a
    small model on a CPU): a policy that overestimates the rate takes the prompts
    queued on a replica for drained long before they are, and piles the first burst of
    requests onto whichever replica holds a shared prefix; underestimating it only
    spreads that burst a little more evenly. Give the engines' real rate when known.

    ``rate_prior_samples``: how far one deployment's measurements move its rates away
    from the mean of the model group's. A TTFT seen through LiteLLM carries the
    gateway's own overhead and any time the call waited in its event loop behind
    others, so one call can make a deployment look several times faster than its
    twins; taken as its rate, that outweighs the prefix cached on another deployment
    and sends a conversation away from its cache. So a deployment with ``n`` answers
    measured is given ``(n · own + k · group) / (n + k)`` (``k`` this field): the
    group's level is learned from the first answer on, a deployment consistently
    faster or slower than its twins earns its own rate over its answers, and ``0``
    trusts each deployment's own measurements alone."""

    prefill_tokens_per_s: float = 1_000.0
    decode_tokens_per_s: float = 50.0
    learn_rates: bool = True
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    route_ttl_s: float = 600.0
    rate_prior_samples: float = 4.0

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ConfigError("prefill_tokens_per_s and decode_tokens_per_s must be > 0")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ConfigError("backoff_s must be >= 0 and max_backoff_s >= backoff_s")
        if self.route_ttl_s <= 0:
            raise ConfigError(f"route_ttl_s must be > 0, got {self.route_ttl_s}")
        if not self.rate_prior_samples >= 0:
            raise ConfigError(f"rate_prior_samples must be >= 0, got {self.rate_prior_samples}")


def deployment_key(deployment: Mapping[str, Any]) -> str:
    """A deployment's id (``model_info.id``, which LiteLLM always sets): its replica id."""
    info = deployment.get("model_info")
    found = info.get("id") if isinstance(info, Mapping) else None
    if found is None:
        raise ConfigError("a LiteLLM deployment without model_info.id cannot be routed")
    return str(found)


def deployment_model(deployment: Mapping[str, Any]) -> str:
    """The model a deployment serves (``litellm_params.model``)."""
    params = deployment.get("litellm_params")
    model = params.get("model") if isinstance(params, Mapping) else None
    return str(model) if model else deployment_key(deployment)


@dataclass
class Route:
    """One dispatched call, open until its end is reported (or it expires)."""

    route_id: str
    replica_id: str
    request: RouteRequest
    decision: Decision
    started: float
    characters: int  # of the routing text, to refine the characters-per-token estimate
    idle: bool  # nothing else was in flight on the replica when it was dispatched
    call_id: str | None = None  # LiteLLM's litellm_call_id: one per request, shared by its retries
    attempt_of: int | None = None  # the request's marker (Fleet.open), shared by its retries
    shared_call: bool = False  # another request has the same call_id (Fleet.open)


class _Replica:
    __slots__ = (
        "decode_rate",
        "failures",
        "in_flight",
        "model",
        "open_until",
        "prefill_rate",
        "queued_tokens",
        "replica_id",
        "samples",
    )

    def __init__(self, replica_id: str, model: str, config: FleetConfig) -> None:
        self.replica_id = replica_id
        self.model = model
        self.in_flight = 0
        self.queued_tokens = 0
        self.failures = 0
        self.open_until = 0.0
        self.prefill_rate = config.prefill_tokens_per_s
        self.decode_rate = config.decode_tokens_per_s
        self.samples = 0  # answers its own rates were measured from

    def state(
        self, now: float, group: tuple[float, float], prior_samples: float, others: Load
    ) -> ReplicaState:
        """The replica as the policy sees it: its rates pooled with the ``group``'s
        (see :class:`FleetConfig`)."""
        own = self.samples / (self.samples + prior_samples) if self.samples else 0.0
        prefill = group[0] + own * (self.prefill_rate - group[0])
        decode = group[1] + own * (self.decode_rate - group[1])
        return ReplicaState(
            replica_id=self.replica_id,
            model=self.model,
            in_flight=self.in_flight + others[0],
            queued_tokens=self.queued_tokens + others[1],
            prefill_tokens_per_s=prefill,
            decode_tokens_per_s=decode,
            healthy=now >= self.open_until,
        )


class Fleet:
    """Live state of the deployments one strategy has routed to, and its open routes."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._replicas: dict[str, _Replica] = {}
        self._open: OrderedDict[str, Route] = OrderedDict()  # oldest first
        self._numbers = itertools.count(1)
        # route ids are unique per fleet: LiteLLM's callbacks are process-wide, so every
        # strategy in a process sees every call's end, and a sequence shared between
        # strategies would let one close another's route of the same number
        self._prefix = secrets.token_hex(4)

    def states(
        self,
        deployments: Sequence[Mapping[str, Any]],
        now: float,
        remote: Mapping[str, Load] | None = None,
    ) -> list[ReplicaState]:
        """The replicas of ``deployments`` (new ones start idle), as the policy sees
        them, with the load other routers report on them (``remote``); when every
        breaker is open, all are offered anyway. A replica's rates are the mean rates
        of those that have answered (else the configured ones), moved towards its own
        by its answers (:class:`FleetConfig`): measured rates carry overheads a
        configured one lacks, and a replica must look neither faster for being unknown
        nor several times faster for one quick answer."""
        rates, remote = self._fleet_rates(), remote or {}
        prior = self.config.rate_prior_samples
        states = [
            replica.state(now, rates, prior, remote.get(replica.replica_id, (0, 0)))
            for replica in map(self._replica, deployments)
        ]
        if states and not any(state.healthy for state in states):
            return [replace(state, healthy=True) for state in states]
        return states

    def _fleet_rates(self) -> tuple[float, float]:
        learned = [r for r in self._replicas.values() if r.samples]
        if not learned:
            return self.config.prefill_tokens_per_s, self.config.decode_tokens_per_s
        count = len(learned)
        return (
            sum(r.prefill_rate for r in learned) / count,
            sum(r.decode_rate for r in learned) / count,
        )

    def _replica(self, deployment: Mapping[str, Any]) -> _Replica:
        key = deployment_key(deployment)
        replica = self._replicas.get(key)
        if replica is None:
            replica = self._replicas[key] = _Replica(key, deployment_model(deployment), self.config)
        return replica

    def open(
        self,
        request: RouteRequest,
        decision: Decision,
        now: float,
        characters: int,
        call_id: str | None = None,
        attempt_of: int | None = None,
    ) -> Route:
        """Book a dispatch to ``decision.replica_id`` (a replica of the last ``states``).

        ``attempt_of`` tells a request's attempts apart from other requests' (the
        ``id`` of the proxy's logging object, one per request, shared by its
        retries). An open route with the same ``call_id`` and another ``attempt_of``
        is another request's: on the proxy a client may choose the id
        (``x-litellm-call-id``), and one request's failure would release another's
        routes. Every route of such an id is left out of :meth:`open_of_call`; each
        closes on its own end, or expires."""
        others = [r for r in self._open.values() if call_id is not None and r.call_id == call_id]
        shared = any(route.attempt_of != attempt_of for route in others)
        for route in others if shared else ():
            route.shared_call = True
        replica = self._replicas[decision.replica_id]
        idle = replica.in_flight == 0
        replica.in_flight += 1
        replica.queued_tokens += request.prompt_tokens
        number = next(self._numbers)
        route = Route(
            f"{self._prefix}-r{number}",
            replica.replica_id,
            request,
            decision,
            now,
            characters,
            idle,
            call_id,
            attempt_of,
            shared,
        )
        self._open[route.route_id] = route
        return route

    def open_of_call(self, call_id: str) -> list[str]:
        """The ids of the open routes booked for LiteLLM's call ``call_id``."""
        return [
            route.route_id
            for route in self._open.values()
            if route.call_id == call_id and not route.shared_call
        ]

    def close(self, route_ids: Iterable[object], replica_id: str | None) -> Route | None:
        """Close the newest open route of ``route_ids`` that went to ``replica_id`` (any
        replica when unknown) and release its counters; ``None`` when none is open."""
        for route_id in reversed(list(route_ids)):
            route = self._open.get(str(route_id))
            if route is not None and replica_id in (None, route.replica_id):
                del self._open[route.route_id]
                replica = self._replicas[route.replica_id]
                replica.in_flight -= 1
                replica.queued_tokens -= route.request.prompt_tokens
                return route
        return None

    def expired(self, now: float) -> list[Route]:
        """Close and return the routes open longer than ``route_ttl_s``."""
        stale: list[Route] = []
        while self._open:
            route = next(iter(self._open.values()))
            if now - route.started < self.config.route_ttl_s:
                break
            stale.append(route)
            self.close([route.route_id], route.replica_id)
        return stale

    def answered(
        self, route: Route, uncached: int, ttft_s: float, generated: int, e2e_s: float
    ) -> None:
        """An answer: close the breaker, fold the answer into the rates (EWMA). Only a
        call sent to an idle replica teaches its prefill rate: the TTFT of a call that
        queued behind others measures the queue, which the policy already counts, and
        taking it for slow prefill would make a busy replica look slow and herd the
        traffic onto the others."""
        replica = self._replicas[route.replica_id]
        replica.failures, replica.open_until = 0, 0.0
        if not self.config.learn_rates or not route.idle:
            return
        decode_s = e2e_s - ttft_s
        prefill = uncached / ttft_s if uncached >= _MIN_RATE_TOKENS and ttft_s > 0 else None
        decode = (
            generated / decode_s if generated >= _MIN_RATE_TOKENS // 8 and decode_s > 0 else None
        )
        if prefill is None:
            return
        replica.samples += 1
        if replica.samples == 1:  # the first measurement replaces the configured guess
            replica.prefill_rate = prefill
            replica.decode_rate = decode or self._fleet_rates()[1]
            return
        replica.prefill_rate += _RATE_ALPHA * (prefill - replica.prefill_rate)
        if decode is not None:
            replica.decode_rate += _RATE_ALPHA * (decode - replica.decode_rate)

    def failed(self, route: Route, now: float) -> None:
        """A failure: open the breaker for the backoff."""
        replica = self._replicas[route.replica_id]
        replica.failures += 1
        config = self.config
        backoff = min(config.max_backoff_s, config.backoff_s * 2 ** (replica.failures - 1))
        replica.open_until = now + backoff

    def loads(self) -> dict[str, Load]:
        """Every known replica's ``(in_flight, queued_tokens)`` from this router."""
        return {r.replica_id: (r.in_flight, r.queued_tokens) for r in self._replicas.values()}

    def __len__(self) -> int:
        """Routes open now."""
        return len(self._open)
