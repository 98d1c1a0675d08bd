"""Routes and replica load on a Redis server: routers in any number of processes and
hosts share what each learned (a :class:`~contextpilot_rag.routing.route_store.RouteStore`).

Key layout (``P`` is ``key_prefix``, ``contextpilot:`` by default, shared with the
conversation store's keys, which it never touches)::

    P routes          hash key -> "learned_ms US blocks US origin US replica_id"
                      (US: the byte 0x1f; the replica id last, so it may hold anything)
    P routes:age      sorted set key -> learned_ms: the ``route_ttl_s`` and
                      ``max_routes`` bounds, oldest learned dropped first
    P load:<origin>   hash replica_id -> "in_flight US queued_tokens", expiring
                      ``load_ttl_s`` after the origin's last report (PEXPIRE)
    P loads           sorted set origin -> expiry (ms): which load hashes to read

Times are the server's (``TIME`` inside each script), so routers on hosts whose clocks
differ agree on a route's age: a look-up is one plain ``HMGET`` (the cheapest round
trip, on the decision's path), aged by the server's clock as the store last saw it from
a script's reply. Every other call is one Lua script (one round trip, atomic on the
server). Scripts touch keys they derive from the prefix, so the keys of one store
must live on one server: Redis Cluster is not supported.

Failures: every command runs under ``timeout_s`` (connect and read, 0.25 s by default)
and ends in :class:`~contextpilot_rag.errors.StoreUnavailableError` when Redis is
down, refuses or hangs, as :class:`~contextpilot_rag.stores.redis.RedisConversationStore`
does (the same client settings).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError, StoreFormatError
from ..routing.route_store import (
    DEFAULT_LOAD_TTL_S,
    DEFAULT_MAX_ROUTES,
    DEFAULT_ROUTE_TTL_S,
    Load,
    RouteUpdate,
    SharedRoute,
    check_route_bounds,
)
from ._redis_client import RedisConnection
from .redis import DEFAULT_KEY_PREFIX

if TYPE_CHECKING:
    import redis as redis_module

__all__ = ["DEFAULT_TIMEOUT_S", "RedisRouteStore"]

DEFAULT_TIMEOUT_S = 0.25
_SEP = "\x1f"
_MAX_ARGS = 3000  # routes per script call (Lua's unpack has a stack limit)

_NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

# KEYS: routes, routes:age. ARGV: ttl_ms, max routes, origin, then key, replica, blocks
# triples. Stores the routes stamped now, then drops expired and excess routes.
_PUBLISH = (
    _NOW_MS
    + """
local ttl, max, origin = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = 4, #ARGV, 3 do
  local value = string.format('%d', now) .. '\\31' .. ARGV[i + 2] .. '\\31' .. origin
    .. '\\31' .. ARGV[i + 1]
  redis.call('HSET', KEYS[1], ARGV[i], value)
  redis.call('ZADD', KEYS[2], now, ARGV[i])
end
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%d', now - ttl),
  'LIMIT', 0, 1000)
if #old > 0 then
  redis.call('HDEL', KEYS[1], unpack(old))
  redis.call('ZREM', KEYS[2], unpack(old))
end
local excess = redis.call('ZCARD', KEYS[2]) - max
while excess > 0 do
  local gone = redis.call('ZPOPMIN', KEYS[2], math.min(excess, 1000))
  for j = 1, #gone, 2 do redis.call('HDEL', KEYS[1], gone[j]) end
  excess = excess - #gone / 2
end
return string.format('%d', now)
"""
)

# KEYS: load:<origin>, loads. ARGV: ttl_ms, origin, then replica, load pairs.
_REPORT = (
    _NOW_MS
    + """
redis.call('DEL', KEYS[1])
if #ARGV > 2 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 3))
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
return 1
"""
)

# KEYS: loads. ARGV: the load hashes' key prefix.
# Returns {now_ms, origin, {field, value, ...}, origin, ...}.
_LOADS = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now))
local out = {string.format('%d', now)}
for _, origin in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  out[#out + 1] = origin
  out[#out + 1] = redis.call('HGETALL', ARGV[1] .. origin)
end
return out
"""
)

# KEYS: load:<origin>, loads. ARGV: origin.
_WITHDRAW = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


class RedisRouteStore:
    """A :class:`~contextpilot_rag.routing.route_store.RouteStore` on Redis.

    ``url_or_client``: a ``redis://`` / ``rediss://`` URL, or a ``redis.Redis`` client
    (used as configured; :meth:`close` leaves it open). ``max_routes``,
    ``route_ttl_s`` and ``load_ttl_s`` bound what the store holds (see the module
    docstring); ``key_prefix`` separates stores on one database; ``timeout_s``
    bounds each command when the store opens the URL itself.

    Needs the ``redis`` extra (``pip install "contextpilot-rag[redis]"``)."""

    def __init__(
        self,
        url_or_client: str | redis_module.Redis,
        *,
        max_routes: int = DEFAULT_MAX_ROUTES,
        route_ttl_s: float = DEFAULT_ROUTE_TTL_S,
        load_ttl_s: float = DEFAULT_LOAD_TTL_S,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        check_route_bounds(max_routes, route_ttl_s, load_ttl_s)
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ConfigError("RedisRouteStore: key_prefix must be a non-empty str")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ConfigError(f"RedisRouteStore: timeout_s must be > 0, got {timeout_s!r}")
        self._redis = RedisConnection(
            url_or_client, timeout_s=timeout_s, store="Redis route store", owner="RedisRouteStore"
        )
        self._client, self._call = self._redis.client, self._redis.call
        self.max_routes = max_routes
        self.route_ttl_s = float(route_ttl_s)
        self.load_ttl_s = float(load_ttl_s)
        self._prefix = key_prefix
        self._offset_ms = 0.0  # the server's clock minus this host's (learned by scripts)
        self._routes, self._ages = f"{key_prefix}routes", f"{key_prefix}routes:age"
        self._loads = f"{key_prefix}loads"
        register = self._client.register_script
        self._publish = register(_PUBLISH)
        self._report, self._read_loads = register(_REPORT), register(_LOADS)
        self._withdraw = register(_WITHDRAW)

    def publish(self, origin: str, routes: Sequence[RouteUpdate]) -> None:
        ttl_ms, keys = max(1, round(self.route_ttl_s * 1000)), [self._routes, self._ages]
        for start in range(0, len(routes), _MAX_ARGS // 3):
            args: list[object] = [ttl_ms, self.max_routes, origin]
            for key, replica_id, blocks in routes[start : start + _MAX_ARGS // 3]:
                args += (key, replica_id, blocks)
            sent_ms = time.time() * 1000
            now_ms = self._call(lambda args=args: self._publish(keys=keys, args=args))
            self._server_time(now_ms, sent_ms)

    def lookup(self, keys: Sequence[int]) -> list[SharedRoute]:
        if not keys:
            return []
        values = self._call(lambda: self._client.hmget(self._routes, keys))
        now, found = round(time.time() * 1000 + self._offset_ms), []
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            route = _route(key, value, now)
            if route.age_s <= self.route_ttl_s:
                found.append(route)
        return found

    def report_load(self, origin: str, load: Mapping[str, Load]) -> None:
        args: list[object] = [max(1, round(self.load_ttl_s * 1000)), origin]
        for replica_id, (in_flight, queued) in load.items():
            args += (replica_id, f"{in_flight}{_SEP}{queued}")
        keys = [self._load_key(origin), self._loads]
        self._call(lambda: self._report(keys=keys, args=args))

    def loads(self) -> dict[str, dict[str, Load]]:
        sent_ms = time.time() * 1000
        reply = self._call(
            lambda: self._read_loads(keys=[self._loads], args=[f"{self._prefix}load:"])
        )
        self._server_time(reply[0], sent_ms)
        result: dict[str, dict[str, Load]] = {}
        for i in range(1, len(reply), 2):
            fields = reply[i + 1]
            result[_text(reply[i])] = {
                _text(fields[j]): _load(fields[j + 1]) for j in range(0, len(fields), 2)
            }
        return result

    def withdraw(self, origin: str) -> None:
        keys = [self._load_key(origin), self._loads]
        self._call(lambda: self._withdraw(keys=keys, args=[origin]))

    def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` unless the server answers."""
        self._call(self._client.ping)

    def close(self) -> None:
        """Close the connections this store opened (not a client it was given)."""
        self._redis.close()

    def __repr__(self) -> str:
        return f"RedisRouteStore(key_prefix={self._prefix!r})"

    def _server_time(self, now_ms: bytes | str, sent_ms: float) -> None:
        """Learn the server clock's offset from this host's (a script's ``TIME``,
        taken between ``sent_ms`` and now), so that a look-up, one plain ``HMGET``,
        ages routes by the server's clock."""
        try:
            server = int(now_ms)
        except (TypeError, ValueError):
            raise StoreFormatError("Redis route store: a script returned no time") from None
        self._offset_ms = server - (sent_ms + time.time() * 1000) / 2

    def _load_key(self, origin: str) -> str:
        return f"{self._prefix}load:{origin}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _route(key: int, value: bytes | str, now_ms: int) -> SharedRoute:
    try:
        learned, blocks, origin, replica_id = _text(value).split(_SEP, 3)
        age_s = max(0, now_ms - int(learned)) / 1000
        return SharedRoute(key, replica_id, int(blocks), age_s, origin)
    except ValueError as exc:
        raise StoreFormatError(f"Redis route store: damaged route under key {key}") from exc


def _load(value: bytes | str) -> Load:
    try:
        in_flight, queued = _text(value).split(_SEP)
        return int(in_flight), int(queued)
    except ValueError as exc:
        raise StoreFormatError("Redis route store: damaged load report") from exc
