"""The fleet's parts: :class:`Endpoint` (one server, as configured), the
:class:`Credentials` it sends but never shows, and :class:`Replica`, the live state of one
``(endpoint, model)`` pair — in-flight and queued counters, circuit breaker, learned
prefill and decode rates."""

from __future__ import annotations

import base64
import datetime
import email.utils
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import cast
from urllib.parse import unquote

from ..._numbers import is_finite_at_least, is_finite_positive
from ...errors import ConfigError
from ..types import ReplicaState

__all__ = ["Credentials", "Endpoint", "Replica", "display_url", "replicas_of", "retry_after_s"]

_MIN_RATE_TOKENS = 64  # shorter prefills say more about overheads than about the rate
_RATE_ALPHA = 0.3


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible server. ``models`` it serves (empty: the client's
    ``model``); ``rtt_s`` the network round trip if known (else measured by
    :meth:`RoutingClient.probe`, 0 until then); the rates feed the cost policies.

    ``slot``: a llama-server slot (``-np``) to address: every request carries it as
    ``id_slot``, and the endpoint is a routing target of its own (:attr:`target`,
    its own counters and breaker), so several slots of one server may be listed.
    ``max_cached_prompts``: how many of its most recent prompts the endpoint keeps
    cached (a llama-server slot keeps 1), ``None`` for a prefix cache that keeps
    earlier prefixes; the policy's route memory then forgets prefixes newer prompts
    have overwritten.

    ``max_batch``: how many requests the server runs at once (vLLM's
    ``--max-num-seqs``, llama-server's ``-np``; a slot endpoint runs one), if known: a
    policy that models batch slots (``combined``) then predicts the wait for one when
    the endpoint's in-flight requests reach it.

    ``send_cache_salt``: whether a call's ``cache_salt`` (a salted Prompt's, or the
    parameter) goes into the request body, vLLM's top-level field; ``None`` (default):
    as the client's ``send_cache_salt`` says. Set ``False`` for a server that refuses
    unknown fields. Route keys stay per salt either way."""

    base_url: str
    models: tuple[str, ...] = ()
    region: str = "local"
    rtt_s: float | None = None
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0
    api_key: str | None = field(default=None, repr=False)
    slot: int | None = None
    max_cached_prompts: int | None = None
    send_cache_salt: bool | None = None
    max_batch: int | None = None

    def __post_init__(self) -> None:
        url = self.base_url
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            shown = _split_credentials(url)[0] if isinstance(url, str) else url
            raise ConfigError(f"base_url must start with http:// or https://, got {shown!r}")
        object.__setattr__(self, "base_url", url.rstrip("/"))
        object.__setattr__(self, "_credentials", Credentials(self))
        if isinstance(self.models, str) or not all(isinstance(m, str) and m for m in self.models):
            raise ConfigError("models must be a tuple of non-empty model names")
        object.__setattr__(self, "models", tuple(self.models))
        if self.rtt_s is not None and not is_finite_at_least(self.rtt_s, 0):
            raise ConfigError(f"rtt_s must be a finite number >= 0, got {self.rtt_s!r}")
        rates = (self.prefill_tokens_per_s, self.decode_tokens_per_s)
        if not all(is_finite_positive(rate) for rate in rates):
            raise ConfigError(
                "prefill_tokens_per_s and decode_tokens_per_s must be finite numbers > 0, "
                f"got {rates[0]!r} and {rates[1]!r}"
            )
        for name in ("slot", "max_cached_prompts", "max_batch"):
            value, least = getattr(self, name), 0 if name == "slot" else 1
            if value is not None and (type(value) is not int or value < least):
                raise ConfigError(f"{name} must be None or an integer >= {least}, got {value!r}")
        if self.send_cache_salt not in (None, True, False):
            raise ConfigError(
                f"send_cache_salt must be None or a bool, got {self.send_cache_salt!r}"
            )

    @property
    def display_url(self) -> str:
        """``base_url`` with its credentials (``user:password@``) shown as ``***@``:
        what results, errors, logs and metrics name the endpoint by."""
        return Credentials.of(self).display_url

    @property
    def target(self) -> str:
        """The routing target: :attr:`display_url`, or ``display_url#slot<n>`` for a slot."""
        url = self.display_url
        return url if self.slot is None else f"{url}#slot{self.slot}"

    def __repr__(self) -> str:  # the dataclass's, with the URL's credentials redacted
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)[1:] if f.repr]
        return f"Endpoint(base_url={self.display_url!r}, {', '.join(shown)})"


class Credentials:
    """What an :class:`Endpoint` sends but never shows: its URL split from the
    credentials, the ``Authorization`` header they make (URL credentials as HTTP basic
    auth, as httpx would send them, else ``api_key`` as a bearer token), and the secret
    strings to scrub from any text shown."""

    __slots__ = ("display_url", "headers", "request_url", "secrets")

    def __init__(self, endpoint: Endpoint) -> None:
        self.display_url, self.request_url, userinfo = _split_credentials(endpoint.base_url)
        self.headers: dict[str, str] = {}
        if endpoint.api_key:
            self.headers["Authorization"] = f"Bearer {endpoint.api_key}"
        raw_user, _, raw_password = userinfo.partition(":")
        user, password = unquote(raw_user), unquote(raw_password)
        token = ""
        if userinfo:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        # an engine that echoes the request's Authorization header echoes the basic-auth
        # token, which decodes to the password
        found = (userinfo, password or user, raw_password or raw_user, token, endpoint.api_key)
        shown = {secret for secret in found if secret and len(secret) > 2}
        self.secrets = tuple(sorted(shown, key=len, reverse=True))

    @staticmethod
    def of(endpoint: Endpoint) -> Credentials:
        return cast(Credentials, endpoint.__dict__["_credentials"])

    def scrub(self, text: str) -> str:
        """``text`` with every secret of the endpoint replaced by ``***``."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def display_url(url: str) -> str:
    """``url`` with its credentials (``user:password@``) shown as ``***@``: how
    errors, logs and reprs name an endpoint URL that is not (yet) an :class:`Endpoint`."""
    return _split_credentials(url)[0]


def _split_credentials(url: str) -> tuple[str, str, str]:
    """``(display URL, URL without credentials, userinfo)`` of ``url``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return url, url, ""
    return f"{scheme}{sep}***@{host}{slash}{path}", f"{scheme}{sep}{host}{slash}{path}", userinfo


class Replica:
    """Live state of one (endpoint, model) pair; its owner (the client's dispatcher)
    mutates it under its lock. ``in_flight``: attempts dispatched and not finished;
    ``queued_tokens``: their prompts not yet answered by a first token. The breaker is
    open (``healthy`` false) until ``open_until``."""

    __slots__ = (
        "decode_rate",
        "endpoint",
        "failures",
        "in_flight",
        "model",
        "open_until",
        "prefill_rate",
        "queued_tokens",
        "replica_id",
        "rtt_s",
    )

    def __init__(self, endpoint: Endpoint, model: str) -> None:
        self.endpoint = endpoint
        self.model = model
        multi = len(endpoint.models) > 1
        self.replica_id = f"{endpoint.target}#{model}" if multi else endpoint.target
        self.in_flight = 0
        self.queued_tokens = 0
        self.rtt_s = endpoint.rtt_s or 0.0
        self.failures = 0
        self.open_until = 0.0
        self.prefill_rate = endpoint.prefill_tokens_per_s
        self.decode_rate = endpoint.decode_tokens_per_s

    def trip(self, now: float, backoff_s: float, max_backoff_s: float, at_least_s: float) -> None:
        """Open the breaker: ``backoff_s`` doubled per failure in a row, at most
        ``max_backoff_s``, or ``at_least_s`` (a ``Retry-After``) if longer."""
        self.failures += 1
        backoff = min(max_backoff_s, backoff_s * 2 ** (self.failures - 1))
        self.open_until = now + max(backoff, at_least_s)

    def recovered(self) -> None:
        """The endpoint answered: close the breaker and forget the failures."""
        self.failures, self.open_until = 0, 0.0

    def learn(self, uncached: int, ttft_s: float, generated: int, decode_s: float) -> None:
        """Fold one answer into the effective prefill and decode rates (EWMA). The
        prefill rate is measured over the TTFT, so time spent queued behind other
        prompts lowers it: under load, uncached tokens are priced at what they cost."""
        prefill_s = ttft_s - self.rtt_s
        if uncached >= _MIN_RATE_TOKENS and prefill_s > 0:
            self.prefill_rate += _RATE_ALPHA * (uncached / prefill_s - self.prefill_rate)
        if generated >= _MIN_RATE_TOKENS // 8 and decode_s > 0:
            self.decode_rate += _RATE_ALPHA * (generated / decode_s - self.decode_rate)

    def state(self, now: float, others: tuple[int, int] = (0, 0)) -> ReplicaState:
        """The replica as the policy sees it; ``others``: the in-flight requests and
        queued tokens other routers report on it (shared state)."""
        e = self.endpoint
        return ReplicaState(
            replica_id=self.replica_id,
            model=self.model,
            region=e.region,
            rtt_s=self.rtt_s,
            in_flight=self.in_flight + others[0],
            queued_tokens=self.queued_tokens + others[1],
            prefill_tokens_per_s=self.prefill_rate,
            decode_tokens_per_s=self.decode_rate,
            healthy=now >= self.open_until,
            max_batch=e.max_batch,
        )


def replicas_of(endpoints: Sequence[str | Endpoint], model: str | None) -> list[Replica]:
    """The routing targets of ``endpoints`` (base URLs or :class:`Endpoint`): one per
    model each serves, only ``model`` when given. Raises :class:`ConfigError` for no
    endpoint, a repeated target, or an endpoint without a model."""
    if not endpoints:
        raise ConfigError("RoutingClient needs at least one endpoint")
    parsed = [e if isinstance(e, Endpoint) else Endpoint(e) for e in endpoints]
    if len({e.target for e in parsed}) != len(parsed):
        raise ConfigError("endpoints must be distinct (base URL and slot)")
    replicas: list[Replica] = []
    for endpoint in parsed:
        models = endpoint.models or ((model,) if model else ())
        if not models:
            raise ConfigError(f"{endpoint.display_url}: no model; pass model= or Endpoint.models")
        replicas += [Replica(endpoint, m) for m in models if model is None or m == model]
    if not replicas:
        raise ConfigError(f"no endpoint serves model {model!r}")
    return replicas


def retry_after_s(value: str | None, cap_s: float) -> float:
    """The wait a ``Retry-After`` header asks for (delay-seconds or an HTTP-date),
    at most ``cap_s``; 0 when absent, unreadable or past."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = _seconds_until(value)
    return min(seconds, cap_s) if math.isfinite(seconds) and seconds > 0 else 0.0


def _seconds_until(http_date: str) -> float:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp() - time.time()
