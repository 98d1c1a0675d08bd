"""Reading an engine's answer: OpenAI server-sent events (``data: {...}`` lines ending
with ``data: [DONE]``, split from the text as it arrives by :class:`Lines`) or one JSON
object, folded into a :class:`Reply`. Pure functions over text and bytes; an answer of
the wrong shape raises :class:`AttemptFailed` (the endpoint's fault, worth retrying
elsewhere)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AttemptFailed",
    "Kind",
    "Lines",
    "Reply",
    "TokenCounts",
    "count",
    "is_json",
    "parse_body",
    "parse_line",
]

Kind = Literal["chat", "completion"]  # the OpenAI endpoint: /chat/completions, /completions

_NEWLINES = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines ends a line


class AttemptFailed(Exception):
    """A failure worth retrying elsewhere: a malformed answer, a 5xx/429/401/403/404, a
    stream cut short or silent too long, a transport error."""


@dataclass(frozen=True)
class TokenCounts:
    """The token counts an engine reported for one answer (``None``: not reported)."""

    prompt: int | None
    cached: int | None
    completion: int | None


@dataclass
class Reply:
    """What the answer of one attempt delivered so far."""

    text: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    responded: bool = False  # the response's status line arrived
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by index

    def counts(self) -> TokenCounts:
        """Prompt, cached and completion tokens from ``usage`` (vLLM, SGLang, OpenAI) or
        llama-server's ``timings`` (``prompt_n`` uncached + ``cache_n`` cached)."""
        details = (self.usage or {}).get("prompt_tokens_details")
        cached = count(details if isinstance(details, dict) else None, "cached_tokens")
        cache_n = count(self.timings, "cache_n")
        prompt = count(self.usage, "prompt_tokens")
        if prompt is None:
            prompt_n = count(self.timings, "prompt_n")
            prompt = None if prompt_n is None else prompt_n + (cache_n or 0)
        return TokenCounts(
            prompt, cache_n if cached is None else cached, count(self.usage, "completion_tokens")
        )


class Lines:
    """Splits text arriving in pieces into lines, as :meth:`str.splitlines` splits the
    whole (as httpx's ``iter_lines`` does). Invariant: ``_rest`` is the text after the
    last complete line; a ``\r`` ending a piece stays there, as it may begin a ``\r\n``."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = ""

    def feed(self, text: str) -> list[str]:
        """The lines ``text`` completes."""
        text = self._rest + text
        cut = len(text) - 1 if text.endswith("\r") else len(text)
        lines = text[:cut].splitlines()
        if cut and text[cut - 1] not in _NEWLINES:  # the last line goes on in the next piece
            self._rest = lines.pop() + text[cut:]
        else:
            self._rest = text[cut:]
        return lines

    def flush(self) -> list[str]:
        """The last line, when the text ended without a line break."""
        rest, self._rest = self._rest, ""
        return rest.splitlines()


def is_json(headers: Mapping[str, str]) -> bool:
    """Whether the engine answered one JSON object instead of an event stream."""
    return headers.get("content-type", "").startswith("application/json")


def parse_line(kind: Kind, line: str, reply: Reply) -> str:
    """Fold one SSE line into ``reply``; returns the content delta (may be empty)."""
    if not line.startswith("data:"):
        return ""
    data = line[5:].strip()
    if data == "[DONE]":
        reply.done = True
        return ""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise AttemptFailed(f"malformed stream chunk: {data[:80]!r}") from exc
    return _fold(kind, _object(chunk, "stream chunk"), "delta", reply)


def parse_body(kind: Kind, body: bytes, reply: Reply) -> str:
    """Fold a whole (non-streamed) JSON reply into ``reply``; returns its text."""
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise AttemptFailed(f"malformed reply: {body[:80]!r}") from exc
    text = _fold(kind, _object(answer, "reply"), "message", reply)
    reply.done = True
    return text


def _fold(
    kind: Kind, chunk: Mapping[str, Any], part: Literal["delta", "message"], reply: Reply
) -> str:
    """Fold one stream chunk (``part`` ``"delta"``) or a whole reply (``"message"``)
    into ``reply``; its text. A field of the wrong JSON type is the endpoint's fault."""
    usage = _optional(chunk.get("usage"), "usage")
    timings = _optional(chunk.get("timings"), "timings")
    reply.usage, reply.timings = usage or reply.usage, timings or reply.timings
    choices = chunk.get("choices")
    if not choices:
        return ""
    if not isinstance(choices, list):
        raise AttemptFailed(f"malformed reply: choices is {type(choices).__name__}, not a list")
    choice = _object(choices[0], "choice")
    finish_reason = _string(choice.get("finish_reason"), "finish_reason")
    if finish_reason:
        reply.finish_reason = finish_reason
    if kind == "completion":
        return _string(choice.get("text"), "text")
    message = _optional(choice.get(part), part)
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise AttemptFailed(f"malformed reply: tool_calls is {type(calls).__name__}, not a list")
    for index, call in enumerate(calls):
        _join_tool_call(reply.tool_calls, _object(call, "tool call"), index)
    return _string(message.get("content"), "content")


def _object(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object; anything else is malformed."""
    if isinstance(value, dict):
        return value
    raise AttemptFailed(f"malformed reply: {what} is {type(value).__name__}, not an object")


def _optional(value: object, what: str) -> dict[str, Any]:
    """An optional JSON object (``None``: empty)."""
    return {} if value is None else _object(value, what)


def _string(value: object, what: str) -> str:
    """``value`` as a JSON string (``None``: empty); anything else is malformed."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    raise AttemptFailed(f"malformed reply: {what} is {type(value).__name__}, not a string")


def _join_tool_call(calls: dict[int, dict[str, Any]], fragment: Mapping[str, Any], at: int) -> None:
    """Add one tool-call fragment (streamed, OpenAI: the first of a call carries its
    ``id``, ``type`` and name; later ones pieces of ``arguments``; whole in a
    non-streamed reply, at position ``at`` when it has no ``index``) to ``calls``."""
    index = fragment.get("index", at)
    call = calls.setdefault(
        index if isinstance(index, int) else at,
        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
    )
    if fragment.get("id"):
        call["id"] = str(fragment["id"])
    if fragment.get("type"):
        call["type"] = str(fragment["type"])
    function = _optional(fragment.get("function"), "function")
    call["function"]["name"] += _string(function.get("name"), "function name")
    call["function"]["arguments"] += _string(function.get("arguments"), "function arguments")


def count(mapping: Mapping[str, Any] | None, key: str) -> int | None:
    """An integer field of an engine's report, ``None`` when absent or not an integer."""
    value = (mapping or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
