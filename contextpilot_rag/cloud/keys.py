"""``prompt_cache_key``: which requests a hosted API should route to one cache.

OpenAI routes a request by a hash of its first tokens combined with
``prompt_cache_key``; requests with the same key and prefix land where that prefix is
cached, up to about 15 requests a minute on one route, after which the provider spreads
the rest over other servers (where they miss). The pilot derives the key from what
it knows will be shared:

- a request: its system prompt and its first ``key_blocks`` blocks in final order (the
  reorder puts the blocks it shares with earlier requests first), so requests that
  share that leading prefix share the key;
- a conversation keeps the key its first turn got (stored with the conversation), so
  its later turns go where their history is cached;
- a route past the share of the provider's rate its new requests may take
  (:class:`KeyBuckets`) gets its new requests under a numbered variant of the key, so
  one popular prefix takes a few routes rather than overflowing one, and the
  conversations already on it keep reaching their cache. A route's load counts the
  requests of the last minute *and* the turns its open conversations are expected to
  send next: a conversation joins a route when it starts, but its later turns follow
  it there, so a route filled by new conversations alone overflows a minute later.

The key is a digest (never a secret or a user's text); a prompt with a tenant's cache
salt mixes the salt in, so no other tenant's requests share its key.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence

from ..errors import ConfigError

__all__ = [
    "KEY_PREFIX",
    "ROUTE_WINDOW_S",
    "KeyBuckets",
    "bucket_key",
    "parts_digest",
    "prefix_cache_key",
]

KEY_PREFIX = "cpk-"
_HEX_CHARS = 32
ROUTE_WINDOW_S = 60.0
"""The window a route's request rate is counted over (a minute)."""


def parts_digest(*parts: str) -> str:
    """A key naming ``parts`` in order (each length-prefixed, so no two sequences
    share one): :data:`KEY_PREFIX` and a truncated SHA-256."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return KEY_PREFIX + hasher.hexdigest()[:_HEX_CHARS]


def prefix_cache_key(
    system_key: str, leading_block_ids: Sequence[str], cache_salt: str | None = None
) -> str:
    """The key of requests whose prompt starts with the system prompt named
    ``system_key`` and the blocks ``leading_block_ids``."""
    return parts_digest("prefix", cache_salt or "", system_key, *leading_block_ids)


def bucket_key(key: str, bucket: int) -> str:
    """``key`` itself for bucket 0, else the ``bucket``-th variant of it (a digest)."""
    return key if bucket == 0 else parts_digest("bucket", key, str(bucket))


class KeyBuckets:
    """Where a new request of a key goes when its route is busy: the key's lowest
    bucket (:func:`bucket_key`) whose load is under ``rate_per_minute``.
    ``rate_per_minute`` ``None``: always the key itself.

    A bucket's load is the requests it took in the last minute plus the requests its
    open conversations are expected to send in the next one (each conversation's last
    :meth:`record` says how many: ``returns``, until ``until``). A conversation's
    newer request replaces its expectation.

    Bounded: the ``max_keys`` keys used most recently are counted (the others count as
    idle), each by its last ``ceil(rate_per_minute)`` request times, and at most
    ``max_keys`` open conversations (the least recently seen is dropped). Not
    thread-safe: the pilot calls it under its lock."""

    def __init__(self, rate_per_minute: float | None, max_keys: int) -> None:
        if rate_per_minute is not None and not rate_per_minute > 0:
            raise ConfigError(f"rate_per_minute must be > 0 or None, got {rate_per_minute!r}")
        if max_keys < 1:
            raise ConfigError(f"max_keys must be >= 1, got {max_keys!r}")
        self._rate = rate_per_minute
        self._max_keys = max_keys
        self._times: OrderedDict[str, deque[float]] = OrderedDict()
        # conversation -> (key, expected requests, until), least recently seen first
        self._open: OrderedDict[Hashable, tuple[str, float, float]] = OrderedDict()
        self._expected: dict[str, float] = {}  # key -> sum of its open conversations'

    def choose(self, key: str, now_s: float) -> str:
        """The key a new request of ``key`` should carry now (changes nothing but
        forgetting conversations whose expectation ran out)."""
        if self._rate is None:
            return key
        self._close(now_s)
        bucket = 0
        while True:  # ends: at most max_keys buckets are busy
            candidate = bucket_key(key, bucket)
            load = self._recent(candidate, now_s) + self._expected.get(candidate, 0.0)
            if load < self._rate:
                return candidate
            bucket += 1

    def record(
        self,
        key: str,
        now_s: float,
        *,
        conversation: Hashable | None = None,
        returns: float = 0.0,
        until: float = 0.0,
    ) -> None:
        """Count a request sent with ``key`` at ``now_s``; for a turn of
        ``conversation``, expect ``returns`` more requests of it on ``key`` within the
        next minute, until ``until`` (its earlier expectation is met by this one)."""
        if self._rate is None:
            return
        if not 0.0 <= returns <= 1.0:
            raise ConfigError(f"returns must be in [0, 1], got {returns!r}")
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = deque(maxlen=math.ceil(self._rate))
            if len(self._times) > self._max_keys:
                self._times.popitem(last=False)
        else:
            self._times.move_to_end(key)
        times.append(now_s)
        if conversation is None:
            return
        self._forget(conversation)
        if returns > 0.0 and until > now_s:
            self._open[conversation] = (key, returns, until)
            self._expected[key] = self._expected.get(key, 0.0) + returns
            if len(self._open) > self._max_keys:
                self._forget(next(iter(self._open)))

    def _forget(self, conversation: Hashable) -> None:
        entry = self._open.pop(conversation, None)
        if entry is None:
            return
        key, returns, _ = entry
        left = self._expected[key] - returns
        if left > 1e-9:
            self._expected[key] = left
        else:
            del self._expected[key]

    def _close(self, now_s: float) -> None:
        """Forget the open conversations whose expectation ran out by ``now_s`` (the
        least recently seen first; one seen later may run out earlier, and is
        forgotten when it reaches the front)."""
        while self._open:
            conversation, (_, _, until) = next(iter(self._open.items()))
            if until > now_s:
                return
            self._forget(conversation)

    def _recent(self, key: str, now_s: float) -> int:
        times = self._times.get(key)
        if times is None:
            return 0
        return sum(1 for at_s in times if at_s > now_s - ROUTE_WINDOW_S)
