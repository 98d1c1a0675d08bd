"""Prefix caches of hosted APIs, modelled from the providers' published rules.

These are *emulations*: each model follows what the provider documents, not what its
servers do internally, and every figure computed with them is emulated. Time is always
an argument (``now_s``, simulated seconds); nothing here sleeps or reads a clock.

**Anthropic** (:class:`AnthropicCacheModel`), from "Prompt caching",
https://platform.claude.com/docs/en/build-with-claude/prompt-caching (formerly
https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching):

- the prompt is a sequence of content blocks in the order tools → system → messages;
  only a block carrying ``cache_control`` (a *breakpoint*) writes a cache entry, for the
  whole prefix up to and including that block; at most 4 breakpoints per request, more
  is an ``invalid_request_error``;
- a prefix shorter than the model's minimum cacheable length (1,024 tokens on most
  models; 512, 2,048 or 4,096 on some, per the page's table) is not cached;
- a request reads the longest cached prefix ending at a block boundary that lies at most
  20 blocks back from one of its breakpoints (the breakpoint's own block counted first);
- an entry lives 5 minutes from its last use (a read refreshes it), or 1 hour with
  ``"ttl": "1h"``; a 1-hour breakpoint may not follow a 5-minute one;
- usage: ``cache_read_input_tokens`` (served from cache), ``cache_creation_input_tokens``
  (written to cache by this request, split into ``cache_creation.ephemeral_5m_input_tokens``
  / ``ephemeral_1h_input_tokens``) and ``input_tokens``, the rest — tokens neither read
  from nor written to the cache; the three add up to the whole prompt.

**OpenAI** (:class:`OpenAICacheModel`), from "Prompt caching",
https://platform.openai.com/docs/guides/prompt-caching:

- automatic for prompts of 1,024 tokens or more; cache hits come in 128-token steps, so
  ``usage.prompt_tokens_details.cached_tokens`` is 0 or 1,024 + k·128;
- a request goes to a machine chosen by a hash of the prompt's first ~256 tokens
  combined with ``prompt_cache_key``; above ~15 requests per minute for one
  prefix-and-key the overflow goes to other machines; each machine has its own cache, so
  the same prefix under another key (or overflowing) can miss;
- in-memory retention: 5–10 minutes of inactivity, at most an hour;
  ``prompt_cache_retention="24h"`` keeps prefixes up to 24 hours.

**OpenAI breakpoints** (:class:`OpenAIBreakpointCacheModel`, ``gpt-5.6`` and later:
:data:`~contextpilot_rag.cloud.rules.OPENAI_BREAKPOINT_MODELS`), from "Prompt caching",
https://developers.openai.com/api/docs/guides/prompt-caching, and the openai SDK's
``prompt_cache_options`` docstrings:

- a prefix is cached only where a *breakpoint* ends it (no 128-token steps): an explicit
  ``"prompt_cache_breakpoint": {"mode": "explicit"}`` on a content part (never on an
  assistant message), and, in the default ``prompt_cache_options.mode`` ``"implicit"``,
  one managed breakpoint at the end of the latest user or tool message;
- a request writes the implicit breakpoint plus up to the latest three explicit ones
  (``"implicit"``) or up to the latest four explicit ones (``"explicit"``; with no
  explicit breakpoint such a request does not use the cache at all); a prefix under
  1,024 tokens is not written;
- a request reads the longest prefix ending at any of its block boundaries that an
  earlier request wrote (no content-block lookback limit; the SDK's bound, the latest 80
  breakpoints of the conversation, is not modelled);
- an entry lives at least 30 minutes (``ttl`` ``"30m"``, the only value); writes cost
  1.25× the uncached input price, reads 0.1×; ``usage.prompt_tokens_details`` reports
  ``cache_write_tokens`` and ``cached_tokens`` of the total ``prompt_tokens``;
- routing and overflow over cache machines are the older models' (above), with the
  prompt's head taken as the content blocks that start within its first ~256 tokens.

**Gemini** implicit caching (https://ai.google.dev/gemini-api/docs/caching, reported as
``usage_metadata.cached_content_token_count``) is the OpenAI model with
:meth:`OpenAICacheRules.gemini_implicit`: one machine, no key, no overflow.

Where a rule leaves a number open (OpenAI's exact retention, machine count, overflow
destination), the default is the conservative end and a field of the rules object.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..cloud.rules import ANTHROPIC_RULES, OPENAI_BREAKPOINT_RULES, ProviderRules
from ..errors import CacheControlError, ConfigError
from ..usage import InputTokens
from .block_hashes import iter_block_hashes

__all__ = [
    "TTL_1H_S",
    "TTL_5M_S",
    "AnthropicCacheModel",
    "CacheBlock",
    "ManualClock",
    "OpenAIBreakpointCacheModel",
    "OpenAIBreakpointUsage",
    "OpenAICacheModel",
    "OpenAICacheRules",
    "OpenAIUsage",
    "Retention",
]

TTL_5M_S = ANTHROPIC_RULES.ttl_s["5m"]
"""Anthropic's default cache lifetime, ``{"type": "ephemeral"}``: 5 minutes from last use."""

TTL_1H_S = ANTHROPIC_RULES.ttl_s["1h"]
"""Anthropic's extended lifetime, ``{"type": "ephemeral", "ttl": "1h"}``."""

Retention = Literal["in_memory", "24h"]
"""OpenAI's ``prompt_cache_retention`` values."""


class ManualClock:
    """Simulated seconds that move only when told to: ``clock()`` reads them,
    :meth:`advance` moves them forward. For servers that take a clock callable."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = float(start_s)

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0); returns the new time."""
        if not seconds >= 0:
            raise ConfigError(f"seconds must be >= 0, got {seconds!r}")
        self.now_s += float(seconds)
        return self.now_s


@dataclass
class _Entry:
    expires_s: float
    ttl_s: float
    created_s: float


class _ExpiringEntries:
    """Cache entries keyed by prefix identity, each alive until ``expires_s``.

    Invariant: every live key has at least one heap item with its current ``expires_s``;
    heap items whose time no longer matches their entry are stale and skipped. Every
    refresh pushes an item, so the heap is rebuilt from the entries whenever it holds
    more than twice as many items as entries (plus a constant): memory follows the
    entries, not the traffic (an entry refreshed on every request, with a 24-hour
    lifetime, would otherwise leave a day of stale items behind).
    """

    _SLACK = 64  # heap items beyond twice the entries before a rebuild

    def __init__(self) -> None:
        self._entries: dict[Any, _Entry] = {}
        self._heap: list[tuple[float, int, Any]] = []
        self._pushes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def alive(self, key: Any, now_s: float) -> _Entry | None:
        entry = self._entries.get(key)
        return entry if entry is not None and entry.expires_s > now_s else None

    def put(self, key: Any, entry: _Entry) -> None:
        self._entries[key] = entry
        self._pushes += 1
        heapq.heappush(self._heap, (entry.expires_s, self._pushes, key))
        if len(self._heap) > 2 * len(self._entries) + self._SLACK:
            start, self._pushes = self._pushes, self._pushes + len(self._entries)
            items = enumerate(self._entries.items(), start=start + 1)
            self._heap = [(entry.expires_s, n, key) for n, (key, entry) in items]
            heapq.heapify(self._heap)

    def purge(self, now_s: float) -> None:
        """Drop every entry expired at ``now_s``."""
        while self._heap and self._heap[0][0] <= now_s:
            expires_s, _, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is not None and entry.expires_s == expires_s:
                del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()
        self._heap.clear()


def _check_time(now_s: float) -> None:
    if isinstance(now_s, bool) or not isinstance(now_s, (int, float)) or now_s != now_s:
        raise ConfigError(f"now_s must be a number of simulated seconds, got {now_s!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def _positive_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")


@dataclass(frozen=True)
class CacheBlock:
    """One content block of an Anthropic request, in cache order (tools → system →
    messages), or one content part of an OpenAI breakpoint request. ``key`` identifies
    the block's content and place (two prompts share a prefix exactly when their blocks'
    keys agree up to there); ``tokens`` is its length; ``breakpoint_ttl_s`` is set when
    the block carries ``cache_control`` (``TTL_5M_S`` or ``TTL_1H_S``) or
    ``prompt_cache_breakpoint`` (OpenAI's lifetime is the request's, so the value only
    marks the breakpoint there)."""

    key: str
    tokens: int
    breakpoint_ttl_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 0:
            raise ConfigError(f"tokens must be an integer >= 0, got {self.tokens!r}")
        if self.breakpoint_ttl_s is not None:
            _positive_seconds("breakpoint_ttl_s", self.breakpoint_ttl_s)


@dataclass(frozen=True)
class _AnthropicPlan:
    """Where one request reads and writes: block ``read_block`` (or -1: no read) ends
    the prefix served from cache; ``writes`` are the breakpoints long enough to cache."""

    prefix_tokens: tuple[int, ...]
    prefix_keys: tuple[tuple[str, bytes], ...]
    read_block: int
    writes: tuple[int, ...]


class AnthropicCacheModel:
    """Anthropic's explicit prompt cache (rules in the module docstring), one request at
    a time. Entries are per model: a prefix cached for one model is no hit for another.

    The numbers come from ``rules`` (default
    :data:`~contextpilot_rag.cloud.rules.ANTHROPIC_RULES`, the same the breakpoint
    planner reads): ``max_breakpoints``, the per-model minimum (``min_tokens(model)``)
    and ``lookback_blocks``.

    Invariant: an entry exists only for a prefix that ended at a breakpoint of an earlier
    request, was at least the model's minimum long, and has not outlived its TTL since
    its last write or read. Not thread-safe: callers serialise access.
    """

    def __init__(self, rules: ProviderRules | None = None) -> None:
        self.rules = rules or ANTHROPIC_RULES
        self._entries = _ExpiringEntries()

    @property
    def cached_prefixes(self) -> int:
        """Live and not-yet-purged entries."""
        return len(self._entries)

    def reset(self) -> None:
        self._entries.clear()

    def lookup(self, blocks: Sequence[CacheBlock], *, now_s: float, model: str = "") -> int:
        """Tokens the request would read from cache now, changing nothing."""
        plan = self._plan(blocks, now_s, model)
        return plan.prefix_tokens[plan.read_block] if plan.read_block >= 0 else 0

    def request(
        self, blocks: Sequence[CacheBlock], *, now_s: float, model: str = ""
    ) -> InputTokens:
        """Serve one request at ``now_s``: read the longest reachable cached prefix
        (refreshing it), write every breakpoint that is long enough, report usage.
        Raises :class:`~contextpilot_rag.errors.CacheControlError` (state unchanged) for
        a request the API would reject.

        In the API's ``usage`` words: ``uncached_tokens`` is ``input_tokens``,
        ``cache_read_tokens`` is ``cache_read_input_tokens``, the two writes are
        ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``
        (their sum ``cache_creation_input_tokens``)."""
        plan = self._plan(blocks, now_s, model)
        self._entries.purge(now_s)
        read_tokens = self._refresh_read(plan, now_s)
        written = self._write(plan, blocks, now_s, read_tokens)
        total = plan.prefix_tokens[-1] if plan.prefix_tokens else 0
        return InputTokens(
            uncached_tokens=total - read_tokens - sum(written.values()),
            cache_read_tokens=read_tokens,
            cache_write_5m_tokens=written.get(TTL_5M_S, 0),
            cache_write_1h_tokens=sum(t for ttl, t in written.items() if ttl != TTL_5M_S),
        )

    def _plan(self, blocks: Sequence[CacheBlock], now_s: float, model: str) -> _AnthropicPlan:
        _check_time(now_s)
        breakpoints = _breakpoints(blocks, self.rules.max_breakpoints)
        prefix_tokens, prefix_keys = _prefixes(blocks, model)
        minimum = self.rules.min_tokens(model)
        writes = tuple(b for b in breakpoints if prefix_tokens[b] >= minimum)
        read_block = max((self._read_at(b, prefix_keys, now_s) for b in breakpoints), default=-1)
        return _AnthropicPlan(prefix_tokens, prefix_keys, read_block, writes)

    def _read_at(self, breakpoint: int, keys: Sequence[tuple[str, bytes]], now_s: float) -> int:
        """The last block within the lookback window of ``breakpoint`` whose prefix is
        cached, or -1."""
        lookback = self.rules.lookback_blocks  # 0: no limit
        first = max(breakpoint - lookback + 1, 0) if lookback else 0
        for block in range(breakpoint, first - 1, -1):
            if self._entries.alive(keys[block], now_s) is not None:
                return block
        return -1

    def _refresh_read(self, plan: _AnthropicPlan, now_s: float) -> int:
        if plan.read_block < 0:
            return 0
        key = plan.prefix_keys[plan.read_block]
        entry = self._entries.alive(key, now_s)
        assert entry is not None  # planned at this now_s
        self._entries.put(key, _Entry(now_s + entry.ttl_s, entry.ttl_s, entry.created_s))
        return plan.prefix_tokens[plan.read_block]

    def _write(
        self, plan: _AnthropicPlan, blocks: Sequence[CacheBlock], now_s: float, read_tokens: int
    ) -> dict[float, int]:
        """Store the planned breakpoints; returns tokens newly written, by TTL."""
        written: dict[float, int] = {}
        covered = read_tokens
        for block in plan.writes:
            ttl_s = blocks[block].breakpoint_ttl_s or TTL_5M_S
            key = plan.prefix_keys[block]
            old = self._entries.alive(key, now_s)
            keep_ttl = max(ttl_s, old.ttl_s) if old is not None else ttl_s
            self._entries.put(key, _Entry(now_s + keep_ttl, keep_ttl, now_s))
            end = plan.prefix_tokens[block]
            if end > covered:
                written[ttl_s] = written.get(ttl_s, 0) + end - covered
                covered = end
        return written


def _breakpoints(blocks: Sequence[CacheBlock], max_breakpoints: int) -> list[int]:
    """Indices of the blocks carrying ``cache_control``, validated as the API does."""
    marked = [i for i, block in enumerate(blocks) if block.breakpoint_ttl_s is not None]
    if len(marked) > max_breakpoints:
        raise CacheControlError(
            f"A maximum of {max_breakpoints} blocks with cache_control may be provided. "
            f"Found {len(marked)}."
        )
    ttls = [blocks[i].breakpoint_ttl_s or TTL_5M_S for i in marked]
    if ttls != sorted(ttls, reverse=True):
        raise CacheControlError(
            "a cache_control breakpoint with a longer ttl must not come after one with a "
            "shorter ttl: put 'ttl': '1h' breakpoints before '5m' ones"
        )
    return marked


def _prefixes(
    blocks: Sequence[CacheBlock], model: str
) -> tuple[tuple[int, ...], tuple[tuple[str, bytes], ...]]:
    """Cumulative tokens and a chained identity of every block prefix."""
    tokens: list[int] = []
    keys: list[tuple[str, bytes]] = []
    running, digest = 0, b""
    for block in blocks:
        running += block.tokens
        digest = hashlib.blake2b(digest + block.key.encode(), digest_size=16).digest()
        tokens.append(running)
        keys.append((model, digest))
    return tuple(tokens), tuple(keys)


@dataclass(frozen=True)
class OpenAICacheRules:
    """OpenAI's published automatic-cache rules, as numbers.

    ``in_memory_retention_s`` is the idle lifetime (the docs say 5–10 minutes; the
    default takes 5), ``in_memory_max_age_s`` the hard cap (an hour), ``extended_retention_s``
    the ``"24h"`` lifetime. ``machines`` caches are reached by the routing hash of the
    first ``routing_prefix_tokens`` tokens and the key; ``overflow_requests_per_minute``
    requests a minute per route stay on its machine, each further batch of that many
    moves one machine on (None: never overflow). ``default_retention``: the lifetime of
    a request that names none. OpenAI's API reference (``prompt_cache_retention``,
    openai-python 2.x) says organizations without Zero Data Retention default to
    ``"24h"`` on models that offer both, ZDR organizations to ``"in_memory"``, and
    ``gpt-5.5`` and later offer only ``"24h"``; the default here is ``"in_memory"``, the
    shorter lifetime (a ZDR organization's, and the rule the emulated figures in
    docs/benchmarks.md were measured under)."""

    min_cached_tokens: int = 1024
    step_tokens: int = 128
    routing_prefix_tokens: int = 256
    machines: int = 4
    overflow_requests_per_minute: int | None = 15
    in_memory_retention_s: float = 300.0
    in_memory_max_age_s: float = 3600.0
    extended_retention_s: float = 86400.0
    default_retention: Retention = "in_memory"

    def __post_init__(self) -> None:
        if self.default_retention not in ("in_memory", "24h"):
            raise ConfigError(
                f"default_retention must be 'in_memory' or '24h', got {self.default_retention!r}"
            )
        for name in ("min_cached_tokens", "step_tokens", "routing_prefix_tokens", "machines"):
            _positive_int(name, getattr(self, name))
        if self.overflow_requests_per_minute is not None:
            _positive_int("overflow_requests_per_minute", self.overflow_requests_per_minute)
        for name in ("in_memory_retention_s", "in_memory_max_age_s", "extended_retention_s"):
            _positive_seconds(name, getattr(self, name))

    @classmethod
    def gemini_implicit(cls, min_cached_tokens: int = 1024) -> OpenAICacheRules:
        """Gemini's implicit caching: automatic above a model's minimum (1,024 tokens
        on Flash models, more on Pro), one cache, no key. The hit granularity is not
        published; the 128-token step is kept."""
        return cls(
            min_cached_tokens=min_cached_tokens, machines=1, overflow_requests_per_minute=None
        )


@dataclass(frozen=True)
class OpenAIUsage:
    """The prompt side of an OpenAI ``usage`` object (``cached_tokens`` is a multiple of
    the step, at least the minimum, or 0)."""

    prompt_tokens: int
    cached_tokens: int
    machine: int

    @property
    def input_tokens(self) -> InputTokens:
        """The same counts as billed: cached tokens read, the rest uncached."""
        return InputTokens(self.prompt_tokens - self.cached_tokens, self.cached_tokens)


class OpenAICacheModel:
    """OpenAI's automatic prompt cache (rules in the module docstring), one request at a
    time. Entries are per machine and model, one per cacheable step boundary.

    Invariant: machine ``m`` holds the prefix of ``n`` tokens (``n`` a multiple of the
    step, ``n >= min_cached_tokens``) only if a request routed to ``m`` within its
    retention carried that prefix. Not thread-safe: callers serialise access.
    """

    def __init__(self, rules: OpenAICacheRules | None = None) -> None:
        self.rules = rules or OpenAICacheRules()
        self._machines = _CacheMachines(self.rules)

    def reset(self) -> None:
        self._machines.clear()

    def route(self, tokens: Sequence[int], prompt_cache_key: str | None = None) -> int:
        """The machine a request goes to when its route is not overflowing."""
        return self._machines.home(self._route_id(tokens, prompt_cache_key))

    def lookup(
        self,
        tokens: Sequence[int],
        *,
        now_s: float,
        prompt_cache_key: str | None = None,
        model: str = "",
    ) -> int:
        """Cached tokens the request would get now (ignoring overflow), changing nothing."""
        _check_time(now_s)
        machine = self._machines.caches[self.route(tokens, prompt_cache_key)]
        return self._hit(machine, _step_keys(tokens, self.rules, model), now_s)[0]

    def request(
        self,
        tokens: Sequence[int],
        *,
        now_s: float,
        prompt_cache_key: str | None = None,
        retention: Retention | None = None,
        model: str = "",
    ) -> OpenAIUsage:
        """Serve one request at ``now_s``: route it, read the longest cached step prefix
        on that machine, then store (or refresh) every step prefix of the prompt there.
        ``retention``: ``None`` takes the rules' ``default_retention``."""
        _check_time(now_s)
        ttl_s, max_age_s = self._lifetime(retention or self.rules.default_retention)
        index = self._machines.admit(self._route_id(tokens, prompt_cache_key), now_s)
        machine = self._machines.caches[index]
        machine.purge(now_s)
        keys = _step_keys(tokens, self.rules, model)
        cached, _ = self._hit(machine, keys, now_s)
        for key in keys:
            old = machine.alive(key, now_s)
            created_s = old.created_s if old is not None else now_s
            expires_s = min(now_s + ttl_s, created_s + max_age_s)
            machine.put(key, _Entry(expires_s, ttl_s, created_s))
        return OpenAIUsage(prompt_tokens=len(tokens), cached_tokens=cached, machine=index)

    def _lifetime(self, retention: str) -> tuple[float, float]:
        if retention == "in_memory":
            return self.rules.in_memory_retention_s, self.rules.in_memory_max_age_s
        if retention == "24h":
            return self.rules.extended_retention_s, self.rules.extended_retention_s
        raise CacheControlError(
            f"prompt_cache_retention must be 'in_memory' or '24h', got {retention!r}"
        )

    def _hit(
        self, machine: _ExpiringEntries, keys: Sequence[tuple[str, int, int]], now_s: float
    ) -> tuple[int, int]:
        """(cached tokens, entries hit): the longest stored step prefix."""
        for position in range(len(keys) - 1, -1, -1):
            if machine.alive(keys[position], now_s) is not None:
                return keys[position][2], position + 1
        return 0, 0

    def _route_id(self, tokens: Sequence[int], prompt_cache_key: str | None) -> bytes:
        head = ",".join(map(str, tokens[: self.rules.routing_prefix_tokens]))
        return _route_id(head, prompt_cache_key)


def _route_id(head: str, prompt_cache_key: str | None) -> bytes:
    """A route's identity: the prompt's head (as text) with the key."""
    salt = "" if prompt_cache_key is None else f"\x00{prompt_cache_key}"
    return hashlib.blake2b(f"{head}{salt}".encode(), digest_size=16).digest()


class _CacheMachines:
    """OpenAI's cache machines, each with its own ``caches`` entry, and the spreading of
    requests over them: a route (:func:`_route_id`) has a home machine; above
    ``overflow_requests_per_minute`` requests a minute on one route, each further batch
    of that many moves one machine on.

    Invariant: ``_recent[route]`` holds the times of the route's admitted requests, of
    which those older than a minute are dropped when the route is next admitted; the
    routes with none in the last minute are dropped whenever the table has doubled
    since the last sweep, so it holds about the routes of the last minute, however
    many routes came before."""

    _SLACK = 64  # routes beyond twice those kept by the last sweep before the next

    def __init__(self, rules: OpenAICacheRules) -> None:
        self.caches = [_ExpiringEntries() for _ in range(rules.machines)]
        self._limit = rules.overflow_requests_per_minute
        self._recent: dict[bytes, deque[float]] = {}
        self._swept = 0  # routes kept by the last sweep

    def __len__(self) -> int:
        """Live and not-yet-purged entries, over all machines."""
        return sum(len(entries) for entries in self.caches)

    def clear(self) -> None:
        for entries in self.caches:
            entries.clear()
        self._recent.clear()
        self._swept = 0

    def home(self, route: bytes) -> int:
        """The machine of ``route`` when it is not overflowing."""
        return int.from_bytes(route[:8], "big") % len(self.caches)

    def admit(self, route: bytes, now_s: float) -> int:
        """Count one request on ``route`` at ``now_s``; the machine it goes to."""
        if self._limit is None:
            return self.home(route)
        if len(self._recent) > 2 * self._swept + self._SLACK:
            self._recent = {r: t for r, t in self._recent.items() if t[-1] > now_s - 60.0}
            self._swept = len(self._recent)
        recent = self._recent.setdefault(route, deque())
        while recent and recent[0] <= now_s - 60.0:
            recent.popleft()
        shift = len(recent) // self._limit
        recent.append(now_s)
        return (self.home(route) + shift) % len(self.caches)


def _step_keys(
    tokens: Sequence[int], rules: OpenAICacheRules, model: str
) -> list[tuple[str, int, int]]:
    """Identities of the prompt's cacheable step prefixes, shortest first: (model,
    chained hash, prefix length) for every step boundary at or above the minimum."""
    keys = []
    for index, chained in enumerate(iter_block_hashes(tokens, rules.step_tokens)):
        length = (index + 1) * rules.step_tokens
        if length >= rules.min_cached_tokens:
            keys.append((model, chained, length))
    return keys


@dataclass(frozen=True)
class OpenAIBreakpointUsage:
    """The prompt side of a ``gpt-5.6`` ``usage`` object, as billed: ``tokens`` holds the
    reads (``cached_tokens``) in ``cache_read_tokens``, the writes
    (``cache_write_tokens``) in ``cache_write_5m_tokens`` (the field priced at a model's
    short write price) and the rest in ``uncached_tokens``; ``machine`` is the cache the
    request went to."""

    tokens: InputTokens
    machine: int


@dataclass(frozen=True)
class _BreakpointPlan:
    """Where one request may read and what it writes: ``writes`` are the blocks whose
    prefixes it stores (long enough, ascending); ``uses_cache`` is False for an
    explicit-mode request without breakpoints, which neither reads nor writes."""

    prefix_tokens: tuple[int, ...]
    prefix_keys: tuple[tuple[str, bytes], ...]
    route: bytes
    writes: tuple[int, ...]
    uses_cache: bool


class OpenAIBreakpointCacheModel:
    """OpenAI's breakpoint prompt cache of ``gpt-5.6`` and later (rules in the module
    docstring), one request at a time; an emulation of the published rules.

    ``rules`` (default :data:`~contextpilot_rag.cloud.rules.OPENAI_BREAKPOINT_RULES`)
    gives the breakpoints written per request (``max_breakpoints``; rules with 0, such
    as the automatic cache's, write none but the implicit one), the minimum
    (``min_tokens(model)``) and the lifetime (the first of ``ttl_s``); ``routing`` the
    machines, the routing head and the overflow rate (:class:`OpenAICacheRules`; its
    step, minimum and retention fields are not read). A read does not refresh the entry
    it reads (the guide promises 30 minutes from the write, no more): the conservative
    reading.

    Invariant: machine ``m`` holds the prefix ending at a block only if a request routed
    to ``m`` wrote a breakpoint there within the lifetime, and the prefix is at least the
    model's minimum long. Not thread-safe: callers serialise access.
    """

    def __init__(
        self, rules: ProviderRules | None = None, routing: OpenAICacheRules | None = None
    ) -> None:
        self.rules = rules or OPENAI_BREAKPOINT_RULES
        self.routing = routing or OpenAICacheRules()
        self.lifetime_s = next(iter(self.rules.ttl_s.values()))
        self._machines = _CacheMachines(self.routing)

    @property
    def cached_prefixes(self) -> int:
        """Live and not-yet-purged entries, over all machines."""
        return len(self._machines)

    def reset(self) -> None:
        self._machines.clear()

    def route(self, blocks: Sequence[CacheBlock], prompt_cache_key: str | None = None) -> int:
        """The machine a request goes to when its route is not overflowing."""
        prefix_tokens, prefix_keys = _prefixes(blocks, "")
        return self._machines.home(
            self._route_id(blocks, prefix_tokens, prefix_keys, prompt_cache_key)
        )

    def lookup(
        self,
        blocks: Sequence[CacheBlock],
        *,
        now_s: float,
        prompt_cache_key: str | None = None,
        model: str = "",
        implicit_block: int | None = None,
    ) -> int:
        """Tokens the request would read from cache now (ignoring overflow), changing
        nothing."""
        plan = self._plan(blocks, now_s, prompt_cache_key, model, implicit_block)
        machine = self._machines.caches[self._machines.home(plan.route)]
        return self._read_tokens(plan, machine, now_s)

    def request(
        self,
        blocks: Sequence[CacheBlock],
        *,
        now_s: float,
        prompt_cache_key: str | None = None,
        model: str = "",
        implicit_block: int | None = None,
    ) -> OpenAIBreakpointUsage:
        """Serve one request at ``now_s``. A block with ``breakpoint_ttl_s`` set carries
        an explicit breakpoint; ``implicit_block`` is the block that ends the latest user
        or tool message in implicit mode (``None``: explicit mode). Route the request,
        read the longest cached prefix on its machine, write the latest breakpoints that
        are long enough, report usage. Raises
        :class:`~contextpilot_rag.errors.ConfigError` (state unchanged) for a bad
        ``now_s`` or ``implicit_block``."""
        plan = self._plan(blocks, now_s, prompt_cache_key, model, implicit_block)
        index = self._machines.admit(plan.route, now_s)
        machine = self._machines.caches[index]
        machine.purge(now_s)
        read = self._read_tokens(plan, machine, now_s)
        written = self._write(plan, machine, now_s, read)
        total = plan.prefix_tokens[-1] if plan.prefix_tokens else 0
        tokens = InputTokens(total - read - written, read, cache_write_5m_tokens=written)
        return OpenAIBreakpointUsage(tokens, index)

    def _plan(
        self,
        blocks: Sequence[CacheBlock],
        now_s: float,
        prompt_cache_key: str | None,
        model: str,
        implicit_block: int | None,
    ) -> _BreakpointPlan:
        _check_time(now_s)
        _check_implicit_block(implicit_block, len(blocks))
        explicit = [i for i, block in enumerate(blocks) if block.breakpoint_ttl_s is not None]
        prefix_tokens, prefix_keys = _prefixes(blocks, model)
        minimum = self.rules.min_tokens(model)
        chosen = self._written_breakpoints(explicit, implicit_block)
        return _BreakpointPlan(
            prefix_tokens,
            prefix_keys,
            self._route_id(blocks, prefix_tokens, prefix_keys, prompt_cache_key),
            tuple(block for block in chosen if prefix_tokens[block] >= minimum),
            uses_cache=bool(explicit) or implicit_block is not None,
        )

    def _written_breakpoints(self, explicit: list[int], implicit_block: int | None) -> list[int]:
        """The latest ``max_breakpoints`` explicit breakpoints, or the implicit one and
        the latest ``max_breakpoints - 1`` explicit ones; ascending."""
        if implicit_block is None:
            return _latest(explicit, self.rules.max_breakpoints)
        return sorted({*_latest(explicit, self.rules.max_breakpoints - 1), implicit_block})

    def _route_id(
        self,
        blocks: Sequence[CacheBlock],
        prefix_tokens: Sequence[int],
        prefix_keys: Sequence[tuple[str, bytes]],
        prompt_cache_key: str | None,
    ) -> bytes:
        """The route of the blocks that start within the routing head, and the key."""
        starts = (end - block.tokens for end, block in zip(prefix_tokens, blocks, strict=True))
        opening = sum(1 for start in starts if start < self.routing.routing_prefix_tokens)
        head = prefix_keys[opening - 1][1].hex() if opening else ""
        return _route_id(head, prompt_cache_key)

    def _read_tokens(self, plan: _BreakpointPlan, machine: _ExpiringEntries, now_s: float) -> int:
        """The longest prefix ending at a block boundary with a live entry (no lookback
        limit); 0 when there is none or the request does not use the cache."""
        if not plan.uses_cache:
            return 0
        for block in range(len(plan.prefix_keys) - 1, -1, -1):
            if machine.alive(plan.prefix_keys[block], now_s) is not None:
                return plan.prefix_tokens[block]
        return 0

    def _write(
        self, plan: _BreakpointPlan, machine: _ExpiringEntries, now_s: float, read_tokens: int
    ) -> int:
        """Store (or refresh) the planned breakpoints for the lifetime; returns the tokens
        written past what was read."""
        for block in plan.writes:
            old = machine.alive(plan.prefix_keys[block], now_s)
            created_s = old.created_s if old is not None else now_s
            entry = _Entry(now_s + self.lifetime_s, self.lifetime_s, created_s)
            machine.put(plan.prefix_keys[block], entry)
        deepest = plan.prefix_tokens[plan.writes[-1]] if plan.writes else 0
        return max(0, deepest - read_tokens)


def _latest(indices: list[int], count: int) -> list[int]:
    """The last ``count`` of ``indices`` (none for ``count <= 0``)."""
    return indices[max(len(indices) - count, 0) :]


def _check_implicit_block(index: object, blocks: int) -> None:
    if index is None:
        return
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < blocks:
        raise ConfigError(
            f"implicit_block must be None or the index of one of the request's {blocks} "
            f"blocks (0..{blocks - 1}), got {index!r}"
        )
