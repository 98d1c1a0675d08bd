"""Real ``redis-server`` processes on loopback, for the store tests and benchmarks.

Redis is not a dependency: :func:`find_redis_server` says whether ``redis-server`` is
on PATH (``apt-get install redis-server``; ``make test`` installs it where apt can),
and callers skip or stop when it returns ``None``::

    with RedisServer(tmp_dir) as server:
        pilot = ContextPilot(store=server.url())
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "find_redis_server"]


def find_redis_server() -> str | None:
    """The path of ``redis-server`` on PATH, or ``None``."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """A real ``redis-server`` on a free loopback port, with its files (and its log,
    ``redis.log``) in ``directory``. ``persistent``: every write is appended to the AOF
    and fsynced before Redis answers (``appendfsync always``), so a killed server
    restarts with every write it acknowledged; otherwise nothing is saved.
    :meth:`start` returns once the server answers ``PING``; leaving a ``with`` block
    stops it."""

    def __init__(self, directory: Path, *, persistent: bool = False) -> None:
        self.directory = directory
        self.persistent = persistent
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"]
        command = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            *(persistence if self.persistent else ["--appendonly", "no"]),
        ]  # fmt: skip
        with open(self.directory / "redis.log", "ab") as log:  # the server keeps its own copy
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while self.command(b"PING") != b"+PONG":
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not start: see {self.directory}/redis.log")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """SIGTERM, then wait for the process to exit."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(10)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, as a crash."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the server holds its connections and answers nothing (a hang)."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGCONT)

    def flush(self) -> None:
        assert self.command(b"FLUSHALL") == b"+OK"

    def command(self, name: bytes) -> bytes | None:
        """The first reply line of a one-word command, or None when unreachable."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(name + b"\r\n")
                return conn.recv(64).split(b"\r\n")[0]
        except OSError:
            return None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
