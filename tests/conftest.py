"""Shared fixtures: the offline tokenizer, a pilot built on it, a fake clock, the
check every optimized prompt must pass (no block lost, none sent twice), and real
``redis-server`` processes on loopback for the store tests (skipped, with the reason,
where ``redis-server`` is not installed)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, Prompt, Tokenizer, render_block
from contextpilot_rag.testing import RedisServer, find_redis_server
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


MarkedParts = Callable[[Mapping[str, Any]], list[tuple[str, Mapping[str, Any]]]]


def openai_marked_parts(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(role, part)`` of each content part of an OpenAI request body (its Chat
    Completions ``messages`` or its Responses ``input``) that carries a
    ``prompt_cache_breakpoint``."""
    return [
        (message["role"], part)
        for message in (*body.get("messages", ()), *body.get("input", ()))
        if isinstance(message["content"], list)
        for part in message["content"]
        if "prompt_cache_breakpoint" in part
    ]


@pytest.fixture(scope="session")
def marked_parts() -> MarkedParts:
    return openai_marked_parts


def _need_redis() -> None:
    if find_redis_server() is None:
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
    if server.running():
        server.resume()
    server.kill()
