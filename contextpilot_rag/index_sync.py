"""A pilot's side of the shared context index: what it appends to its store's index
log, and which of the other pilots' records it replays into its own index.

Every pilot keeps its own :class:`~contextpilot_rag.index.ContextIndex` (and its
tenants' indexes), bounded by its own configuration. On a shared store each request a
pilot indexes is also appended to the store's log
(:class:`~contextpilot_rag.stores.index_log.IndexLog`) as an :class:`IndexRecord`:
the index paths it entered and the registry keys whose popularity it raised. The
append is write-behind (a writer thread; the call that indexed the request does not
wait for the store), and each append also reads the records of other pilots that came
before it. Before planning, a pilot replays the records it has read and not replayed
— at most ``IndexLogConfig.replay_batch`` per call — reading the log itself only when
no read was made for ``replay_interval_s`` (or it is behind); its own records are
skipped. So pilots on one store converge on one index and order the same documents
alike: eventually consistent, never waiting for each other.

The log is advisory. A failed append or read fails no call: it is counted
(:class:`IndexLogStats`), one warning is logged, and the pilot plans on its own index,
neither appending nor reading, for ``retry_s``; then it tries again, from where it
stopped reading. Records the log trimmed before this pilot read them are counted as
``missed`` and skipped (the pilot goes on from the oldest the log holds).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from .errors import ConfigError, StoreError, StoreFormatError
from .stores.index_log import (
    DEFAULT_MAX_ENTRIES,
    IndexLog,
    LoggedRecord,
    LogRead,
    check_max_entries,
)

__all__ = [
    "APPEND_BATCH",
    "FORMAT",
    "MAX_QUEUED",
    "WRITER_IDLE_S",
    "IndexLogConfig",
    "IndexLogStats",
    "IndexRecord",
    "IndexSync",
    "LoggedPlacement",
    "decode_record",
    "encode_record",
]

logger = logging.getLogger(__name__)

FORMAT = 1
APPEND_BATCH = 256  # records per append
MAX_QUEUED = 10_000  # records waiting for the writer; the oldest dropped beyond
WRITER_IDLE_S = 1.0  # the writer thread ends after this long without work
IndexKind = Literal["main", "tenant", "shared"]
_KINDS: tuple[IndexKind, ...] = ("main", "tenant", "shared")


@dataclass(frozen=True)
class IndexLogConfig:
    """Whether and how a pilot on a shared store shares its context index.

    ``enabled``: share through the store's index log (stores without one, the
    in-memory default included, share nothing whatever this says). ``max_entries``:
    the log's bound in the store (records; the oldest trimmed first).
    ``replay_batch``: the most records replayed before one call;
    ``replay_interval_s``: the least time between two reads of the log (a pilot that
    read a full batch reads again at its next call). ``retry_s``: how long a pilot
    whose log call failed works without the log before trying it again."""

    enabled: bool = True
    max_entries: int = DEFAULT_MAX_ENTRIES
    replay_batch: int = 64
    replay_interval_s: float = 0.005
    retry_s: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("IndexLogConfig.enabled must be a bool")
        check_max_entries(self.max_entries)
        batch = self.replay_batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"IndexLogConfig.replay_batch must be an int >= 1, got {batch!r}")
        for name, least in (("replay_interval_s", 0.0), ("retry_s", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < least:
                raise ConfigError(f"IndexLogConfig.{name} must be a number >= 0, got {value!r}")


class LoggedPlacement(NamedTuple):
    """One index path a request entered: ``kind`` names the index (``"main"``: the
    index of requests without a tenant; ``"tenant"``: its tenant's; ``"shared"``: the
    tenants' shared-block index), ``path`` the keys, ``tokens`` their token counts."""

    kind: IndexKind
    path: tuple[str, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """What a pilot indexed for one request: its ``request_id`` (unique across pilots
    on one store), its ``tenant``, the ``placements`` it entered and the block
    registry keys whose popularity it raised (``counted``)."""

    request_id: str
    tenant: str | None
    placements: tuple[LoggedPlacement, ...]
    counted: tuple[str, ...]


def encode_record(record: IndexRecord) -> bytes:
    """Compact UTF-8 JSON with a format number:
    ``{"f": 1, "r": request_id, "t": tenant | null, "p": [[kind, path, tokens], …],
    "k": counted}``."""
    data = {
        "f": FORMAT,
        "r": record.request_id,
        "t": record.tenant,
        "p": [[place.kind, place.path, place.tokens] for place in record.placements],
        "k": record.counted,
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_record(data: bytes) -> IndexRecord:
    """The record stored as ``data``; another format or a damaged record is a
    :class:`~contextpilot_rag.errors.StoreFormatError` (checked completely, so that
    replaying a decoded record cannot fail)."""
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreFormatError("index log: a record is not JSON") from exc
    if not isinstance(record, dict) or record.get("f") != FORMAT:
        raise StoreFormatError("index log: a record of another format (or damaged)")
    request_id, tenant = record.get("r"), record.get("t")
    placements, counted = record.get("p"), record.get("k")
    if not (isinstance(request_id, str) and request_id):
        raise StoreFormatError("index log: a record without its request id")
    if tenant is not None and not (isinstance(tenant, str) and tenant):
        raise StoreFormatError("index log: a record with a bad tenant")
    if not isinstance(placements, list) or not isinstance(counted, list) or not _strings(counted):
        raise StoreFormatError("index log: a damaged record")
    return IndexRecord(
        request_id, tenant, tuple(_placement(p, tenant) for p in placements), tuple(counted)
    )


def _placement(value: object, tenant: str | None) -> LoggedPlacement:
    if not (isinstance(value, list) and len(value) == 3):
        raise StoreFormatError("index log: a damaged placement")
    kind, path, tokens = value
    if kind not in _KINDS or (kind != "main") != (tenant is not None):
        raise StoreFormatError(f"index log: a placement in index {kind!r}")
    if not (_strings(path) and path and isinstance(tokens, list) and len(tokens) == len(path)):
        raise StoreFormatError("index log: a damaged placement path")
    if not all(type(count) is int and count >= 0 for count in tokens):
        raise StoreFormatError("index log: a damaged placement's token counts")
    return LoggedPlacement(kind, tuple(path), tuple(tokens))


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item for item in value)


@dataclass(frozen=True)
class IndexLogStats:
    """A pilot's index log since it started: records ``appended`` and ``replayed``
    (other pilots' requests inserted here); ``missed``, records trimmed from the log
    before this pilot read them; ``damaged``, unreadable records skipped;
    ``failures``, failed log calls; ``dropped``, records not appended (a failure, or
    while the log was off after one); ``degraded``: the last call failed and none
    has succeeded since."""

    appended: int = 0
    replayed: int = 0
    missed: int = 0
    damaged: int = 0
    failures: int = 0
    dropped: int = 0
    degraded: bool = False


class IndexSync:
    """Appends a pilot's records to ``log`` and reads the other pilots' (see the
    module docstring). Thread-safe; never raises from :meth:`publish` or
    :meth:`pending`. ``clock``: monotonic seconds (injectable for tests).

    Appends are write-behind: :meth:`publish` queues, a writer thread appends (and
    reads the records that precede its own in the same call). :meth:`pending` reads
    only when no read was made for ``replay_interval_s``; it never waits for the
    writer (a read in progress is left to it)."""

    def __init__(
        self,
        log: IndexLog,
        config: IndexLogConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.config = config
        self.origin = secrets.token_hex(8)
        self._clock = clock
        self._lock = threading.Lock()  # the cursor, the counters, the outage state
        self._read_lock = threading.Lock()  # one read at a time: no record returned twice
        self._cursor = 0  # the last sequence number read (0: none; start at the oldest)
        self._unread: list[IndexRecord] = []  # read, not yet returned by pending()
        self._next_read = -float("inf")
        self._down_until = -float("inf")
        self._stats = IndexLogStats()
        self._queue: deque[IndexRecord] = deque()  # published, not appended yet
        self._in_flight = 0  # records taken from the queue, being appended
        self._settled = threading.Condition(self._lock)  # queue empty, nothing in flight
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None

    def stats(self) -> IndexLogStats:
        with self._lock:
            return self._stats

    def publish(self, records: Sequence[IndexRecord]) -> None:
        """Queue ``records`` for the background writer and return at once (counted as
        dropped while the log is off, or beyond :data:`MAX_QUEUED` waiting records)."""
        if not records:
            return
        if self._down():
            self._count(dropped=len(records))
            return
        with self._lock:
            self._queue.extend(records)
            overflow = max(0, len(self._queue) - MAX_QUEUED)
            for _ in range(overflow):
                self._queue.popleft()
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_behind, name="contextpilot-index-log", daemon=True
                )
                self._writer.start()
        if overflow:
            self._count(dropped=overflow)
        self._wake.set()

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (at most ``timeout_s``) until every record published before is appended
        or counted as dropped: by the writer thread, or in this thread when none runs
        (tests, shutdown)."""
        with self._lock:
            writer = self._writer
        if writer is None or not writer.is_alive():
            while self._append_queued():
                pass
        else:
            self._wake.set()
        with self._settled:
            self._settled.wait_for(lambda: not self._queue and not self._in_flight, timeout_s)

    def _write_behind(self) -> None:
        """The writer thread: appends what :meth:`publish` queued, reading through its
        appends; it ends after :data:`WRITER_IDLE_S` without work (the next publish
        starts another), so a pilot that is dropped leaves no thread behind."""
        while True:
            woken = self._wake.wait(WRITER_IDLE_S)
            self._wake.clear()
            worked = False
            while self._append_queued():
                worked = True
            if worked or woken:
                continue
            with self._lock:
                if not self._queue:
                    self._writer = None
                    return

    def _append_queued(self) -> bool:
        """Append up to :data:`APPEND_BATCH` queued records in one call, reading what
        precedes them; False when nothing was queued."""
        with self._lock:
            records = [self._queue.popleft() for _ in range(min(APPEND_BATCH, len(self._queue)))]
            self._in_flight += len(records)
        if not records:
            return False
        try:
            self._append(records)
        finally:
            with self._settled:
                self._in_flight -= len(records)
                self._settled.notify_all()
        return True

    def _append(self, records: Sequence[IndexRecord]) -> None:
        if self._down():
            self._count(dropped=len(records))
            return
        data = [encode_record(record) for record in records]
        with self._read_lock:
            limit = self._room()
            try:
                read = self.log.append(self.origin, data, after=self._cursor, limit=limit)
            except StoreError as exc:
                self._failed(exc, dropped=len(records))
                return
            self._count(appended=len(records))
            self._answered()
            if limit:
                self._advance(read, self._clock(), limit, appended=len(records))

    def pending(self) -> list[IndexRecord]:
        """The other pilots' records not replayed yet, oldest first: those the last
        append read, and, when a read is due, those a read finds now (none while the
        log is off)."""
        now = self._clock()
        if (now < self._next_read and not self._unread) or self._down():
            return []
        if not self._read_lock.acquire(blocking=False):
            return []  # another thread is reading: it replays what there is
        try:
            if now >= self._next_read and self._room():
                self._read(now, self._room())
            unread, self._unread = self._unread, []
        finally:
            self._read_lock.release()
        self._count(replayed=len(unread))
        return unread

    def close(self) -> None:
        self.log.close()

    def _room(self) -> int:
        """How many records one read may take: what the batch of one call has left
        besides those read and not replayed yet (read lock held)."""
        return max(0, self.config.replay_batch - len(self._unread))

    def _read(self, now: float, limit: int) -> None:
        """Read at most ``limit`` records after the cursor (read lock held)."""
        try:
            read = self.log.read(self._cursor, limit)
        except StoreError as exc:
            self._failed(exc)
            return
        self._answered()
        if read.last < self._cursor:  # the log was emptied: start again
            self._cursor = 0
            self._read(now, limit)
            return
        self._advance(read, now, limit)

    def _advance(self, read: LogRead, now: float, limit: int, *, appended: int = 0) -> None:
        """Take ``read`` (read lock held): it covered the records numbered above the
        cursor up to ``read.last - appended`` (those after are this pilot's, just
        appended), at most ``limit``; what the log trimmed before it is counted as
        missed."""
        records, cursor = read.records, self._cursor
        if read.last < cursor:  # the log was emptied under an append: start again
            self._cursor, self._next_read = 0, now
            return
        end = read.last - appended
        complete = cursor >= end or len(records) < limit or records[-1].sequence == end
        first = records[0].sequence if records else end + 1  # the first number still held
        missed = first - cursor - 1 if cursor and first > cursor + 1 else 0
        self._cursor = read.last if complete else records[-1].sequence
        self._next_read = now + self.config.replay_interval_s if complete else now
        decoded, damaged = self._decode(records)
        self._unread.extend(decoded)
        self._count(missed=missed, damaged=damaged)

    def _decode(self, records: Sequence[LoggedRecord]) -> tuple[list[IndexRecord], int]:
        """The records of other origins, decoded; and how many could not be."""
        decoded, damaged = [], 0
        for record in records:
            if record.origin == self.origin:
                continue
            try:
                decoded.append(decode_record(record.data))
            except StoreFormatError:
                damaged += 1
        if damaged:
            logger.warning("index log %r: %d unreadable record(s) skipped", self.log, damaged)
        return decoded, damaged

    def _count(self, **added: int) -> None:
        with self._lock:
            stats = self._stats
            self._stats = replace(
                stats, **{name: getattr(stats, name) + value for name, value in added.items()}
            )

    def _down(self) -> bool:
        return self._stats.degraded and self._clock() < self._down_until

    def _failed(self, exc: StoreError, dropped: int = 0) -> None:
        with self._lock:
            self._down_until = self._clock() + self.config.retry_s
            stats = self._stats
            was_degraded = stats.degraded
            self._stats = replace(
                stats, failures=stats.failures + 1, dropped=stats.dropped + dropped, degraded=True
            )
        if not was_degraded:
            logger.warning(
                "index log %r unavailable (%s): planning on this pilot's own index, "
                "retrying in %.1f s",
                self.log,
                exc,
                self.config.retry_s,
            )

    def _answered(self) -> None:
        if not self._stats.degraded:
            return
        with self._lock:
            self._stats = replace(self._stats, degraded=False)
        logger.info("index log %r answers again: sharing the context index", self.log)
