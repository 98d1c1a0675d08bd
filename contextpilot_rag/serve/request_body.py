"""The request contract of the proxy: an OpenAI ``/v1/chat/completions`` or
``/v1/completions`` body, optionally with the ``contextpilot`` field, validated into a
:class:`ProxyRequest` before anything else happens. Pure: no HTTP framework here.

The ``contextpilot`` field is read by :mod:`contextpilot_rag.request_field`.

Every error is an :class:`~.api_errors.ApiError` (HTTP 400) naming the offending
``param``; unknown keys are errors too, so a misspelt option never passes silently.
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
    """The request body as JSON; ``NaN``/``Infinity`` (not JSON) are refused."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise ApiError.invalid("the request body is not valid JSON") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


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
