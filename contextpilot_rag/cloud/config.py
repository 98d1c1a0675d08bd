"""How a :class:`~contextpilot_rag.ContextPilot` prepares prompts for hosted caches."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._numbers import is_number
from ..errors import ConfigError
from .rules import (
    ANTHROPIC_RULES,
    OPENAI_BREAKPOINT_RULES,
    OPENAI_RULES,
    ProviderRules,
    rules_for,
)

__all__ = ["CloudCacheConfig"]


@dataclass(frozen=True)
class CloudCacheConfig:
    """``enabled``: plan cache breakpoints and derive ``prompt_cache_key`` for every
    prompt (:attr:`Prompt.cache_plan`, :attr:`Prompt.prompt_cache_key`). ``rules``:
    the provider's cache rules (:data:`~.rules.ANTHROPIC_RULES` by default; any
    :class:`~.rules.ProviderRules`), ``model`` the model the prompts go to (its
    minimum cacheable length), ``ttl`` the cache lifetime planned with, one of
    ``rules.ttl_s`` (``""``, the default: the rules' first, ``"5m"`` on Anthropic and
    OpenAI, ``"30m"`` on :data:`~.rules.OPENAI_BREAKPOINT_RULES`): the breakpoints'
    (``"5m"`` or ``"1h"`` on Anthropic, ``"30m"`` on OpenAI's ``gpt-5.6`` and later), or
    on OpenAI's automatic cache ``"5m"`` (the in-memory lifetime, and the request asks
    for no retention), ``"in_memory"`` or ``"24h"`` (the request's
    ``prompt_cache_retention`` asks for that one:
    :attr:`~.breakpoints.CachePlan.retention`). It is also the horizon of what the
    pilot learns: a prefix counts as cached, and a conversation's next turn as a read,
    within it. ``next_turn_probability``: the chance a conversation sends another turn
    within the lifetime (``None``: the pilot learns it per turn number from the
    conversations it serves, starting from ``(t + 1) / (t + 2)`` after ``t`` earlier
    turns; :class:`~.continuation.ContinuationTracker`).
    ``key_blocks``: the leading blocks that name a request's ``prompt_cache_key``
    (``None``: as many as reach the model's minimum cacheable prefix, since requests
    that share less can read nothing from each other);
    ``key_rate_share``: the share of the provider's per-route rate
    (:attr:`~.rules.ProviderRules.key_rate_per_minute`) a route's load may reach
    before new requests go under another variant of the key; the load counts the
    route's requests of the last minute and the next turns its open conversations are
    expected to send, and the rest of the rate is a margin for when those turns come
    (:mod:`.keys`).
    ``max_counted``: the most recent sharing requests counted per prefix (a bound on
    the work). ``ledger_size``: the breakpoint prefixes remembered as cached (and the
    keys whose request rate is counted).

    Off by default: planning reads the index for every prompt and makes ``optimize``
    markedly slower, which a self-hosted engine (whose prefix cache needs no
    breakpoints) would pay for nothing. Turn it on for hosted APIs."""

    enabled: bool = False
    rules: ProviderRules = field(default=ANTHROPIC_RULES)
    model: str | None = None
    ttl: str = ""
    next_turn_probability: float | None = None
    key_blocks: int | None = None
    key_rate_share: float = 0.6
    max_counted: int = 8
    ledger_size: int = 65_536

    def __post_init__(self) -> None:
        if not isinstance(self.rules, ProviderRules):
            raise ConfigError("CloudCacheConfig.rules must be a ProviderRules")
        if self.ttl == "":
            object.__setattr__(self, "ttl", next(iter(self.rules.ttl_s)))
        self.rules.check_ttl(self.ttl)
        if self.model is not None and not isinstance(self.model, str):
            raise ConfigError("CloudCacheConfig.model must be a str or None")
        self._check_openai_model()
        probability = self.next_turn_probability
        if probability is not None and not (is_number(probability) and 0 <= probability <= 1):
            raise ConfigError("CloudCacheConfig.next_turn_probability must be in [0, 1] or None")
        share = self.key_rate_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ConfigError(f"CloudCacheConfig.key_rate_share must be in (0, 1], got {share!r}")
        for name in ("key_blocks", "max_counted", "ledger_size"):
            value = getattr(self, name)
            if value is None and name == "key_blocks":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"CloudCacheConfig.{name} must be a positive int")

    def _check_openai_model(self) -> None:
        """OpenAI's automatic-cache rules are refused for a ``gpt-5.6`` model, which
        caches only at breakpoints: its prompts planned without any would each be
        written whole at the write price. (The breakpoint rules are left to the caller
        for any model: a later one takes them too.)"""
        if self.model is None or self.rules is not OPENAI_RULES:
            return
        if rules_for("openai", self.model) is OPENAI_BREAKPOINT_RULES:
            raise ConfigError(
                f"{self.model!r} caches only at breakpoints (OPENAI_BREAKPOINT_RULES), not "
                f"automatically (OPENAI_RULES): pass rules=rules_for('openai', {self.model!r})"
            )

    @property
    def key_rate_per_minute(self) -> float | None:
        """The requests a minute a key's new requests may fill on one route (``None``:
        no limit)."""
        rate = self.rules.key_rate_per_minute
        return None if rate is None else rate * self.key_rate_share

    @property
    def ttl_s(self) -> float:
        """The lifetime :attr:`ttl` in seconds."""
        return self.rules.ttl_s[self.ttl]
