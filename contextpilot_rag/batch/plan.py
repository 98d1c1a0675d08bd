"""The result every batch builder returns, and helpers shared by the builders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BatchPlan", "Progress", "check_plan", "no_progress"]

Progress = Callable[[str, int], Callable[[int], None]]
"""``progress(label, total)`` returns ``advance(n)``; used for long builds."""


def no_progress(label: str, total: int) -> Callable[[int], None]:
    return lambda n: None


@dataclass(frozen=True)
class BatchPlan:
    """How to run a batch. Builders work on *block codes*: request ``i`` is a sequence
    of distinct non-negative ints (one per block). ``orders[i]`` lists positions into
    request ``i``'s own sequence, in the order its blocks should be sent (a
    permutation of ``range(len(request))``); ``schedule`` lists request indices in
    execution order (a permutation of ``range(len(requests))``)."""

    orders: tuple[tuple[int, ...], ...]
    schedule: tuple[int, ...]


def check_plan(plan: BatchPlan, sizes: Sequence[int]) -> None:
    """Raise ``AssertionError`` unless ``plan`` is a valid plan for requests of
    ``sizes`` blocks (used by tests and as a guard in debug runs)."""
    assert len(plan.orders) == len(sizes), "one order per request"
    for order, size in zip(plan.orders, sizes, strict=True):
        assert sorted(order) == list(range(size)), "each order is a permutation"
    assert sorted(plan.schedule) == list(range(len(sizes))), "schedule is a permutation"
