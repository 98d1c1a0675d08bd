"""Late binding at the client: the requests a policy held (:attr:`Decision.hold_s`),
each waiting in its caller, and the queue that offers them to the policy again.

A held request books nothing (no counter of any endpoint) until it is dispatched. Its
caller waits on a :class:`Waiter` (a thread's event or a coroutine's, from the driver)
until a prefill ends somewhere — then the dispatcher offers every held request again in
:func:`~contextpilot_rag.routing.holding.release_order` and hands each one it dispatches
to its caller, already booked — or until ``wait_s``, when the caller offers it again.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass

from ..holding import release_order
from ..types import Decision, RouteRequest
from .endpoints import Replica

__all__ = ["HOLD_RECHECK_S", "Held", "HeldRequests", "NewWaiter", "Waiter"]

HOLD_RECHECK_S = 0.5  # a held request is offered again at least this often
_ORDER = operator.attrgetter("order")


class Waiter:
    """A held request waiting in its caller. ``order``: its :func:`release_order` key;
    ``ready``: the dispatch a release decided for it (counters booked). Drivers
    subclass it with a way to wait that suits their caller."""

    __slots__ = ("order", "ready", "request")

    def __init__(self, request: RouteRequest) -> None:
        self.request = request
        self.order = release_order(None, 0)
        self.ready: tuple[Decision, Replica] | None = None

    def wake(self) -> None:
        """Nudge the waiting caller (from any thread)."""
        raise NotImplementedError


NewWaiter = Callable[[RouteRequest], Waiter]


@dataclass(frozen=True)
class Held:
    """The policy held the request: wait for a release or ``wait_s`` (the policy's
    estimate of when the request's wait drops to its threshold), then resume."""

    waiter: Waiter
    wait_s: float


class HeldRequests:
    """The held requests by request id. Invariant: a waiter is here from its hold until
    a release dispatches it, its caller offers it again, or its caller gives up. Its
    owner (the dispatcher) calls every method under its lock."""

    def __init__(self) -> None:
        self.waiting: dict[str, Waiter] = {}
        self._numbers = itertools.count()

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def hold(self, waiter: Waiter, decision: Decision) -> Held:
        """Keep ``waiter`` until a release or its timer (a new place in the order)."""
        waiter.order = release_order(decision.predicted_ttft_s, next(self._numbers))
        self.waiting[waiter.request.request_id] = waiter
        return Held(waiter, min(decision.hold_s, HOLD_RECHECK_S))

    def held_again(self, waiter: Waiter, decision: Decision) -> None:
        """A release held ``waiter`` again: its place by the new prediction."""
        waiter.order = release_order(decision.predicted_ttft_s, waiter.order[1])

    def drop(self, waiter: Waiter) -> None:
        self.waiting.pop(waiter.request.request_id, None)

    def in_release_order(self) -> list[Waiter]:
        return sorted(self.waiting.values(), key=_ORDER)

    def dispatched(self, waiter: Waiter, decision: Decision, replica: Replica) -> None:
        """A release dispatched ``waiter`` (booked): hand it to its caller."""
        del self.waiting[waiter.request.request_id]
        waiter.ready = (decision, replica)
        with contextlib.suppress(RuntimeError):  # the caller's event loop is gone
            waiter.wake()
