"""What the engines say about their model: the context length an OpenAI-compatible
server reports in ``GET /models`` (vLLM's and SGLang's ``max_model_len``).

A fleet answers a prompt from whichever endpoint the policy picks, so the context a
prompt may fill is the smallest one reported. An endpoint that is down, slow, refuses
the request or reports no length counts for nothing: reading the list never raises.
LlamaIndex reads an LLM's metadata inside its async calls (``apredict``), so the read
blocks the caller's event loop: the endpoints are asked at once, one thread each, and
the read ends at one deadline, however many endpoints hang.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from contextpilot_rag.routing import Endpoint
from contextpilot_rag.routing.client.endpoints import Credentials

__all__ = ["reported_context_window"]

logger = logging.getLogger(__name__)


def reported_context_window(
    endpoints: Sequence[Endpoint],
    model: str | None,
    *,
    timeout_s: float,
    transport: httpx.BaseTransport | None = None,
) -> int | None:
    """The smallest ``max_model_len`` the servers of ``endpoints`` report for the
    models routed to (``model``; without it each endpoint's ``models``, or every
    model it lists); ``None`` when none reports one. Every server is asked at once and
    the answers that arrive within ``timeout_s`` count (a server still answering is
    left to its own request timeout, ``timeout_s``, in its thread)."""
    servers = list({e.base_url: e for e in endpoints}.values())  # slots share a server
    if not servers:
        return None
    http = httpx.Client(timeout=httpx.Timeout(timeout_s), transport=transport)
    pool = ThreadPoolExecutor(len(servers), thread_name_prefix="contextpilot-models")
    try:
        asked = {pool.submit(_listed_models, http, endpoint): endpoint for endpoint in servers}
        answered, _ = wait(asked, timeout=timeout_s)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    lengths: list[int] = []
    for future in answered:
        endpoint = asked[future]
        wanted = {model} if model else set(endpoint.models)
        lengths += _lengths(future.result(), wanted)
    if len(answered) == len(asked):
        http.close()
    else:  # not under the late requests: once they are done
        threading.Thread(target=_close_after, args=(asked, http), daemon=True).start()
    return min(lengths, default=None)


def _close_after(requests: Iterable[Future[list[Any]]], http: httpx.Client) -> None:
    wait(requests)
    http.close()


def _listed_models(http: httpx.Client, endpoint: Endpoint) -> list[Any]:
    """The ``data`` entries of the endpoint's ``GET /models`` (``[]`` on any failure)."""
    credentials = Credentials.of(endpoint)
    try:
        response = http.get(f"{credentials.request_url}/models", headers=credentials.headers)
        response.raise_for_status()
        listed = response.json().get("data")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        shown = credentials.scrub(str(exc))
        logger.debug("%s: no model list (%s)", endpoint.display_url, shown)
        return []
    return listed if isinstance(listed, list) else []


def _lengths(listed: Iterable[Any], wanted: set[str]) -> list[int]:
    """The positive integer ``max_model_len`` of each entry for a wanted model (any
    model when ``wanted`` is empty)."""
    lengths = []
    for entry in listed:
        if not isinstance(entry, dict) or (wanted and entry.get("id") not in wanted):
            continue
        length = entry.get("max_model_len")
        if type(length) is int and length > 0:
            lengths.append(length)
    return lengths
