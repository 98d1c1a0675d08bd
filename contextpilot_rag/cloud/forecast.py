"""Where a prompt's prefix will be read again: the breakpoint candidates the pilot
proposes (:class:`~.breakpoints.ReuseCandidate`), from its index and the conversation.

- **system**: read by the other requests with this system prompt; their recent
  number (within the lifetime) predicts the next window's. A system prompt no recent
  request shares is expected to be read as often as the system prompts seen anew so
  far were sent again within the lifetime (learnt by the pilot).
- **shared_blocks** (a prompt without history): after each leading block ``k``, read
  by the requests that will start with the same ``k`` blocks. The index counts the
  recent ones that did; block popularity predicts the ones that will, as placing a
  block first *because* others carry it is the point of the reorder: the system
  prompt's recent requests × the smallest share of requests that carried any of the
  ``k`` blocks, halved for each block past the first one after the deepest prefix a
  recent request shares. The smallest share bounds the share carrying all ``k``
  blocks only from above; later requests that go past where recent ones left this
  path mostly leave it within a block or two, so spare breakpoints belong there.
- **history**: the end of the conversation's history, from where the deepest prefix an
  earlier turn cached is read back (and the rest written for the next turn): the
  previous turn's, or where that turn wrote none, an earlier one's within the
  provider's lookback (a turn whose tail was not worth a write leaves the next turn
  the entries before it; without a breakpoint at the history's end that turn would
  read none of them).
- **tail**: the end of this turn, read by the conversation's next turn.

Both conversation candidates are read by every later turn that comes while the cache
lives (each prompt starts with the previous one), so their expected reads are the
expected later turns (``later_turns``), not only the chance of the next one: with a
one-hour lifetime, whose write premium a single read does not repay, the difference
decides whether a conversation is cached at all.

Every candidate also says whether a breakpoint is believed cached at that exact prefix
(the pilot's :class:`~.ledger.CacheLedger`): writing it again is then a read.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .breakpoints import ReuseCandidate
from .ledger import CacheLedger

if TYPE_CHECKING:
    from ..index import ContextIndex

__all__ = ["IndexSignals", "PromptShape", "ReuseSignals", "reuse_candidates"]


@dataclass(frozen=True)
class PromptShape:
    """Token and index positions of one prompt. Tokens count from the prompt's start
    (pilot tokenizer); depths are lengths of its index path (system prompt key,
    history, blocks, tail)."""

    system_tokens: int  # 0: no system message
    user_message_index: int
    history_tokens: int  # before the current user message
    # per history turn, latest first: index depth and tokens through its tail (the end
    # of its user message), and the content blocks after it up to the history's end
    turn_ends: tuple[tuple[int, int, int], ...]
    block_ends: tuple[int, ...]  # each block's end, in final order
    prompt_tokens: int
    fixed_depth: int  # index depth before this turn's blocks
    earlier_turns: int
    conversation: bool
    # the first history turn's blocks: their user message, and per block its index
    # depth and the tokens through it (a later turn's prompt starts with them)
    opening_message_index: int = 0
    opening_blocks: tuple[tuple[int, int], ...] = ()


class ReuseSignals(Protocol):
    """What the pilot's state says about reuse (lock held)."""

    def recent_sharing(self, depth: int) -> int:
        """Other requests, recent within the lifetime, that share the prompt's index
        path up to ``depth``."""
        ...

    def block_share(self, count: int) -> float:
        """The expected share of requests that carry the prompt's first ``count``
        blocks, in [0, 1]."""
        ...

    def cached(self, depth: int) -> bool:
        """Whether a breakpoint is believed cached at the index path up to ``depth``."""
        ...


def reuse_candidates(
    shape: PromptShape,
    signals: ReuseSignals,
    next_turn_probability: float | None,
    new_system_reads: float = 0.0,
    later_turns: float | None = None,
    lookback_blocks: int | None = None,
) -> list[ReuseCandidate]:
    """The breakpoint candidates of one prompt, in prompt order. ``new_system_reads``:
    the reads expected of a system prompt no recent request shares (the chance that a
    system prompt seen anew is sent again within the lifetime; 0: none).
    ``later_turns``: the conversation's turns expected after this one, each within the
    lifetime of the one before (the reads of the history and tail candidates; ``None``:
    the next turn's chance alone). ``lookback_blocks``: how many content blocks before a
    breakpoint the provider looks for a cached prefix (``None``: no limit)."""
    candidates: list[ReuseCandidate] = []
    system_reads: float = 0.0
    if shape.system_tokens:
        system_reads = signals.recent_sharing(1)
        cached = shape.system_tokens if signals.cached(1) else 0
        basis = f"{system_reads} recent requests share the system prompt"
        if not system_reads and new_system_reads > 0.0:
            system_reads = new_system_reads
            basis = (
                "no recent request shares the system prompt; one seen anew is sent again "
                f"within the lifetime with p={new_system_reads:.2f}"
            )
        candidates.append(
            ReuseCandidate("system", 0, 0, shape.system_tokens, system_reads, cached, basis, 1)
        )
    if shape.earlier_turns == 0:
        candidates += _shared_blocks(shape, signals, system_reads)
    else:
        candidates += _opening_blocks(shape, signals)
    p_next = _next_turn(shape, next_turn_probability)
    reads = p_next if later_turns is None or not shape.conversation else later_turns
    if shape.earlier_turns:
        cached, basis = 0, "the conversation's next turn"
        for back, (depth, tokens, after) in enumerate(shape.turn_ends):
            if lookback_blocks is not None and after >= lookback_blocks:
                break  # too far before the breakpoint to be found
            if signals.cached(depth):
                cached = tokens
                basis = (
                    "the conversation's previous turn cached its prefix"
                    if back == 0
                    else f"the conversation's turn {back + 1} turns back cached its prefix"
                )
                break
        candidates.append(
            ReuseCandidate(
                "history",
                shape.user_message_index - 1,
                -1,
                shape.history_tokens,
                reads,
                cached,
                basis,
                shape.fixed_depth,
            )
        )
    if shape.conversation:
        candidates.append(
            ReuseCandidate(
                "tail",
                shape.user_message_index,
                -1,
                shape.prompt_tokens,
                reads,
                0,
                f"next turn of the conversation (p={p_next:.2f}; {reads:.2f} later turns)",
                shape.fixed_depth + len(shape.block_ends) + 1,
            )
        )
    return candidates


_UNSHARED_DECAY = 0.5
"""Popularity's prediction is multiplied by this for each block past the first one
after the deepest prefix a recent request shares."""


def _shared_blocks(
    shape: PromptShape, signals: ReuseSignals, system_reads: float
) -> list[ReuseCandidate]:
    candidates = []
    unshared = 0  # blocks up to here after the deepest prefix a recent request shares
    for count, end_tokens in enumerate(shape.block_ends, start=1):
        depth = shape.fixed_depth + count
        seen = signals.recent_sharing(depth)
        unshared = 0 if seen else unshared + 1
        decay = _UNSHARED_DECAY ** max(0, unshared - 1)
        predicted = system_reads * signals.block_share(count) * decay
        reads = max(float(seen), predicted)
        if reads <= 0 and not signals.cached(depth):
            continue
        basis = f"{seen} recent requests share these blocks; popularity predicts {predicted:.2f}"
        cached = end_tokens if signals.cached(depth) else 0
        candidates.append(
            ReuseCandidate(
                "shared_blocks",
                shape.user_message_index,
                count - 1,
                end_tokens,
                reads,
                cached,
                basis,
                depth,
            )
        )
    return candidates


def _opening_blocks(shape: PromptShape, signals: ReuseSignals) -> list[ReuseCandidate]:
    """A later turn's prompt starts with its conversation's first turn, whose ends of
    shared blocks other conversations' first turns read. A breakpoint there costs a
    later turn nothing (it reads or writes a deeper prefix anyway) and keeps the entry
    alive: without it the entry expires a lifetime after the first turn, however long
    the conversation goes on. Candidates where an entry is believed cached, read by
    the recent requests that share the prefix. Those count the conversation's own
    turns, and a later user may come after a quiet spell: as the breakpoint is free,
    no share of readers is required of it."""
    candidates = []
    for count, (depth, end_tokens) in enumerate(shape.opening_blocks, start=1):
        if not signals.cached(depth):
            continue
        seen = signals.recent_sharing(depth)
        candidates.append(
            ReuseCandidate(
                "shared_blocks",
                shape.opening_message_index,
                count - 1,
                end_tokens,
                float(seen),
                end_tokens,
                f"the conversation's first turn cached these blocks (free here: this turn "
                f"reads or writes past them); {seen} recent requests share them, this "
                "conversation's turns included",
                depth,
            )
        )
    return candidates


def _next_turn(shape: PromptShape, fixed: float | None) -> float:
    if not shape.conversation:
        return 0.0
    if fixed is not None:
        return fixed
    return (shape.earlier_turns + 1) / (shape.earlier_turns + 2)


class IndexSignals:
    """:class:`ReuseSignals` read from a context index, block popularity and the
    cache ledger, for one prompt whose index path is ``path``.

    ``shares``: each block's share of requests (popularity / requests counted), in
    final order. ``ledger_key`` turns a path prefix into the ledger's key (a tenant's
    salt goes in it)."""

    def __init__(
        self,
        index: ContextIndex | None,
        path: Sequence[str],
        *,
        since: float,
        limit: int,
        shares: Sequence[float],
        ledger: CacheLedger,
        ledger_key: Callable[[int], Hashable],
        now: float,
        ttl_s: float,
    ) -> None:
        self._index, self._path, self._since, self._limit = index, path, since, limit
        self._ledger, self._ledger_key, self._now, self._ttl_s = ledger, ledger_key, now, ttl_s
        self._smallest_share = list(itertools.accumulate(shares, min))
        # the shallowest depth found shared by no recent request: a longer prefix of
        # the same path is shared by a subset of those requests, so it is not read again
        self._none_from = len(path) + 1

    def recent_sharing(self, depth: int) -> int:
        if self._index is None or depth >= self._none_from:
            return 0
        seen = self._index.recent_sharing(
            self._path[:depth], self._since, limit=self._limit, budget=8 * self._limit
        )
        if seen == 0:
            self._none_from = depth
        return seen

    def block_share(self, count: int) -> float:
        if not 0 < count <= len(self._smallest_share):
            return 0.0
        return min(1.0, self._smallest_share[count - 1])

    def cached(self, depth: int) -> bool:
        return self._ledger.fresh(self._ledger_key(depth), self._now, self._ttl_s)
