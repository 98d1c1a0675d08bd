"""Conversations in a SQLite file: one host, any number of threads and processes on the
same file, kept across restarts.

Layout (schema 1)::

    cp_meta(key, value)                  'schema' -> 1; 'version' -> the last version given
    cp_conversations(id, version, touched, record)   record: serialize.encode_conversation
    cp_dropped(id, dropped)              ids dropped by TTL or LRU, the newest
                                         max_conversations of them (for forgotten())

Invariants: every row's ``version`` is unique in the file and grows with each write (a
file-wide counter, so a re-created conversation never reuses a version and a
compare-and-set cannot mistake it for the record it read); an id is never both in
``cp_conversations`` and in ``cp_dropped``. Writes run in ``BEGIN IMMEDIATE``
transactions, so the version check and the write are one atomic step across
processes; reads run without a transaction (WAL: readers never wait for writers).

``touched`` (``clock()``, wall-clock seconds by default) is a record's last access; a
record untouched for ``ttl_s`` is expired: reads no longer see it and the next write
moves it to ``cp_dropped``. Reads refresh ``touched`` at most once per
:data:`TOUCH_INTERVAL_S` (or ``ttl_s / 100`` if shorter), so that reading stays a read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..conversations import Conversation, StoredConversation
from ..errors import ConfigError, StoreFormatError
from ._sqlite_connection import open_database, store_errors, transaction
from .cache import RecordCache
from .serialize import decode_conversation, encode_conversation
from .sqlite_index_log import SQLiteIndexLog

__all__ = ["TOUCH_INTERVAL_S", "SQLiteConversationStore"]

SCHEMA = 1
TOUCH_INTERVAL_S = 1.0

_SCHEMA_SQL = (
    "CREATE TABLE IF NOT EXISTS cp_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS cp_conversations (id TEXT PRIMARY KEY, "
    "version INTEGER NOT NULL, touched REAL NOT NULL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS cp_conversations_touched ON cp_conversations (touched)",
    "CREATE TABLE IF NOT EXISTS cp_dropped (id TEXT PRIMARY KEY, dropped REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS cp_dropped_at ON cp_dropped (dropped)",
    f"INSERT OR IGNORE INTO cp_meta VALUES ('schema', {SCHEMA}), ('version', 0)",
)


class SQLiteConversationStore:
    """A :class:`~contextpilot_rag.conversations.VersionedConversationStore` in the
    SQLite file ``path`` (created if missing; its directory must exist). Bounded like
    the in-memory store: at most ``max_conversations`` records (least recently used
    dropped first), none idle longer than ``ttl_s`` (``None``: no expiry), and the
    ids of the last ``max_conversations`` dropped ones remembered for
    :meth:`forgotten`. ``clock`` gives seconds comparable across processes and
    restarts (wall-clock time by default). A write that waits longer than
    ``busy_timeout_s`` for another process's lock raises
    :class:`~contextpilot_rag.errors.StoreUnavailableError`. ``cache_conversations``:
    how many decoded records this process keeps by version, so that a record that did
    not change is not decoded again (every read still asks the file: :mod:`.cache`).

    Durability: WAL with ``synchronous=NORMAL``: a committed write survives the
    process (a crash, a restart), not necessarily a power loss."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_conversations: int = 10_000,
        ttl_s: float | None = 3600.0,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 5.0,
        cache_conversations: int = 256,
    ) -> None:
        _check_bounds(max_conversations, ttl_s)
        self._cache = RecordCache(cache_conversations)
        if not isinstance(busy_timeout_s, (int, float)) or not busy_timeout_s > 0:
            raise ConfigError("busy_timeout_s must be a number > 0")
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ConfigError(f"SQLite store {str(self.path)!r}: no directory {self.path.parent}")
        self._max = max_conversations
        self._ttl_s = ttl_s
        self._clock = clock
        self._busy_timeout_s = float(busy_timeout_s)
        self._name = f"SQLite store {str(self.path)!r}"
        self._touch_interval_s = min(TOUCH_INTERVAL_S, ttl_s / 100) if ttl_s else TOUCH_INTERVAL_S
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._db = self._open()

    # -- ConversationStore ------------------------------------------------------------

    def get(self, conversation_id: str) -> Conversation | None:
        return self.get_versioned(conversation_id).conversation

    def get_versioned(self, conversation_id: str) -> StoredConversation:
        with self._lock, self._errors():
            db, now = self._connection(), self._clock()
            row = db.execute(
                "SELECT version, touched, CASE version WHEN ? THEN NULL ELSE record END "
                "FROM cp_conversations WHERE id = ?",
                (self._cache.version(conversation_id), conversation_id),
            ).fetchone()
            if row is None:
                return StoredConversation(None, 0, self._is_dropped(db, conversation_id))
            version, touched, record = row
            if self._is_expired(touched, now):
                return StoredConversation(None, 0, True)
            if now - touched >= self._touch_interval_s:
                db.execute(
                    "UPDATE cp_conversations SET touched = ? WHERE id = ? AND version = ?",
                    (now, conversation_id, version),
                )
            return StoredConversation(self._decoded(conversation_id, version, record), version)

    def _decoded(self, conversation_id: str, version: int, record: bytes | None) -> Conversation:
        """The record at ``version``: decoded from ``record``, or, when the read left it
        out (``None``), the one the cache holds at that version (lock held: the cache
        cannot have changed since the read asked for its version)."""
        if record is None:
            held = self._cache.get(conversation_id, version)
            assert held is not None, "the cache changed under the store's lock"
            return held
        conversation = decode_conversation(record, conversation_id)
        self._cache.put(conversation, version)
        return conversation

    def put(self, conversation: Conversation) -> None:
        self._put(conversation, None)

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        return self._put(conversation, expected_version)

    def delete(self, conversation_id: str) -> bool:
        with self._lock, self._errors(), self._transaction() as db:
            self._cache.discard(conversation_id)
            deleted = db.execute("DELETE FROM cp_conversations WHERE id = ?", (conversation_id,))
            db.execute("DELETE FROM cp_dropped WHERE id = ?", (conversation_id,))
            return deleted.rowcount > 0

    def forgotten(self, conversation_id: str) -> bool:
        with self._lock, self._errors():
            db = self._connection()
            row = db.execute(
                "SELECT touched FROM cp_conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if row is not None:
                return self._is_expired(row[0], self._clock())
            return self._is_dropped(db, conversation_id)

    def __len__(self) -> int:
        with self._lock, self._errors():
            deadline = -float("inf") if self._ttl_s is None else self._clock() - self._ttl_s
            row = (
                self._connection()
                .execute("SELECT count(*) FROM cp_conversations WHERE touched >= ?", (deadline,))
                .fetchone()
            )
            return int(row[0])

    def close(self) -> None:
        """Close this process's connection (the file and its records stay)."""
        with self._lock:
            self._db.close()

    def open_index_log(self, max_entries: int) -> SQLiteIndexLog:
        """The context index's log beside these conversations: a table of this file
        (:mod:`.sqlite_index_log`), with this store's busy timeout."""
        return SQLiteIndexLog(
            self.path, max_entries=max_entries, busy_timeout_s=self._busy_timeout_s
        )

    def __enter__(self) -> SQLiteConversationStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteConversationStore({str(self.path)!r})"

    # -- writing ----------------------------------------------------------------------

    def _put(self, conversation: Conversation, expected_version: int | None) -> bool:
        """Write ``conversation`` if its record is at ``expected_version`` (any when
        ``None``), expiring idle records first: one transaction."""
        record = encode_conversation(conversation)
        conversation_id = conversation.conversation_id
        with self._lock, self._errors():
            with self._transaction() as db:
                now = self._clock()
                self._expire(db, now)
                row = db.execute(
                    "SELECT version FROM cp_conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
                current = 0 if row is None else row[0]
                if expected_version is not None and current != expected_version:
                    return False
                version = self._write(db, conversation_id, record, now, new=row is None)
            self._cache.put(conversation, version)  # under the lock, as every cache change
            return True

    def _write(
        self, db: sqlite3.Connection, conversation_id: str, record: bytes, now: float, *, new: bool
    ) -> int:
        """Store ``record`` under the next version (inside a write transaction)."""
        db.execute("UPDATE cp_meta SET value = value + 1 WHERE key = 'version'")
        (version,) = db.execute("SELECT value FROM cp_meta WHERE key = 'version'").fetchone()
        db.execute(
            "INSERT INTO cp_conversations (id, version, touched, record) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
            "touched = excluded.touched, record = excluded.record",
            (conversation_id, version, now, record),
        )
        db.execute("DELETE FROM cp_dropped WHERE id = ?", (conversation_id,))
        if new:
            self._evict(db, now)
        return int(version)

    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        if self._ttl_s is None:
            return
        rows = db.execute(
            "SELECT id FROM cp_conversations WHERE touched < ?", (now - self._ttl_s,)
        ).fetchall()
        self._drop(db, [row[0] for row in rows], now)

    def _evict(self, db: sqlite3.Connection, now: float) -> None:
        """Drop the least recently used records beyond ``max_conversations``."""
        (count,) = db.execute("SELECT count(*) FROM cp_conversations").fetchone()
        if count > self._max:
            rows = db.execute(
                "SELECT id FROM cp_conversations ORDER BY touched, version LIMIT ?",
                (count - self._max,),
            ).fetchall()
            self._drop(db, [row[0] for row in rows], now)

    def _drop(self, db: sqlite3.Connection, ids: Sequence[str], now: float) -> None:
        if not ids:
            return
        db.executemany("DELETE FROM cp_conversations WHERE id = ?", [(i,) for i in ids])
        db.executemany("INSERT OR REPLACE INTO cp_dropped VALUES (?, ?)", [(i, now) for i in ids])
        db.execute(
            "DELETE FROM cp_dropped WHERE id IN "
            "(SELECT id FROM cp_dropped ORDER BY dropped DESC LIMIT -1 OFFSET ?)",
            (self._max,),
        )

    # -- connection -------------------------------------------------------------------

    def _is_expired(self, touched: float, now: float) -> bool:
        return self._ttl_s is not None and touched < now - self._ttl_s

    @staticmethod
    def _is_dropped(db: sqlite3.Connection, conversation_id: str) -> bool:
        row = db.execute("SELECT 1 FROM cp_dropped WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None

    def _connection(self) -> sqlite3.Connection:
        """This process's connection: a forked child opens its own (a SQLite
        connection must not cross a fork)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        db = open_database(
            self.path, store=self._name, timeout_s=self._busy_timeout_s, schema_sql=_SCHEMA_SQL
        )
        with self._errors():
            (schema,) = db.execute("SELECT value FROM cp_meta WHERE key = 'schema'").fetchone()
        if schema != SCHEMA:
            raise StoreFormatError(
                f"SQLite store {str(self.path)!r} has schema {schema}; this version "
                f"reads schema {SCHEMA}"
            )
        return db

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._connection())

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return store_errors(self._name, self._busy_timeout_s)


def _check_bounds(max_conversations: object, ttl_s: object) -> None:
    if not isinstance(max_conversations, int) or isinstance(max_conversations, bool):
        raise ConfigError("max_conversations must be a positive int")
    if max_conversations < 1:
        raise ConfigError("max_conversations must be a positive int")
    if ttl_s is not None and (not isinstance(ttl_s, (int, float)) or not ttl_s > 0):
        raise ConfigError("conversation ttl_s must be > 0 or None")
