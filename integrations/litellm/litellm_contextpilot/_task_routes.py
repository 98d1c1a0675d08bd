"""The routes each asyncio task was routed, so that a call given up with its task
releases its deployment at once rather than after ``FleetConfig.route_ttl_s``.

LiteLLM tells its callbacks how a call ended when it answers or fails, never when the
task awaiting it is cancelled (a timeout, a cancelled ``gather``, a proxy request given
up), and nothing when a stream is closed before its end. A task awaits one call at a
time, so the routes it leaves open when it ends cancelled are those of the calls it gave
up: the call it was awaiting, or a stream it was reading.

Invariant: a task is held here from its first route until it ends, with exactly one
done-callback (so a long-lived task that routes many calls gathers no callbacks), and
``_task_of`` maps every route held under a task back to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["TaskRoutes"]

Task = asyncio.Task[object]


class TaskRoutes:
    """Open route ids by the task that routed them. ``release`` is called (outside
    this object's lock) with the routes of a task that ended cancelled and were still
    open then; its owner closes them."""

    def __init__(self, release: Callable[[list[str]], None]) -> None:
        self._release = release
        self._lock = threading.Lock()
        self._routes: dict[Task, set[str]] = {}
        self._task_of: dict[str, Task] = {}

    def watch(self, route_id: str) -> None:
        """Tie an open route to the task running now (nothing outside a task)."""
        task = _current_task()
        if task is None or task.done():
            return
        with self._lock:
            routes = self._routes.get(task)
            if routes is None:
                routes = self._routes[task] = set()
                task.add_done_callback(self._ended)
            routes.add(route_id)
            self._task_of[route_id] = task

    def forget(self, route_id: str) -> None:
        """A route closed (answered, failed or expired): nothing left to release."""
        with self._lock:
            task = self._task_of.pop(route_id, None)
            if task is not None:
                self._routes[task].discard(route_id)

    def _ended(self, task: Task) -> None:
        with self._lock:
            routes = self._routes.pop(task, set())
            for route_id in routes:
                del self._task_of[route_id]
        if routes and task.cancelled():
            self._release(sorted(routes))

    def __len__(self) -> int:
        """Routes held (open, under a task still running)."""
        with self._lock:
            return len(self._task_of)


def _current_task() -> Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        return None
