"""``contextpilot-rag optimize``: the pilot over JSON Lines, for any language and for
shell pipelines. Pure line handling here; the command's wiring is in :mod:`.cli`.

Each input line is one JSON object, either a request::

    {"question": "...", "documents": ["text" | {"id", "text", "score", "metadata", "shared"}],
     "conversation_id": "chat-42", "tenant": "acme", "system": "..."}   # the last three optional

(the documents as in the ``contextpilot`` request field, see :mod:`.request_field`), or
the answer to a conversation's turn, which the next turn's de-duplication needs::

    {"conversation_id": "chat-42", "answer": "...", "tenant": "acme", "request_id": "cp-…"}

(``tenant`` and ``request_id`` optional; with the ``request_id`` of the turn's output
line the answer is paired with exactly that turn, else with the turn awaiting one).

Each line gives one output line, in order: a request's prompt (``messages`` to send,
the blocks' ids in the order sent, the de-duplicated ones, the request id, stats and
the ``cache_salt`` to pass to engines that take one), ``{"line": N, "recorded": ID}``
for an answer, or ``{"line": N, "error": {"type": ..., "message": ...}}`` for a line
that could not be used. A bad line changes nothing: the pilot checks a request
completely before it records it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

from ._json_lines import json_object
from .errors import ContextPilotError, InvalidInputError
from .pilot import ContextPilot
from .prompt import Prompt
from .request_field import FIELD, FieldError, parse_pilot_fields

__all__ = ["LineError", "LineResult", "process_line", "process_lines"]

_REQUEST_KEYS = frozenset({"question", "documents", "conversation_id", "tenant", "system"})
_ANSWER_KEYS = frozenset({"conversation_id", "answer", "tenant", "request_id"})

LineResult = dict[str, Any]


class LineError(InvalidInputError):
    """An input line that is not a request or an answer (the result carries its number)."""


def process_lines(pilot: ContextPilot, lines: Iterable[str]) -> Iterator[LineResult]:
    """One result per non-blank line of ``lines`` (numbered from 1, blank lines
    counted), in order; a line's error is its result, never raised."""
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield process_line(pilot, line, number)


def process_line(pilot: ContextPilot, line: str, number: int) -> LineResult:
    """The result of input line ``number`` (see the module)."""
    try:
        item = json_object(line, LineError)
        if "answer" in item:
            return {"line": number, "recorded": _answer(pilot, item)}
        return _prompt_result(number, _request(pilot, item))
    except ContextPilotError as exc:
        return {"line": number, "error": {"type": type(exc).__name__, "message": str(exc)}}


def _unknown(item: Mapping[str, Any], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(item) - known)
    if unknown:
        raise LineError(f"{what} has unknown keys {unknown}; known: {sorted(known)}")


def _request(pilot: ContextPilot, item: Mapping[str, Any]) -> Prompt:
    _unknown(item, _REQUEST_KEYS, "a request")
    question = item.get("question")
    if not isinstance(question, str) or not question.strip():
        raise LineError("'question' must be a non-empty string")
    try:
        fields = parse_pilot_fields({k: v for k, v in item.items() if k != "question"})
    except FieldError as exc:  # named as the line names it, not as serve's field
        where = exc.param.removeprefix(f"{FIELD}.")
        message = str(exc).removeprefix(f"'{exc.param}' ")
        raise LineError(f"'{where}' {message}") from exc
    except InvalidInputError as exc:
        raise LineError(f"{exc}") from exc
    with _line_keys({"query": "question"}):
        return pilot.optimize(
            fields.documents,
            question,
            conversation_id=fields.conversation_id,
            system=fields.system,
            tenant=fields.tenant,
        )


def _answer(pilot: ContextPilot, item: Mapping[str, Any]) -> str:
    _unknown(item, _ANSWER_KEYS, "an answer")
    conversation_id, answer, tenant, request_id = (
        item.get(k) for k in ("conversation_id", "answer", "tenant", "request_id")
    )
    if not isinstance(conversation_id, str) or not conversation_id:
        raise LineError("an answer needs its 'conversation_id' (a string)")
    if not isinstance(answer, str):
        raise LineError("'answer' must be a string")
    for key, value in (("tenant", tenant), ("request_id", request_id)):
        if value is not None and not isinstance(value, str):
            raise LineError(f"'{key}' must be a string")
    with _line_keys({"text": "answer"}):
        pilot.record_answer(conversation_id, answer, request_id=request_id, tenant=tenant)
    return conversation_id


@contextlib.contextmanager
def _line_keys(renamed: Mapping[str, str]) -> Iterator[None]:
    """An input error of the pilot's that starts with one of its argument names
    (``query``, ``text``), named as the line names it (``'question'``, ``'answer'``)."""
    try:
        yield
    except InvalidInputError as exc:
        message = str(exc)
        for name, key in renamed.items():
            if message.startswith(f"{name} "):
                named = f"'{key}'{message[len(name) :]}"
                try:  # the same error type, as the output line reports it
                    renamed_error = type(exc)(named)
                except TypeError:
                    renamed_error = LineError(named)
                raise renamed_error from exc
        raise


def _prompt_result(number: int, prompt: Prompt) -> LineResult:
    result: LineResult = {
        "line": number,
        "request_id": prompt.request_id,
        "messages": [dict(message) for message in prompt.messages],
        "blocks": [block.id for block in prompt.blocks],
        "deduplicated": [block.id for block in prompt.deduplicated],
        "stats": asdict(prompt.stats),
    }
    if prompt.conversation_id is not None:
        result["conversation_id"] = prompt.conversation_id
        # the pilot no longer held the conversation (expired, or evicted past its bound):
        # this turn starts it afresh, without the history
        result["history_lost"] = prompt.history_lost
    if prompt.tenant is not None:
        result["tenant"] = prompt.tenant
    if prompt.cache_salt is not None:
        result["cache_salt"] = prompt.cache_salt
    return result
