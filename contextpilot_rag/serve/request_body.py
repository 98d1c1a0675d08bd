"""The request contract of the proxy: an OpenAI ``/v1/chat/completions`` or
``/v1/completions`` body, optionally with the ``contextpilot`` field, validated into a
:class:`ProxyRequest` before anything else happens. Pure: no HTTP framework here.

The ``contextpilot`` field is read by :mod:`contextpilot_rag.request_field`.

Every error is an :class:`~.api_errors.ApiError` (HTTP 400) naming the offending
``param``; unknown keys are errors too, so a misspelt option never passes silently. The
engine parameters the routing client reads (``max_tokens``, ``max_completion_tokens``,
``cache_salt``) are checked here too, so a request the fleet would refuse is refused
before the pilot records its turn; so are the names of the routing client's own call
arguments (``kind``, ``self``), which no OpenAI request has and which could not be
forwarded as engine parameters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from .. import request_field
from ..request_field import FIELD, FieldError, PilotFields, chat_question, check_messages
from .api_errors import FIELD_ERROR, ApiError

__all__ = [
    "MAX_NESTING",
    "Kind",
    "PilotFields",
    "PilotRequest",
    "ProxyRequest",
    "parse_json",
    "parse_pilot_fields",
    "parse_request",
]

Kind = Literal["chat", "completion"]

_RESERVED = frozenset({"model", "messages", "prompt", "stream", "stream_options", FIELD})
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")
_SALT = "cache_salt"
# RoutingClient.achat/acomplete/astream's own arguments besides ``prompt`` (reserved):
# as engine parameters they would collide with them
_CLIENT_ARGUMENTS = ("kind", "self")

MAX_NESTING = 128
"""The deepest a request body may nest arrays and objects (deeper: HTTP 400); far
beyond any real request, far below Python's recursion limit, which forwarding the body
to the engine (JSON encoding) would otherwise hit."""


@dataclass(frozen=True)
class PilotRequest:
    """What the pilot builds the prompt from: the field, the ``query`` (the last user
    message, or the completion prompt) and the ``system`` prompt (the client's system
    message or the field's ``system``; ``None``: the pilot's default)."""

    fields: PilotFields
    query: str
    system: str | None


@dataclass(frozen=True)
class ProxyRequest:
    """One validated request. ``payload``: the chat messages or the completion prompt
    exactly as the client sent them (what an untouched request forwards); ``params``:
    every other OpenAI parameter, forwarded to the engine as given; ``pilot``: set when
    the request carried the ``contextpilot`` field."""

    kind: Kind
    model: str | None
    stream: bool
    include_usage: bool
    params: Mapping[str, Any]
    payload: list[dict[str, Any]] | str
    pilot: PilotRequest | None = None


def parse_json(raw: bytes) -> object:
    """The request body as JSON; ``NaN``/``Infinity`` (not JSON) and arrays or objects
    nested deeper than :data:`MAX_NESTING` are refused."""
    too_deep = f"the request body nests arrays and objects deeper than {MAX_NESTING} levels"
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        raise ApiError.invalid("the request body is not valid JSON") from None
    except RecursionError:  # the parser's own limit (lower on older Pythons)
        raise ApiError.invalid(too_deep) from None
    if not _nests_within(body, MAX_NESTING):
        raise ApiError.invalid(too_deep)
    return body


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _nests_within(value: object, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` arrays and objects deep (level by
    level, without recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):  # ``level``: the containers one level deeper each round
        if not level:
            return True
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
    return not level


def parse_request(kind: Kind, body: object) -> ProxyRequest:
    """Validate an OpenAI request ``body`` for the ``kind`` endpoint."""
    if not isinstance(body, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError.invalid("'model' must be a string", param="model")
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError.invalid("'stream_options' must be an object", param="stream_options")
    include_usage = _optional_bool(options or {}, "include_usage", "stream_options.")
    params = {key: value for key, value in body.items() if key not in _RESERVED}
    _check_supported(kind, params)
    _check_routed(params)
    _check_not_client_arguments(params)
    payload = _chat_payload(body) if kind == "chat" else _completion_payload(body)
    request = ProxyRequest(kind, model, stream, include_usage, params, payload)
    if body.get(FIELD) is None:
        return request
    fields = parse_pilot_fields(body[FIELD])
    pilot = PilotRequest(fields, *_question(payload, fields))
    return ProxyRequest(kind, model, stream, include_usage, params, payload, pilot)


def _optional_bool(body: Mapping[str, Any], name: str, prefix: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError.invalid(f"'{prefix}{name}' must be a boolean", param=prefix + name)
    return value


def _check_supported(kind: Kind, params: Mapping[str, Any]) -> None:
    """Parameters that change the response's shape beyond one streamed choice."""
    n, best_of = params.get("n"), params.get("best_of")
    if n not in (None, 1) or best_of not in (None, 1):
        name = "n" if n not in (None, 1) else "best_of"
        raise _unsupported(name, "the proxy answers one choice per request; send n=1")
    if params.get("logprobs") not in (None, False) or params.get("top_logprobs") is not None:
        raise _unsupported("logprobs", "the proxy does not return log probabilities")
    if kind == "completion" and params.get("echo") not in (None, False):
        raise _unsupported("echo", "the proxy does not echo the prompt")


def _check_routed(params: Mapping[str, Any]) -> None:
    """The parameters the routing client reads as well as the engine: token limits
    (integers >= 0) and ``cache_salt`` (a non-empty string)."""
    for name in _TOKEN_LIMITS:
        value = params.get(name)
        if value is not None and (type(value) is not int or value < 0):
            raise ApiError.invalid(f"'{name}' must be an integer >= 0", param=name)
    salt = params.get(_SALT)
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError.invalid(f"'{_SALT}' must be a non-empty string", param=_SALT)


def _check_not_client_arguments(params: Mapping[str, Any]) -> None:
    """No engine parameter is named like one of the routing client's own arguments."""
    for name in _CLIENT_ARGUMENTS:
        if name in params:
            raise ApiError.invalid(f"Unrecognized request argument supplied: {name}", param=name)


def _unsupported(param: str, message: str) -> ApiError:
    return ApiError.invalid(
        f"'{param}' is not supported: {message}", param=param, code="unsupported"
    )


def _chat_payload(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    with _api_errors():
        return check_messages(body.get("messages"))


def _completion_payload(body: Mapping[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError.invalid(
            "'prompt' must be a string (or a list of one string): the proxy sends one "
            "prompt per request",
            param="prompt",
        )
    return prompt


def parse_pilot_fields(value: object) -> PilotFields:
    """Validate the ``contextpilot`` field (see :mod:`contextpilot_rag.request_field`)."""
    with _api_errors():
        return request_field.parse_pilot_fields(value)


def _question(payload: list[dict[str, Any]] | str, fields: PilotFields) -> tuple[str, str | None]:
    """The question and the system prompt of a request with the field."""
    if isinstance(payload, str):
        return payload, fields.system
    with _api_errors():
        return chat_question(payload, fields)


@contextmanager
def _api_errors() -> Iterator[None]:
    """A :class:`FieldError` as the 400 answer naming its ``param``; an error the
    field's fix belongs to carries the ``invalid_contextpilot_field`` code."""
    try:
        yield
    except FieldError as exc:
        code = FIELD_ERROR if exc.blames_field else None
        raise ApiError.invalid(str(exc), param=exc.param, code=code) from None
