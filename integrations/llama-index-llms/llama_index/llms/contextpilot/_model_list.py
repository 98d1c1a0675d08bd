"""What the engines say about their model: the context length an OpenAI-compatible
server reports in ``GET /models`` (vLLM's and SGLang's ``max_model_len``).

A fleet answers a prompt from whichever endpoint the policy picks, so the context a
prompt may fill is the smallest one reported. An endpoint that is down, slow, refuses
the request or reports no length counts for nothing: reading the list never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
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
    model it lists), each request bounded by ``timeout_s``; ``None`` when none
    reports one."""
    servers = {endpoint.base_url: endpoint for endpoint in endpoints}  # slots share a server
    lengths: list[int] = []
    with httpx.Client(timeout=httpx.Timeout(timeout_s), transport=transport) as http:
        for endpoint in servers.values():
            wanted = {model} if model else set(endpoint.models)
            lengths += _lengths(_listed_models(http, endpoint), wanted)
    return min(lengths, default=None)


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
