"""The result every batch builder returns, and helpers shared by the builders."""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import InvalidInputError

__all__ = [
    "BatchPlan",
    "Progress",
    "check_plan",
    "check_requests",
    "no_progress",
    "orders_of",
    "sequences_of",
]

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


def sequences_of(
    requests: Sequence[Sequence[int]], orders: Sequence[Sequence[int]]
) -> list[list[int]]:
    """Each request's block codes in its plan's order."""
    return [
        [request[position] for position in order]
        for request, order in zip(requests, orders, strict=True)
    ]


def orders_of(
    requests: Sequence[Sequence[int]], sequences: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], ...]:
    """The plan orders (positions into each request) that give ``sequences``."""
    orders = []
    for request, sequence in zip(requests, sequences, strict=True):
        position = {code: index for index, code in enumerate(request)}
        orders.append(tuple(position[code] for code in sequence))
    return tuple(orders)


def check_requests(
    requests: Sequence[Sequence[int]], weights: Sequence[float] | None
) -> npt.NDArray[np.int64]:
    """Raise :class:`InvalidInputError` unless every request holds distinct
    non-negative int codes and ``weights`` (when given) has a finite weight >= 0 for
    every code: a planner given a repeated or negative code returned orders that were
    not a permutation of the request. Returns every request's codes in one array,
    in order."""
    lengths = [len(request) for request in requests]
    try:
        flat = np.fromiter(itertools.chain.from_iterable(requests), np.int64, sum(lengths))
    except (TypeError, ValueError, OverflowError):
        raise InvalidInputError("block codes must be non-negative ints") from None
    if flat.size and int(flat.min()) < 0:
        raise InvalidInputError("block codes must be non-negative ints")
    for number, (request, length) in enumerate(zip(requests, lengths, strict=True)):
        if len(set(request)) != length:
            raise InvalidInputError(
                f"request {number} holds a block code twice; codes must be distinct"
            )
    if weights is None:
        return flat
    top = int(flat.max()) if flat.size else -1
    if len(weights) <= top:
        raise InvalidInputError(f"weights has {len(weights)} entries; codes go up to {top}")
    if any(not (isinstance(w, numbers.Real) and math.isfinite(w) and w >= 0) for w in weights):
        raise InvalidInputError("weights must be finite numbers >= 0")
    return flat
