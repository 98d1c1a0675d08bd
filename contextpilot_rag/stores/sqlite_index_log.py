"""The index log in a SQLite file: one table (an
:class:`~contextpilot_rag.stores.index_log.IndexLog`).

The file may be the one a :class:`~contextpilot_rag.stores.sqlite.SQLiteConversationStore`
or a :class:`~contextpilot_rag.stores.sqlite_routes.SQLiteRouteStore` uses: the tables
differ. Layout::

    cp_index_log(seq INTEGER PRIMARY KEY AUTOINCREMENT, origin, record)

``AUTOINCREMENT`` never reuses a number, so ``seq`` is the sequence number, growing by
one per record (appends are ``BEGIN IMMEDIATE`` transactions, one writer at a time).
Each append deletes the rows more than ``max_entries`` behind the newest in the same
transaction: the table holds exactly ``max_entries`` records at most. A read is one
read transaction on the same connection (WAL: it never waits for a writer).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ._sqlite_connection import open_database, store_errors, transaction
from .index_log import DEFAULT_MAX_ENTRIES, LoggedRecord, LogRead, check_max_entries

__all__ = ["SQLiteIndexLog"]

_SELECT = (
    "SELECT seq, origin, record FROM cp_index_log WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?"
)
_SCHEMA_SQL = (
    "CREATE TABLE IF NOT EXISTS cp_index_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "origin TEXT NOT NULL, record BLOB NOT NULL)",
)


class SQLiteIndexLog:
    """An index log in the table ``cp_index_log`` of the SQLite file ``path`` (created
    if missing; its directory must exist). An append waits at most ``busy_timeout_s``
    for another process's write lock."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        busy_timeout_s: float = 5.0,
    ) -> None:
        self.max_entries = check_max_entries(max_entries)
        if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, (int, float)):
            raise ConfigError(f"busy_timeout_s must be a number > 0, got {busy_timeout_s!r}")
        if not busy_timeout_s > 0:
            raise ConfigError(f"busy_timeout_s must be a number > 0, got {busy_timeout_s!r}")
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ConfigError(f"SQLite index log {str(self.path)!r}: no directory")
        self._busy_timeout_s = float(busy_timeout_s)
        self._name = f"SQLite index log {str(self.path)!r}"
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._db: sqlite3.Connection | None = None  # opened by the first call

    def append(self, origin: str, records: Sequence[bytes], *, after: int, limit: int) -> LogRead:
        with self._lock, self._errors(), transaction(self._connection()) as db:
            before = _last(db)
            unseen = db.execute(_SELECT, (after, before, limit)).fetchall() if limit > 0 else []
            db.executemany(
                "INSERT INTO cp_index_log (origin, record) VALUES (?, ?)",
                [(origin, record) for record in records],
            )
            last = _last(db)
            db.execute("DELETE FROM cp_index_log WHERE seq <= ?", (last - self.max_entries,))
        return LogRead(_records(unseen), last)

    def read(self, after: int, limit: int) -> LogRead:
        with self._lock, self._errors():
            db = self._connection()
            db.execute("BEGIN")  # one snapshot for both: no record between them is lost
            try:
                last = _last(db)
                rows = db.execute(_SELECT, (after, last, limit)).fetchall()
            finally:
                db.execute("COMMIT")
        return LogRead(_records(rows), last)

    def close(self) -> None:
        """Close this process's connection (the file and its rows stay)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db = None

    def __repr__(self) -> str:
        return f"SQLiteIndexLog({str(self.path)!r}, max_entries={self.max_entries})"

    def _connection(self) -> sqlite3.Connection:
        """This process's connection, opened on first use (so that a locked file fails
        a call, not the pilot's construction); a forked child opens its own."""
        if self._db is None or os.getpid() != self._pid:
            self._pid = os.getpid()
            self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        return open_database(
            self.path, store=self._name, timeout_s=self._busy_timeout_s, schema_sql=_SCHEMA_SQL
        )

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return store_errors(self._name, self._busy_timeout_s)


def _last(db: sqlite3.Connection) -> int:
    (last,) = db.execute("SELECT coalesce(max(seq), 0) FROM cp_index_log").fetchone()
    return int(last)


def _records(rows: Sequence[tuple[int, str, bytes]]) -> tuple[LoggedRecord, ...]:
    return tuple(LoggedRecord(seq, origin, bytes(record)) for seq, origin, record in rows)
