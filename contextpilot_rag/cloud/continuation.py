"""How often a conversation's turn is followed by its next turn while the cache lives:
the reads a ``tail`` (and ``history``) breakpoint can expect (``docs/cloud.md``).

A turn is *followed* when the conversation's next turn comes within ``ttl_s`` of it
(later, its cached prefix has expired). Per turn number ``t`` the estimate is the
share of resolved turns that were followed, shrunk toward the rule of succession
``(t + 1) / (t + 2)`` (what is assumed with no observation) by ``prior_weight``
pseudo-turns. So a workload whose conversations stop at a fixed length stops writing
tails its last turns never read, and one whose conversations go on keeps them.

:meth:`later_turns` chains the estimates: how many more turns a conversation is
expected to send, each within ``ttl_s`` of the one before (every one of them reads what
this turn caches, since each prompt starts with the previous one).

It also keeps the gaps between followed turns, so :meth:`returns_within` can say how
likely the next turn is within a shorter window (what a route's request rate sees).

**Censoring.** A followed turn is known as soon as its next turn comes; a turn that is
not followed is known only when ``ttl_s`` has passed. Counting only resolved turns
therefore sees the followed ones minutes earlier than the others: for the first
``ttl_s`` of a run no turn resolves as not followed at all, and every estimate leans
toward "the conversation goes on" (on a workload of conversations of one to four
turns, shorter in all than a five-minute lifetime, a first turn was expected to be
followed by far more turns than any conversation sent). So once enough gaps are known
(:data:`MIN_GAPS`), a turn that has waited longer than the longest recent gap is
*presumed ended*: counted as not followed then, and counted as followed after all if
its next turn still comes within ``ttl_s`` (so no count stays wrong; only their timing
changes).

Invariant: every observed turn is pending (its conversation's next turn may still
come; at most one per conversation, oldest first), presumed ended (counted in
``resolved``; its conversation's next turn within ``ttl_s`` moves it into
``followed``), or counted in ``resolved`` (and in ``followed`` when its next turn came
in time). Not thread-safe by itself: the pilot's lock guards it.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable, Iterable

from ..errors import ConfigError

__all__ = ["CHAIN_TURNS", "ContinuationTracker", "chained_turns"]

_GAPS_KEPT = 256
MIN_GAPS = 16
"""Gaps between followed turns needed before a waiting turn is presumed ended earlier
than ``ttl_s`` (module docstring, *Censoring*)."""
CHAIN_TURNS = 16
"""Later turns counted at most by :meth:`ContinuationTracker.later_turns` (the prior
alone, ``(t + 1) / (t + 2)`` per turn, would never stop)."""


def chained_turns(probabilities: Iterable[float]) -> float:
    """Expected later turns when the ``j``-th later turn comes (within the lifetime of
    the one before) with the ``j``-th probability, given the earlier ones came: the sum
    of the running products, over at most :data:`CHAIN_TURNS` turns."""
    total, chance = 0.0, 1.0
    for probability in itertools.islice(probabilities, CHAIN_TURNS):
        chance *= probability
        if chance <= 0.0:
            break
        total += chance
    return total


class ContinuationTracker:
    """Counts followed and resolved turns per turn number (see the module docstring).
    ``capacity`` bounds the pending conversations; the oldest is resolved as not
    followed when it is exceeded."""

    def __init__(self, ttl_s: float, *, prior_weight: float = 2.0, capacity: int = 65_536) -> None:
        if not ttl_s > 0 or not prior_weight > 0:
            raise ConfigError("ContinuationTracker needs ttl_s > 0 and prior_weight > 0")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError("ContinuationTracker capacity must be a positive int")
        self._ttl_s, self._prior_weight, self._capacity = ttl_s, prior_weight, capacity
        self._pending: OrderedDict[Hashable, tuple[int, float]] = OrderedDict()
        # turns counted as not followed before ttl_s, until it has passed (oldest first)
        self._presumed: OrderedDict[Hashable, tuple[int, float]] = OrderedDict()
        self._followed: Counter[int] = Counter()
        self._resolved: Counter[int] = Counter()
        self._gaps: deque[float] = deque(maxlen=_GAPS_KEPT)  # between followed turns
        self._ordered_gaps: list[float] = []  # the same, sorted

    def probability(self, turn: int, now: float) -> float:
        """The chance that turn number ``turn`` (0: a conversation's first) is followed
        by the next within ``ttl_s``, in [0, 1]."""
        self._expire(now)
        return self._estimate(turn)

    def _estimate(self, turn: int) -> float:
        """:meth:`probability` as the counts stand (expired turns already resolved)."""
        prior = (turn + 1) / (turn + 2)
        weight = self._prior_weight
        return (self._followed[turn] + weight * prior) / (self._resolved[turn] + weight)

    def resolved(self, turn: int, now: float) -> int:
        """How many turns numbered ``turn`` are known followed or not (the evidence
        behind :meth:`probability`; before any, it is the prior alone)."""
        self._expire(now)
        return self._resolved[turn]

    def later_turns(self, turn: int, now: float) -> float:
        """The turns expected after turn number ``turn``, each within ``ttl_s`` of the
        previous one (:func:`chained_turns` of :meth:`probability` for ``turn``,
        ``turn + 1``, ...): the reads a prefix this turn writes can expect. Past the
        deepest turn number resolved so far, the chain goes on with that turn's
        estimate, not the prior: a chance of reaching a turn no conversation has
        reached is already small, and the prior's ``(t + 1) / (t + 2)`` would multiply
        it several times over (conversations that always stop after two turns would
        keep writing their last turns' tails)."""
        self._expire(now)
        resolved = [number for number, count in self._resolved.items() if count]
        last = max(turn, *resolved) if resolved else None  # estimates beyond it repeat
        return chained_turns(
            self._estimate(t if last is None else min(t, last)) for t in itertools.count(turn)
        )

    def returns_within(self, turn: int, seconds: float, now: float) -> float:
        """The chance that turn number ``turn`` is followed by the next within
        ``seconds`` (at most ``ttl_s``): :meth:`probability` times the share of the
        recent followed turns that came that soon (with one pseudo-gap that did, so
        1 before any is seen)."""
        within = bisect_right(self._ordered_gaps, seconds)
        return self.probability(turn, now) * (within + 1) / (len(self._gaps) + 1)

    def gap_quantile(self, quantile: float) -> float:
        """The ``quantile`` of the recent gaps between a turn and its next (``ttl_s``
        before any is seen): how long a conversation that has not come back is still
        likely to."""
        ordered = self._ordered_gaps
        if not ordered:
            return self._ttl_s
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]

    def pending(self, conversation: Hashable, now: float) -> bool:
        """Whether ``conversation`` sent a turn within ``ttl_s`` whose next has not
        come yet (its next turn would now count as followed)."""
        self._expire(now)
        return conversation in self._pending or conversation in self._presumed

    def observe(self, conversation: Hashable, turn: int, now: float) -> None:
        """``conversation`` sends its turn number ``turn`` now (sending the same turn
        again, a retry, changes nothing but its time)."""
        self._expire(now)
        presumed = self._presumed.pop(conversation, None)
        if presumed is not None:  # counted as not followed: correct that if it was
            if presumed[0] == turn - 1:
                self._followed[turn - 1] += 1
                self._add_gap(now - presumed[1])
            elif presumed[0] == turn:  # a retry: the turn waits again (pending below)
                self._resolved[turn] -= 1
        previous = self._pending.pop(conversation, None)
        if previous is not None and previous[0] != turn:
            followed = previous[0] == turn - 1
            self._resolve(previous[0], followed=followed)
            if followed:
                self._add_gap(now - previous[1])
        self._pending[conversation] = (turn, now)
        while len(self._pending) > self._capacity:
            _, (oldest, _) = self._pending.popitem(last=False)
            self._resolve(oldest, followed=False)

    def sighted(self, thing: Hashable, now: float) -> None:
        """``thing`` (a system prompt, a block) is sent now: as turn 0 when it was not
        sent within ``ttl_s`` (seen anew), else as turn 1, its return. Turn 0's
        :meth:`probability` is then the chance that something seen anew is sent again
        within the lifetime."""
        self.observe(thing, 1 if self.pending(thing, now) else 0, now)

    def _add_gap(self, gap: float) -> None:
        if len(self._gaps) == self._gaps.maxlen:
            oldest = self._gaps[0]
            del self._ordered_gaps[bisect_left(self._ordered_gaps, oldest)]
        self._gaps.append(gap)
        insort(self._ordered_gaps, gap)

    def _expire(self, now: float) -> None:
        """Resolve the turns that waited past the horizon as not followed (presumed
        ended while ``ttl_s`` has not passed); forget presumed ones past ``ttl_s``."""
        horizon = self._ttl_s
        if len(self._ordered_gaps) >= MIN_GAPS:
            horizon = min(horizon, self._ordered_gaps[-1])
        while self._pending:
            conversation, (turn, sent) = next(iter(self._pending.items()))
            if now - sent <= horizon:
                break
            del self._pending[conversation]
            self._resolve(turn, followed=False)
            if now - sent <= self._ttl_s:
                self._presumed[conversation] = (turn, sent)
        while self._presumed:
            _, (_, sent) = next(iter(self._presumed.items()))
            if now - sent <= self._ttl_s and len(self._presumed) <= self._capacity:
                break
            self._presumed.popitem(last=False)

    def _resolve(self, turn: int, *, followed: bool) -> None:
        self._resolved[turn] += 1
        self._followed[turn] += followed
