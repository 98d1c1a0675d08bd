"""The best possible prefix sharing of a small batch, exactly, and a bound for any batch.

The batch problem (unbounded cache, block granularity): every request is a set of
distinct blocks; a plan chooses each request's block order and an execution order; a
request hits the longest common prefix of its sequence with any earlier request's
sequence (in blocks, each weighted by its size). The sent sequences form a trie, and a
request adds exactly the trie nodes it does not share with an earlier one, so

    hits = weight of everything sent - weight of the trie of all sequences

for every execution order: only the block orders matter, and the optimum is the
lightest trie. :func:`optimal_hits` finds it by exhaustive search with memoisation
(exponential: a handful of requests only); :func:`seen_before_bound` bounds every plan
of every size without search ("every block seen before is a hit"), and
:func:`best_partner_bound` more tightly ("a request hits at most what it shares with
the one request whose path it follows"), and :func:`separation_bound` by counting the
trie's nodes at every depth (requests that share little must part early).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

__all__ = [
    "OptimalPlan",
    "best_partner_bound",
    "best_partner_shares",
    "optimal_hits",
    "plan_hits",
    "random_instance",
    "seen_before_bound",
    "separation_bound",
    "separation_width",
]

_Key = tuple[tuple[int, ...], ...]
"""Sets of blocks as a canonical multiset: sorted tuples of sorted, non-empty tuples."""


@dataclass(frozen=True)
class OptimalPlan:
    """``sequences[i]``: request ``i``'s blocks in the best order; ``hits``: the weight
    of blocks hit when the sequences run in any order."""

    sequences: tuple[tuple[int, ...], ...]
    hits: float


def plan_hits(
    sequences_in_execution_order: Sequence[Sequence[int]],
    weights: Mapping[int, float] | None = None,
    *,
    min_hit: float = 0.0,
) -> float:
    """Weight of the blocks hit: each sequence's longest common prefix with any
    earlier sequence (unbounded cache, block granularity), counted only where it weighs
    at least ``min_hit`` (a provider that caches no shorter prefix)."""
    seen: set[tuple[int, ...]] = set()
    hits = 0.0
    for sequence in sequences_in_execution_order:
        prefix: tuple[int, ...] = ()
        hit = 0.0
        for block in sequence:
            prefix += (block,)
            if prefix not in seen:
                break
            hit += _weight(weights, block)
        hits += hit if hit >= min_hit else 0.0
        seen.update(tuple(sequence[:end]) for end in range(1, len(sequence) + 1))
    return hits


def seen_before_bound(
    requests: Sequence[Collection[int]], weights: Mapping[int, float] | None = None
) -> float:
    """An upper bound on the hits of every plan: a block can hit only where it was in
    an earlier request, so each block hits at most once fewer than it occurs."""
    counts = Counter(block for request in requests for block in set(request))
    return sum((count - 1) * _weight(weights, block) for block, count in counts.items())


def best_partner_shares(
    requests: Sequence[Collection[int]],
    weights: Mapping[int, float] | None = None,
    *,
    earlier_only: bool = False,
) -> np.ndarray:
    """Per request, the weight of the blocks it shares with its best partner: any other
    request, or with ``earlier_only`` the requests before it (0 where none shares a
    block). Work is the sum over blocks of their holders squared, vectorised."""
    holders: dict[int, list[int]] = defaultdict(list)
    for row, request in enumerate(requests):
        for block in set(request):
            holders[block].append(row)
    rows = {block: np.asarray(members) for block, members in holders.items() if len(members) > 1}
    best = np.zeros(len(requests))
    shared = np.zeros(len(requests))
    for row, request in enumerate(requests):
        shared[:] = 0.0
        for block in set(request):
            if block in rows:
                shared[rows[block]] += _weight(weights, block)
        shared[row] = 0.0
        if earlier_only:
            shared[row:] = 0.0
        best[row] = shared.max(initial=0.0)
    return best


def best_partner_bound(
    requests: Sequence[Collection[int]],
    weights: Mapping[int, float] | None = None,
    *,
    earlier_only: bool = False,
) -> float:
    """An upper bound on the hits of every plan: a request's hit is a prefix of its
    sequence that one earlier request's sequence also starts with, so it is at most
    the weight of the blocks it shares with its best partner
    (:func:`best_partner_shares`). ``earlier_only``: the execution order is fixed
    (online) and partners are the requests before it; otherwise (batch) any other
    request can be the partner, and whichever request runs first hits nothing, so the
    smallest best share is taken off."""
    best = best_partner_shares(requests, weights, earlier_only=earlier_only)
    total = float(best.sum())
    return total if earlier_only or not len(requests) else total - float(best.min())


def separation_bound(
    requests: Sequence[Collection[int]],
    weights: Mapping[int, float] | None = None,
    *,
    levels: int = 300,
    min_prefix: float = 0.0,
) -> float:
    """An upper bound on the hits of every plan, in any execution order, from the
    trie's width at every depth.

    Measure depth in weight: block ``j`` of a sequence spans ``[c_{j-1}, c_j)``, its
    prefix's cumulative weights, and the trie's weight is the integral over depth ``t``
    of ``N(t)``, the number of trie nodes spanning ``t``. Two requests pass through the
    same node at ``t`` only if their sequences share a prefix heavier than ``t``, so
    only if the blocks they share weigh more than ``t``. Hence any set of requests
    heavier than ``t`` that pairwise share at most ``t`` sits on distinct nodes at
    ``t``: ``N(t)`` is at least its size. And in any execution order the requests that
    hit deeper than ``t`` (share more than ``t`` with an earlier one) number ``A(t) −
    N(t)``, ``A(t)`` being the requests heavier than ``t``: of each node's requests all
    but the first. Hits are the integral of that count, at most the weight sent less
    the integral of the independent sets' sizes.

    ``min_prefix``: only hits of at least that weight count (a provider caches no
    shorter prefix); they are at most ``min_prefix · (A − N)`` just below
    ``min_prefix`` plus the integral above it.

    On ``levels`` equal depth intervals this takes, per interval, an independent set
    (minimum-degree greedy; any one is a valid witness) of the graph joining requests
    that share more than the interval's start, among the requests at least as heavy as
    its end. Exact depth counts for unit weights with ``levels`` at the longest
    request's length. Cost: O(n²) memory for the pairwise shares and about O(levels ·
    n²) vectorised work, so meant for a few thousand requests."""
    if levels < 1:
        raise ValueError(f"levels must be at least 1, got {levels}")
    if not min_prefix >= 0:
        raise ValueError(f"min_prefix must be >= 0, got {min_prefix}")
    sets = [sorted(set(request)) for request in requests]
    if len(sets) < 2:
        return 0.0
    heavy = np.array([sum(_weight(weights, b) for b in blocks) for blocks in sets])
    shared = _pairwise_shares(sets, weights)
    top = float(heavy.max())
    if min_prefix > top:
        return 0.0
    slack = 1e-9 * top  # float rounding: toward more hits (more edges, more alive)
    hits = float(np.maximum(heavy - min_prefix, 0.0).sum())  # the integral of A above it
    if min_prefix > 0:
        alive = heavy >= min_prefix - slack
        parted = _greedy_independent_set(shared >= min_prefix - slack, alive)
        hits += min_prefix * (int(alive.sum()) - parted)
    step = top / levels
    for level in range(levels):
        start, end = max(level * step, min_prefix), (level + 1) * step
        alive = heavy >= end
        if end > start and alive.any():
            hits -= (end - start) * _greedy_independent_set(shared > start, alive)
    return max(0.0, hits)


def separation_width(
    requests: Sequence[Collection[int]], weights: Mapping[int, float] | None, depth: float
) -> int:
    """The size of a set of requests heavier than ``depth`` that pairwise share at most
    ``depth`` (minimum-degree greedy, as :func:`separation_bound` takes at each depth):
    each sits on its own trie node at ``depth`` in every plan, so every plan's trie is
    at least this wide there."""
    if not depth >= 0:
        raise ValueError(f"depth must be >= 0, got {depth!r}")
    sets = [sorted(set(request)) for request in requests]
    heavy = np.array([sum(_weight(weights, b) for b in blocks) for blocks in sets])
    alive = heavy > depth
    if len(sets) < 2:
        return int(alive.sum())
    return _greedy_independent_set(_pairwise_shares(sets, weights) > depth, alive)


def _pairwise_shares(
    sets: Sequence[Sequence[int]], weights: Mapping[int, float] | None
) -> np.ndarray:
    """``shares[i, j]``: the weight of the blocks requests i and j share (0 on the
    diagonal). Work: the sum over blocks of their holders squared."""
    holders: dict[int, list[int]] = defaultdict(list)
    for row, blocks in enumerate(sets):
        for block in blocks:
            holders[block].append(row)
    shares = np.zeros((len(sets), len(sets)))
    for block, members in holders.items():
        if len(members) > 1:
            index = np.asarray(members)
            shares[np.ix_(index, index)] += _weight(weights, block)
    np.fill_diagonal(shares, 0.0)
    return shares


def _greedy_independent_set(adjacent: np.ndarray, alive: np.ndarray) -> int:
    """Size of an independent set of the ``alive`` vertices: repeatedly take a vertex
    of least degree among those left and drop its neighbours."""
    left = alive.copy()
    if not adjacent[np.ix_(left, left)].any():
        return int(left.sum())
    degree = adjacent[:, left].sum(axis=1)
    size = 0
    while left.any():
        candidates = np.flatnonzero(left)
        vertex = candidates[np.argmin(degree[candidates])]
        size += 1
        dropped = adjacent[vertex] & left
        dropped[vertex] = True
        left &= ~dropped
        degree -= adjacent[:, dropped].sum(axis=1)
    return size


def optimal_hits(
    requests: Sequence[Collection[int]], weights: Mapping[int, float] | None = None
) -> OptimalPlan:
    """The block orders with the most hits (exact). Exponential in the instance: meant
    for up to about 8 requests of 4 blocks."""
    sets = [tuple(sorted(set(request))) for request in requests]
    solver = _LightestTrie(weights)
    sequences = solver.assign(sets)
    total = sum(_weight(weights, block) for request in sets for block in request)
    return OptimalPlan(tuple(sequences), total - solver.weight(_canonical(sets)))


def random_instance(
    seed: int, *, n_requests: int, blocks_per_request: int, vocabulary: int, skew: float = 1.0
) -> list[tuple[int, ...]]:
    """``n_requests`` sets of ``blocks_per_request`` distinct blocks out of
    ``vocabulary``, drawn by Zipf popularity (``1 / rank**skew``) without
    replacement, in a random order. Deterministic in its arguments."""
    if not 1 <= blocks_per_request <= vocabulary:
        raise ValueError(f"need 1 <= blocks_per_request <= vocabulary, got {blocks_per_request}")
    rng = random.Random(seed)
    popularity = [1.0 / (rank + 1) ** skew for rank in range(vocabulary)]
    requests = []
    for _ in range(n_requests):
        keys = {block: rng.random() ** (1.0 / popularity[block]) for block in range(vocabulary)}
        chosen = sorted(keys, key=keys.__getitem__, reverse=True)[:blocks_per_request]
        rng.shuffle(chosen)
        requests.append(tuple(chosen))
    return requests


def _weight(weights: Mapping[int, float] | None, block: int) -> float:
    return 1.0 if weights is None else weights[block]


def _canonical(sets: Sequence[Sequence[int]]) -> _Key:
    return tuple(sorted(tuple(sorted(blocks)) for blocks in sets if blocks))


class _LightestTrie:
    """Memoised search for the lightest trie over a multiset of block sets.

    The root's children partition the sets by their first block. The first set takes
    some block ``b`` first; any subset of the other sets holding ``b`` joins it under
    that child, and the rest form tries of their own. A branch that puts ``b`` under
    two children overcounts (the trie would merge them), so it is never below the
    optimum, and the optimum is one of the branches: the minimum is exact."""

    def __init__(self, weights: Mapping[int, float] | None) -> None:
        self._weights = weights
        self._best: dict[_Key, tuple[float, int, tuple[int, ...]]] = {}

    def weight(self, key: _Key) -> float:
        """Weight of the lightest trie holding every set of ``key`` as a path."""
        if not key:
            return 0.0
        if key not in self._best:
            self._best[key] = self._search(key)
        return self._best[key][0]

    def _search(self, key: _Key) -> tuple[float, int, tuple[int, ...]]:
        first, rest = key[0], key[1:]
        best: tuple[float, int, tuple[int, ...]] = (float("inf"), -1, ())
        for block in first:
            holders = [i for i, blocks in enumerate(rest) if block in blocks]
            for size in range(len(holders) + 1):
                for together in combinations(holders, size):
                    inside, outside = _split(key, block, together)
                    value = (
                        _weight(self._weights, block)
                        + self.weight(_canonical(inside))
                        + self.weight(_canonical(outside))
                    )
                    if value < best[0]:
                        best = (value, block, together)
        return best

    def sequences(self, key: _Key) -> list[tuple[int, ...]]:
        """For each set of ``key``, in order, its path in the lightest trie."""
        if not key:
            return []
        self.weight(key)
        _, block, together = self._best[key]
        inside_positions = [0, *(1 + i for i in together)]
        outside_positions = [p for p in range(1, len(key)) if p - 1 not in together]
        inside, outside = _split(key, block, together)
        paths: list[tuple[int, ...]] = [()] * len(key)
        for position, path in zip(inside_positions, self.assign(inside), strict=True):
            paths[position] = (block, *path)
        for position, path in zip(outside_positions, self.assign(outside), strict=True):
            paths[position] = path
        return paths

    def assign(self, sets: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """Paths for ``sets`` in their own order (empty sets get empty paths)."""
        key = _canonical(sets)
        pool: dict[tuple[int, ...], list[tuple[int, ...]]] = defaultdict(list)
        for blocks, path in zip(key, self.sequences(key), strict=True):
            pool[blocks].append(path)
        return [pool[tuple(sorted(blocks))].pop() if blocks else () for blocks in sets]


def _split(
    key: _Key, block: int, together: tuple[int, ...]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The sets under ``block`` (the first and ``rest[together]``, ``block`` removed)
    and the others."""
    chosen = set(together)
    inside = [key[0], *(key[1 + i] for i in together)]
    outside = [blocks for i, blocks in enumerate(key[1:]) if i not in chosen]
    return [tuple(b for b in blocks if b != block) for blocks in inside], outside
