"""The index log: an append-only, bounded sequence of records in a shared store,
through which pilots on one store share their context index (``docs/stores.md``).

A log holds opaque records (what a pilot inserted into its index: the pilot's side,
encoding included, is :mod:`contextpilot_rag.index_sync`), each stamped with the
``origin`` that appended it and a **sequence number** the log assigns.

Invariants: sequence numbers start at 1 and grow by one per record, in the order the
log accepted them, across every process appending to it; the log holds at most about
``max_entries`` records, the oldest dropped first (so a reader that falls further
behind finds the numbers it missed gone: a gap, which it can count). A log that is
deleted (the store emptied) starts again at 1; a reader whose position is past the
log's newest record can tell (:attr:`LogRead.last`).

Implementations: :class:`~contextpilot_rag.stores.redis_index_log.RedisIndexLog` (a
stream) and :class:`~contextpilot_rag.stores.sqlite_index_log.SQLiteIndexLog` (a
table). A conversation store offers its log through :class:`IndexLogProvider`; the
in-memory store has none (one process needs no log).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigError

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "IndexLog",
    "IndexLogProvider",
    "LogRead",
    "LoggedRecord",
    "check_max_entries",
    "index_log_of",
]

DEFAULT_MAX_ENTRIES = 10_000


class LoggedRecord(NamedTuple):
    """One record as the log returns it: its ``sequence`` number, the ``origin`` that
    appended it and its ``data``."""

    sequence: int
    origin: str
    data: bytes


class LogRead(NamedTuple):
    """What one read returned: ``records`` (ascending sequence numbers, at most the
    limit asked for) and ``last``, the newest sequence number the log holds (0: the
    log is empty), read in the same call."""

    records: tuple[LoggedRecord, ...]
    last: int


@runtime_checkable
class IndexLog(Protocol):
    """An append-only bounded log shared by processes (see the module docstring).
    Every method raises :class:`~contextpilot_rag.errors.StoreError` (or a subclass)
    on failure, within the store's timeout."""

    max_entries: int

    def append(self, origin: str, records: Sequence[bytes], *, after: int, limit: int) -> LogRead:
        """Append ``records`` in order, stamped with ``origin``, and trim the log to its
        bound; in the same call (one round trip), read the records numbered above
        ``after`` that precede the appended ones, at most ``limit`` (0: none). The
        result's ``last`` is the number of the last record appended."""
        ...

    def read(self, after: int, limit: int) -> LogRead:
        """The records numbered above ``after``, oldest first, at most ``limit``."""
        ...

    def close(self) -> None:
        """Release what the log opened itself (not a connection it was given)."""
        ...


@runtime_checkable
class IndexLogProvider(Protocol):
    """A conversation store that can hold an index log beside its conversations (on
    the same server or file, with the same timeouts)."""

    def open_index_log(self, max_entries: int) -> IndexLog: ...


def check_max_entries(max_entries: object) -> int:
    """``max_entries`` if it is an int >= 1, else :class:`ConfigError`."""
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ConfigError(f"index log max_entries must be an int >= 1, got {max_entries!r}")
    return max_entries


def index_log_of(store: object, max_entries: int = DEFAULT_MAX_ENTRIES) -> IndexLog | None:
    """The index log ``store`` offers (:class:`IndexLogProvider`), or ``None``."""
    if isinstance(store, IndexLogProvider):
        return store.open_index_log(check_max_entries(max_entries))
    return None
