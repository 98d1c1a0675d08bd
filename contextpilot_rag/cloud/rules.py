"""Hosted providers' prompt-cache rules, as data.

Each :class:`ProviderRules` states what a provider documents about its prompt cache:
how many explicit breakpoints a request may carry, the shortest prefix it caches per
model, how far back from a breakpoint it looks for an earlier cached prefix, the
lifetimes it offers and what a write and a read cost relative to the base input price.
The breakpoint planner (:mod:`.breakpoints`) reads nothing else, so a user with other
terms (a new model, a negotiated price) passes other rules. Sources: ``docs/cloud.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .._numbers import is_finite_positive, is_int, is_number
from ..errors import ConfigError
from .model_names import match_model_name

__all__ = [
    "ANTHROPIC_RULES",
    "MARKERS",
    "OPENAI_BREAKPOINT_MODELS",
    "OPENAI_BREAKPOINT_RULES",
    "OPENAI_RULES",
    "CacheTtl",
    "Marker",
    "ProviderRules",
    "rules_for",
]

CacheTtl = Literal["5m", "1h", "in_memory", "24h", "30m"]
"""The lifetimes the built-in rules offer: Anthropic's ``"5m"`` and ``"1h"``; OpenAI's
``"5m"`` (its in-memory lifetime, no retention asked for), ``"in_memory"`` and ``"24h"``
(the ``prompt_cache_retention`` values, asked for by name); ``"30m"``, the lifetime of
OpenAI's breakpoints (``prompt_cache_options.ttl``, ``gpt-5.6`` and later)."""

Marker = Literal["cache_control", "prompt_cache_breakpoint"]
"""The content-block field that marks a breakpoint: Anthropic's ``cache_control``
(``{"type": "ephemeral"}``), OpenAI's ``prompt_cache_breakpoint``
(``{"mode": "explicit"}``, ``gpt-5.6`` and later)."""

MARKERS: tuple[Marker, ...] = ("cache_control", "prompt_cache_breakpoint")


@dataclass(frozen=True)
class ProviderRules:
    """One provider's prompt-cache rules.

    ``max_breakpoints``: explicit cache breakpoints a request may carry (0: the cache
    is automatic, as OpenAI's). ``min_cacheable_tokens``: the shortest prefix cached;
    ``model_min_tokens`` overrides it per model and its dated releases
    (``"claude-haiku-4-5"`` matches ``"claude-haiku-4-5-20251001"``, not another model
    whose name it starts: :func:`~.model_names.match_model_name`).
    ``lookback_blocks``: content blocks before a breakpoint searched for an earlier
    cached prefix (0: no limit, every block boundary of the request; the breakpoint
    planner reads it so). ``marker``: the content-block field that carries a
    breakpoint (:data:`Marker`); ``unmarked_roles``: the roles whose content blocks may
    not carry one (OpenAI's assistant messages), whose marker the request moves to the
    last block before them. ``ttl_s``: the lifetimes on offer, by name. ``write_multiplier``
    (by lifetime) and ``read_multiplier``: a cache write and read as multiples of the
    base input price. ``key_rate_per_minute``: the requests a minute one route (a prompt
    prefix with one ``prompt_cache_key``) takes before the provider spreads the rest over
    other cache servers (``None``: no such limit, or no key). ``request_retention``: per
    lifetime, the request's ``prompt_cache_retention`` value that asks for it (a lifetime
    not listed sends none, and gets the provider's default). Guaranteed after
    construction: counts >= 0, multipliers > 0, every lifetime priced, every retention a
    non-empty str for an offered lifetime, the key rate ``None`` or >= 1, ``marker`` one of
    :data:`MARKERS`, ``unmarked_roles`` a tuple of role names."""

    provider: str
    max_breakpoints: int = 4
    min_cacheable_tokens: int = 1024
    model_min_tokens: Mapping[str, int] = field(default_factory=dict, hash=False)
    lookback_blocks: int = 20
    ttl_s: Mapping[str, float] = field(
        default_factory=lambda: {"5m": 300.0, "1h": 3600.0}, hash=False
    )
    write_multiplier: Mapping[str, float] = field(
        default_factory=lambda: {"5m": 1.25, "1h": 2.0}, hash=False
    )
    read_multiplier: float = 0.1
    key_rate_per_minute: int | None = None
    request_retention: Mapping[str, str] = field(default_factory=dict, hash=False)
    marker: Marker = "cache_control"
    unmarked_roles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.provider, str) or not self.provider:
            raise ConfigError("ProviderRules.provider must be a non-empty str")
        for name in ("max_breakpoints", "min_cacheable_tokens", "lookback_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"ProviderRules.{name} must be an int >= 0, got {value!r}")
        minimums = self.model_min_tokens
        if not isinstance(minimums, Mapping) or any(
            not isinstance(model, str) or not is_int(tokens) or tokens < 0
            for model, tokens in minimums.items()
        ):
            raise ConfigError("ProviderRules.model_min_tokens maps model names to ints >= 0")
        lifetimes = self.ttl_s
        if not isinstance(lifetimes, Mapping) or not lifetimes:
            raise ConfigError("ProviderRules.ttl_s must name at least one lifetime > 0 s")
        if any(not (is_number(seconds) and seconds > 0) for seconds in lifetimes.values()):
            raise ConfigError("ProviderRules.ttl_s must name at least one lifetime > 0 s")
        writes = self.write_multiplier
        if not isinstance(writes, Mapping) or set(writes) != set(lifetimes):
            raise ConfigError("ProviderRules.write_multiplier must price every lifetime of ttl_s")
        multipliers = (*writes.values(), self.read_multiplier)
        if not all(is_finite_positive(m) for m in multipliers):
            raise ConfigError("ProviderRules multipliers must be finite numbers > 0")
        rate = self.key_rate_per_minute
        if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or rate < 1):
            raise ConfigError(
                f"ProviderRules.key_rate_per_minute must be an int >= 1 or None, got {rate!r}"
            )
        self._check_request_retention()
        if self.marker not in MARKERS:
            raise ConfigError(f"ProviderRules.marker must be one of {MARKERS}, got {self.marker!r}")
        roles = self.unmarked_roles
        if not isinstance(roles, tuple) or not all(isinstance(r, str) and r for r in roles):
            raise ConfigError(
                f"ProviderRules.unmarked_roles must be a tuple of role names, got {roles!r}"
            )
        # private copies: a caller's later change to its dict cannot change the rules
        for name in ("model_min_tokens", "ttl_s", "write_multiplier", "request_retention"):
            object.__setattr__(self, name, dict(getattr(self, name)))

    def _check_request_retention(self) -> None:
        for ttl, value in self.request_retention.items():
            if ttl not in self.ttl_s:
                raise ConfigError(
                    f"ProviderRules.request_retention names {ttl!r}, which is not a lifetime "
                    f"of ttl_s {sorted(self.ttl_s)}"
                )
            if not isinstance(value, str) or not value:
                raise ConfigError(
                    f"ProviderRules.request_retention[{ttl!r}] must be a non-empty str, "
                    f"got {value!r}"
                )

    def min_tokens(self, model: str | None) -> int:
        """The shortest cacheable prefix for ``model`` (the default for ``None`` or an
        unlisted model)."""
        name = match_model_name(model, self.model_min_tokens) if model else None
        return self.min_cacheable_tokens if name is None else self.model_min_tokens[name]

    def check_ttl(self, ttl: str) -> float:
        """The lifetime ``ttl`` in seconds; :class:`ConfigError` if not offered."""
        seconds = self.ttl_s.get(ttl) if isinstance(ttl, str) else None
        if seconds is None:
            raise ConfigError(
                f"{self.provider} offers cache lifetimes {sorted(self.ttl_s)}, not {ttl!r}"
            )
        return seconds

    def write_premium(self, ttl: str) -> float:
        """What a cache write costs above an uncached input token (0.25 for a 5-minute
        write at 1.25×), as a fraction of the base input price."""
        self.check_ttl(ttl)
        return self.write_multiplier[ttl] - 1.0

    @property
    def read_saving(self) -> float:
        """What a cache read saves against an uncached input token (0.9 at 0.1×)."""
        return 1.0 - self.read_multiplier


ANTHROPIC_RULES = ProviderRules(
    provider="anthropic",
    max_breakpoints=4,
    min_cacheable_tokens=1024,
    model_min_tokens={
        "claude-opus-5": 512,
        "claude-fable-5": 512,
        "claude-mythos-5": 512,
        "claude-opus-4-6": 4096,
        "claude-opus-4-5": 4096,
        "claude-haiku-4-5": 4096,
        "claude-3-5-haiku": 2048,
        "claude-3-haiku": 2048,
    },
    lookback_blocks=20,
)
"""Anthropic's Messages API (``docs/cloud.md`` cites the pages): 4 breakpoints, 1,024
tokens minimum (512, 2,048 or 4,096 on the models listed), 20-block lookback, 5-minute
(refreshed on use) and 1-hour lifetimes, writes 1.25× / 2×, reads 0.1×."""

OPENAI_RULES = ProviderRules(
    provider="openai",
    max_breakpoints=0,
    min_cacheable_tokens=1024,
    lookback_blocks=0,
    ttl_s={"5m": 300.0, "in_memory": 300.0, "24h": 3600.0},
    write_multiplier={"5m": 1.0, "in_memory": 1.0, "24h": 1.0},
    read_multiplier=0.5,
    key_rate_per_minute=15,
    request_retention={"in_memory": "in_memory", "24h": "24h"},
)
"""OpenAI's automatic cache: no breakpoints, prompts of 1,024 tokens and more, no write
premium, about 15 requests a minute per prefix and ``prompt_cache_key`` on one server;
the read price varies by model (0.1×–0.5×), so money comes from the price table
(:mod:`.prices`), not from ``read_multiplier``. Lifetimes: ``"in_memory"`` retention
keeps a prefix 5–10 minutes idle (300 s, the short end); ``"24h"`` (extended) keeps it
"up to" 24 hours, 1–2 hours for most usage (3,600 s, the short end). ``"5m"`` plans as
``"in_memory"`` but asks for no retention: the organization's default applies, which is
``"24h"`` without Zero Data Retention on models that offer both (``docs/cloud.md``)."""

OPENAI_BREAKPOINT_RULES = ProviderRules(
    provider="openai",
    max_breakpoints=4,
    min_cacheable_tokens=1024,
    lookback_blocks=0,
    ttl_s={"30m": 1800.0},
    write_multiplier={"30m": 1.25},
    read_multiplier=0.1,
    key_rate_per_minute=15,
    marker="prompt_cache_breakpoint",
    unmarked_roles=("assistant",),
)
"""OpenAI's cache on ``gpt-5.6`` and later models (``OPENAI_BREAKPOINT_MODELS``): a prefix
is cached only where a breakpoint ends it, and a request reads the longest cached
prefix ending at any of its block boundaries (no lookback limit). The request carries
``prompt_cache_options={"mode": "explicit", "ttl": "30m"}`` (no implicit breakpoint at
its latest message: every write is one the planner chose) and
``prompt_cache_breakpoint: {"mode": "explicit"}`` on the planned content blocks, at most
4 written per request, never on an assistant message. Writes cost 1.25× the input
price, reads 0.1×; an entry lives at least 30 minutes (``"30m"``, the only lifetime);
prompts of 1,024 tokens and more; requests are spread over cache servers by their
first tokens and ``prompt_cache_key`` as on the older models (``docs/cloud.md``)."""

OPENAI_BREAKPOINT_MODELS: tuple[str, ...] = ("gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna")
"""The models :func:`rules_for` gives :data:`OPENAI_BREAKPOINT_RULES` (and their dated
releases); pass the rules yourself for a later model."""

_BY_PROVIDER = {"anthropic": ANTHROPIC_RULES, "openai": OPENAI_RULES}


def rules_for(provider: str, model: str | None = None) -> ProviderRules:
    """The built-in rules of ``provider`` (``"anthropic"``, ``"openai"``): for OpenAI,
    :data:`OPENAI_BREAKPOINT_RULES` for a model of :data:`OPENAI_BREAKPOINT_MODELS`,
    :data:`OPENAI_RULES` for any other."""
    rules = _BY_PROVIDER.get(provider)
    if rules is None:
        raise ConfigError(f"no built-in cache rules for {provider!r}; pass ProviderRules(...)")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"model must be a str or None, got {type(model).__name__}")
    if rules is OPENAI_RULES and model and match_model_name(model, OPENAI_BREAKPOINT_MODELS):
        return OPENAI_BREAKPOINT_RULES
    return rules
