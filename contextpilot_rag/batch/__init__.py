"""Batch mode: plan a whole batch of requests at once (block order per request and an
execution order), for offline jobs of thousands to 100,000+ requests.

:meth:`contextpilot_rag.ContextPilot.optimize_batch` is the entry point; this package
holds the planners, which work on integer block codes and know nothing of prompts.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError
from .greedy import greedy_plan
from .plan import (
    BatchPlan,
    Progress,
    check_plan,
    check_requests,
    no_progress,
    orders_of,
    sequences_of,
)
from .refine import Refiner, refine_sequences
from .schedule import grouped_schedule, prefix_tree_schedule
from .trie import PrefixTrie

__all__ = [
    "JOINT_PARTNERS",
    "REFINE_UP_TO",
    "BatchMethod",
    "BatchPlan",
    "BatchSchedule",
    "Progress",
    "check_plan",
    "greedy_plan",
    "grouped_schedule",
    "no_progress",
    "plan_batch",
    "popularity_rank",
    "prefix_tree_schedule",
    "refine_sequences",
    "shared_tokens",
]

BatchMethod = Literal["auto", "greedy", "cluster"]
BatchSchedule = Literal["prefix-tree", "grouped", "builder"]

REFINE_UP_TO = 5_000
"""``plan_batch`` refines batches up to this many requests unless told otherwise. The
refining (single moves on the builds, joint moves on the kept one) grows faster than
the batch and gains less on large batches; at 100,000 requests one pass costs more
than the greedy build. The ``bench`` section of docs/benchmarks.md times it at 2,000
and 12,000 requests. A second single-move pass gains little for most of the first's
time, so it runs once."""


JOINT_PARTNERS = 3
"""The refined build ``plan_batch`` keeps gets one pass of joint moves
(:func:`refine_sequences` ``pairs``) with each request's this many heaviest partners
by shared weight. More partners gained next to nothing on the ``families`` workloads,
fewer gained less."""


def plan_batch(
    requests: Sequence[Sequence[int]],
    *,
    method: BatchMethod = "auto",
    schedule: BatchSchedule = "prefix-tree",
    weights: Sequence[float] | None = None,
    refine: bool | None = None,
    progress: Progress = no_progress,
) -> BatchPlan:
    """Block order and execution order for ``requests`` (distinct non-negative block
    codes each). ``method``: ``"greedy"`` splits groups on their most shared block;
    ``"cluster"`` is the paper's Alg. 4 (sparse pairwise distances, hierarchical
    clustering); ``"auto"`` (default) builds both and keeps the one whose block orders
    share more tokens (:func:`shared_tokens`; ties: greedy). Neither wins everywhere:
    greedy on independent Zipf draws, clustering by several points on workloads whose
    requests come in near-duplicate groups (topics, query templates), measured in the
    ``families`` section of docs/benchmarks.md. ``refine``: after the build, move each
    request to the prefix it shares most (:mod:`.refine`, one pass; never shares less),
    then move pairs of requests held apart by their prefixes together
    (:data:`JOINT_PARTNERS`). With ``"auto"`` the greedy build is refined first, and
    the clustered one too unless it already shares less than the refined greedy one
    (its pass gains much less than greedy's);
    the one that refines better gets the joint moves. Default: on up to
    :data:`REFINE_UP_TO` requests. ``schedule``:
    ``"prefix-tree"`` (depth first over the final sequences, default), ``"grouped"``
    (Alg. 5), or ``"builder"`` (the builder's own order; unrefined plans only, since
    refining moves requests between subtrees). ``weights[code]``: the block's size in
    tokens, so the planners prefer sharing long blocks."""
    if method not in ("auto", "greedy", "cluster"):
        raise ConfigError(
            f"unknown batch method {method!r}; choose one of ['auto', 'cluster', 'greedy']"
        )
    schedulers = {"prefix-tree": prefix_tree_schedule, "grouped": grouped_schedule}
    if schedule != "builder" and schedule not in schedulers:
        raise ConfigError(
            f"unknown batch schedule {schedule!r}; choose 'prefix-tree', 'grouped' or 'builder'"
        )
    flat = check_requests(requests, weights)
    requests, weights = _dense_codes(requests, weights, flat)
    if refine is None:
        refine = schedule != "builder" and len(requests) <= REFINE_UP_TO
    elif refine and schedule == "builder":
        raise ConfigError("schedule='builder' keeps the builder's order: use refine=False")
    builds = {
        "greedy": lambda: greedy_plan(requests, weights=weights, progress=progress),
        "cluster": lambda: _cluster(requests, progress),
    }
    candidates = [
        builds[name]() for name in (("greedy", "cluster") if method == "auto" else (method,))
    ]
    if not refine:
        plan = _most_shared(requests, candidates, weights)
        if schedule == "builder":
            return plan
        sequences = sequences_of(requests, plan.orders)
    else:
        sized = _code_weights(requests, weights)
        rank = popularity_rank(requests)
        refiners = [
            Refiner(sequences_of(requests, plan.orders), sized, rank) for plan in candidates
        ]
        best, best_shared = refiners[0], -1.0
        for refiner in refiners:  # greedy first: its pass gains the most
            if best_shared >= 0.0 and refiner.shared() < best_shared:
                continue  # behind before its pass; the clustered build's gains little
            refiner.single_passes(1)
            shared = refiner.shared()
            if shared > best_shared:  # ties: the first
                best, best_shared = refiner, shared
        best.joint_pass(JOINT_PARTNERS)
        sequences = best.sequences
    return BatchPlan(orders_of(requests, sequences), schedulers[schedule](sequences))


def _dense_codes(
    requests: Sequence[Sequence[int]],
    weights: Sequence[float] | None,
    flat: npt.NDArray[np.int64],
) -> tuple[Sequence[Sequence[int]], Sequence[float] | None]:
    """``requests`` with codes renumbered ``0..distinct - 1`` in their order (and
    ``weights`` to match) when the codes are sparse — hashed ids, say: the planners
    size arrays by the largest code. Orders and schedule are positions and indices,
    and the renumbering keeps the codes' order (the planners' ties), so the plan is
    the same. ``flat``: every request's codes in one array (:func:`check_requests`)."""
    if not flat.size or int(flat.max()) < 2 * flat.size + 1024:
        return requests, weights
    distinct, dense = np.unique(flat, return_inverse=True)
    bounds = np.cumsum([0, *(len(request) for request in requests)])
    renumbered = [dense[start:end].tolist() for start, end in itertools.pairwise(bounds)]
    if weights is not None:
        weights = [weights[code] for code in distinct.tolist()]
    return renumbered, weights


def shared_tokens(
    requests: Sequence[Sequence[int]],
    orders: Sequence[Sequence[int]],
    weights: Sequence[float] | None = None,
) -> float:
    """The block tokens a plan's block orders let requests share in an unbounded prefix
    cache: every block sent again after a prefix an earlier request already sent, by
    ``weights[code]`` (default 1 per block). The same in every execution order (it is
    the total weight less the weight of the prefix tree of the final sequences), so
    it compares builders before scheduling. O(total blocks)."""
    return _shared_along(sequences_of(requests, orders), weights)


def _shared_along(sequences: Sequence[Sequence[int]], weights: Sequence[float] | None) -> float:
    """:func:`shared_tokens` of the final sequences."""
    trie = PrefixTrie()
    shared = 0.0
    for index, sequence in enumerate(sequences):
        matched = trie.add(sequence, index)
        if weights is None:
            shared += matched
        else:
            shared += sum(float(weights[code]) for code in sequence[:matched])
    return shared


def _most_shared(
    requests: Sequence[Sequence[int]],
    candidates: Sequence[BatchPlan],
    weights: Sequence[float] | None,
) -> BatchPlan:
    """The candidate whose block orders share the most tokens (ties: the first)."""
    best, best_shared = candidates[0], -1.0
    for plan in candidates:
        shared = shared_tokens(requests, plan.orders, weights)
        if shared > best_shared:
            best, best_shared = plan, shared
    return best


def _code_weights(
    requests: Sequence[Sequence[int]], weights: Sequence[float] | None
) -> list[float]:
    size = max((max(request) for request in requests if request), default=-1) + 1
    if weights is None:
        return [1.0] * size
    return [float(weight) for weight in weights[:size]]


def popularity_rank(requests: Sequence[Sequence[int]]) -> list[int]:
    """Per code, its rank by how many requests hold it (0: most; ties: smaller code),
    the order the builders give a leaf's unshared blocks (the ``rank`` that
    :func:`refine_sequences` takes)."""
    flat = np.fromiter((code for request in requests for code in request), dtype=np.int64)
    counts = np.bincount(flat) if flat.size else np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(counts.size), -counts))
    rank = np.empty(counts.size, dtype=np.int64)
    rank[order] = np.arange(counts.size)
    return rank.tolist()


def _cluster(requests: Sequence[Sequence[int]], progress: Progress) -> BatchPlan:
    from .cluster import cluster_plan

    return cluster_plan(requests, progress=progress)
