"""Processes as the kernel sees them (Linux ``/proc``): identity that survives pid
reuse, process-group membership, and terminating a whole group.

A process is identified by ``(pid, start_ticks)``: a pid can be recycled once its
process is gone, its start time (field 22 of ``/proc/PID/stat``) cannot. Zombies count
as gone: they hold no resources and cannot be signalled away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "ProcessInfo",
    "StopResult",
    "group_members",
    "is_running",
    "process_info",
    "signal_process",
    "terminate_group",
]

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessInfo:
    """One line of ``/proc/PID/stat``, the fields we use."""

    pid: int
    state: str
    pgid: int
    start_ticks: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def process_info(pid: int) -> ProcessInfo | None:
    """The process ``pid`` now, or ``None`` if there is none."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) is parenthesised and may hold spaces or ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessInfo(pid, state=fields[0], pgid=int(fields[2]), start_ticks=int(fields[19]))


def is_running(pid: int, start_ticks: int | None = None) -> bool:
    """Whether ``pid`` is a live (non-zombie) process, and the same one that started at
    ``start_ticks`` when given."""
    info = process_info(pid)
    if info is None or not info.alive:
        return False
    return start_ticks is None or info.start_ticks == start_ticks


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            info = process_info(int(entry.name))
            if info is not None and info.pgid == pgid and info.alive:
                members.append(info.pid)
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def signal_process(pid: int, signum: int, start_ticks: int | None = None) -> bool:
    """Send ``signum`` to ``pid`` — only if it is still the process that started at
    ``start_ticks``, when given. Race-free where pidfds exist: the process is pinned
    before its start time is checked, so a pid reused in between is never signalled."""
    pidfd = None
    try:
        if start_ticks is not None and hasattr(os, "pidfd_open"):
            pidfd = os.pidfd_open(pid)
        if start_ticks is not None and not is_running(pid, start_ticks):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


StopResult = Literal["terminated", "killed", "gone", "not ours"]


def terminate_group(
    pgid: int,
    *,
    leader_alive: bool = True,
    leader_start_ticks: int | None = None,
    grace_s: float = 15.0,
) -> StopResult:
    """Stop every process of group ``pgid``: SIGTERM to the group leader (the watchdog,
    which terminates the rest) — or to the whole group when the leader is gone —, then
    SIGTERM to the group, then SIGKILL. Returns ``"terminated"`` (gone after SIGTERM),
    ``"killed"`` (SIGKILL was needed), ``"gone"`` (nothing was left to stop) or, with
    ``leader_start_ticks``, ``"not ours"``: the leader is no longer the process that
    started then, and nothing was signalled.

    The caller vouches that ``pgid`` is its group: a leader it has not reaped, a leader
    identified by its start time, or a group with members (a pgid is not reused while
    any member lives)."""
    if leader_alive:
        if not signal_process(pgid, signal.SIGTERM, leader_start_ticks):
            if leader_start_ticks is not None:
                return "not ours"
            _signal_group(pgid, signal.SIGTERM)
    elif group_members(pgid):
        _signal_group(pgid, signal.SIGTERM)
    else:
        return "gone"
    if _wait_group_gone(pgid, grace_s):
        return "terminated"
    _signal_group(pgid, signal.SIGTERM)
    if _wait_group_gone(pgid, 2.0):
        return "terminated"
    _signal_group(pgid, signal.SIGKILL)
    _wait_group_gone(pgid, 5.0)
    return "killed"
