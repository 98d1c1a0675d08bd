"""Batch mode: plan a whole batch of requests at once (block order per request and an
execution order), for offline jobs of thousands to 100,000+ requests.

:meth:`contextpilot_rag.ContextPilot.optimize_batch` is the entry point; this package
holds the planners, which work on integer block codes and know nothing of prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from ..errors import ConfigError
from .greedy import greedy_plan
from .plan import BatchPlan, Progress, check_plan, no_progress
from .schedule import grouped_schedule, prefix_tree_schedule
from .trie import PrefixTrie

__all__ = [
    "BatchMethod",
    "BatchPlan",
    "BatchSchedule",
    "Progress",
    "check_plan",
    "greedy_plan",
    "grouped_schedule",
    "no_progress",
    "plan_batch",
    "prefix_tree_schedule",
    "shared_tokens",
]

BatchMethod = Literal["auto", "greedy", "cluster"]
BatchSchedule = Literal["prefix-tree", "grouped", "builder"]


def plan_batch(
    requests: Sequence[Sequence[int]],
    *,
    method: BatchMethod = "auto",
    schedule: BatchSchedule = "prefix-tree",
    weights: Sequence[float] | None = None,
    progress: Progress = no_progress,
) -> BatchPlan:
    """Block order and execution order for ``requests`` (distinct non-negative block
    codes each). ``method``: ``"greedy"`` splits groups on their most shared block;
    ``"cluster"`` is the paper's Alg. 4 (sparse pairwise distances, hierarchical
    clustering); ``"auto"`` (default) builds both and keeps the one whose block orders
    share more tokens (:func:`shared_tokens`; ties: greedy). Neither wins everywhere:
    greedy by a point or less on independent Zipf draws, clustering by several on
    workloads whose requests come in near-duplicate groups (topics, query templates),
    measured in the ``families`` section of docs/benchmarks.md. ``schedule``:
    ``"prefix-tree"`` (depth first over the final sequences, default), ``"grouped"``
    (Alg. 5), or ``"builder"`` (the builder's own order). ``weights[code]``: the
    block's size in tokens, so the greedy planner prefers sharing long blocks."""
    builders: dict[str, Callable[[], BatchPlan]] = {
        "greedy": lambda: greedy_plan(requests, weights=weights, progress=progress),
        "cluster": lambda: _cluster(requests, progress),
        "auto": lambda: _better(requests, weights, progress),
    }
    if method not in builders:
        raise ConfigError(f"unknown batch method {method!r}; choose one of {sorted(builders)}")
    schedulers = {"prefix-tree": prefix_tree_schedule, "grouped": grouped_schedule}
    if schedule != "builder" and schedule not in schedulers:
        raise ConfigError(
            f"unknown batch schedule {schedule!r}; choose 'prefix-tree', 'grouped' or 'builder'"
        )
    plan = builders[method]()
    if schedule == "builder":
        return plan
    sequences = [
        [request[position] for position in order]
        for request, order in zip(requests, plan.orders, strict=True)
    ]
    return BatchPlan(plan.orders, schedulers[schedule](sequences))


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
    trie = PrefixTrie()
    shared = 0.0
    for index, (request, order) in enumerate(zip(requests, orders, strict=True)):
        sequence = [request[position] for position in order]
        matched = trie.add(sequence, index)
        if weights is None:
            shared += matched
        else:
            shared += sum(float(weights[code]) for code in sequence[:matched])
    return shared


def _better(
    requests: Sequence[Sequence[int]], weights: Sequence[float] | None, progress: Progress
) -> BatchPlan:
    greedy = greedy_plan(requests, weights=weights, progress=progress)
    cluster = _cluster(requests, progress)
    if shared_tokens(requests, cluster.orders, weights) > shared_tokens(
        requests, greedy.orders, weights
    ):
        return cluster
    return greedy


def _cluster(requests: Sequence[Sequence[int]], progress: Progress) -> BatchPlan:
    from .cluster import cluster_plan

    return cluster_plan(requests, progress=progress)
