"""Answers from an OpenAI-compatible endpoint: ``POST {base_url}/chat/completions``,
non-streaming, greedy (``temperature=0``), ``concurrency`` requests in flight.

Transient failures — a connection or read error, a timeout, HTTP 408, 429 or 5xx —
are retried ``retries`` times with exponential back-off; any other HTTP error (a
prompt longer than the model's context is a 400) is final. A failed request is
returned as a :class:`Completion` with ``error`` set, never raised, so one bad
prompt does not end a long run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from .._numbers import is_finite_at_least
from ..errors import ConfigError

__all__ = ["Completion", "Endpoint", "complete_all", "probe"]

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server: its ``/v1`` root, the served model, an optional
    bearer token and the per-attempt timeout."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"endpoint must be an http(s) URL, got {self.base_url!r}")
        if not self.model:
            raise ConfigError("the endpoint needs a model name")
        timeout_s = self.timeout_s
        if not is_finite_at_least(timeout_s, 0) or timeout_s <= 0:
            raise ConfigError(f"timeout_s must be a finite number > 0, got {self.timeout_s!r}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class Completion:
    """One request's outcome: the answer text, or ``error``; the engine's token
    counts where it reports them; wall time over all attempts."""

    text: str | None
    error: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0
    attempts: int = 1


class _Transient(Exception):
    pass


class _Final(Exception):
    pass


def _body(endpoint: Endpoint, messages: Sequence[Mapping[str, str]], max_tokens: int) -> Any:
    return {
        "model": endpoint.model,
        "messages": [dict(message) for message in messages],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": False,
    }


def _parse(response: httpx.Response) -> Completion:
    if response.status_code in _TRANSIENT_STATUS:
        raise _Transient(f"HTTP {response.status_code}: {response.text[:200]}")
    if response.status_code >= 400:
        raise _Final(f"HTTP {response.status_code}: {response.text[:500]}")
    try:
        data = response.json()
        text = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise _Final(f"not a chat completion: {exc!r}: {response.text[:200]}") from None
    if not isinstance(text, str) or not text.strip():
        # no answer to score (a reasoning model that spent max_tokens thinking returns
        # null content): a failed request, not an answer that declines nothing
        raise _Final(f"no answer text (content {text!r}); raise --max-tokens?")
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Completion(
        text=text,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        cached_tokens=_count(details.get("cached_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _complete(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    messages: Sequence[Mapping[str, str]],
    *,
    max_tokens: int,
    retries: int,
    backoff_s: float,
) -> Completion:
    started = time.perf_counter()
    error = ""
    for attempt in range(1, retries + 2):
        try:
            response = await client.post(
                "/chat/completions", json=_body(endpoint, messages, max_tokens)
            )
            done = _parse(response)
            return _timed(done, started, attempt)
        except (httpx.TransportError, _Transient) as exc:
            error = f"{type(exc).__name__}: {exc}" if isinstance(exc, httpx.HTTPError) else str(exc)
        except _Final as exc:
            return _timed(Completion(None, str(exc)), started, attempt)
        except httpx.HTTPError as exc:  # not a transport failure: retrying will not help
            return _timed(Completion(None, f"{type(exc).__name__}: {exc}"), started, attempt)
        if attempt <= retries:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
    return _timed(
        Completion(None, f"gave up after {retries + 1} attempts: {error}"), started, retries + 1
    )


def _timed(completion: Completion, started: float, attempts: int) -> Completion:
    return replace(completion, seconds=time.perf_counter() - started, attempts=attempts)


async def _complete_all(
    endpoint: Endpoint,
    requests: Sequence[Sequence[Mapping[str, str]]],
    *,
    max_tokens: int,
    concurrency: int,
    retries: int,
    backoff_s: float,
    on_done: Callable[[], None] | None,
    transport: httpx.AsyncBaseTransport | None,
) -> list[Completion]:
    results: list[Completion | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(endpoint.timeout_s, connect=min(endpoint.timeout_s, 10.0))

    async with httpx.AsyncClient(
        base_url=endpoint.base_url.rstrip("/"),
        headers=endpoint.headers,
        timeout=timeout,
        limits=limits,
        transport=transport,
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                index = queue.get_nowait()  # in order: a conversation's turns stay close
                results[index] = await _complete(
                    client,
                    endpoint,
                    requests[index],
                    max_tokens=max_tokens,
                    retries=retries,
                    backoff_s=backoff_s,
                )
                if on_done is not None:
                    on_done()

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return [result if result is not None else Completion(None, "not sent") for result in results]


def complete_all(
    endpoint: Endpoint,
    requests: Sequence[Sequence[Mapping[str, str]]],
    *,
    max_tokens: int = 128,
    concurrency: int = 4,
    retries: int = 3,
    backoff_s: float = 0.5,
    on_done: Callable[[], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Completion]:
    """The completion of each request (a message list), in request order; requests
    are started in order, ``concurrency`` at a time. ``on_done`` is called after each
    finishes; ``transport`` replaces the network (tests)."""
    for name, value, low in (("max_tokens", max_tokens, 1), ("concurrency", concurrency, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"retries must be an integer >= 0, got {retries!r}")
    return asyncio.run(
        _complete_all(
            endpoint,
            requests,
            max_tokens=max_tokens,
            concurrency=concurrency,
            retries=retries,
            backoff_s=backoff_s,
            on_done=on_done,
            transport=transport,
        )
    )


def probe(endpoint: Endpoint, *, timeout_s: float = 10.0) -> str | None:
    """``None`` when the endpoint answers ``GET /models`` (any HTTP status), else why
    it cannot be reached — checked once before a run sends hundreds of requests."""
    try:
        httpx.get(
            endpoint.base_url.rstrip("/") + "/models", headers=endpoint.headers, timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
