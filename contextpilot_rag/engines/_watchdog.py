"""Keep an engine from outliving whoever started it.

    python _watchdog.py --parent PID [--grace S] -- COMMAND...

Run as the leader of a new session (the launcher starts it so), it starts COMMAND in
its own process group and then stops the whole group — the engine and every process
the engine spawned — when any of these happens: the parent process dies (crash, SIGKILL:
noticed by polling ``getppid``), the watchdog gets SIGTERM / SIGINT / SIGHUP, or the
engine exits on its own. Stopping is SIGTERM to the group, ``--grace`` seconds, then
SIGKILL to what is left. SIGUSR1 detaches: the parent is no longer watched (the CLI's
``engine start`` uses this so the engine outlives the command).

It is also a child subreaper, so the engine's orphans are reaped here rather than left
as zombies. Standard library only, and run by file path: it must work even when the
package around it cannot be imported.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.1


class _Watch:
    """The state the signal handlers change: which parent to watch, whether to stop."""

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self.stop_requested = False

    def on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def on_detach(self, signum: int, frame: FrameType | None) -> None:
        self.parent = 0
        _say("detached: the parent is no longer watched")

    def parent_gone(self) -> bool:
        return self.parent != 0 and os.getppid() != self.parent


def _say(message: str) -> None:
    print(f"[contextpilot watchdog {os.getpid()}] {message}", file=sys.stderr, flush=True)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_children(engine_pid: int) -> int | None:
    """Reap every exited child; the engine's exit code if it was among them."""
    engine_code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return engine_code
        if pid == 0:
            return engine_code
        if pid == engine_pid:
            engine_code = os.waitstatus_to_exitcode(status)


def _others_in_group() -> list[int]:
    """Live members of our process group other than us (zombies excluded)."""
    me, pgid, others = os.getpid(), os.getpgrp(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            others.append(int(entry.name))
    return others


def _supervise(engine_pid: int, watch: _Watch) -> int | None:
    """Wait for a reason to stop; the engine's exit code if it exited by itself."""
    while True:
        code = _reap_children(engine_pid)
        if code is not None:
            _say(f"engine exited with {code}")
            return code
        if watch.stop_requested:
            _say("stop requested")
            return None
        if watch.parent_gone():
            time.sleep(_POLL_S)  # a SIGUSR1 sent just before the parent exited lands here
            if watch.parent_gone():
                _say(f"parent {watch.parent} is gone")
                return None
        time.sleep(_POLL_S)


def _stop_group(engine_pid: int, grace_s: float) -> None:
    """SIGTERM to the group, then SIGKILL to whatever survives ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgrp(), signal.SIGTERM)  # our own handler only sets a flag
    deadline = time.monotonic() + grace_s
    while _others_in_group() and time.monotonic() < deadline:
        _reap_children(engine_pid)
        time.sleep(0.05)
    for pid in _others_in_group():
        _say(f"pid {pid} ignored SIGTERM for {grace_s} s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _others_in_group() and time.monotonic() < deadline:
        _reap_children(engine_pid)
        time.sleep(0.05)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="_watchdog.py")
    parser.add_argument("--parent", type=int, required=True, help="pid to watch; 0: none")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the engine command")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if os.getpgrp() != os.getpid():
        os.setsid()
    watch = _Watch(args.parent)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, watch.on_stop)
    signal.signal(signal.SIGUSR1, watch.on_detach)
    _become_subreaper()
    if watch.parent_gone():  # the parent died before we got here
        return 0
    try:
        engine_pid = os.posix_spawnp(args.command[0], args.command, os.environ)
    except OSError as error:
        _say(f"cannot start {args.command[0]!r}: {error}")
        return 127
    _say(f"engine pid {engine_pid}: {' '.join(args.command)}")
    code = _supervise(engine_pid, watch)
    _stop_group(engine_pid, args.grace)
    return 0 if code is None else code


if __name__ == "__main__":
    raise SystemExit(main())
