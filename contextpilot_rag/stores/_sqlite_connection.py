"""The SQLite connections the SQLite stores share: opened in autocommit mode (every
write is an explicit ``BEGIN IMMEDIATE`` transaction), usable from any thread (each
store guards its connections with its own locks), SQLite's errors as the typed ones."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import ConfigError, StoreError, StoreFormatError, StoreUnavailableError

__all__ = ["connect", "open_database", "store_errors", "transaction"]


def connect(path: Path, *, store: str, timeout_s: float) -> sqlite3.Connection:
    """A connection to ``path`` that waits ``timeout_s`` for a lock (set SQLite's
    ``busy_timeout`` to match); ``store`` names the store in errors. A file that does
    not exist yet is created readable and writable by its owner only (SQLite gives its
    ``-wal`` and ``-shm`` files the same mode); an existing file keeps its mode."""
    _create_private(path)
    try:
        db = sqlite3.connect(
            path,
            timeout=timeout_s,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE
            check_same_thread=False,  # guarded by the store's locks
        )
    except sqlite3.Error as exc:
        raise ConfigError(f"cannot open {store}: {exc}") from exc
    return db


def _create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists: the stores hold
    documents, questions and answers, which the default umask (022) would leave
    readable by every user of the host. An error is left for SQLite to report."""
    if str(path) in ("", ":memory:"):  # SQLite's names for databases in no file
        return
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # it exists (another process may just have created it), or cannot be
        return
    os.close(descriptor)


def open_database(
    path: Path, *, store: str, timeout_s: float, schema_sql: Sequence[str] = ()
) -> sqlite3.Connection:
    """A connection to ``path`` (see :func:`connect`) in WAL mode with
    ``synchronous=NORMAL``; ``schema_sql``: statements run in one write transaction
    (``CREATE TABLE IF NOT EXISTS …``: a store's writer creates its tables). SQLite's
    errors are raised as the typed ones."""
    db = connect(path, store=store, timeout_s=timeout_s)
    with store_errors(store, timeout_s):
        db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        if schema_sql:
            deadline = time.monotonic() + timeout_s
            _retried(lambda: db.execute("PRAGMA journal_mode = WAL"), deadline)
            _retried(lambda: _create(db, schema_sql), deadline)
        db.execute("PRAGMA synchronous = NORMAL")
    return db


def _create(db: sqlite3.Connection, schema_sql: Sequence[str]) -> None:
    with transaction(db):
        for statement in schema_sql:
            db.execute(statement)


def _retried(step: Callable[[], object], deadline: float) -> None:
    """``step``, again while SQLite answers "locked" and ``deadline`` (monotonic
    seconds) has not passed. Processes opening a new database together contend for
    the lock that switches it to WAL; SQLite reports that at once, without waiting the
    busy timeout, since waiting could deadlock."""
    delay_s = 0.005
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as exc:
            if not _locked(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay_s)
        delay_s = min(2 * delay_s, 0.1)


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction: it holds the file's write lock from its start, so what it
    reads stays true until it commits."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:  # some errors (a full disk) end it themselves
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextlib.contextmanager
def store_errors(store: str, busy_timeout_s: float) -> Iterator[None]:
    """SQLite's errors as the store's typed ones; ``store`` names it."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if _locked(exc):
            raise StoreUnavailableError(
                f"{store} stayed locked by another process for "
                f"busy_timeout_s={busy_timeout_s}: {exc}"
            ) from exc
        raise StoreError(f"{store}: {exc}") from exc
    except sqlite3.ProgrammingError as exc:  # a closed connection
        raise StoreUnavailableError(f"{store}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise StoreFormatError(f"{store}: {exc}") from exc


def _locked(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock ("database is locked",
    "busy")."""
    message = str(exc).lower()
    return "locked" in message or "busy" in message
