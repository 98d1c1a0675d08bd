"""A ZMQ subscriber that keeps a :class:`~.mirror.KVCacheMirror` in step with an
engine's KV-cache events (vLLM ``--kv-events-config``; the ``kv-events`` extra).

One background thread owns the sockets: a SUB socket on the engine's publisher and,
for replays, a short-lived DEALER on its ROUTER replay endpoint (send ``[b"",
start_seq]``, receive ``[b"", topic, seq, payload]`` per buffered batch, then an end
marker whose sequence frame is eight ``0xff`` bytes).

Sequence rules (live sequence numbers rise by one per batch within a publisher run):

- the next number: apply the batch;
- a jump forward (a gap): replay the missing batches, then go on; a replay that
  cannot be had (no replay endpoint, a timeout, batches no longer buffered) loses the
  sync;
- a number at or below the last live one (the publisher restarted): the engine's
  cache starts empty, so the mirror is cleared and rebuilt from the new run's batch 0;
- between the last live number and the next expected one: a batch the replay
  already applied; skipped.

*Synced* means the mirror has seen every batch since a moment the engine's cache was
known empty (the publisher's first batch, a replay from batch 0, an
``AllBlocksCleared``, a restart). After a loss it stays unsynced, events still applied
as they come, until the cache is known empty again. On start the subscriber asks for
a replay from batch 0, so a subscriber started after the engine is synced at once
while the publisher still buffers its first batch. Malformed messages are counted and
skipped; a listener that raises is logged and counted; nothing stops the thread but
:meth:`KVEventSubscriber.stop`.

Limit: a publisher that restarts unseen and publishes more batches than the subscriber
last saw before it reconnects looks like a gap, not a restart.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..errors import ConfigError, InvalidInputError
from .mirror import KVCacheMirror, MirrorChange

try:
    import zmq

    from . import wire
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "contextpilot_rag.kv_events.KVEventSubscriber needs pyzmq and msgspec: "
        "pip install 'contextpilot-rag[kv-events]'"
    ) from exc

__all__ = ["KVEventSubscriber", "MirrorListener", "SubscriberStats"]

logger = logging.getLogger(__name__)

MirrorListener = Callable[[MirrorChange], object]
"""Called on the subscriber thread after each handled message that changed the mirror."""

_COUNTERS = (
    "batches",
    "events",
    "unknown_events",
    "gaps",
    "replays",
    "replay_failures",
    "restarts",
    "resyncs",
    "duplicates",
    "decode_errors",
    "other_topics",
    "listener_errors",
)
_DRAIN_LIMIT = 256  # messages handled between two looks at the stop flag


@dataclass(frozen=True)
class SubscriberStats:
    """Counters since construction. ``last_seq``: the last batch applied and passed to
    the listeners (``None`` before the first); ``gaps``: forward jumps in the live sequence;
    ``replays``: replay requests (gaps and syncs from batch 0); ``restarts``:
    sequences that went back; ``resyncs``: times the subscriber became synced again
    after being unsynced (the first sync included); ``duplicates``: live batches a
    replay had already applied; ``decode_errors``: malformed messages skipped;
    ``other_topics``: messages of another topic sharing the topic prefix."""

    synced: bool
    last_seq: int | None
    batches: int
    events: int
    unknown_events: int
    gaps: int
    replays: int
    replay_failures: int
    restarts: int
    resyncs: int
    duplicates: int
    decode_errors: int
    other_topics: int
    listener_errors: int


def _check_endpoint(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or "://" not in value:
        raise ConfigError(f"{name} must be a ZMQ endpoint such as 'tcp://127.0.0.1:5557'")


class KVEventSubscriber:
    """Subscribes to an engine's KV-cache events and applies them to ``mirror``.

    ``endpoint``: the engine's publisher (which binds when its configured endpoint has
    ``*``); with ``bind=True`` this side binds instead (an engine configured with a
    host address connects). ``replay_endpoint``: the engine's replay ROUTER, or
    ``None`` (then a gap loses the sync). ``topic``: the engine's ``topic``.
    ``replay_timeout_s``: the longest wait for the next replay message.
    Use :meth:`start` / :meth:`stop` or ``with``; :meth:`stop` joins the thread."""

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:5557",
        replay_endpoint: str | None = "tcp://127.0.0.1:5558",
        topic: str = "kv",
        *,
        mirror: KVCacheMirror,
        bind: bool = False,
        replay_timeout_s: float = 2.0,
        poll_interval_s: float = 0.05,
    ) -> None:
        _check_endpoint("endpoint", endpoint)
        _check_endpoint("replay_endpoint", replay_endpoint, optional=True)
        if not isinstance(topic, str):
            raise ConfigError("topic must be a str")
        if not isinstance(mirror, KVCacheMirror):
            raise ConfigError("mirror must be a KVCacheMirror")
        for name, value in (
            ("replay_timeout_s", replay_timeout_s),
            ("poll_interval_s", poll_interval_s),
        ):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.mirror = mirror
        self._bind = bind
        self._replay_timeout_s = float(replay_timeout_s)
        self._poll_ms = max(1, int(poll_interval_s * 1000))
        self._topic = topic.encode()
        self._listeners: list[MirrorListener] = []
        self._lock = threading.Lock()
        self._handled = threading.Condition(self._lock)
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._reset_sequence()

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> KVEventSubscriber:
        """Start the thread (no-op while it runs); raises
        :class:`~contextpilot_rag.errors.ConfigError` if the endpoint cannot be used."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._reset_sequence()
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="kv-event-subscriber", daemon=True
        )
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise ConfigError(f"cannot subscribe to {self.endpoint}: {failure[0]}") from failure[0]
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close its sockets; returns within about one poll
        interval (or ``timeout_s`` at most)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("KV-event subscriber thread did not stop within %.1f s", timeout_s)
            else:
                self._thread = None

    @property
    def running(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> KVEventSubscriber:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- state ------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Whether the mirror is known to equal the engine's cache (module docstring);
        never once the thread has stopped (nothing keeps the mirror up to date)."""
        return self._synced and self.mirror.exact and self.running

    def stats(self) -> SubscriberStats:
        """A snapshot of the counters."""
        with self._lock:
            return SubscriberStats(synced=self.synced, last_seq=self._last_seq, **self._counts)

    def wait(self, predicate: Callable[[SubscriberStats], bool], timeout_s: float) -> bool:
        """Block until ``predicate(stats())`` holds (checked after each handled
        message); returns whether it did within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._handled:
            while True:
                stats = SubscriberStats(synced=self.synced, last_seq=self._last_seq, **self._counts)
                if predicate(stats):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._handled.wait(min(left, 0.1))

    def add_listener(self, listener: MirrorListener) -> None:
        """Call ``listener(change)`` after each message that changed the mirror."""
        if not callable(listener):
            raise InvalidInputError("a listener must be callable")
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: MirrorListener) -> None:
        """Stop calling ``listener`` (unknown listeners are ignored)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    # -- the thread -------------------------------------------------------------------

    def _reset_sequence(self) -> None:
        self._synced = False
        self._losses = 0
        self._expected: int | None = None
        self._last_live: int | None = None
        # digests of the batches a replay applied before any live batch arrived: a
        # live batch numbered among them is a duplicate only if it is the same batch
        self._replayed: dict[int, bytes] = {}
        self._last_seq: int | None = None
        self._applied_seq: int | None = None

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            ctx: zmq.Context[Any] = zmq.Context()
        except zmq.ZMQError as exc:  # out of file descriptors, say
            failure.append(exc)
            ready.set()
            return
        sub = ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            (sub.bind if self._bind else sub.connect)(self.endpoint)
        except zmq.ZMQError as exc:
            failure.append(exc)
        finally:
            ready.set()
        try:
            if not failure:
                self._ctx = ctx
                self._follow(sub)
        except Exception:  # a bug, not a message: log it rather than die silently
            logger.exception("KV-event subscriber thread failed")
        finally:
            self._ctx = None
            sub.close(0)
            ctx.term()

    def _follow(self, sub: zmq.Socket[Any]) -> None:
        self._handle(self._catch_up(0, None))
        while not self._stop.is_set():
            if sub.poll(self._poll_ms):
                self._drain(sub)

    def _drain(self, sub: zmq.Socket[Any]) -> None:
        for _ in range(_DRAIN_LIMIT):
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(self._on_message(frames))

    def _handle(self, change: MirrorChange) -> None:
        with self._lock:
            listeners = list(self._listeners) if change else []
        for listener in listeners:
            try:
                listener(change)
            except Exception:
                self._count("listener_errors")
                logger.exception("KV-event listener %r failed", listener)
        with self._handled:
            self._last_seq = self._applied_seq  # published once its listeners ran
            self._handled.notify_all()

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    # -- sequence rules ---------------------------------------------------------------

    def _on_message(self, frames: list[bytes]) -> MirrorChange:
        if len(frames) != 3:
            self._count("decode_errors")
            return MirrorChange()
        topic, seq_frame, payload = frames
        if topic != self._topic:
            self._count("other_topics")
            return MirrorChange()
        try:
            seq = wire.decode_seq(seq_frame)
        except InvalidInputError:
            self._count("decode_errors")
            return MirrorChange()
        return self._on_batch(seq, payload)

    def _on_batch(self, seq: int, payload: bytes) -> MirrorChange:
        expected, last_live = self._expected, self._last_live
        if last_live is not None:
            restarted = seq <= last_live
        else:  # only replayed batches so far: a lower number that is another batch
            restarted = (
                expected is not None
                and seq < expected
                and (self._replayed.get(seq) != _digest(payload))
            )
        if restarted:
            self._count("restarts")
            expected = None  # a new publisher run
        self._last_live = seq
        self._replayed.clear()
        if expected is None:
            if seq == 0:  # the publisher's first batch: its engine's cache was empty
                return self._from_empty() | self._apply(seq, payload)
            return self._catch_up(0, (seq, payload))
        if seq < expected:
            self._count("duplicates")
            return MirrorChange()
        if seq > expected:
            self._count("gaps")
            return self._catch_up(expected, (seq, payload))
        return self._apply(seq, payload)

    def _from_empty(self) -> MirrorChange:
        """The engine's cache is known empty now: clear the mirror, synced from here."""
        change = self.mirror.clear()
        self._now_synced()
        return change

    def _now_synced(self) -> None:
        if not self._synced:
            self._synced = True
            self._count("resyncs")

    def _lose_sync(self) -> None:
        self._synced = False
        self._losses += 1
        self.mirror.mark_inexact()

    def _apply(self, seq: int, payload: bytes) -> MirrorChange:
        self._expected = seq + 1
        self._applied_seq = seq
        try:
            batch = wire.decode_batch(seq, payload)
        except InvalidInputError as exc:
            self._count("decode_errors")
            logger.warning("skipping KV-event batch %d: %s", seq, exc)
            self._lose_sync()  # its events are lost
            return MirrorChange()
        self._count("batches")
        self._count("events", len(batch.events))
        self._count("unknown_events", batch.unknown_events)
        change = self.mirror.apply(batch.events)
        if change.cleared:
            self._now_synced()
        return change

    def _catch_up(self, start: int, live: tuple[int, bytes] | None) -> MirrorChange:
        """Replay from ``start`` (0: rebuild from an empty cache), then apply the live
        batch ``live`` if the replay did not cover it. A failed replay loses the sync
        (the live batch is still applied)."""
        self._count("replays")
        losses = self._losses
        change = MirrorChange()
        if start == 0:
            change = self.mirror.clear()
            self._expected = 0
        replayed = self._replay(start)
        if replayed is None:
            self._count("replay_failures")
            self._lose_sync()
            if live is None:
                self._expected = None
                return change
            self._expected = live[0]
            return change | self._apply(*live)
        change |= replayed
        if start == 0 and self._losses == losses:
            self._now_synced()
        if live is None or live[0] < (self._expected or 0):
            return change
        if live[0] > (self._expected or 0):
            self._count("replay_failures")  # the replay stopped short of the live batch
            self._lose_sync()
            self._expected = live[0]
        return change | self._apply(*live)

    def _replay(self, start: int) -> MirrorChange | None:
        """Apply the buffered batches from ``start`` on, as the publisher replays them;
        ``None`` when the replay fails (nothing at ``start``, a hole, a timeout)."""
        if self.replay_endpoint is None or self._ctx is None:
            return None
        dealer = self._ctx.socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", wire.encode_seq(start)], zmq.NOBLOCK)
            return self._receive_replay(dealer, start)
        except zmq.ZMQError as exc:
            logger.warning("KV-event replay from %d failed: %s", start, exc)
            return None
        finally:
            dealer.close(0)

    def _receive_replay(self, dealer: zmq.Socket[Any], start: int) -> MirrorChange | None:
        change = MirrorChange()
        next_seq = start
        deadline = time.monotonic() + self._replay_timeout_s
        while not self._stop.is_set():
            if not dealer.poll(self._poll_ms):
                if time.monotonic() > deadline:
                    logger.warning("KV-event replay from %d timed out", start)
                    return None
                continue
            deadline = time.monotonic() + self._replay_timeout_s
            frames = dealer.recv_multipart()
            if len(frames) != 4 or frames[0] != b"":
                self._count("decode_errors")
                continue
            _, _, seq_frame, payload = frames
            if seq_frame == wire.END_SEQ:
                return change
            try:
                seq = wire.decode_seq(seq_frame)
            except InvalidInputError:
                self._count("decode_errors")
                return None
            if seq != next_seq:
                logger.warning("KV-event replay wanted batch %d, got %d", next_seq, seq)
                return None
            if self._last_live is None:
                self._replayed[seq] = _digest(payload)
            change |= self._apply(seq, payload)
            next_seq += 1
        return None


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()
