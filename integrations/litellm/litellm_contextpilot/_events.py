"""What a LiteLLM call carries, read defensively: the metadata this package stamps on a
request and finds again in its logging callbacks, the deployment that served it, its
timing, its usage and its answer.

LiteLLM hands a ``CustomLogger`` the call's ``kwargs`` (its logging object's details):
``litellm_params.litellm_metadata`` and ``litellm_params.metadata`` are the request's
metadata as it was routed, ``litellm_params.model_info.id`` the deployment, ``api_call_start_time``
when the HTTP call started and ``completion_start_time`` when its first token arrived
(the end, for a call that was not streamed). Everything is optional here: a field
LiteLLM does not send reads as ``None``, never as an error in a callback.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.usage import CacheUsage, parse_cache_usage

__all__ = [
    "PILOT_KEY",
    "ROUTES_KEY",
    "PilotStamp",
    "RouteIds",
    "answer_text",
    "cache_usage",
    "call_seconds",
    "completion_tokens",
    "deployment_id",
    "drop_stamps",
    "logged_metadata",
    "request_metadata",
    "sent_metadata",
]

PILOT_KEY = "contextpilot"
"""Metadata the hook stamps: ``{"request_id", "conversation_id", "tenant", "public",
"boundaries"}`` (``public``: a tenant's prompt sent unsalted to engines that take
salts; ``boundaries``: its block ends)."""

ROUTES_KEY = "contextpilot_routes"
"""Metadata the strategy stamps: the ids of its routing decisions for the request,
oldest first (a retry adds one), as :class:`RouteIds`."""


class PilotStamp(dict[str, Any]):
    """The hook's stamp on one request (:data:`PILOT_KEY`). Its own type, so that where
    the request is read as the proxy holds it (its failure hook), a stamp that a client
    sent in the request body is never taken for the hook's."""


class RouteIds(list[str]):
    """The route ids the strategy stamped on one request. Its own type, so a list of
    that name that a caller or a client sent is never taken for the strategy's and
    extended (LiteLLM copies a request's metadata per attempt, keeping the type)."""


_METADATA_FIELDS = ("litellm_metadata", "metadata")
"""Where a request carries LiteLLM's metadata, the first found winning. Most calls have
``metadata`` only; on the endpoints whose provider has a ``metadata`` field of its own
(``/v1/messages``, ``/v1/responses``) LiteLLM keeps its metadata in
``litellm_metadata`` and takes ``metadata`` for the provider's, which it logs as the
caller sent it: a stamp made there never reaches the callbacks."""


def drop_stamps(request_kwargs: dict[str, Any]) -> None:
    """Remove :data:`PILOT_KEY` and :data:`ROUTES_KEY` from the request's metadata (a
    copy is put back; the caller's dict is left alone): only the hook and the strategy
    stamp them, and one a proxy's client sent would name another request's prompt or
    routes (their ids are sequential), recording its answer in another conversation."""
    for name in _METADATA_FIELDS:
        found = request_kwargs.get(name)
        if isinstance(found, dict) and (PILOT_KEY in found or ROUTES_KEY in found):
            request_kwargs[name] = {
                key: value for key, value in found.items() if key not in (PILOT_KEY, ROUTES_KEY)
            }


def request_metadata(request_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's metadata dict, to stamp (created when absent): LiteLLM's
    ``litellm_metadata`` where the request has one, else ``metadata``
    (:data:`_METADATA_FIELDS`).

    A copy, put back into ``request_kwargs``: applications pass one dict (common tags)
    to many calls, and a stamp made in that dict would be every concurrent call's, so
    one call's answer would be recorded as another's turn and close another's route."""
    for name in _METADATA_FIELDS:
        found = request_kwargs.get(name)
        if isinstance(found, dict):
            own: dict[str, Any] = dict(found)
            request_kwargs[name] = own
            return own
    created: dict[str, Any] = {}
    request_kwargs["metadata"] = created
    return created


def sent_metadata(request: Mapping[str, Any]) -> Mapping[str, Any]:
    """A request's metadata, to read: both of LiteLLM's fields merged, the one
    :func:`request_metadata` stamps winning."""
    merged: dict[str, Any] = {}
    for name in reversed(_METADATA_FIELDS):
        found = request.get(name)
        if isinstance(found, Mapping):
            merged.update(found)
    return merged


def logged_metadata(kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """A logged call's metadata (:func:`sent_metadata` of its ``litellm_params``)."""
    params = kwargs.get("litellm_params")
    return sent_metadata(params) if isinstance(params, Mapping) else {}


def deployment_id(kwargs: Mapping[str, Any]) -> str | None:
    """The id of the deployment that served a logged call."""
    params = kwargs.get("litellm_params")
    candidates = [params.get("model_info") if isinstance(params, Mapping) else None]
    candidates.append(logged_metadata(kwargs).get("model_info"))
    for info in candidates:
        if isinstance(info, Mapping) and info.get("id") is not None:
            return str(info["id"])
    found = kwargs.get("model_id")
    return str(found) if found is not None else None


def call_seconds(
    kwargs: Mapping[str, Any], start_time: object, end_time: object
) -> tuple[float, float] | None:
    """``(ttft_s, e2e_s)`` of a logged call from LiteLLM's timing: from the start of
    the HTTP call (else the call's start) to its first token (else its end), and to
    its end. ``None`` when the times are missing or out of order."""
    started = _seconds(kwargs.get("api_call_start_time")) or _seconds(start_time)
    ended = _seconds(kwargs.get("end_time")) or _seconds(end_time)
    first = _seconds(kwargs.get("completion_start_time")) or ended
    if started is None or ended is None or first is None:
        return None
    ttft, e2e = first - started, ended - started
    if ttft < 0 or e2e < ttft:
        return None
    return ttft, e2e


def _seconds(value: object) -> float | None:
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def cache_usage(response: object) -> CacheUsage | None:
    """The cached and total prompt tokens an answer reports; ``None`` when it says
    nothing about the cache (never read as 0 cached)."""
    if response is None:
        return None
    try:
        return parse_cache_usage(response)
    except InvalidInputError:
        return None


def completion_tokens(response: object) -> int:
    usage = _get(response, "usage")
    count = _get(usage, "completion_tokens")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def answer_text(response: object) -> str | None:
    """The text of the first choice of a chat answer (a streamed one, assembled)."""
    choices = _get(response, "choices")
    if not isinstance(choices, (list, tuple)) or not choices:
        return None
    content = _get(_get(choices[0], "message"), "content")
    return content if isinstance(content, str) else None


def _get(node: object, name: str) -> Any:
    if isinstance(node, Mapping):
        return node.get(name)
    return getattr(node, name, None)
