"""The response contract of the proxy: OpenAI ``chat.completion`` /
``text_completion`` objects and their server-sent-event chunks, built from a routed
:class:`~contextpilot_rag.routing.client.ChatResult`, plus the ``contextpilot``
extension object of requests that carried the field::

    "contextpilot": {
        "request_id": "…",            # the pilot's request id (ContextPilot.observe)
        "conversation_id": "chat-42", # as sent (null without one)
        "tenant": "acme",             # as sent (null without one)
        "blocks_total": 5,            # distinct documents of the request
        "blocks_sent": 4,             # rendered in full in this prompt
        "blocks_matched": 2,          # at the front, in an order sent before
        "blocks_deduplicated": 1,     # shown in an earlier turn: a location note instead
        "reordered": true,            # sent in another order than given
        "history_lost": false,        # the conversation's stored history had expired
        "reusable_tokens": 812,       # prompt tokens the pilot predicts cached
        "labels": {"doc-7": "doc-7"}  # document id -> the label the prompt shows it under
    }

A streamed answer carries it in its first chunk. Pure: no HTTP framework here.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..prompt import Prompt
from ..routing.client import ChatResult
from .api_errors import ApiError
from .request_body import Kind

__all__ = ["ChunkWriter", "Envelope", "pilot_extension", "response_object", "usage_of"]

_OBJECTS = {
    "chat": ("chat.completion", "chat.completion.chunk"),
    "completion": ("text_completion",) * 2,
}
_ID_PREFIX = {"chat": "chatcmpl", "completion": "cmpl"}


def pilot_extension(
    prompt: Prompt, conversation_id: str | None, tenant: str | None
) -> dict[str, Any]:
    """The ``contextpilot`` object of a response (see the module)."""
    stats = prompt.stats
    deduplicated = prompt.deduplicated_ids
    given = [block.id for block in prompt.original_blocks if block.id not in deduplicated]
    return {
        "request_id": prompt.request_id,
        "conversation_id": conversation_id,
        "tenant": tenant,
        "blocks_total": stats.blocks_total,
        "blocks_sent": len(prompt.blocks),
        "blocks_matched": stats.blocks_matched,
        "blocks_deduplicated": stats.blocks_deduplicated,
        "reordered": [block.id for block in prompt.blocks] != given,
        "history_lost": prompt.history_lost,
        "reusable_tokens": stats.reusable_tokens,
        "labels": prompt.labels,
    }


def usage_of(result: ChatResult) -> dict[str, Any] | None:
    """The usage the engine reported (``None`` when it reported no prompt tokens)."""
    if result.prompt_tokens is None:
        return None
    completion = result.completion_tokens or 0
    usage: dict[str, Any] = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
    }
    if result.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": result.cached_tokens}
    return usage


@dataclass(frozen=True)
class Envelope:
    """The fields every response object and chunk of one answer share."""

    kind: Kind
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, kind: Kind, model: str) -> Envelope:
        return cls(kind, f"{_ID_PREFIX[kind]}-{uuid.uuid4().hex}", int(time.time()), model)

    def wrap(self, choices: list[dict[str, Any]], *, chunk: bool, **extra: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "id": self.id,
            "object": _OBJECTS[self.kind][1 if chunk else 0],
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        payload.update((key, value) for key, value in extra.items() if value is not None)
        return payload


def response_object(
    envelope: Envelope, result: ChatResult, extension: dict[str, Any] | None
) -> dict[str, Any]:
    """The whole (non-streamed) response to a request."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish(result)}
    if envelope.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            message["tool_calls"] = list(result.tool_calls)
            message["content"] = result.text or None
        choice["message"] = message
    else:
        choice["text"] = result.text
    return envelope.wrap([choice], chunk=False, usage=usage_of(result), contextpilot=extension)


class ChunkWriter:
    """The ``data:`` events of one streamed answer; the first chunk written carries the
    ``contextpilot`` extension."""

    def __init__(self, envelope: Envelope, extension: dict[str, Any] | None) -> None:
        self._envelope = envelope
        self._extension = extension

    def opening(self) -> bytes:
        """The first chunk of a chat answer: the assistant's role (a completion
        stream has none)."""
        return self._chunk({"role": "assistant", "content": ""})

    def delta(self, text: str) -> bytes:
        return self._chunk({"content": text} if self._envelope.kind == "chat" else text)

    def closing(self, result: ChatResult, *, include_usage: bool) -> bytes:
        """The tool calls (if any), the finish reason, the usage if asked, ``[DONE]``."""
        events = []
        if result.tool_calls and self._envelope.kind == "chat":
            calls = [{"index": i, **call} for i, call in enumerate(result.tool_calls)]
            events.append(self._chunk({"tool_calls": calls}))
        events.append(self._chunk({} if self._envelope.kind == "chat" else "", _finish(result)))
        if include_usage:
            events.append(_event(self._envelope.wrap([], chunk=True, usage=usage_of(result))))
        events.append(b"data: [DONE]\n\n")
        return b"".join(events)

    @staticmethod
    def error(error: ApiError) -> bytes:
        """An error after the stream began (the OpenAI SDKs raise it). No ``[DONE]``
        follows: the answer is incomplete."""
        return _event(error.body())

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        choice["delta" if isinstance(delta, dict) else "text"] = delta
        extension, self._extension = self._extension, None
        return _event(self._envelope.wrap([choice], chunk=True, contextpilot=extension))


def _finish(result: ChatResult) -> str:
    """The engine's finish reason, else what the answer implies."""
    return result.finish_reason or ("tool_calls" if result.tool_calls else "stop")


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
