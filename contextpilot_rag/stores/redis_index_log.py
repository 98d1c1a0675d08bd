"""The index log on a Redis server: one stream (an
:class:`~contextpilot_rag.stores.index_log.IndexLog`).

Key layout (``P`` is ``key_prefix``, shared with the conversation and route keys,
which it never touches)::

    P index-log   stream; entry id "<sequence>-0", fields o: origin, d: record

The entry id's first part *is* the sequence number, so a reader resumes with one
``XRANGE`` from the number after the last it saw. An append is one Lua script (atomic:
concurrent appenders never take the same number) that first reads the records the
appender has not seen (those before its own: one round trip for both), then adds each
record with ``XADD … MAXLEN ~ max_entries``: Redis trims whole stream nodes, so the stream holds
``max_entries`` records plus at most one node (``stream-node-max-entries``, 100 by
default). A read is one script too (the records, and the newest id).
Commands run under the client's timeouts and fail with the store's typed errors
(:class:`~contextpilot_rag.stores._redis_client.RedisConnection`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, StoreFormatError
from ._redis_client import RedisConnection
from .index_log import DEFAULT_MAX_ENTRIES, LoggedRecord, LogRead, check_max_entries
from .redis import DEFAULT_KEY_PREFIX

if TYPE_CHECKING:
    import redis as redis_module

__all__ = ["RedisIndexLog"]

# KEYS: the stream. ARGV: max entries, origin, the last sequence number the caller
# read, the most records to read, then the records. Returns {the last sequence number
# given, the records between the caller's and the appended ones (as XRANGE)}.
_APPEND = """
local function last_sequence(key)
  local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if #top > 0 then return tonumber(string.match(top[1][1], '^(%d+)')) end
  if redis.call('EXISTS', key) == 0 then return 0 end
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      return tonumber(string.match(info[i + 1], '^(%d+)'))
    end
  end
  return 0
end
local before = last_sequence(KEYS[1])
local after, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local records = {}
if limit > 0 and after < before then
  records = redis.call('XRANGE', KEYS[1], string.format('%d-0', after + 1),
    string.format('%d-0', before), 'COUNT', limit)
end
local sequence = before
for i = 5, #ARGV do
  sequence = sequence + 1
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], string.format('%d-0', sequence),
    'o', ARGV[2], 'd', ARGV[i])
end
return {string.format('%d', sequence), records}
"""

# KEYS: the stream. ARGV: the first sequence number wanted, the most records. Returns
# {the newest entry id (or '0'), {{id, {field, value, ...}}, ...}}.
_READ = """
local records = redis.call('XRANGE', KEYS[1], ARGV[1] .. '-0', '+', 'COUNT', ARGV[2])
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local newest = '0'
if #top > 0 then newest = top[1][1] end
return {newest, records}
"""


class RedisIndexLog:
    """An index log in the Redis stream ``<key_prefix>index-log``.

    ``url_or_client``: a ``redis://`` URL (opened here with ``timeout_s``, closed by
    :meth:`close`) or a ``redis.Redis`` client (a conversation store's, used as it is
    and left open)."""

    def __init__(
        self,
        url_or_client: str | redis_module.Redis,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        timeout_s: float = 1.0,
    ) -> None:
        self.max_entries = check_max_entries(max_entries)
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ConfigError("RedisIndexLog: key_prefix must be a non-empty str")
        self._redis = RedisConnection(
            url_or_client, timeout_s=timeout_s, store="Redis index log", owner="RedisIndexLog"
        )
        self._client, self._call = self._redis.client, self._redis.call
        self._key = f"{key_prefix}index-log"
        register = self._client.register_script
        self._append, self._read = register(_APPEND), register(_READ)

    def append(self, origin: str, records: Sequence[bytes], *, after: int, limit: int) -> LogRead:
        args: list[Any] = [self.max_entries, origin, after, limit, *records]
        last, entries = self._call(lambda: self._append(keys=[self._key], args=args))
        return LogRead(_records(entries), _sequence(last))

    def read(self, after: int, limit: int) -> LogRead:
        args = [after + 1, limit]
        newest, entries = self._call(lambda: self._read(keys=[self._key], args=args))
        return LogRead(_records(entries), _sequence(newest))

    def close(self) -> None:
        self._redis.close()

    def __repr__(self) -> str:
        return f"RedisIndexLog({self._key!r}, max_entries={self.max_entries})"


def _sequence(entry_id: bytes | str) -> int:
    text = _text(entry_id)
    try:
        return int(text.partition("-")[0])
    except ValueError:
        raise StoreFormatError(f"Redis index log: entry id {text!r} is no sequence") from None


def _records(entries: Sequence[Any]) -> tuple[LoggedRecord, ...]:
    return tuple(_record(entry_id, fields) for entry_id, fields in entries)


def _record(entry_id: bytes | str, fields: Sequence[Any]) -> LoggedRecord:
    """An entry (its fields as a flat list) as a record; one without its fields has
    empty data, which the reader counts as damaged and skips rather than stopping."""
    values = {_text(fields[i]): fields[i + 1] for i in range(0, len(fields) - 1, 2)}
    origin, data = values.get("o", b""), values.get("d", b"")
    if isinstance(data, str):
        data = data.encode("utf-8")
    return LoggedRecord(_sequence(entry_id), _text(origin), data)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
