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
  conversations already on it keep reaching their cache.

The key is a digest (never a secret or a user's text); a prompt with a tenant's cache
salt mixes the salt in, so no other tenant's requests share its key.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from collections.abc import Sequence

from ..errors import ConfigError

__all__ = ["KEY_PREFIX", "KeyBuckets", "bucket_key", "prefix_cache_key"]

KEY_PREFIX = "cpk-"
_HEX_CHARS = 32
_WINDOW_S = 60.0


def _digest(*parts: str) -> str:
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
    return _digest("prefix", cache_salt or "", system_key, *leading_block_ids)


def bucket_key(key: str, bucket: int) -> str:
    """``key`` itself for bucket 0, else the ``bucket``-th variant of it (a digest)."""
    return key if bucket == 0 else _digest("bucket", key, str(bucket))


class KeyBuckets:
    """Where a new request of a key goes when its route is busy: the key's lowest
    bucket (:func:`bucket_key`) that took fewer than ``rate_per_minute`` requests in the
    last minute. ``rate_per_minute`` ``None``: always the key itself.

    Bounded: the ``max_keys`` keys used most recently are counted (the others count as
    idle), each by its last ``ceil(rate_per_minute)`` request times. Not thread-safe:
    the pilot calls it under its lock."""

    def __init__(self, rate_per_minute: float | None, max_keys: int) -> None:
        if rate_per_minute is not None and not rate_per_minute > 0:
            raise ConfigError(f"rate_per_minute must be > 0 or None, got {rate_per_minute!r}")
        if max_keys < 1:
            raise ConfigError(f"max_keys must be >= 1, got {max_keys!r}")
        self._rate = rate_per_minute
        self._max_keys = max_keys
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def choose(self, key: str, now_s: float) -> str:
        """The key a new request of ``key`` should carry now (changes nothing)."""
        if self._rate is None:
            return key
        bucket = 0
        while True:  # ends: at most max_keys buckets are busy
            candidate = bucket_key(key, bucket)
            if self._recent(candidate, now_s) < self._rate:
                return candidate
            bucket += 1

    def record(self, key: str, now_s: float) -> None:
        """Count a request sent with ``key`` at ``now_s``."""
        if self._rate is None:
            return
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = deque(maxlen=math.ceil(self._rate))
            if len(self._times) > self._max_keys:
                self._times.popitem(last=False)
        else:
            self._times.move_to_end(key)
        times.append(now_s)

    def _recent(self, key: str, now_s: float) -> int:
        times = self._times.get(key)
        if times is None:
            return 0
        return sum(1 for at_s in times if at_s > now_s - _WINDOW_S)
