"""Cache breakpoints that pay (Anthropic-style explicit prompt caching).

A breakpoint asks the provider to cache the prompt up to it. Writing costs more than
sending the tokens uncached (1.25× for 5 minutes, 2× for 1 hour); a later read costs
0.1×. So a breakpoint pays only where later requests will read the prefix before it
expires. The pilot proposes candidates where its index and the conversation predict
reuse (:class:`ReuseCandidate`: the end of the system prompt, the end of the leading
blocks other requests are expected to share, the end of the conversation history, the
end of this turn for the next one); :func:`plan_breakpoints` keeps the ones whose
expected saving beats the write premium, at most ``max_breakpoints``, and says why
for every candidate (:class:`CachePlan`).

The saving of a candidate, in base-price input tokens, with ``covered`` the tokens up
to the previous breakpoint kept:

- ``read_now``: the part of the prefix after ``covered`` that an earlier request
  already cached (``cached_tokens``) is read now at a ``read_saving`` discount;
- ``new``: the part after both is written, at ``write_premium``, and read by
  ``expected_reads`` later requests: ``new × (read_saving × expected_reads −
  write_premium)``.

A candidate is kept when the sum is positive and its prefix reaches the model's
minimum cacheable length. Candidates of one ``kind`` are alternatives (the shared
blocks may end after any block): the best of them is kept. Breakpoints the budget
leaves then go to other ends of the shared blocks before the deepest kept breakpoint,
which cost no write (the prompt is written once, up to its deepest breakpoint) and add
entries other requests can read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from .._numbers import is_finite_at_least, is_int
from ..errors import ConfigError, InvalidInputError
from .rules import Marker, ProviderRules

__all__ = [
    "KINDS",
    "Breakpoint",
    "BreakpointKind",
    "CachePlan",
    "ReuseCandidate",
    "SkippedBreakpoint",
    "duplicates_pay",
    "plan_breakpoints",
]

BreakpointKind = Literal["system", "shared_blocks", "history", "tail"]
KINDS: tuple[BreakpointKind, ...] = ("system", "shared_blocks", "history", "tail")
"""Candidate kinds, in prompt order."""


@dataclass(frozen=True)
class ReuseCandidate:
    """A place a breakpoint could go, and what the pilot predicts of its reuse.

    ``message_index`` indexes :attr:`Prompt.messages`; ``part`` the message's content
    blocks (:meth:`Prompt.content_parts`; -1: its last). ``prefix_tokens``: the
    prompt's tokens up to here (pilot tokenizer). ``expected_reads``: later requests
    expected to read this prefix within the lifetime. ``cached_tokens``: the tokens
    of this prefix an earlier request is believed to have cached, readable from here.
    ``basis`` says where the numbers come from; ``index_depth`` the length of the
    pilot's index path up to here (0: unknown)."""

    kind: BreakpointKind
    message_index: int
    part: int
    prefix_tokens: int
    expected_reads: float
    cached_tokens: int = 0
    basis: str = ""
    index_depth: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInputError(
                f"ReuseCandidate.kind must be one of {KINDS}, got {self.kind!r}"
            )
        counts = ("message_index", "prefix_tokens", "cached_tokens", "index_depth")
        for name in counts:
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise InvalidInputError(f"ReuseCandidate.{name} must be an int >= 0, got {value!r}")
        if not is_int(self.part) or self.part < -1:
            raise InvalidInputError(f"ReuseCandidate.part must be an int >= -1, got {self.part!r}")
        if not is_finite_at_least(self.expected_reads, 0):
            raise InvalidInputError(
                f"ReuseCandidate.expected_reads must be a finite number >= 0, "
                f"got {self.expected_reads!r}"
            )
        if not isinstance(self.basis, str):
            raise InvalidInputError("ReuseCandidate.basis must be a str")


@dataclass(frozen=True)
class Breakpoint:
    """A kept candidate and the saving that justified it (base-price input tokens)."""

    candidate: ReuseCandidate
    saving_tokens: float
    reason: str

    @property
    def kind(self) -> BreakpointKind:
        return self.candidate.kind

    @property
    def position(self) -> tuple[int, int]:
        """``(message_index, part)``."""
        return self.candidate.message_index, self.candidate.part


@dataclass(frozen=True)
class SkippedBreakpoint:
    """A candidate left out, and why."""

    candidate: ReuseCandidate
    saving_tokens: float
    reason: str


@dataclass(frozen=True)
class CachePlan:
    """Where a prompt's cache breakpoints go (at most ``rules.max_breakpoints``, in
    prompt order) and why; ``skipped`` the candidates left out, with reasons.
    ``min_tokens`` is the model's minimum cacheable prefix; ``retention`` the request's
    ``prompt_cache_retention`` that asks for the lifetime ``ttl`` (``None``: send none,
    :attr:`~.rules.ProviderRules.request_retention`); ``marker`` the content-block field
    that carries the breakpoints and ``unmarked_roles`` the roles that may carry none
    (the rules', :attr:`~.rules.ProviderRules.marker`)."""

    provider: str
    model: str | None
    ttl: str
    min_tokens: int
    breakpoints: tuple[Breakpoint, ...]
    skipped: tuple[SkippedBreakpoint, ...]
    retention: str | None = None
    marker: Marker = "cache_control"
    unmarked_roles: tuple[str, ...] = ()

    @property
    def positions(self) -> tuple[tuple[int, int], ...]:
        return tuple(breakpoint.position for breakpoint in self.breakpoints)

    @property
    def expected_saving_tokens(self) -> float:
        """The planned breakpoints' predicted saving, in base-price input tokens."""
        return sum(breakpoint.saving_tokens for breakpoint in self.breakpoints)

    def expected_saving_usd(self, input_usd_per_million: float) -> float:
        """:attr:`expected_saving_tokens` in USD at a base input price (USD per million
        tokens, e.g. ``DEFAULT_PRICES.price(model).input``)."""
        return self.expected_saving_tokens * input_usd_per_million / 1_000_000


def plan_breakpoints(
    candidates: Iterable[ReuseCandidate],
    rules: ProviderRules,
    *,
    model: str | None = None,
    ttl: str = "5m",
) -> CachePlan:
    """Keep the candidates whose breakpoint pays (see the module docstring), at most
    ``rules.max_breakpoints``, the best of each kind."""
    if not isinstance(rules, ProviderRules):
        raise ConfigError(f"rules must be a ProviderRules, got {type(rules).__name__}")
    premium = rules.write_premium(ttl)
    min_tokens = rules.min_tokens(model)
    by_kind = _grouped(candidates)
    kept: list[Breakpoint] = []
    skipped: list[SkippedBreakpoint] = []
    covered = 0
    for kind in KINDS:
        group = by_kind.get(kind, ())
        if not group:
            continue
        scored = [(_saving(c, covered, rules.read_saving, premium), c) for c in group]
        # an end that cannot be kept (under the minimum, say) must not beat one that can
        eligible = [
            pair
            for pair in scored
            if _refusal(pair[1], pair[0], covered, min_tokens, rules) is None
        ]
        best_saving, best = max(
            eligible or scored, key=lambda pair: (pair[0], -pair[1].prefix_tokens)
        )
        for saving, candidate in scored:
            if candidate is not best:
                why = "another end of it pays more"
                if saving > best_saving:  # it lost only because it cannot be kept
                    why = _refusal(candidate, saving, covered, min_tokens, rules) or why
                skipped.append(SkippedBreakpoint(candidate, saving, why))
        reason = _refusal(best, best_saving, covered, min_tokens, rules)
        if reason is not None:
            skipped.append(SkippedBreakpoint(best, best_saving, reason))
            continue
        kept.append(Breakpoint(best, best_saving, _justification(best, best_saving)))
        covered = best.prefix_tokens
    if not rules.lookback_blocks:
        kept, folded = _history_into_tail(kept)
        skipped.extend(folded)
    extra = _free_shared_ends(kept, by_kind.get("shared_blocks", ()), rules, min_tokens)
    if extra:
        chosen = {id(b.candidate) for b in extra}
        skipped = [s for s in skipped if id(s.candidate) not in chosen]
        kept = sorted([*kept, *extra], key=lambda b: b.candidate.prefix_tokens)
    kept, over = _within_limit(kept, rules.max_breakpoints)
    skipped.extend(over)
    retention = rules.request_retention.get(ttl)
    return CachePlan(
        rules.provider,
        model,
        ttl,
        min_tokens,
        tuple(kept),
        tuple(skipped),
        retention,
        rules.marker,
        rules.unmarked_roles,
    )


def _history_into_tail(
    kept: Sequence[Breakpoint],
) -> tuple[list[Breakpoint], list[SkippedBreakpoint]]:
    """Without a lookback limit a request reads the longest cached prefix before any of
    its breakpoints, and it writes its prompt up to its deepest one: a history
    breakpoint kept beside a tail then only spends a slot (on OpenAI's breakpoint
    models it cannot even mark the answer it ends with). Its read and its saving go to
    the tail, its slot back to the budget."""
    kinds = [breakpoint.kind for breakpoint in kept]
    if "history" not in kinds or "tail" not in kinds:
        return list(kept), []
    history, tail = kept[kinds.index("history")], kept[kinds.index("tail")]
    cached = max(tail.candidate.cached_tokens, history.candidate.cached_tokens)
    candidate = replace(tail.candidate, cached_tokens=cached)
    saving = history.saving_tokens + tail.saving_tokens
    folded = Breakpoint(candidate, saving, _justification(candidate, saving))
    rest = [breakpoint for breakpoint in kept if breakpoint.kind not in ("history", "tail")]
    why = "the tail reads the same cached prefix and writes past it (no lookback limit)"
    return [*rest, folded], [SkippedBreakpoint(history.candidate, history.saving_tokens, why)]


def _free_shared_ends(
    kept: Sequence[Breakpoint],
    group: Sequence[ReuseCandidate],
    rules: ProviderRules,
    min_tokens: int,
) -> list[Breakpoint]:
    """Breakpoints left in the budget, spent on ends of the shared blocks that cost no
    write.

    A request writes its prompt once, up to its deepest breakpoint, whatever the
    breakpoints before it; so an end of the shared blocks before the deepest kept
    breakpoint (a shared-blocks end, the history or the tail) adds no write, only an
    entry that other requests sharing exactly those leading blocks can read (a request
    reads an entry only where an earlier one put a breakpoint). Readers through an end
    are its ``expected_reads``; those through a deeper kept shared end read that one
    instead. Ends are added greedily by their marginal saving while it is positive and
    the budget lasts."""
    budget = rules.max_breakpoints - len(kept)
    if budget <= 0 or not kept or not group:
        return []
    written_to = max(b.candidate.prefix_tokens for b in kept)
    floor = max((b.candidate.prefix_tokens for b in kept if b.kind == "system"), default=0)
    chain = [b.candidate for b in kept if b.kind == "shared_blocks"]
    options = [
        c
        for c in group
        if floor < c.prefix_tokens < written_to
        and c.prefix_tokens >= min_tokens
        and all(c.prefix_tokens != k.prefix_tokens for k in chain)
    ]

    def value(ends: Sequence[ReuseCandidate]) -> float:
        ordered = sorted(ends, key=lambda c: c.prefix_tokens)
        total = 0.0
        for here, deeper in itertools.zip_longest(ordered, ordered[1:]):
            readers = here.expected_reads - (deeper.expected_reads if deeper else 0.0)
            total += max(0.0, readers) * rules.read_saving * (here.prefix_tokens - floor)
        return total

    added: list[Breakpoint] = []
    while budget > 0 and options:
        base = value(chain)
        gain, best = max(
            ((value([*chain, c]) - base, c) for c in options),
            key=lambda pair: (pair[0], pair[1].prefix_tokens),
        )
        if gain <= 0:
            break
        chain.append(best)
        options.remove(best)
        reason = f"saves ~{gain:.0f} input tokens: read by requests sharing these blocks, no write"
        added.append(Breakpoint(best, gain, reason))
        budget -= 1
    return added


def _grouped(candidates: Iterable[ReuseCandidate]) -> dict[str, list[ReuseCandidate]]:
    if isinstance(candidates, (str, bytes, Mapping)) or not isinstance(candidates, Iterable):
        raise InvalidInputError(f"candidates must be ReuseCandidates, got {candidates!r}")
    by_kind: dict[str, list[ReuseCandidate]] = {}
    for candidate in candidates:
        if not isinstance(candidate, ReuseCandidate) or candidate.kind not in KINDS:
            raise InvalidInputError(f"not a ReuseCandidate of a known kind: {candidate!r}")
        by_kind.setdefault(candidate.kind, []).append(candidate)
    return by_kind


def _saving(candidate: ReuseCandidate, covered: int, read_saving: float, premium: float) -> float:
    """Expected saving of a breakpoint here, in base-price input tokens."""
    cached = min(candidate.cached_tokens, candidate.prefix_tokens)
    read_now = max(0, cached - covered) * read_saving
    new = candidate.prefix_tokens - max(covered, cached)
    return read_now + max(0, new) * (read_saving * candidate.expected_reads - premium)


def _refusal(
    candidate: ReuseCandidate,
    saving: float,
    covered: int,
    min_tokens: int,
    rules: ProviderRules,
) -> str | None:
    if rules.max_breakpoints == 0:
        return f"{rules.provider} caches automatically (no breakpoints)"
    if candidate.prefix_tokens < min_tokens:
        return f"prefix of {candidate.prefix_tokens} tokens is under the minimum {min_tokens}"
    if candidate.prefix_tokens <= covered:
        return "adds nothing after the previous breakpoint"
    if saving <= 0:
        return (
            f"write would not pay: {candidate.expected_reads:.2f} expected reads × "
            f"{rules.read_saving:.2f} <= write premium"
        )
    return None


def _justification(candidate: ReuseCandidate, saving: float) -> str:
    parts = [f"saves ~{saving:.0f} input tokens"]
    if candidate.cached_tokens:
        parts.append(f"reads {candidate.cached_tokens} cached tokens")
    if candidate.expected_reads:
        parts.append(f"{candidate.expected_reads:.2f} expected reads")
    return ", ".join(parts)


def _within_limit(
    kept: Sequence[Breakpoint], limit: int
) -> tuple[list[Breakpoint], list[SkippedBreakpoint]]:
    """The ``limit`` best breakpoints (by saving), back in prompt order."""
    if len(kept) <= limit:
        return list(kept), []
    ranked = sorted(range(len(kept)), key=lambda i: kept[i].saving_tokens, reverse=True)
    chosen = sorted(ranked[:limit])
    dropped = [
        SkippedBreakpoint(kept[i].candidate, kept[i].saving_tokens, f"over the limit of {limit}")
        for i in sorted(ranked[limit:])
    ]
    return [kept[i] for i in chosen], dropped


def duplicates_pay(
    whole_tokens: int,
    deduplicated_tokens: int,
    rules: ProviderRules,
    *,
    model: str | None = None,
    ttl: str = "5m",
    next_turn: float,
) -> bool:
    """Whether a later turn should send its repeated blocks in full: de-duplicated, its
    prompt (``deduplicated_tokens``) is under the model's minimum cacheable prefix and
    in full (``whole_tokens``) it is not, and in full it costs less, counting this turn
    and what the next one (probability ``next_turn``) pays for it as its history.

    In base-price input tokens, a prompt of ``T`` tokens that is cached costs
    ``T · (1 + premium)`` now (the write; no premium on an automatic cache) and
    ``T · (1 − read_saving)`` at the next turn; one that is not (under the minimum)
    costs ``T`` now and ``T · (1 + premium)`` at the next turn, which writes it with
    its own tail. Nothing is read now either way: the history before this turn's
    blocks is shorter than the de-duplicated prompt, so it is under the minimum too.
    Left out, as small: the later turns reading the repeated blocks again at the read
    price."""
    if not 0.0 <= next_turn <= 1.0:
        raise InvalidInputError(f"next_turn must be in [0, 1], got {next_turn!r}")
    minimum = rules.min_tokens(model)
    if not deduplicated_tokens < minimum <= whole_tokens:
        return False
    automatic = rules.max_breakpoints == 0
    premium = 0.0 if automatic else rules.write_premium(ttl)
    if not automatic and next_turn * rules.read_saving <= premium:
        return False  # the write would not pay: neither side is cached
    cached = whole_tokens * (1.0 + premium + next_turn * (1.0 - rules.read_saving))
    return cached < deduplicated_tokens * (1.0 + next_turn * (1.0 + premium))
