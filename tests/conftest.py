"""Shared fixtures: the offline tokenizer, a pilot built on it, a fake clock, the
check every optimized prompt must pass (no block lost, none sent twice), and real
``redis-server`` processes on loopback for the store tests (skipped, with the reason,
where ``redis-server`` is not installed)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, Prompt, Tokenizer, render_block
from contextpilot_rag.tokenizers import default_tokenizer

# The benchmark scripts and their shared `lib` package are not installed: tests of them
# import them from the checkout, as `python benchmarks/<script>.py` does.
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def assert_prompt_accounts_for_blocks(prompt: Prompt, blocks: Sequence[ContextBlock]) -> None:
    """Each unique input block appears exactly once: rendered in full in the last user
    message, or listed as de-duplicated and rendered in an earlier user message."""
    unique = list(dict.fromkeys(blocks))
    last = prompt.messages[-1]["content"]
    history = [m["content"] for m in prompt.messages[:-1] if m["role"] == "user"]
    shown = {block.id for block in prompt.blocks}
    deduplicated = {block.id for block in prompt.deduplicated}
    assert sorted(shown | deduplicated) == sorted(block.id for block in unique)
    assert len(prompt.blocks) + len(prompt.deduplicated) == len(unique)
    for block in unique:
        rendered = render_block(block, label=prompt.labels.get(block.id))
        if block.id in shown:
            assert last.count(rendered) == 1, block.id
        else:
            assert rendered not in last, block.id
            assert any(rendered in message for message in history), block.id


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return default_tokenizer()


@pytest.fixture
def pilot(tokenizer: Tokenizer) -> ContextPilot:
    return ContextPilot(tokenizer=tokenizer)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def check_prompt() -> Callable[[Prompt, Sequence[ContextBlock]], None]:
    return assert_prompt_accounts_for_blocks


class RedisServer:
    """A real ``redis-server`` on a free loopback port, with its files in ``directory``.
    ``persistent``: every write is appended to the AOF and fsynced before Redis
    answers (``appendfsync always``), so a killed server restarts with every write it
    acknowledged; otherwise nothing is saved."""

    def __init__(self, directory: Path, *, persistent: bool = False) -> None:
        self.directory = directory
        self.persistent = persistent
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
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
                raise RuntimeError(f"redis-server did not start: see {self.directory}/redis.log")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, as a crash."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        self._process = None

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _need_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip(
            "redis-server is not on PATH: the Redis store tests run a real server "
            "(`apt-get install redis-server`; `make test` installs it where apt can)"
        )
    pytest.importorskip("redis", reason='the redis client: pip install "contextpilot-rag[redis]"')


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One non-persistent server for the session; see :func:`redis_url`."""
    _need_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's server, emptied for this test."""
    redis_server.flush()
    return redis_server.url()


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, with every acknowledged write on disk: for
    tests that kill and restart it."""
    _need_redis()
    server = RedisServer(tmp_path, persistent=True)
    server.start()
    yield server
    if server._process is not None and server._process.poll() is None:
        server.resume()
    server.kill()
