"""Store URLs: the one place where ``store="redis://…" | "sqlite:///…"`` is read.

- ``redis://[[user]:password@]host[:port][/db]`` (``rediss://`` for TLS): a
  :class:`~contextpilot_rag.stores.redis.RedisConversationStore`. Query options:
  ``key_prefix`` (default ``contextpilot:``), ``timeout_s`` (default ``1.0``).
- ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (SQLAlchemy's
  convention: the path follows the third slash): a
  :class:`~contextpilot_rag.stores.sqlite.SQLiteConversationStore`. Query option:
  ``busy_timeout_s`` (default ``5.0``).

A URL is parsed and checked completely (:class:`~contextpilot_rag.errors.ConfigError`)
before any store, client or file is created.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit, urlunsplit

from ..conversations import ConversationStore, InMemoryConversationStore
from ..errors import ConfigError

__all__ = ["StoreURL", "open_store", "parse_store_url", "redacted", "resolve_store"]

_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "redis": ("key_prefix", "timeout_s"),
    "sqlite": ("busy_timeout_s",),
}
_SHOWN_OPTIONS = frozenset(name for names in _OPTIONS.values() for name in names)


@dataclass(frozen=True)
class StoreURL:
    """A checked store URL: the backend, what it opens (the Redis URL without this
    library's options, or the SQLite file's path) and the options it gave."""

    backend: Literal["redis", "sqlite"]
    target: str
    options: Mapping[str, str] = field(default_factory=dict)

    def number(self, name: str, default: float) -> float:
        return float(self.options.get(name, default))

    def __repr__(self) -> str:  # the dataclass's, with the target's credentials redacted
        options = dict(self.options)
        return f"StoreURL(backend={self.backend!r}, target={redacted(self.target)!r}, {options=})"


def parse_store_url(url: str) -> StoreURL:
    """Check ``url`` and say what it names; a malformed one is a ConfigError."""
    if not isinstance(url, str):
        raise ConfigError(f"a store URL must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _bad(url, str(exc)) from exc
    if parts.fragment:
        raise _bad(url, "a store URL has no #fragment")
    if parts.scheme in ("redis", "rediss"):
        return _redis_url(url, parts)
    if parts.scheme == "sqlite":
        return _sqlite_url(url, parts.netloc, parts.path, parts.query)
    raise ConfigError(
        f"unknown store URL {redacted(url)!r}: use redis://HOST:PORT/DB, rediss://…, "
        "sqlite:///PATH, or store=None for memory"
    )


def open_store(
    url: str, *, max_conversations: int = 10_000, ttl_s: float | None = 3600.0
) -> ConversationStore:
    """The conversation store ``url`` names, bounded by ``max_conversations`` and
    ``ttl_s`` (conversation idle time). Checks everything before opening anything."""
    spec = parse_store_url(url)
    if spec.backend == "redis":
        from .redis import RedisConversationStore

        return RedisConversationStore(
            spec.target,
            ttl_s=ttl_s,
            max_conversations=max_conversations,
            key_prefix=spec.options.get("key_prefix", "contextpilot:"),
            timeout_s=spec.number("timeout_s", 1.0),
        )
    from .sqlite import SQLiteConversationStore

    return SQLiteConversationStore(
        spec.target,
        max_conversations=max_conversations,
        ttl_s=ttl_s,
        busy_timeout_s=spec.number("busy_timeout_s", 5.0),
    )


def resolve_store(
    store: object,
    *,
    max_conversations: int = 10_000,
    ttl_s: float | None = 3600.0,
    clock: Callable[[], float] | None = None,
) -> ConversationStore:
    """What a ``store=`` argument means: ``None`` a new in-memory store (on
    ``clock``), a URL the store it names (:func:`open_store`), a store object itself."""
    if store is None:
        if clock is None:
            return InMemoryConversationStore(max_conversations=max_conversations, ttl_s=ttl_s)
        return InMemoryConversationStore(
            max_conversations=max_conversations, ttl_s=ttl_s, clock=clock
        )
    if isinstance(store, str):
        return open_store(store, max_conversations=max_conversations, ttl_s=ttl_s)
    if isinstance(store, ConversationStore):
        return store
    raise ConfigError(
        "store must be None, a store URL (redis://…, sqlite:///…) or a ConversationStore, "
        f"got {type(store).__name__}"
    )


def _redis_url(url: str, parts: SplitResult) -> StoreURL:
    try:
        port = parts.port
    except ValueError:
        raise _bad(url, "the port is not 0..65535") from None
    if not parts.hostname:
        raise _bad(url, "no host (redis://HOST:PORT/DB)")
    if port == 0:
        raise _bad(url, "port 0 names no server")
    path = parts.path
    if path not in ("", "/") and not (path.startswith("/") and path[1:].isdigit()):
        raise _bad(url, "the database is a number (/0, /1, …)")
    options = _options(url, parts.query, "redis")
    if "timeout_s" in options:
        _positive(url, "timeout_s", options["timeout_s"])
    if "key_prefix" in options and not options["key_prefix"]:
        raise _bad(url, "key_prefix must not be empty")
    target = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return StoreURL("redis", target, options)


def _sqlite_url(url: str, netloc: str, path: str, query: str) -> StoreURL:
    if netloc:
        raise _bad(
            url,
            "sqlite URLs have no host; write sqlite:///relative.db or sqlite:////absolute/path.db",
        )
    file = unquote(path[1:]) if path.startswith("/") else ""
    if not file or file.endswith("/"):
        raise _bad(url, "no database file (sqlite:///PATH)")
    if file == ":memory:":
        raise _bad(
            url,
            "an in-memory SQLite database is not shared; "
            "use store=None for a store in this process",
        )
    options = _options(url, query, "sqlite")
    if "busy_timeout_s" in options:
        _positive(url, "busy_timeout_s", options["busy_timeout_s"])
    if not Path(file).parent.is_dir():
        raise _bad(url, f"no directory {str(Path(file).parent)!r}")
    return StoreURL("sqlite", file, options)


def _options(url: str, query: str, backend: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:  # its message quotes the field, which may be a secret
        raise _bad(url, "the query is not NAME=VALUE pairs joined by &") from None
    allowed = _OPTIONS[backend]
    options: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            known = ", ".join(allowed)
            raise _bad(url, f"unknown option {name!r} for {backend} (known: {known})")
        if name in options:
            raise _bad(url, f"option {name!r} given twice")
        options[name] = value
    return options


def _positive(url: str, name: str, value: str) -> None:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise _bad(url, f"{name} must be a number > 0, got {value!r}")


def _bad(url: str, problem: str) -> ConfigError:
    """The error for a malformed ``url``: it names the URL without its credentials."""
    return ConfigError(f"bad store URL {redacted(url)!r}: {problem}")


def redacted(url: str) -> str:
    """``url`` as messages and logs may show it: its credentials (``user:password@``)
    as ``***@``, and the values of query parameters other than this library's options
    (``?password=…``, a bare ``?token``) as ``***``. An unencoded password may hold
    ``/``, ``?`` or ``#``, so everything before a URL's last ``@`` is hidden
    (``sqlite:`` URLs, whose paths may hold ``@``, have no credentials)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if scheme.lower() != "sqlite":
        _, at, host = rest.rpartition("@")
        rest = f"***@{host}" if at else rest
    base, question, query = rest.partition("?")
    if question:
        query = "&".join(_shown_parameter(pair) for pair in query.split("&"))
    return f"{scheme}{sep}{base}{question}{query}"


def _shown_parameter(pair: str) -> str:
    name, equals, _ = pair.partition("=")
    if name in _SHOWN_OPTIONS:
        return pair
    return f"{name}=***" if equals else "***"
