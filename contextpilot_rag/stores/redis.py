"""Conversations on a Redis server: any number of processes and hosts behave as one.

Key layout (``P`` is ``key_prefix``, ``contextpilot:`` by default)::

    P conv:<id>   hash {v: version, d: serialize.encode_conversation(...)}
                  expires after ttl_s without access (PEXPIRE, refreshed by every read
                  and write): the conversation TTL is the key's expiry
    P conv-seen:<id>  "1", expires forget_after_s after the record's own expiry:
                  present while the record is absent means the store dropped it (TTL
                  or LRU), which is what forgotten() tells; delete() removes both keys
    P conv-lru    sorted set id -> last access (server ms): len() and the
                  max_conversations bound (least recently used dropped first)
    P conv-version    counter: every write's version, unique across the store

Each operation is one Lua script, so it is atomic on the server: a write checks the
record's version and replaces the whole record in one step (compare-and-set), and a
conversation can never be seen half-written. A read refreshes the expiries in the same
script. Scripts touch keys they derive from the prefix (the LRU bound deletes records
it finds in ``P lru``), so the keys of one store must live on one server: Redis
Cluster is not supported.

Failures: every command runs under ``timeout_s`` (connect and read); a refused or
dropped connection is retried once at once (a pooled connection from before a Redis
restart), a timeout never (a write may have been applied). Both end in
:class:`~contextpilot_rag.errors.StoreUnavailableError`: the call fails quickly and
records nothing in this process, and what Redis acknowledged before stays (with
``appendonly yes``, also across a Redis restart).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..conversations import Conversation, StoredConversation
from ..errors import ConfigError, InvalidInputError, StoreError
from ._redis_client import RedisConnection
from .cache import RecordCache
from .serialize import decode_conversation, encode_conversation

if TYPE_CHECKING:
    import redis as redis_module

    from .redis_index_log import RedisIndexLog

__all__ = ["DEFAULT_KEY_PREFIX", "RedisConversationStore"]

DEFAULT_KEY_PREFIX = "contextpilot:"
_DAY_S = 86_400.0

_NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

# KEYS: record, seen, lru. ARGV: ttl_ms (0: none), seen_ms, id, the version whose record
# the caller holds decoded (0: none). Returns {version, record} ({version, nil} when
# the caller holds that version) or {0, nil, forgotten}.
_READ = (
    _NOW_MS
    + """
local version = redis.call('HGET', KEYS[1], 'v')
if not version then
  return {0, false, redis.call('EXISTS', KEYS[2])}
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
redis.call('ZADD', KEYS[3], now, ARGV[3])
if version == ARGV[4] then return {tonumber(version), false, 0} end
return {tonumber(version), redis.call('HGET', KEYS[1], 'd'), 0}
"""
)

# KEYS: record, seen, lru, version counter. ARGV: expected version (-1: any), record,
# ttl_ms (0: none), seen_ms, max records (0: none), id, record key prefix.
# Returns the new version, or 0 when the record is not at the expected version.
_WRITE = (
    _NOW_MS
    + """
local current = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local expected = tonumber(ARGV[1])
if expected >= 0 and current ~= expected then return 0 end
local version = redis.call('INCR', KEYS[4])
redis.call('HSET', KEYS[1], 'v', version, 'd', ARGV[2])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], now, ARGV[6])
if ttl > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - ttl)) end
local max = tonumber(ARGV[5])
if max > 0 and current == 0 then
  local excess = redis.call('ZCARD', KEYS[3]) - max
  if excess > 0 then
    for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, excess)) do
      if excess > 0 and id ~= ARGV[6] then
        redis.call('DEL', ARGV[7] .. id)
        redis.call('ZREM', KEYS[3], id)
        excess = excess - 1
      end
    end
  end
end
return version
"""
)

# KEYS: record, seen, lru. ARGV: id. Returns 1 when a record was deleted.
_DELETE = """
local deleted = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
return deleted
"""

# KEYS: record, seen.
_FORGOTTEN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('EXISTS', KEYS[2])
"""

# KEYS: lru. ARGV: ttl_ms (0: none).
_LEN = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl)) end
return redis.call('ZCARD', KEYS[1])
"""
)


class RedisConversationStore:
    """A :class:`~contextpilot_rag.conversations.VersionedConversationStore` on Redis.

    ``url_or_client``: a ``redis://`` / ``rediss://`` URL, or a ``redis.Redis``
    client (used as it is configured; :meth:`close` leaves it open). ``ttl_s``: the
    idle time after which a conversation expires (``None``: never);
    ``max_conversations``: the most records the store keeps, least recently used
    dropped first (``None``: bounded by the TTL and Redis's memory only);
    ``forget_after_s``: how long after its expiry a dropped conversation is still
    reported by :meth:`forgotten` (default: ``ttl_s``, or a day without a TTL);
    ``key_prefix`` separates stores on one database; ``timeout_s`` bounds each
    command (connect and read) when the store opens the URL itself;
    ``cache_conversations``: how many decoded records this process keeps by version,
    so that a record that did not change is neither sent nor decoded again (reads
    still ask Redis every time: :mod:`.cache`).

    Needs the ``redis`` extra (``pip install "contextpilot-rag[redis]"``)."""

    def __init__(
        self,
        url_or_client: str | redis_module.Redis,
        *,
        ttl_s: float | None = 3600.0,
        max_conversations: int | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        forget_after_s: float | None = None,
        timeout_s: float = 1.0,
        cache_conversations: int = 256,
    ) -> None:
        _check_options(ttl_s, max_conversations, key_prefix, forget_after_s, timeout_s)
        self._cache = RecordCache(cache_conversations)
        self._redis = RedisConnection(
            url_or_client,
            timeout_s=timeout_s,
            store="Redis store",
            owner="RedisConversationStore",
            unavailable_advice="; nothing was recorded by this call in this process: call "
            "again once Redis is back",
        )
        self._call = self._redis.call
        self._prefix = key_prefix
        self._ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        forget_s = forget_after_s if forget_after_s is not None else (ttl_s or _DAY_S)
        self._seen_ms = self._ttl_ms + max(1, round(forget_s * 1000))
        self._max = max_conversations or 0
        self._lru = f"{key_prefix}conv-lru"
        self._version = f"{key_prefix}conv-version"
        register = self._redis.client.register_script
        self._read, self._write = register(_READ), register(_WRITE)
        self._delete, self._forgotten, self._len = (
            register(_DELETE),
            register(_FORGOTTEN),
            register(_LEN),
        )

    # -- ConversationStore ------------------------------------------------------------

    def get(self, conversation_id: str) -> Conversation | None:
        return self.get_versioned(conversation_id).conversation

    def get_versioned(self, conversation_id: str) -> StoredConversation:
        keys, cache = self._keys(conversation_id), self._cache
        for known in (cache.version(conversation_id), 0):
            args = (self._ttl_ms, self._seen_ms, conversation_id, known)
            version, record, forgotten = self._run(self._read, keys, args)
            if not version:
                cache.discard(conversation_id)
                return StoredConversation(None, 0, bool(forgotten))
            if record is not None:
                conversation = decode_conversation(record, conversation_id)
                cache.put(conversation, version)
                return StoredConversation(conversation, version)
            held = cache.get(conversation_id, version)
            if held is not None:
                return StoredConversation(held, version)
        raise StoreError(f"Redis store: no record sent for conversation {conversation_id!r}")

    def put(self, conversation: Conversation) -> None:
        self._put(conversation, -1)

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        if expected_version < 0:
            raise InvalidInputError("expected_version must be >= 0 (0: no record held)")
        return self._put(conversation, expected_version)

    def delete(self, conversation_id: str) -> bool:
        keys = self._keys(conversation_id)[:3]
        self._cache.discard(conversation_id)
        return bool(self._run(self._delete, keys, (conversation_id,)))

    def forgotten(self, conversation_id: str) -> bool:
        return bool(self._run(self._forgotten, self._keys(conversation_id)[:2], ()))

    def __len__(self) -> int:
        return int(self._run(self._len, (self._lru,), (self._ttl_ms,)))

    def ping(self) -> None:
        """Raise :class:`~contextpilot_rag.errors.StoreUnavailableError` unless the
        server answers."""
        self._call(self._redis.client.ping)

    def close(self) -> None:
        """Close the connections this store opened (not a client it was given)."""
        self._redis.close()

    def open_index_log(self, max_entries: int) -> RedisIndexLog:
        """The context index's log beside these conversations: on this store's client
        (its timeouts) under its key prefix (:mod:`.redis_index_log`)."""
        from .redis_index_log import RedisIndexLog

        return RedisIndexLog(self._redis.client, max_entries=max_entries, key_prefix=self._prefix)

    def __enter__(self) -> RedisConversationStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisConversationStore(key_prefix={self._prefix!r})"

    # -- calls ------------------------------------------------------------------------

    def _put(self, conversation: Conversation, expected_version: int) -> bool:
        conversation_id = conversation.conversation_id
        args = (
            expected_version,
            encode_conversation(conversation),
            self._ttl_ms,
            self._seen_ms,
            self._max,
            conversation_id,
            f"{self._prefix}conv:",
        )
        version = int(self._run(self._write, self._keys(conversation_id), args))
        if version:
            self._cache.put(conversation, version)
        return version > 0

    def _keys(self, conversation_id: str) -> tuple[str, str, str, str]:
        prefix = self._prefix
        return (
            f"{prefix}conv:{conversation_id}",
            f"{prefix}conv-seen:{conversation_id}",
            self._lru,
            self._version,
        )

    def _run(self, script: Any, keys: Sequence[str], args: Sequence[object]) -> Any:
        return self._call(lambda: script(keys=list(keys), args=list(args)))


def _check_options(
    ttl_s: object,
    max_conversations: object,
    key_prefix: object,
    forget_after_s: object,
    timeout_s: object,
) -> None:
    _check_positive("ttl_s", ttl_s, optional=True)
    _check_positive("forget_after_s", forget_after_s, optional=True)
    _check_positive("timeout_s", timeout_s, optional=False)
    if max_conversations is not None and (
        not isinstance(max_conversations, int)
        or isinstance(max_conversations, bool)
        or max_conversations < 1
    ):
        raise ConfigError("RedisConversationStore: max_conversations must be a positive int")
    if not isinstance(key_prefix, str) or not key_prefix:
        raise ConfigError("RedisConversationStore: key_prefix must be a non-empty str")


def _check_positive(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        allowed = "> 0 or None" if optional else "> 0"
        raise ConfigError(f"RedisConversationStore: {name} must be {allowed}, got {value!r}")
