"""The Redis connection the Redis stores share: a client opened from a URL (or one the
caller owns) whose commands fail fast with the store's typed errors."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, StoreError, StoreUnavailableError

if TYPE_CHECKING:
    import redis as redis_module

__all__ = ["RedisConnection", "import_redis"]


class RedisConnection:
    """``url_or_client``: a ``redis://`` URL (opened here with ``timeout_s``, closed by
    :meth:`close`) or a ``redis.Redis`` client (used as configured, left open).
    ``store`` names the store in errors; ``unavailable_advice`` ends the message of a
    :class:`StoreUnavailableError`."""

    def __init__(
        self,
        url_or_client: str | redis_module.Redis,
        *,
        timeout_s: float,
        store: str,
        owner: str,
        unavailable_advice: str = "",
    ) -> None:
        redis = import_redis()
        if isinstance(url_or_client, str):
            self.client, self._owns_client = _client_for(redis, url_or_client, timeout_s), True
        elif isinstance(url_or_client, redis.Redis):
            self.client, self._owns_client = url_or_client, False
        else:
            raise ConfigError(
                f"{owner} takes a redis:// URL or a redis.Redis client, "
                f"got {type(url_or_client).__name__}"
            )
        self._errors = redis.RedisError
        self._unavailable = (redis.ConnectionError, redis.TimeoutError)
        self._store = store
        self._advice = unavailable_advice

    def call(self, command: Any) -> Any:
        """Run ``command``, Redis's errors turned into the store's typed ones."""
        try:
            return command()
        except self._unavailable as exc:
            raise StoreUnavailableError(
                f"{self._store} unavailable ({type(exc).__name__}: {exc}){self._advice}"
            ) from exc
        except self._errors as exc:
            raise StoreError(f"{self._store}: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Close the client if it was opened here (not a client the caller gave)."""
        if self._owns_client:
            self.client.close()


def import_redis() -> ModuleType:
    """The ``redis`` package, or an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module("redis")
    except ImportError as exc:
        raise ImportError(
            'the Redis store needs the redis package: pip install "contextpilot-rag[redis]"'
        ) from exc


def _client_for(redis: ModuleType, url: str, timeout_s: float) -> Any:
    """A client whose every call ends within ``timeout_s`` (connect and read) when
    Redis is down or hung: one immediate retry on a refused or dropped connection,
    none on a timeout."""
    retry = redis.retry.Retry(
        redis.backoff.NoBackoff(), 1, supported_errors=(redis.ConnectionError,)
    )
    try:
        return redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=retry
        )
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL: {exc}") from exc
