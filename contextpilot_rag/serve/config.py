"""How ``contextpilot-rag serve`` runs: :class:`ServeConfig`, validated on construction,
and its JSON form for the worker processes (each builds its own proxy from it)."""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import ConfigError
from ..routing.client.endpoints import display_url
from ..routing.registry import POLICY_NAMES
from ..stores.url import redacted
from ..tenants import SALT_KEY_ENV, SaltPolicy, TenantConfig

__all__ = ["API_KEY_ENV", "SALT_KEY_ENV", "ServeConfig"]

API_KEY_ENV = "CONTEXTPILOT_API_KEY"
"""The environment variable ``contextpilot-rag serve`` reads the API key from when
``--api-key`` is not given (an argument is visible to every user in ``ps``)."""

_MIN_KEY_CHARS = 8


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """The proxy's options.

    ``endpoints``: the fleet's OpenAI-compatible base URLs (``http://host:port/v1``);
    ``model``: the model they serve (the one model the proxy answers for); ``policy``:
    a routing policy name. ``host``/``port``: where to listen (loopback by default);
    ``workers``: uvicorn worker processes. ``api_key``: the bearer token clients must
    send (``None``: no authentication). ``store``: the state store URL shared by the
    workers (``redis://…``, ``sqlite:///…``; ``None``: each worker's memory).
    ``timeout_s``: the routing client's per-attempt progress bound; ``max_body_bytes``:
    the largest request body accepted. ``cache_salt``: when a tenant's prompt is sent
    with its tenant's ``cache_salt`` (:func:`~contextpilot_rag.tenants.salts`: ``"private"``,
    ``"always"``, ``"never"`` for engines without it); ``salt_key``: the secret the salts
    derive from, the same in every worker and every proxy in front of one fleet
    (``None``: a random key per worker; the ``serve`` command makes one per run).
    ``share_index``: whether the workers on ``store`` also share their context index
    through the store's index log (``PilotConfig.index_log``, docs/stores.md).
    ``max_history_turns``: the pilot's history window (``PilotConfig.max_history_turns``):
    the earlier turns of a conversation rendered into each prompt and kept in its stored
    record (``None``: every turn, a record that grows with the conversation; set it for a
    long-running server). ``system_into_user``: the pilot's
    ``PilotConfig.system_into_user``: no system message, the system prompt opens the
    first user message (for chat templates that refuse a system message or move it)."""

    endpoints: tuple[str, ...]
    model: str
    policy: str = "combined"
    host: str = "127.0.0.1"
    port: int = 8040
    workers: int = 1
    api_key: str | None = field(default=None, repr=False)
    store: str | None = None
    timeout_s: float = 120.0
    max_body_bytes: int = 32 * 1024 * 1024
    cache_salt: SaltPolicy = "private"
    salt_key: str | None = field(default=None, repr=False)
    share_index: bool = True
    max_history_turns: int | None = None
    system_into_user: bool = False

    def __post_init__(self) -> None:
        endpoints = self.endpoints
        if isinstance(endpoints, str) or not endpoints:
            raise ConfigError("endpoints must be a non-empty sequence of base URLs")
        object.__setattr__(self, "endpoints", tuple(endpoints))
        for url in self.endpoints:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                shown = display_url(url) if isinstance(url, str) else url
                raise ConfigError(f"an endpoint must be an http:// or https:// URL, got {shown!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("model must be a non-empty string (the model the fleet serves)")
        if self.policy not in POLICY_NAMES:
            raise ConfigError(f"unknown policy {self.policy!r}; choose one of {POLICY_NAMES}")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("host must be a non-empty string")
        _check_int("port", self.port, 0, 65535)
        _check_int("workers", self.workers, 1, 64)
        _check_int("max_body_bytes", self.max_body_bytes, 1024, 2**31)
        if self.api_key is not None and (
            not isinstance(self.api_key, str) or len(self.api_key) < _MIN_KEY_CHARS
        ):
            raise ConfigError(f"api_key must be a string of at least {_MIN_KEY_CHARS} characters")
        if self.store is not None and (not isinstance(self.store, str) or not self.store):
            raise ConfigError("store must be a store URL (redis://…, sqlite:///…) or None")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout!r}")
        TenantConfig(cache_salt=self.cache_salt, salt_key=self.salt_key)  # checks both
        if not isinstance(self.share_index, bool):
            raise ConfigError(f"share_index must be a bool, got {self.share_index!r}")
        turns = self.max_history_turns
        if turns is not None and (
            isinstance(turns, bool) or not isinstance(turns, int) or turns < 1
        ):
            raise ConfigError(f"max_history_turns must be an integer >= 1 or None, got {turns!r}")
        if not isinstance(self.system_into_user, bool):
            raise ConfigError(f"system_into_user must be a bool, got {self.system_into_user!r}")

    @property
    def loopback(self) -> bool:
        """Whether ``host`` is reachable from this machine only."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False

    def __repr__(self) -> str:  # the dataclass's, without keys or credentials
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["endpoints"] = tuple(display_url(url) for url in self.endpoints)
        if self.store is not None:
            shown["store"] = redacted(self.store)
        return f"ServeConfig({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    def to_json(self) -> str:
        """The config as JSON (the API key and salt key included: keep it out of logs)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        try:
            fields: dict[str, Any] = json.loads(text)
            fields["endpoints"] = tuple(fields["endpoints"])
            return cls(**fields)
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"not a serve configuration: {exc}") from None


def _check_int(name: str, value: object, least: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ConfigError(f"{name} must be an integer in {least}..{most}, got {value!r}")
