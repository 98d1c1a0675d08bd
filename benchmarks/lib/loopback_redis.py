"""A ``redis-server`` for one benchmark run: what the scripts that compare stores on
loopback Redis (``store_overhead.py``, ``serve_workers.py``, ``soak.py``) start when
they are given no ``--redis-url``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contextpilot_rag.testing import RedisServer, find_redis_server

__all__ = ["loopback_redis"]


@contextmanager
def loopback_redis(directory: Path) -> Iterator[str]:
    """The URL of a non-persistent ``redis-server`` on a free loopback port, its files
    and log in ``directory``, stopped on exit; the run stops, saying what to do, where
    ``redis-server`` is not on PATH."""
    if find_redis_server() is None:
        raise SystemExit("redis-server is not on PATH: install it, or pass --redis-url")
    with RedisServer(directory) as server:
        yield server.url()
