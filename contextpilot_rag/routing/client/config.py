"""How a :class:`~contextpilot_rag.routing.client.RoutingClient` routes, times out,
retries and learns: :class:`ClientConfig`, every option but the endpoints, validated on
construction. :class:`ClientOptions` types the same options as constructor keywords."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from ...errors import ConfigError
from ..prompt_keys import ChatTemplate, chat_template
from ..route_store import check_store_argument

if TYPE_CHECKING:
    import httpx

    from ..metrics import RoutingMetrics
    from ..route_store import RouteStore
    from ..types import CacheFeedback, Policy

__all__ = ["ClientConfig", "ClientOptions"]


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """The options of a :class:`~contextpilot_rag.routing.client.RoutingClient`.

    ``model``: the model to ask for (endpoints listing models serve only those);
    ``None`` routes over every model the endpoints list (accuracy-aware policies).
    ``policy``: a policy name of :func:`~contextpilot_rag.routing.make_policy` or a
    policy object. ``chat_template``: the engines' chat template if known (``"chatml"``,
    ``"llama3"``, ``"gemma"`` or a :class:`~..prompt_keys.ChatTemplate`): route keys then
    follow the text the engine prefills, and completion prompts are scanned for turn
    ends; unknown, message ends are estimated proportionally. ``block_tokens`` and
    ``chars_per_token``: the engine's KV block and the first estimate of a token's
    characters, for the route keys. ``metrics``: ``True`` (or a
    :class:`~..metrics.RoutingMetrics`) keeps Prometheus metrics. ``learn_rates``:
    replace each endpoint's configured prefill and decode rates by what its answers
    show (EWMA), so the policy prices uncached tokens at what they cost on the fleet as
    loaded. ``pilot``: who learns each answer's cache hit (the
    :class:`~contextpilot_rag.ContextPilot` that built the Prompts sent).

    ``send_cache_salt``: send a call's ``cache_salt`` (a salted Prompt's
    :attr:`~contextpilot_rag.prompt.Prompt.cache_salt`, or the ``cache_salt``
    parameter) as the request body's top-level field, as vLLM takes it (default);
    ``False`` for a fleet whose servers refuse unknown fields (an
    :class:`~.endpoints.Endpoint` may say otherwise for itself). A salted call's
    route keys are its salt's either way (``docs/tenants.md``).

    ``store``: routing state shared with routers in other processes (learned routes
    and replica load): ``None`` (this client's own, the default), a store URL
    (``redis://HOST:PORT/DB``, ``sqlite:///PATH``: checked here, opened by the
    client) or a :class:`~contextpilot_rag.routing.route_store.RouteStore` (used as
    given, left open by :meth:`RoutingClient.close`). See
    :mod:`~contextpilot_rag.routing.shared_routes` and ``docs/stores.md``.

    Time bounds: ``timeout_s`` bounds each attempt's every wait for progress (to
    connect, for the first stream event, between two events; keep-alives do not
    count); ``deadline_s`` (``None``: unbounded) a whole call by wall time. A failing
    endpoint is kept out ``backoff_s``, doubled per failure in a row up to
    ``max_backoff_s`` (which also caps ``Retry-After``); ``max_attempts``: tries per
    call. ``transport`` / ``async_transport``: httpx transports (tests, proxies)."""

    model: str | None = None
    policy: str | Policy = "combined"
    chat_template: str | ChatTemplate | None = None
    block_tokens: int = 16
    chars_per_token: float = 4.0

    timeout_s: float = 120.0
    deadline_s: float | None = None
    max_attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    learn_rates: bool = True
    send_cache_salt: bool = True
    metrics: bool | RoutingMetrics = False
    pilot: CacheFeedback | None = None
    store: str | RouteStore | None = None
    transport: httpx.BaseTransport | None = None
    async_transport: httpx.AsyncBaseTransport | None = None

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_attempts < 1:
            raise ConfigError(
                f"timeout_s must be > 0 and max_attempts >= 1, got {self.timeout_s!r} and "
                f"{self.max_attempts!r}"
            )
        if not 0 < self.backoff_s <= self.max_backoff_s:
            raise ConfigError(
                f"0 < backoff_s <= max_backoff_s needed, got {self.backoff_s!r} and "
                f"{self.max_backoff_s!r}"
            )
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ConfigError(f"deadline_s must be None or > 0, got {self.deadline_s!r}")
        if self.block_tokens < 1 or self.chars_per_token <= 0:
            raise ConfigError("block_tokens must be >= 1 and chars_per_token > 0")
        if not isinstance(self.send_cache_salt, bool):
            raise ConfigError(f"send_cache_salt must be a bool, got {self.send_cache_salt!r}")
        chat_template(self.chat_template)  # an unknown name is a ConfigError now
        check_store_argument(self.store)  # a bad URL is a ConfigError before anything opens

    @property
    def template(self) -> ChatTemplate | None:
        """:attr:`chat_template` resolved to a template (``None``: unknown)."""
        return chat_template(self.chat_template)


class ClientOptions(TypedDict, total=False):
    """:class:`ClientConfig`'s fields as keywords of ``RoutingClient``."""

    model: str | None
    policy: str | Policy
    timeout_s: float
    deadline_s: float | None
    max_attempts: int
    block_tokens: int
    chars_per_token: float
    backoff_s: float
    max_backoff_s: float
    transport: httpx.BaseTransport | None
    async_transport: httpx.AsyncBaseTransport | None
    metrics: bool | RoutingMetrics
    chat_template: str | ChatTemplate | None
    learn_rates: bool
    send_cache_salt: bool
    pilot: CacheFeedback | None
    store: str | RouteStore | None
