"""Our routing policies as a LiteLLM custom routing strategy.

LiteLLM asks a custom strategy for the deployment of every call
(``async_get_available_deployment`` / ``get_available_deployment``) and tells its
``CustomLogger`` callbacks how every call ended. :class:`ContextPilotRoutingStrategy`
is both: it routes each request with a :class:`~contextpilot_rag.routing.Policy` over
the model group's healthy deployments (each deployment a replica), stamps the decision's
id on the request's metadata, and learns from the end LiteLLM reports for it — the
engine's ``usage.prompt_tokens_details.cached_tokens`` (which corrects the route table),
the TTFT and end-to-end time from LiteLLM's timing (which refine the deployment's
prefill and decode rates), failures (which open its breaker).

LiteLLM does not report every failure: a proxy request logs all its attempts through
one logging object, which runs the failure callbacks for its first failed attempt only.
A retry or fallback follows a failure, so the routes of a request's earlier attempts
still open when it is routed again are closed as failed then; those of its last attempt,
when the proxy reports the request failed (``async_post_call_failure_hook``).

With ``store=`` (a ``redis://`` or ``sqlite:///`` URL, or a
:class:`~contextpilot_rag.routing.route_store.RouteStore`) the strategies of several
processes — LiteLLM proxy workers, on several hosts — share what they learn, as
``RoutingClient`` does (:mod:`contextpilot_rag.routing.shared_routes`): a request whose
prefixes this process does not know is looked up in the store (one round trip), the
routes it teaches are published in the background, and each process's load per
deployment (deployment ids are the same in every process of one configuration) is added
to what the policy sees. With the store down, each process routes on its own state.
Learned rates and breakers stay per process.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
from litellm.types.router import CustomRoutingStrategyBase

from contextpilot_rag.errors import ConfigError, RoutingError
from contextpilot_rag.routing import (
    Decision,
    Outcome,
    Policy,
    ReplicaState,
    RouteRequest,
    make_policy,
)
from contextpilot_rag.routing.prompt_keys import ChatTemplate
from contextpilot_rag.routing.route_store import Load, RouteStore, resolve_route_store
from contextpilot_rag.routing.route_table import RouteTableBase
from contextpilot_rag.routing.shared_routes import SharedRoutes
from contextpilot_rag.tenants import conversation_key
from contextpilot_rag.usage import CacheUsage

from ._callbacks import ProxyFailureLogger, add_callback, remove_callback
from ._events import (
    PILOT_KEY,
    ROUTES_KEY,
    RouteIds,
    cache_usage,
    call_seconds,
    completion_tokens,
    deployment_id,
    logged_metadata,
    request_metadata,
    sent_metadata,
)
from ._fleet import Fleet, FleetConfig, Route, deployment_key
from ._keys import RouteKeys
from ._task_routes import TaskRoutes

__all__ = ["ContextPilotRoutingStrategy", "RouterSource", "proxy_router"]

logger = logging.getLogger(__name__)

Deployment = dict[str, Any]
RouterSource = Callable[[], Any]
"""Finds the Router to attach to when the strategy was not attached explicitly."""


def proxy_router() -> Any:
    """The LiteLLM proxy's Router (``litellm.proxy.proxy_server.llm_router``), or
    ``None`` before the proxy has built it."""
    return getattr(importlib.import_module("litellm.proxy.proxy_server"), "llm_router", None)


@dataclass(frozen=True)
class _View:
    now: float
    replicas: tuple[ReplicaState, ...]


class ContextPilotRoutingStrategy(ProxyFailureLogger, CustomRoutingStrategyBase):
    """Routes a LiteLLM Router's calls with one of our policies (``policy``: a
    registry name such as ``"combined"``, ``"ranvier"``, ``"gorgo"``, with
    ``policy_options`` for its constructor, or a :class:`Policy` object).

    Use::

        strategy = ContextPilotRoutingStrategy("combined").attach(router)

    ``attach`` registers it as the router's routing strategy and as a LiteLLM callback
    (its feedback). On the LiteLLM proxy, list it under ``litellm_settings.callbacks``
    instead: it attaches itself to the proxy's router before the first request is
    routed (``router_source``, default :func:`proxy_router`).

    ``tenant``: the tenant of requests that name none (the hook stamps the request's
    own); each tenant's route keys are salted apart (:mod:`._keys`). ``store``: routing state shared
    with other processes (a URL or a ``RouteStore``; see the module). ``template``:
    the engines' chat template (``chatml``, ``llama3``, ``gemma``) when known, so route
    keys count tokens as the engine does. ``fleet``: starting rates, breaker backoff,
    route expiry. ``clock``: monotonic seconds (injected in tests).
    """

    def __init__(
        self,
        policy: str | Policy = "combined",
        *,
        policy_options: Mapping[str, Any] | None = None,
        router: Any = None,
        tenant: str | None = None,
        store: str | RouteStore | None = None,
        template: str | ChatTemplate | None = None,
        block_tokens: int = 16,
        chars_per_token: float = 4.0,
        fleet: FleetConfig | None = None,
        router_source: RouterSource = proxy_router,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.callback_id = uuid.uuid4().hex  # see ._callbacks
        if isinstance(policy, str):
            policy = make_policy(policy, **dict(policy_options or {}))
        elif policy_options:
            raise ConfigError("policy_options apply to a policy given by name only")
        if not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a registry name or a Policy, got {policy!r}")
        self.policy = policy
        self.tenant = tenant
        memory = policy.route_memory
        self._table = memory if isinstance(memory, RouteTableBase) else None
        self._owned_store = isinstance(store, str)
        route_store = resolve_route_store(store)
        self.shared = None if route_store is None else SharedRoutes(route_store, self._local_load)
        self._keys = RouteKeys(
            block_tokens=block_tokens, chars_per_token=chars_per_token, template=template
        )
        self._fleet = Fleet(fleet or FleetConfig())
        self._tasks = TaskRoutes(self._release_cancelled)
        self._router_source = router_source
        self._clock = clock
        self._lock = threading.Lock()  # guards the policy, the fleet and the keys
        self.router: Any = None
        if router is not None:
            self.attach(router)

    # -- installation --------------------------------------------------------------

    def attach(self, router: Any) -> ContextPilotRoutingStrategy:
        """Make this the routing strategy of ``router`` (``register_plugin``, or
        ``set_custom_routing_strategy`` before LiteLLM 1.110) and a LiteLLM callback."""
        register = getattr(router, "register_plugin", None) or router.set_custom_routing_strategy
        register(self)
        self.router = router
        add_callback(self)
        return self

    def detach(self) -> None:
        """Stop receiving LiteLLM's callbacks (the router keeps the strategy until its
        routing strategy is changed)."""
        remove_callback(self)

    def close(self) -> None:
        """Detach, and with a ``store``: publish what is queued, withdraw this
        process's load report, and close the store if it was opened from a URL."""
        self.detach()
        shared = self.shared
        if shared is not None:
            shared.close()
            if self._owned_store:
                shared.store.close()

    def _local_load(self) -> dict[str, Load]:
        """This process's load per deployment (what it reports to the others)."""
        with self._lock:
            return self._fleet.loads()

    @property
    def open_routes(self) -> int:
        """Calls routed whose end has not been reported yet."""
        with self._lock:
            return len(self._fleet)

    # -- LiteLLM's custom routing strategy ---------------------------------------------

    async def async_get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[object] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> Deployment:
        """The deployment for one call, among the healthy ones LiteLLM offers. The
        route stays tied to the task awaiting the call, which releases it if it ends
        cancelled (:mod:`._task_routes`)."""
        router = self._router()
        select = getattr(router, "select", None)
        if select is not None:
            found = await select(model, request_kwargs, kind="healthy", messages=messages)
        else:
            found = _group(router, model)
        deployment, route = self._pick(model, found, messages, input, request_kwargs)
        if route is not None:
            self._tasks.watch(route.route_id)
        return deployment

    def get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[object] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> Deployment:
        """The sync path: the model group's deployments (this strategy's breakers
        keep failed ones out while they back off)."""
        found = _group(self._router(), model)
        return self._pick(model, found, messages, input, request_kwargs)[0]

    def _router(self) -> Any:
        if self.router is None:
            found = self._router_source()
            if found is None:
                raise ConfigError(
                    "ContextPilotRoutingStrategy is attached to no Router: call "
                    "strategy.attach(router)"
                )
            self.attach(found)
        return self.router

    def _pick(
        self,
        model: str,
        found: object,
        messages: object,
        input: object,
        request_kwargs: dict[str, Any] | None,
    ) -> tuple[Deployment, Route | None]:
        """Route one call among ``found`` (what LiteLLM offers) and stamp the
        decision's id on the request's own metadata, for the callbacks; the route
        booked (``None`` when LiteLLM had settled on a deployment)."""
        if isinstance(found, dict):  # LiteLLM already settled on one deployment
            return found, None
        listed = found if isinstance(found, (list, tuple)) else ()
        deployments = [d for d in listed if isinstance(d, dict)]
        if not deployments:
            raise RoutingError(f"no deployment of model group {model!r} is available")
        kwargs = request_kwargs if request_kwargs is not None else {}
        metadata = request_metadata(kwargs)
        earlier = metadata.get(ROUTES_KEY)  # this request's earlier attempts, if ours
        earlier = earlier if isinstance(earlier, RouteIds) else RouteIds()
        self._close_unreported(earlier, "failed before a retry or fallback", failed=True)
        request, characters = self._route_request(kwargs, sent_metadata(kwargs), messages, input)
        decision, route = self._decide(request, deployments, characters, _call_of(kwargs))
        metadata[ROUTES_KEY] = RouteIds([*earlier, route.route_id])
        logger.debug("route %s -> %s (%s)", route.route_id, decision.replica_id, decision.reason)
        return _chosen(deployments, decision), route

    def _route_request(
        self,
        kwargs: Mapping[str, Any],
        metadata: Mapping[str, Any],
        messages: object,
        input: object,
    ) -> tuple[RouteRequest, int]:
        """The call's route request (keys salted with its tenant) and the length of
        its routing text."""
        pilot = metadata.get(PILOT_KEY)
        pilot = pilot if isinstance(pilot, Mapping) else {}
        tenant = pilot.get("tenant") or self.tenant
        text = self._keys.text(messages, input, pilot.get("boundaries"))
        with self._lock:  # the keys refine an estimate under it
            request = self._keys.request(
                text,
                request_id=uuid.uuid4().hex,
                expected_output_tokens=_max_tokens(kwargs),
                session=_session(kwargs, pilot, tenant),
                tenant=tenant,
                arrival_s=self._clock(),
                public=pilot.get("public") is True,
            )
        return request, len(text.text)

    def _decide(
        self,
        request: RouteRequest,
        deployments: Sequence[Deployment],
        characters: int,
        call: tuple[str | None, int | None],
    ) -> tuple[Decision, Route]:
        """The policy's decision over ``deployments`` (with other processes' routes and
        load, given a store), booked as an open route."""
        now, shared, table = request.arrival_s, self.shared, self._table
        found = shared.probe(request, table, now) if shared is not None else None
        with self._lock:
            if found and table is not None:  # other processes' routes, as peer entries
                SharedRoutes.adopt(found, table, now)
            self._expire(now)
            remote = shared.remote_load() if shared is not None else None
            states = self._fleet.states(deployments, now, remote)
            decision = self.policy.choose(request, _View(now, tuple(states)))
            if decision.replica_id not in {deployment_key(d) for d in deployments}:
                raise RoutingError(
                    f"policy {self.policy.name!r} chose {decision.replica_id!r}, which is "
                    "not among the deployments"
                )
            route = self._fleet.open(request, decision, now, characters, *call)
        if shared is not None:
            shared.learned(request, decision.replica_id)
        return decision, route

    def _expire(self, now: float) -> None:
        """Release the routes whose end was never reported (lock held)."""
        for route in self._fleet.expired(now):
            self._tasks.forget(route.route_id)
            self._given_up(route, now, "expired")

    def _release_cancelled(self, route_ids: list[str]) -> None:
        """Release the open routes of a task that ended cancelled (its calls were given
        up: LiteLLM reports no end for them). Never raises into the event loop."""
        try:
            self._close_unreported(route_ids, "cancelled", failed=False)
        except Exception:
            logger.exception("ContextPilotRoutingStrategy: releasing cancelled routes failed")

    def _close_unreported(self, route_ids: Sequence[str], reason: str, *, failed: bool) -> None:
        """Close those of ``route_ids`` still open, calls whose end LiteLLM will not
        report: as failures of their deployments (``failed``), else as given up."""
        now = self._clock()
        with self._lock:
            for route_id in route_ids:
                route = self._fleet.close([route_id], None)
                if route is None:
                    continue
                self._tasks.forget(route.route_id)
                if failed:
                    self._failed_unreported(route, now, reason)
                else:
                    self._given_up(route, now, reason)

    def _failed_unreported(self, route: Route, now: float, error: str) -> None:
        """Learn a failure LiteLLM did not report, as :meth:`_learn` learns one it
        reports, timed by this strategy's clock (lock held)."""
        self._fleet.failed(route, now)
        ended = max(0.0, now - route.started)
        cached = route.decision.predicted_cached_tokens
        outcome = Outcome(route.request, route.decision, ended, ended, cached, error=error)
        self.policy.observe(outcome)

    def _given_up(self, route: Route, now: float, reason: str) -> None:
        """Tell the policy a closed route ended without an answer or a failure to
        learn from (lock held)."""
        ended = now - route.started
        outcome = Outcome(route.request, route.decision, ended, ended, error=reason, cancelled=True)
        self.policy.observe(outcome)

    # -- feedback: LiteLLM's logging callbacks -----------------------------------------

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._settle(kwargs, response_obj, start_time, end_time, None)

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._settle(kwargs, None, start_time, end_time, _error_of(kwargs))

    def log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._settle(kwargs, response_obj, start_time, end_time, None)

    def log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._settle(kwargs, None, start_time, end_time, _error_of(kwargs))

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        """On the proxy: attach to its router before the first request is routed."""
        if self.router is None:
            self._router()
        return data

    def request_failed(self, request: Mapping[str, Any], error: Exception) -> None:
        """On the proxy, a request that failed (after its retries and fallbacks):
        close its routes still open (its ``litellm_call_id``'s), whose failure LiteLLM
        did not report. An error from an engine (LiteLLM's ``openai.APIError``) counts
        against the deployment; another (a guardrail refusing an answer) only releases
        it."""
        call_id = _call_id(request)
        if call_id is None:
            return
        with self._lock:
            route_ids = self._fleet.open_of_call(call_id)
        failed = isinstance(error, openai.APIError)
        self._close_unreported(route_ids, _error_text(error), failed=failed)

    def _settle(
        self,
        kwargs: Any,
        response: object,
        start_time: object,
        end_time: object,
        error: str | None,
    ) -> None:
        """Close the call's route and learn from its end; never raises into LiteLLM
        (a second report of one call finds its route closed and does nothing)."""
        try:
            if isinstance(kwargs, Mapping):
                self._learn(kwargs, response, start_time, end_time, error)
        except Exception:
            logger.exception("ContextPilotRoutingStrategy: feedback from a call failed")

    def _learn(
        self,
        kwargs: Mapping[str, Any],
        response: object,
        start_time: object,
        end_time: object,
        error: str | None,
    ) -> None:
        route_ids = logged_metadata(kwargs).get(ROUTES_KEY)
        if not isinstance(route_ids, list) or not route_ids:
            return
        times, usage = call_seconds(kwargs, start_time, end_time), cache_usage(response)
        now = self._clock()
        with self._lock:
            route = self._fleet.close(route_ids, deployment_id(kwargs))
            if route is None:
                return
            self._tasks.forget(route.route_id)
            ttft, e2e = times if times is not None else (now - route.started,) * 2
            cached = _cached_as_predicted(route, usage)
            if error is None:
                self._answered(route, usage, ttft, e2e, response)
            else:
                self._fleet.failed(route, now)
            outcome = Outcome(route.request, route.decision, ttft, e2e, cached, error=error)
            self.policy.observe(outcome)

    def _answered(
        self, route: Route, usage: Any, ttft_s: float, e2e_s: float, response: object
    ) -> None:
        prompt_tokens = usage.prompt_tokens if usage is not None else 0
        if prompt_tokens:
            self._keys.observe_tokens(route.characters, prompt_tokens)
        uncached = prompt_tokens - (usage.cached_tokens if usage is not None else 0)
        self._fleet.answered(route, uncached, ttft_s, completion_tokens(response), e2e_s)


def _cached_as_predicted(route: Route, usage: CacheUsage | None) -> int:
    """The engine's cached prompt tokens in the route keys' tokens, for the policy.

    The keys count a prompt's tokens from its characters (an estimate) and align each
    boundary down to an engine block, so the engine's count of a prefix it did serve
    differs from the prediction by a block or two and a few percent. Read as a miss,
    that would make the policy forget the very routes that are right; so a report
    within two blocks and 10% of the prediction counts as the predicted hit, and only a
    clear miss (an evicted prefix) corrects the routes. No report: as predicted."""
    predicted = route.decision.predicted_cached_tokens
    if usage is None or usage.prompt_tokens <= 0:
        return predicted
    request = route.request
    cached = round(usage.cached_tokens * request.prompt_tokens / usage.prompt_tokens)
    slack = 2 * request.block_tokens + predicted // 10
    return (
        predicted if predicted - slack <= cached < predicted else min(cached, request.prompt_tokens)
    )


def _group(router: Any, model: str) -> list[Deployment]:
    """Every deployment of a model group (no health filter)."""
    registry = getattr(router, "registry", None)
    found = registry().deployments(model) if registry is not None else router.get_model_list(model)
    return list(found or ())


def _chosen(deployments: Sequence[Deployment], decision: Decision) -> Deployment:
    return next(d for d in deployments if deployment_key(d) == decision.replica_id)


def _max_tokens(kwargs: Mapping[str, Any]) -> int:
    value = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 128


def _session(kwargs: Mapping[str, Any], pilot: Mapping[str, Any], tenant: str | None) -> str | None:
    """The affinity key: the pilot's conversation, else the OpenAI ``user``."""
    conversation = pilot.get("conversation_id")
    if isinstance(conversation, str):
        return conversation_key(tenant, conversation)
    user = kwargs.get("user")
    return conversation_key(tenant, user) if isinstance(user, str) and user else None


def _call_id(request: Mapping[str, Any]) -> str | None:
    """LiteLLM's id of a request (``litellm_call_id``), the same for all its attempts."""
    found = request.get("litellm_call_id")
    return found if isinstance(found, str) and found else None


def _call_of(kwargs: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The call's id and its request's marker: the ``id`` of the logging object the
    proxy makes once per request (its retries share it; a client cannot choose it),
    ``None`` without one (:meth:`Fleet.open`)."""
    logging_obj = kwargs.get("litellm_logging_obj")
    return _call_id(kwargs), (id(logging_obj) if logging_obj is not None else None)


def _error_of(kwargs: Any) -> str:
    exception = kwargs.get("exception") if isinstance(kwargs, Mapping) else None
    return _error_text(exception) if exception is not None else "failed"


def _error_text(exception: BaseException) -> str:
    return f"{type(exception).__name__}: {exception}"
