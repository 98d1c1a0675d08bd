"""Which failed calls failed for good: the prompts whose latest attempt failed, by the
caller (the asyncio task, else the thread) that made the call.

LiteLLM reports the failure of every attempt, in the caller, before the Router retries
or falls back, and never says that a call has failed for good: the call simply raises.
So a failure is held as the caller's, and a retry or fallback starting for the same
prompt (LiteLLM's ``log_pre_api_call``, also in the caller) or its answer clears it.
The caller is seen past the call, and the failure final, when its task ends or when it
calls the hook again for its next request (a task or thread makes one call at a time).

Invariant: every held request id is in the set of exactly one caller; a task is held
from its first failure until it ends, with exactly one done-callback; a thread, while it
holds a failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["FailedCalls"]

Caller = asyncio.Task[object] | threading.Thread


class FailedCalls:
    """The prompts (by request id) whose call's latest attempt failed. ``final`` is
    called (outside this object's lock) with those whose call is over."""

    def __init__(self, final: Callable[[list[str]], None]) -> None:
        self._final = final
        self._lock = threading.Lock()
        self._held: dict[Caller, set[str]] = {}
        self._caller_of: dict[str, Caller] = {}

    def failed(self, request_id: str) -> None:
        """An attempt for ``request_id`` failed, reported in the caller."""
        caller = _current_caller()
        with self._lock:
            self._clear(request_id)
            held = self._held.get(caller)
            if held is None:
                held = self._held[caller] = set()
                if isinstance(caller, asyncio.Task):
                    caller.add_done_callback(self._task_ended)
            held.add(request_id)
            self._caller_of[request_id] = caller

    def discard(self, request_id: str) -> None:
        """No longer held: another attempt started, the prompt was answered, or it is
        forgotten."""
        with self._lock:
            self._clear(request_id)

    def caller_moved_on(self) -> None:
        """The caller running now is past its calls: their failures are final."""
        self._settle(_current_caller())

    def _task_ended(self, task: asyncio.Task[object]) -> None:
        self._settle(task)

    def _settle(self, caller: Caller) -> None:
        with self._lock:
            held = self._held.get(caller)
            if held is None:
                return
            if isinstance(caller, asyncio.Task) and not caller.done():
                self._held[caller] = set()  # its done-callback stays
            else:
                del self._held[caller]
            for request_id in held:
                del self._caller_of[request_id]
        if held:
            self._final(sorted(held))

    def _clear(self, request_id: str) -> None:
        caller = self._caller_of.pop(request_id, None)
        if caller is None:
            return
        held = self._held[caller]
        held.discard(request_id)
        if not held and isinstance(caller, threading.Thread):  # no callback to keep
            del self._held[caller]

    def __len__(self) -> int:
        """Failed calls that may still be retried."""
        with self._lock:
            return len(self._caller_of)


def _current_caller() -> Caller:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        task = None
    return task if task is not None else threading.current_thread()
