"""The fleet as one client runs it: :class:`Dispatcher` routes each attempt with the
policy (dispatching or holding it), books its endpoint's counters, and at its end
releases them and feeds back what the engine reported — to the breaker, the learned
rates and token estimate, the policy, the metrics and the decision log, and the pilot.

State has one owner: the dispatcher holds the replicas' live state and the held
requests, and mutates them only under its lock. Every dispatched attempt is a
:class:`Plan` whose counters are released exactly once, on every path (answer, failure,
timeout, cancellation)."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import InvalidDecisionError, InvalidInputError, RoutingError
from ...prompt import Prompt
from ..metrics import DecisionRecord, RoutingMetrics, decision_log, route_table_entries
from ..prompt_keys import ChatTemplate, PromptInput, PromptKeys, PromptText, serialise
from ..route_store import Load, RouteStore, SharedRoute
from ..route_table import RouteTableBase
from ..shared_routes import SharedRoutes
from ..types import Decision, Outcome, Policy, ReplicaState, RouteRequest
from .config import ClientConfig
from .endpoints import Credentials, Endpoint, Replica
from .holding import Held, HeldRequests, NewWaiter
from .results import ChatResult
from .sse import Kind, Reply, TokenCounts

__all__ = ["Ask", "Dispatcher", "Plan"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ask:
    """What a call asks an engine: the endpoint ``kind``, the prompt serialised for
    routing (its text, boundaries and chat messages), the engine ``params`` and the
    ``cache_salt`` it goes with (``None``: none), which also namespaces its route keys."""

    kind: Kind
    text: PromptText
    params: Mapping[str, Any]
    salt: str | None = None

    @staticmethod
    def of(
        kind: Kind, prompt: PromptInput, params: Mapping[str, Any], template: ChatTemplate | None
    ) -> Ask:
        """A Prompt, chat messages or a string (one user turn) as asked; a completion
        takes a string or a Prompt (sent as its text)."""
        salt = _salt_of(prompt, params)
        params = {name: value for name, value in params.items() if name != _SALT}
        if kind == "completion":
            if isinstance(prompt, Prompt):
                return Ask(kind, serialise(prompt, completion=True), params, salt)
            if not isinstance(prompt, str):
                raise InvalidInputError("complete() takes a string or a Prompt")
        elif isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        return Ask(kind, serialise(prompt, template), params, salt)


_SALT = "cache_salt"


def _salt_of(prompt: PromptInput, params: Mapping[str, Any]) -> str | None:
    """The ``cache_salt`` of a call: the parameter when given (``None``: send none),
    else a Prompt's own (:attr:`~contextpilot_rag.prompt.Prompt.cache_salt`)."""
    if _SALT not in params:
        return prompt.cache_salt if isinstance(prompt, Prompt) else None
    salt = params[_SALT]
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidInputError(f"cache_salt must be a non-empty string or None, got {salt!r}")
    return salt


@dataclass
class Plan:
    """One dispatched attempt and its HTTP request; the counters it booked are
    released once (``closed``)."""

    replica: Replica
    request: RouteRequest
    decision: Decision
    body: dict[str, Any]
    url: str
    started: float
    characters: int
    queued: bool = True
    closed: bool = False
    retry_after_s: float = 0.0  # the endpoint's Retry-After, if it answered one

    @property
    def held_s(self) -> float:
        """Time the request waited at the client before dispatch (late binding)."""
        return self.started - self.request.arrival_s


@dataclass(frozen=True)
class _View:
    now: float
    replicas: tuple[ReplicaState, ...]


class Dispatcher:
    """Routes attempts over ``replicas`` with ``policy`` and books their ends."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        policy: Policy,
        config: ClientConfig,
        metrics: RoutingMetrics | None,
        store: RouteStore | None = None,
    ) -> None:
        self.policy = policy
        self.config = config
        self.metrics = metrics
        self.template = config.template
        self.keys = PromptKeys(
            block_tokens=config.block_tokens, chars_per_token=config.chars_per_token
        )
        self.replicas = {r.replica_id: r for r in replicas}
        self.held = HeldRequests()
        self.lock = threading.RLock()  # finish() releases counters under it
        memory = policy.route_memory  # told how many prompts each endpoint keeps
        if memory is not None:
            for replica in replicas:
                memory.limit_prompts(replica.replica_id, replica.endpoint.max_cached_prompts)
        # routes shared with other processes go into (and come from) a route table
        self._table = memory if isinstance(memory, RouteTableBase) else None
        self.shared = None if store is None else SharedRoutes(store, self._local_load)
        self.closed = False

    def close(self) -> None:
        """Route nothing more: every later attempt, and every held request (woken now),
        raises :class:`RoutingError`."""
        with self.lock:
            self.closed = True
            for waiter in self.held.in_release_order():
                waiter.wake()

    def check_open(self) -> None:
        """:class:`RoutingError` once :meth:`close` was called."""
        if self.closed:
            raise RoutingError("this RoutingClient is closed")

    def _local_load(self) -> dict[str, Load]:
        """This client's own load per replica (what it reports to other routers)."""
        with self.lock:
            return {r.replica_id: (r.in_flight, r.queued_tokens) for r in self.replicas.values()}

    def _states(self, now: float) -> tuple[ReplicaState, ...]:
        """Every replica's state (lock held), other routers' load included."""
        replicas = self.replicas.values()
        remote = self.shared.remote_load() if self.shared is not None else None
        if not remote:
            return tuple(r.state(now) for r in replicas)
        return tuple(r.state(now, remote.get(r.replica_id, (0, 0))) for r in replicas)

    def states(self) -> list[ReplicaState]:
        """The fleet as the policy sees it now (counters, health)."""
        now = time.monotonic()
        with self.lock:
            return list(self._states(now))

    def metrics_state(self) -> tuple[list[ReplicaState], int | None]:
        with self.lock:
            return self.states(), route_table_entries(self.policy)

    def route_request(
        self, ask: Ask, logical_id: str, attempt: int, excluded: frozenset[tuple[str, str]]
    ) -> RouteRequest:
        """What the policy decides one attempt of ``ask`` on (hashing the prompt needs
        no lock); :class:`InvalidInputError` for a token limit that is not an integer
        >= 0, :class:`RoutingError` once the client is closed."""
        self.check_open()
        params = ask.params
        max_tokens = params.get("max_tokens") or params.get("max_completion_tokens") or 128
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise InvalidInputError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        return self.keys.request(
            ask.text,
            request_id=uuid.uuid4().hex,
            expected_output_tokens=max_tokens,
            session=params.get("user"),
            logical_id=logical_id,
            attempt=attempt,
            excluded=excluded,
            arrival_s=time.monotonic(),
            may_hold=True,
            salt=ask.salt,
        )

    def look_up(self, request: RouteRequest) -> Callable[[], list[SharedRoute]] | None:
        """The shared store's look-up of the prefixes of ``request`` this client does
        not know, to make before :meth:`plan`: a call that blocks for one store round
        trip (a driver on an event loop makes it in a worker thread). ``None``: no
        store, or every prefix is known here."""
        if self.shared is None:
            return None
        keys = self.shared.unknown_keys(request, self._table, request.arrival_s)
        return functools.partial(self.shared.lookup, keys) if keys else None

    def plan(
        self,
        ask: Ask,
        request: RouteRequest,
        found: Sequence[SharedRoute],
        new_waiter: NewWaiter,
    ) -> Plan | Held:
        """Route one attempt, taking the routes ``found`` in the store
        (:meth:`look_up`) into the route table first; a hold keeps the request
        (waiting on ``new_waiter``'s). The attempt starts at the request's arrival:
        the look-up counts toward its TTFT."""
        now, table = request.arrival_s, self._table
        with self.lock:
            self.check_open()
            if found and table is not None:  # other routers' routes, as peer entries
                SharedRoutes.adopt(found, table, now)
            decision, replica = self._offer(request, now)
            if replica is None:
                return self.held.hold(new_waiter(request), decision)
        return self._build(ask, request, decision, replica, now)

    def resume(self, ask: Ask, held: Held) -> Plan | Held:
        """After a wake-up or ``held.wait_s``: the dispatch a release decided, else
        the request offered again (its wait counts from its first offer)."""
        waiter, now = held.waiter, time.monotonic()
        with self.lock:
            self.check_open()  # the caller abandons it (nothing is booked after close)
            if waiter.ready is None:
                self.held.drop(waiter)
                decision, replica = self._offer(waiter.request, now)
                if replica is None:
                    return self.held.hold(waiter, decision)
            else:
                decision, replica = waiter.ready
        return self._build(ask, waiter.request, decision, replica, now)

    def abandon(self, ask: Ask, held: Held) -> None:
        """The caller of a held request gave up (cancelled, interrupted): forget it,
        and give back what a release had booked for it."""
        waiter = held.waiter
        with self.lock:
            self.held.drop(waiter)
            ready, waiter.ready = waiter.ready, None
        if ready is not None:
            plan = self._build(ask, waiter.request, *ready, time.monotonic())
            self.finish(plan, None, "cancelled", cancelled=True)

    def _offer(self, request: RouteRequest, now: float) -> tuple[Decision, Replica | None]:
        """The policy's decision for ``request`` (lock held); a dispatch books its
        replica's counters, a hold (``None``) books nothing."""
        states = self._states(now)
        if not any(state.healthy for state in states):  # every breaker open: try anyway
            states = tuple(replace(state, healthy=True) for state in states)
        decision = self.policy.choose(request, _View(now, states))
        if self.metrics is not None:
            self.metrics.decided(self.policy.name, decision)
        if decision.hold_s > 0:
            return decision, None
        replica = self.replicas.get(decision.replica_id)
        if replica is None or replica.model != decision.model:
            raise InvalidDecisionError(  # the simulator raises the same for this contract
                f"policy {self.policy.name!r} chose replica {decision.replica_id!r} with model "
                f"{decision.model!r}, which the fleet does not serve"
            )
        replica.in_flight += 1
        replica.queued_tokens += request.prompt_tokens
        if self.shared is not None:
            self.shared.learned(request, decision.replica_id)
        return decision, replica

    def _release_held(self) -> None:
        """A prompt was prefilled: offer the held requests again (lock held); each one
        dispatched is handed to its caller, already booked."""
        now = time.monotonic()
        if self.closed:
            return
        for waiter in self.held.in_release_order():
            try:
                decision, replica = self._offer(waiter.request, now)
            except (RoutingError, InvalidDecisionError):  # raised again in the caller's offer
                continue
            except Exception:  # a policy's own bug: never the finishing request's error
                logger.warning(
                    "re-offering held request %s failed; it stays held",
                    waiter.request.request_id,
                    exc_info=True,
                )
                continue
            if replica is None:
                self.held.held_again(waiter, decision)
            else:
                self.held.dispatched(waiter, decision, replica)

    def _build(
        self, ask: Ask, request: RouteRequest, decision: Decision, replica: Replica, now: float
    ) -> Plan:
        """The HTTP request of a dispatched attempt."""
        logger.debug(
            "route %s -> %s (%s)",
            request.request_id,
            decision.replica_id,
            decision.reason,
            extra={
                "replica": decision.replica_id,
                "reason": decision.reason,
                "predicted_cached_tokens": decision.predicted_cached_tokens,
                "attempt": request.attempt,
            },
        )
        body: dict[str, Any] = {**ask.params, "model": replica.model, "stream": True}
        body["stream_options"] = {"include_usage": True}
        endpoint = replica.endpoint
        if endpoint.slot is not None:
            body["id_slot"] = endpoint.slot  # llama-server's slot field
        if ask.salt is not None and _sends_salt(endpoint, self.config):
            body[_SALT] = ask.salt  # vLLM's top-level field
        if ask.kind == "chat":
            body["messages"] = [dict(m) for m in ask.text.messages]
            path = "chat/completions"
        else:
            body["prompt"] = ask.text.text
            path = "completions"
        url = f"{Credentials.of(endpoint).request_url}/{path}"
        return Plan(replica, request, decision, body, url, now, len(ask.text.text))

    def first_token(self, plan: Plan) -> None:
        """The attempt's prompt is prefilled: its tokens leave the queue (a held
        request may go now)."""
        with self.lock:
            if self._leave_queue(plan) and self.held:
                self._release_held()

    def _leave_queue(self, plan: Plan) -> bool:
        """Take the plan's prompt tokens off its replica's queue (lock held); whether
        they were still on it."""
        if not plan.queued:
            return False
        plan.queued = False
        plan.replica.queued_tokens -= plan.request.prompt_tokens
        if self.shared is not None:
            self.shared.load_changed()
        return True

    def finish(
        self,
        plan: Plan,
        reply: Reply | None,
        error: str | None,
        *,
        cancelled: bool = False,
        result: str | None = None,
    ) -> ChatResult | None:
        """Book the end of an attempt (once; later calls do nothing): release its
        counters, settle the breaker, learn, tell the policy, log; its answer when it
        succeeded. ``cancelled``: the caller gave up, so the breaker stays as it is;
        ``result`` overrides the logged result."""
        now = time.monotonic()
        ttft = (reply.first_token_at if reply and reply.first_token_at else now) - plan.started
        counts = reply.counts() if reply else TokenCounts(None, None, None)
        with self.lock:
            if plan.closed:
                return None
            self._release(plan)
            self._settle(plan, error, cancelled, now)
            if error is None and counts.prompt:
                self._learn(plan, counts, ttft, now - plan.started - ttft)
            predicted = plan.decision.predicted_cached_tokens
            outcome = Outcome(
                plan.request,
                plan.decision,
                ttft,
                now - plan.started,
                cached_tokens=predicted if counts.cached is None else counts.cached,
                error=error,
                cancelled=cancelled,
            )
            self.policy.observe(outcome)
            # only now, with the breaker and the policy told of this end, may a held
            # request go (a failed replica must not look idle and healthy to it)
            if self.held:
                self._release_held()
        self._record(plan, outcome, counts, result)
        if error is not None or reply is None:
            return None
        return _answer(plan, reply, counts, ttft, now)

    def _release(self, plan: Plan) -> None:
        """Give back the plan's counters (lock held)."""
        plan.closed = True
        self._leave_queue(plan)
        plan.replica.in_flight -= 1
        if self.shared is not None:
            self.shared.load_changed()

    def _settle(self, plan: Plan, error: str | None, cancelled: bool, now: float) -> None:
        """The breaker after an attempt: closed by an answer, tripped by a failure (for
        its ``Retry-After`` at least), untouched by a cancellation."""
        if error is None:
            plan.replica.recovered()
        elif not cancelled:
            config = self.config
            plan.replica.trip(now, config.backoff_s, config.max_backoff_s, plan.retry_after_s)

    def _learn(self, plan: Plan, counts: TokenCounts, ttft_s: float, decode_s: float) -> None:
        """Refine the characters-per-token estimate and the replica's rates from an
        answer's token counts (lock held)."""
        prompt_tokens = counts.prompt or 0
        self.keys.observe_tokens(plan.characters, prompt_tokens)
        if self.config.learn_rates:
            cached = counts.cached
            if cached is None:
                # the engine does not report cached tokens (vLLM and SGLang by default):
                # the policy's prediction stands in, else a hit's short TTFT would read
                # as a huge prefill rate over the whole prompt
                cached = min(prompt_tokens, plan.decision.predicted_cached_tokens)
            plan.replica.learn(prompt_tokens - cached, ttft_s, counts.completion or 0, decode_s)

    def _record(
        self, plan: Plan, outcome: Outcome, counts: TokenCounts, result: str | None
    ) -> None:
        """The decision log line and the metrics of one finished attempt."""
        if self.metrics is None and not decision_log.isEnabledFor(logging.INFO):
            return
        record = DecisionRecord.of(
            self.policy.name,
            plan.replica.endpoint.target,
            outcome,
            counts.cached,
            counts.prompt,
            held_s=plan.held_s,
        )
        if result is not None:
            record = replace(record, result=result)
        record.log()
        if self.metrics is not None:
            self.metrics.finished(record, answered=outcome.error is None)

    def succeeded(self, plan: Plan, reply: Reply) -> ChatResult:
        """Finish an answered attempt; its answer."""
        result = self.finish(plan, reply, None)
        if result is None:  # closed already: cannot happen on the success path
            raise RoutingError("internal error: an attempt finished twice")
        return result

    def pilot_feedback(
        self, result: ChatResult, prompt: PromptInput
    ) -> Callable[[], object] | None:
        """The answer's cache hit for the pilot (``None``: no pilot, no Prompt, or no
        counts reported): a call that may block on the pilot's lock or its store (a
        driver on an event loop makes it in a worker thread)."""
        cached, total = result.cached_tokens, result.prompt_tokens
        pilot = self.config.pilot
        if pilot is None or not isinstance(prompt, Prompt) or cached is None or not total:
            return None
        return functools.partial(pilot.observe_cache, prompt, min(cached, total), total)

    def probed(self, base_url: str, rtt_s: float | None) -> None:
        """A probe of the server at ``base_url`` took ``rtt_s`` (``None``: failed, so
        its breakers open)."""
        now = time.monotonic()
        config = self.config
        with self.lock:
            for replica in self.replicas.values():
                if replica.endpoint.base_url != base_url:
                    continue
                if rtt_s is None:
                    replica.trip(now, config.backoff_s, config.max_backoff_s, 0.0)
                else:
                    replica.rtt_s = rtt_s
                    replica.recovered()


def _sends_salt(endpoint: Endpoint, config: ClientConfig) -> bool:
    """Whether ``endpoint`` is sent a call's ``cache_salt``: its own setting, else the
    client's."""
    own = endpoint.send_cache_salt
    return config.send_cache_salt if own is None else own


def _answer(plan: Plan, reply: Reply, counts: TokenCounts, ttft_s: float, now: float) -> ChatResult:
    """The :class:`ChatResult` of an answered attempt; its times include the hold."""
    held_s = plan.held_s
    return ChatResult(
        text="".join(reply.text),
        endpoint=plan.replica.endpoint.display_url,
        model=plan.replica.model,
        ttft_s=held_s + ttft_s,
        e2e_s=held_s + now - plan.started,
        prompt_tokens=counts.prompt,
        cached_tokens=counts.cached,
        completion_tokens=counts.completion,
        finish_reason=reply.finish_reason,
        decision=plan.decision,
        attempts=plan.request.attempt + 1,
        tool_calls=tuple(reply.tool_calls[i] for i in sorted(reply.tool_calls)),
    )
