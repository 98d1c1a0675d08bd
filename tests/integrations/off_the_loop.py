"""A check for the adapters' async paths: the pilot must run in a worker thread, never
on the event loop (tokenizing new documents takes a while; a pilot on a shared store
waits for its round trips, and every call waits for its lock)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from contextpilot_rag import ContextPilot


def refuse_the_pilot_on_the_loop(
    pilot: ContextPilot, monkeypatch: pytest.MonkeyPatch, method: str = "optimize"
) -> None:
    """From now on, ``pilot.<method>`` goes on only once the running loop has run a
    callback it scheduled, which the loop can do only while the call is not holding it:
    a call made on the loop fails ("the pilot ran on the event loop") after 5 s. Call it
    from inside the coroutine under test."""
    loop, call = asyncio.get_running_loop(), getattr(pilot, method)

    def gated(*args: Any, **kwargs: Any) -> Any:
        gate = threading.Event()
        loop.call_soon_threadsafe(gate.set)
        assert gate.wait(5), f"the pilot ran on the event loop ({method})"
        return call(*args, **kwargs)

    monkeypatch.setattr(pilot, method, gated)
