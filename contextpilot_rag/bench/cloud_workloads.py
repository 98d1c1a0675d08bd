"""Timed workloads for the cloud-cache cost benchmark (``bench --suite cloud``).

A hosted cache forgets a prefix a few minutes after its last use, so when requests
arrive matters as much as what they carry. Each family below puts the requests of a
:mod:`~contextpilot_rag.bench.workloads` generator on a simulated clock:

* **multi-turn** — :func:`~.workloads.multiturn_workload` conversations of 3–6 turns
  (each cut to a drawn length), each later turn retrieving a fraction of its documents
  again (30%, 40%, 50% or 60%, by seed); conversations start about every
  ``session_gap_s`` seconds (drawn per seed, :data:`SESSION_GAP_RANGE_S`), their turns
  10–60 s apart.
* **multi-session** — many users over one shared, Zipf-popular corpus
  (:func:`~.workloads.topic_workload`: knowledge bases of skewed popularity, documents
  of skewed popularity within each; their number drawn per seed, :data:`TOPICS_RANGE`);
  users arrive at random, about every ``user_gap_s`` seconds (drawn,
  :data:`USER_GAP_RANGE_S`), each asks 1–4 questions as a conversation, 10–60 s apart.
* **no-overlap** — single-turn requests whose documents are all distinct (no document
  is ever retrieved twice), about every ``gap_s`` seconds, ``k`` documents each (both
  drawn, :data:`NO_OVERLAP_GAP_RANGE_S`, :data:`NO_OVERLAP_K_RANGE`).

How often requests arrive decides how many are alive together in a cache lifetime (and
on one route of an automatic cache), so it is drawn, not fixed: a family is the same
shape at several densities. Seconds are drawn log-uniformly, counts uniformly; an
argument given explicitly is used as is. Pure functions of their arguments: the same
seed gives the same workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import ConfigError
from .workloads import (
    SYSTEM_PROMPT,
    WorkloadRequest,
    log_uniform,
    multiturn_workload,
    online_workload,
    topic_workload,
)

__all__ = [
    "FAMILIES",
    "NO_OVERLAP_GAP_RANGE_S",
    "NO_OVERLAP_K_RANGE",
    "REFETCH_FRACTIONS",
    "SESSION_GAP_RANGE_S",
    "TOPICS_RANGE",
    "USER_GAP_RANGE_S",
    "CloudWorkload",
    "TimedRequest",
    "cloud_workload",
    "multisession_family",
    "multiturn_family",
    "no_overlap_family",
]

FAMILIES = ("multi-turn", "multi-session", "no-overlap")
REFETCH_FRACTIONS = (0.3, 0.4, 0.5, 0.6)
"""Multi-turn: the share of a later turn's documents retrieved again, by ``seed % 4``."""

SESSION_GAP_RANGE_S = (0.5, 20.0)
"""Multi-turn: mean seconds between conversation starts, drawn per seed."""
USER_GAP_RANGE_S = (0.25, 5.0)
"""Multi-session: mean seconds between users' arrivals, drawn per seed."""
TOPICS_RANGE = (10, 60)
"""Multi-session: knowledge bases, drawn per seed."""
NO_OVERLAP_GAP_RANGE_S = (0.2, 5.0)
"""No-overlap: mean seconds between requests, drawn per seed."""
NO_OVERLAP_K_RANGE = (5, 15)
"""No-overlap: documents per request, drawn per seed."""

_TURN_GAP_S = (10.0, 60.0)


def _drawn(seed: int, stream: int) -> np.random.Generator:
    """The generator of a family's drawn parameters (apart from its requests')."""
    return np.random.default_rng([seed, stream, 25])


def _count_and_gap(
    seed: int,
    stream: int,
    count: tuple[int | None, tuple[int, int]],
    gap_s: tuple[float | None, tuple[float, float]],
) -> tuple[int, float]:
    """A count (uniform in its range) and a gap (log-uniform), each drawn unless given
    (both are drawn either way, so giving one leaves the other as drawn)."""
    rng = _drawn(seed, stream)
    (given_count, (low, high)), (given_gap, gap_range) = count, gap_s
    drawn_count = int(rng.integers(low, high + 1))
    drawn_gap = log_uniform(rng, gap_range)
    return (
        drawn_count if given_count is None else given_count,
        drawn_gap if given_gap is None else given_gap,
    )


@dataclass(frozen=True)
class TimedRequest:
    """A request and the simulated second it is sent at. ``user`` names the sender (the
    conversation for a turn; the request itself for a single-turn request)."""

    request: WorkloadRequest
    at_s: float
    user: str


@dataclass(frozen=True)
class CloudWorkload:
    """Requests in send order (``at_s`` non-decreasing) over ``corpus``."""

    family: str
    seed: int
    description: str
    corpus: Mapping[str, str] = field(repr=False)
    requests: tuple[TimedRequest, ...] = field(repr=False)
    system_prompt: str = SYSTEM_PROMPT

    @property
    def duration_s(self) -> float:
        return self.requests[-1].at_s if self.requests else 0.0


def _sorted(requests: list[TimedRequest]) -> tuple[TimedRequest, ...]:
    return tuple(sorted(requests, key=lambda timed: timed.at_s))  # stable: turns keep order


def _span(requests: tuple[TimedRequest, ...]) -> str:
    seconds = requests[-1].at_s if requests else 0.0
    return f"{seconds:.0f} s in all ({len(requests) / max(seconds, 1.0):.1f} requests/s)"


def _turn_times(rng: np.random.Generator, start_s: float, turns: int) -> list[float]:
    gaps = rng.uniform(*_TURN_GAP_S, size=max(0, turns - 1)).tolist()
    return [start_s + sum(gaps[:turn]) for turn in range(turns)]


def multiturn_family(
    seed: int, *, conversations: int = 120, k: int = 10, session_gap_s: float | None = None
) -> CloudWorkload:
    """Conversations of 3–6 turns, ``k`` documents a turn (~200 tokens each), the
    share of documents retrieved again :data:`REFETCH_FRACTIONS` ``[seed % 4]``;
    ``session_gap_s`` ``None``: drawn from :data:`SESSION_GAP_RANGE_S`."""
    if session_gap_s is None:
        session_gap_s = log_uniform(_drawn(seed, 4), SESSION_GAP_RANGE_S)
    fraction = REFETCH_FRACTIONS[seed % len(REFETCH_FRACTIONS)]
    base = multiturn_workload(
        n_sessions=conversations,
        turns=6,
        interleave=conversations,
        k=k,
        reretrieve_fraction=fraction,
        n_docs=2000,
        seed=seed,
    )
    rng = np.random.default_rng([seed, 1])
    by_session: dict[str, list[WorkloadRequest]] = {}
    for request in base.requests:
        by_session.setdefault(request.session or "", []).append(request)
    timed: list[TimedRequest] = []
    start_s = 0.0
    for session, turns in by_session.items():
        start_s += float(rng.exponential(session_gap_s))
        kept = turns[: int(rng.integers(3, 7))]
        for request, at_s in zip(kept, _turn_times(rng, start_s, len(kept)), strict=True):
            timed.append(TimedRequest(request, at_s, session))
    requests = _sorted(timed)
    description = (
        f"{conversations} conversations of 3–6 turns, {k} documents a turn, "
        f"{fraction:.0%} of a later turn's documents retrieved again; a conversation "
        f"starting every {session_gap_s:.2g} s on average, turns 10–60 s apart, "
        f"{_span(requests)}"
    )
    return CloudWorkload("multi-turn", seed, description, base.corpus, requests)


def multisession_family(
    seed: int,
    *,
    requests: int = 1500,
    topics: int | None = None,
    docs_per_topic: int = 24,
    k: int = 10,
    user_gap_s: float | None = None,
) -> CloudWorkload:
    """Users arriving about every ``user_gap_s`` seconds, each sending the next 1–4
    requests of a :func:`~.workloads.topic_workload` stream as one conversation;
    ``topics`` and ``user_gap_s`` ``None``: drawn (:data:`TOPICS_RANGE`,
    :data:`USER_GAP_RANGE_S`)."""
    topics, user_gap_s = _count_and_gap(
        seed, 5, (topics, TOPICS_RANGE), (user_gap_s, USER_GAP_RANGE_S)
    )
    base = topic_workload(
        n_topics=topics, docs_per_topic=docs_per_topic, n_requests=requests, k=k, seed=seed
    )
    rng = np.random.default_rng([seed, 2])
    timed: list[TimedRequest] = []
    start_s, position, number = 0.0, 0, 0
    while position < len(base.requests):
        number += 1
        user = f"u-{number:05d}"
        start_s += float(rng.exponential(user_gap_s))
        turns = base.requests[position : position + int(rng.integers(1, 5))]
        position += len(turns)
        times = _turn_times(rng, start_s, len(turns))
        for turn, (request, at_s) in enumerate(zip(turns, times, strict=True)):
            timed.append(TimedRequest(replace(request, session=user, turn=turn), at_s, user))
    sent = _sorted(timed)
    description = (
        f"{requests} requests from {number} users (1–4 turns each), {topics} knowledge bases "
        f"of {docs_per_topic} documents, Zipf popularity over both, {k} documents a request; "
        f"a user arriving every {user_gap_s:.2g} s on average, turns 10–60 s apart, {_span(sent)}"
    )
    return CloudWorkload("multi-session", seed, description, base.corpus, sent)


def no_overlap_family(
    seed: int, *, requests: int = 300, k: int | None = None, gap_s: float | None = None
) -> CloudWorkload:
    """Single-turn requests, ``k`` documents each, no document in two requests;
    ``k`` and ``gap_s`` ``None``: drawn (:data:`NO_OVERLAP_K_RANGE`,
    :data:`NO_OVERLAP_GAP_RANGE_S`)."""
    k, gap_s = _count_and_gap(seed, 6, (k, NO_OVERLAP_K_RANGE), (gap_s, NO_OVERLAP_GAP_RANGE_S))
    base = online_workload(n_docs=requests * k, n_requests=requests, k=k, seed=seed)
    rng = np.random.default_rng([seed, 3])
    doc_ids = list(base.corpus)
    order = rng.permutation(len(doc_ids)).tolist()
    timed: list[TimedRequest] = []
    at_s = 0.0
    for number, request in enumerate(base.requests):
        at_s += float(rng.exponential(gap_s))
        docs = tuple(doc_ids[i] for i in order[number * k : (number + 1) * k])
        user = f"r-{number:05d}"
        timed.append(TimedRequest(replace(request, doc_ids=docs), at_s, user))
    sent = _sorted(timed)
    description = (
        f"{requests} single-turn requests of {k} documents, no document twice; "
        f"one every {gap_s:.2g} s on average, {_span(sent)}"
    )
    return CloudWorkload("no-overlap", seed, description, base.corpus, sent)


def cloud_workload(family: str, seed: int, scale: float = 1.0) -> CloudWorkload:
    """The workload of ``family`` (:data:`FAMILIES`) for ``seed``; ``scale`` shrinks or
    grows its number of conversations / requests (tests use a small one)."""
    if not scale > 0:
        raise ConfigError(f"scale must be > 0, got {scale!r}")
    if family == "multi-turn":
        return multiturn_family(seed, conversations=max(2, round(120 * scale)))
    if family == "multi-session":
        return multisession_family(seed, requests=max(4, round(1500 * scale)))
    if family == "no-overlap":
        return no_overlap_family(seed, requests=max(2, round(300 * scale)))
    raise ConfigError(f"unknown workload family {family!r}; choose from {', '.join(FAMILIES)}")
