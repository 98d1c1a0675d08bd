"""Routes and replica load in a SQLite file: routers in any number of processes on one
host share what each learned (a :class:`~contextpilot_rag.routing.route_store.RouteStore`).

The file may be the one a :class:`~contextpilot_rag.stores.sqlite.SQLiteConversationStore`
uses (``store="sqlite:///state.db"`` for both): the tables differ. Layout::

    cp_routes(key, replica, blocks, learned, origin)   the latest route per key;
                                                       learned: the clock's seconds
    cp_loads(origin, replica, in_flight, queued, expires)

Invariants: after every publish at most ``max_routes`` rows are held (least recently
learned dropped first) and none older than ``route_ttl_s``; a route older than
``route_ttl_s`` or a load row past ``expires`` is never returned. Writes run in
``BEGIN IMMEDIATE`` transactions on a connection of their own and reads on another
(WAL: a read does not wait for a writer; where SQLite makes it wait, at most 0.25 s),
each behind its own lock, so a router's read-through is never queued behind a write.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..routing.route_store import (
    DEFAULT_LOAD_TTL_S,
    DEFAULT_MAX_ROUTES,
    DEFAULT_ROUTE_TTL_S,
    Load,
    RouteUpdate,
    SharedRoute,
    check_route_bounds,
)
from ._sqlite_connection import open_database, store_errors, transaction

__all__ = ["SQLiteRouteStore"]

_SCHEMA_SQL = (
    "CREATE TABLE IF NOT EXISTS cp_routes (key INTEGER PRIMARY KEY, replica TEXT NOT NULL, "
    "blocks INTEGER NOT NULL, learned REAL NOT NULL, origin TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS cp_routes_learned ON cp_routes (learned)",
    "CREATE TABLE IF NOT EXISTS cp_loads (origin TEXT NOT NULL, replica TEXT NOT NULL, "
    "in_flight INTEGER NOT NULL, queued INTEGER NOT NULL, expires REAL NOT NULL, "
    "PRIMARY KEY (origin, replica))",
)
_MAX_VARIABLES = 500  # keys per SELECT … IN (…), under SQLite's variable limit


def _stored_key(key: int) -> int:
    """``key`` as the signed 64-bit integer SQLite stores: unchanged in that range,
    else wrapped (an unsigned 64-bit hash, as engines' block hashes are, maps one to
    one; wider ints, as the other stores take them, modulo ``2**64``). A lookup
    answers with the key it was asked for."""
    return (key + _HALF) % (2 * _HALF) - _HALF


_HALF = 2**63
_READ_TIMEOUT_S = 0.25  # a read-through waits no longer (WAL reads rarely wait at all)


class SQLiteRouteStore:
    """A :class:`~contextpilot_rag.routing.route_store.RouteStore` in the SQLite file
    ``path``. ``busy_timeout_s`` bounds a write's wait for another process's write
    (reads never wait); ``clock`` (wall-clock seconds, shared by the processes) is
    injectable."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_routes: int = DEFAULT_MAX_ROUTES,
        route_ttl_s: float = DEFAULT_ROUTE_TTL_S,
        load_ttl_s: float = DEFAULT_LOAD_TTL_S,
        busy_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_route_bounds(max_routes, route_ttl_s, load_ttl_s)
        if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, (int, float)):
            raise ConfigError(f"busy_timeout_s must be a number > 0, got {busy_timeout_s!r}")
        if not busy_timeout_s > 0:
            raise ConfigError(f"busy_timeout_s must be a number > 0, got {busy_timeout_s!r}")
        self.path = Path(path)
        self.max_routes = max_routes
        self.route_ttl_s = float(route_ttl_s)
        self.load_ttl_s = float(load_ttl_s)
        self._busy_timeout_s = float(busy_timeout_s)
        self._name = f"SQLite route store {str(self.path)!r}"
        self._clock = clock
        self._pid = os.getpid()
        self._read_lock, self._write_lock = threading.Lock(), threading.Lock()
        self._writer = self._open(schema=True)
        self._reader = self._open(schema=False, timeout_s=_READ_TIMEOUT_S)

    def publish(self, origin: str, routes: Sequence[RouteUpdate]) -> None:
        with self._write_lock, self._errors(), self._transaction() as db:
            now = self._clock()
            db.executemany(
                "INSERT OR REPLACE INTO cp_routes VALUES (?, ?, ?, ?, ?)",
                [
                    (_stored_key(key), replica, blocks, now, origin)
                    for key, replica, blocks in routes
                ],
            )
            db.execute("DELETE FROM cp_routes WHERE learned < ?", (now - self.route_ttl_s,))
            (count,) = db.execute("SELECT count(*) FROM cp_routes").fetchone()
            if count > self.max_routes:
                db.execute(
                    "DELETE FROM cp_routes WHERE key IN "
                    "(SELECT key FROM cp_routes ORDER BY learned LIMIT ?)",
                    (count - self.max_routes,),
                )

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        found: list[SharedRoute] = []
        with self._read_lock, self._errors():
            db, now = self._connection(writer=False), self._clock()
            for start in range(0, len(keys), _MAX_VARIABLES):
                asked = {_stored_key(key): key for key in keys[start : start + _MAX_VARIABLES]}
                rows = db.execute(
                    "SELECT key, replica, blocks, learned, origin FROM cp_routes "
                    f"WHERE key IN ({','.join('?' * len(asked))}) AND learned >= ?",
                    (*asked, now - self.route_ttl_s),
                ).fetchall()
                found += [
                    SharedRoute(asked[key], replica, blocks, max(0.0, now - learned), origin)
                    for key, replica, blocks, learned, origin in rows
                ]
        return found

    def report_load(self, origin: str, load: Mapping[str, Load]) -> None:
        with self._write_lock, self._errors(), self._transaction() as db:
            now = self._clock()
            db.execute("DELETE FROM cp_loads WHERE origin = ? OR expires < ?", (origin, now))
            expires = now + self.load_ttl_s
            db.executemany(
                "INSERT INTO cp_loads VALUES (?, ?, ?, ?, ?)",
                [(origin, replica, f, q, expires) for replica, (f, q) in load.items()],
            )

    def loads(self) -> dict[str, dict[str, Load]]:
        result: dict[str, dict[str, Load]] = {}
        with self._read_lock, self._errors():
            rows = (
                self._connection(writer=False)
                .execute(
                    "SELECT origin, replica, in_flight, queued FROM cp_loads WHERE expires >= ?",
                    (self._clock(),),
                )
                .fetchall()
            )
        for origin, replica, in_flight, queued in rows:
            result.setdefault(origin, {})[replica] = (in_flight, queued)
        return result

    def withdraw(self, origin: str) -> None:
        with self._write_lock, self._errors(), self._transaction() as db:
            db.execute("DELETE FROM cp_loads WHERE origin = ?", (origin,))

    def close(self) -> None:
        """Close this process's connections (the file and its rows stay)."""
        with self._write_lock, self._read_lock:
            self._writer.close()
            self._reader.close()

    def __repr__(self) -> str:
        return f"SQLiteRouteStore({str(self.path)!r})"

    def _connection(self, *, writer: bool) -> sqlite3.Connection:
        """This process's connection: a forked child opens its own."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._writer = self._open(schema=False)
            self._reader = self._open(schema=False, timeout_s=_READ_TIMEOUT_S)
        return self._writer if writer else self._reader

    def _open(self, *, schema: bool, timeout_s: float | None = None) -> sqlite3.Connection:
        """A connection; ``schema``: the writer's, which creates the tables.
        ``timeout_s``: how long a statement waits for a lock (default ``busy_timeout_s``)."""
        return open_database(
            self.path,
            store=self._name,
            timeout_s=self._busy_timeout_s if timeout_s is None else timeout_s,
            schema_sql=_SCHEMA_SQL if schema else (),
        )

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._connection(writer=True))

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return store_errors(self._name, self._busy_timeout_s)
