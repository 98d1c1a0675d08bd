"""The ``contextpilot`` request field: how a chat or completion request carries its
documents, read alike by ``contextpilot-rag serve`` and the LiteLLM plugin. Pure: no
HTTP framework here.

The field (what the OpenAI SDKs send with ``extra_body={"contextpilot": {...}}``)::

    "contextpilot": {
        "documents": [{"id": "doc-7", "text": "...", "score": 0.82, "metadata": {...},
                       "shared": false}              # shared: a public document
                      | "plain text", ...],          # at least one; [] in a conversation
        "conversation_id": "chat-42",                # optional: history + de-duplication
        "tenant": "acme",                            # optional: state and cache per tenant
        "system": "You answer from the documents."   # optional: the system prompt
    }

With the field, a chat request's question is its last message (a user's); the system
prompt is a leading system (or developer) message or the field's ``system``, not both.
The pilot keeps a conversation's history itself, so earlier turns need a
``conversation_id``. Unknown keys are errors, so a misspelt option never passes silently.
Every error is a :class:`FieldError` naming the offending part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .blocks import ContextBlock
from .errors import InvalidInputError

__all__ = [
    "FIELD",
    "FieldError",
    "PilotFields",
    "chat_question",
    "check_messages",
    "parse_pilot_fields",
]

FIELD = "contextpilot"
_FIELD_KEYS = frozenset({"documents", "conversation_id", "tenant", "system"})
_DOCUMENT_KEYS = frozenset({"id", "text", "score", "metadata", "shared"})
_SYSTEM_ROLES = frozenset({"system", "developer"})
_MAX_NAME_CHARS = 256


class FieldError(InvalidInputError):
    """A malformed field, or chat messages that do not fit it. ``param`` names the
    offending part (``contextpilot.documents[2].text``, ``messages[0]``);
    ``blames_field``: the fix is in the field rather than in the messages."""

    def __init__(self, message: str, param: str, *, blames_field: bool = True) -> None:
        super().__init__(f"'{param}' {message}")
        self.param = param
        self.blames_field = blames_field


@dataclass(frozen=True)
class PilotFields:
    """The validated field: the documents as blocks (retrieval order) and the optional
    conversation, tenant and system prompt."""

    documents: tuple[ContextBlock, ...]
    conversation_id: str | None = None
    tenant: str | None = None
    system: str | None = None


def parse_pilot_fields(value: object) -> PilotFields:
    """Validate the field (see the module)."""
    if not isinstance(value, Mapping):
        raise FieldError("must be an object", FIELD)
    unknown = sorted(set(value) - _FIELD_KEYS)
    if unknown:
        raise FieldError(f"has unknown keys {unknown}; known: {sorted(_FIELD_KEYS)}", FIELD)
    conversation_id = _name(value, "conversation_id")
    return PilotFields(
        documents=_documents(value.get("documents"), in_conversation=conversation_id is not None),
        conversation_id=conversation_id,
        tenant=_name(value, "tenant"),
        system=_text(value, "system"),
    )


def _documents(value: object, *, in_conversation: bool) -> tuple[ContextBlock, ...]:
    """The documents; a conversation's turn may have none (a retrieval with no hit)."""
    where = f"{FIELD}.documents"
    if not isinstance(value, list) or not (value or in_conversation):
        raise FieldError(
            "must be a list of documents, non-empty unless the field names a conversation_id",
            where,
        )
    return tuple(_document(item, f"{where}[{index}]") for index, item in enumerate(value))


def _document(item: object, where: str) -> ContextBlock:
    """One document: a string, or an object with ``text`` and optional ``id``,
    ``score``, ``metadata``, ``shared``."""
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, Mapping):
        raise FieldError("must be a string or an object with 'text'", where)
    unknown = sorted(set(item) - _DOCUMENT_KEYS)
    if unknown:
        raise FieldError(f"has unknown keys {unknown}; known: {sorted(_DOCUMENT_KEYS)}", where)
    text, block_id = item.get("text"), item.get("id")
    score, metadata = item.get("score"), item.get("metadata")
    if not isinstance(text, str) or not text.strip():
        raise FieldError("needs a non-empty string 'text'", f"{where}.text")
    if block_id is not None and (not isinstance(block_id, str) or not block_id):
        raise FieldError("must be a non-empty string", f"{where}.id")
    if score is not None and not _is_number(score):
        raise FieldError("must be a finite number", f"{where}.score")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise FieldError("must be an object", f"{where}.metadata")
    shared = item.get("shared", False)
    if not isinstance(shared, bool):
        raise FieldError("must be a boolean", f"{where}.shared")
    try:
        identity: dict[str, Any] = {} if block_id is None else {"id": block_id}
        return ContextBlock(
            text, score=score, metadata=dict(metadata or {}), shared=shared, **identity
        )
    except InvalidInputError as exc:
        raise FieldError(str(exc), where) from None


def _is_number(value: object) -> bool:
    """A finite int or float (an int past float's range, which JSON allows, is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _name(field: Mapping[str, Any], key: str) -> str | None:
    """An optional identifier: a non-empty string of at most 256 characters."""
    value = field.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME_CHARS:
        message = f"must be a non-empty string of at most {_MAX_NAME_CHARS} characters"
        raise FieldError(message, f"{FIELD}.{key}")
    return value


def _text(field: Mapping[str, Any], key: str) -> str | None:
    value = field.get(key)
    if value is not None and not isinstance(value, str):
        raise FieldError("must be a string", f"{FIELD}.{key}")
    return value


def check_messages(messages: object) -> list[dict[str, Any]]:
    """Chat ``messages``: a non-empty list of objects, each with a string ``role``."""
    if not isinstance(messages, list) or not messages:
        raise FieldError("must be a non-empty list", "messages", blames_field=False)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            where = f"messages[{index}]"
            raise FieldError("must be an object with a string 'role'", where, blames_field=False)
    return messages


def chat_question(
    messages: Sequence[Mapping[str, Any]], fields: PilotFields
) -> tuple[str, str | None]:
    """The question (the last message, a user's) and the system prompt of checked chat
    ``messages`` sent with the field; the system prompt is ``None`` when neither the
    messages nor the field give one."""
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        message = f"must be the user's question when '{FIELD}' is set"
        raise FieldError(message, f"messages[{last}]", blames_field=False)
    query = _message_text(messages[last], f"messages[{last}]")
    earlier = [m for m in messages[:last] if m["role"] not in _SYSTEM_ROLES]
    if earlier and fields.conversation_id is None:
        raise FieldError(
            f"has earlier turns: with '{FIELD}' they need '{FIELD}.conversation_id' (the "
            "pilot keeps the history and de-duplicates against it); send the system "
            "message (optional) and the question only",
            "messages",
        )
    return query, _system(messages, fields.system)


def _system(messages: Sequence[Mapping[str, Any]], field_system: str | None) -> str | None:
    """The client's system message (first, at most one), or the field's ``system``."""
    positions = [i for i, m in enumerate(messages) if m["role"] in _SYSTEM_ROLES]
    if not positions:
        return field_system
    if positions != [0]:
        message = "is a system message: it may only come first, once"
        raise FieldError(message, f"messages[{positions[-1]}]", blames_field=False)
    if field_system is not None:
        message = "repeats the system message: give the system prompt once"
        raise FieldError(message, f"{FIELD}.system")
    return _message_text(messages[0], "messages[0]")


def _message_text(message: Mapping[str, Any], where: str) -> str:
    """A message's text: its string content, or its text parts joined by newlines."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
        for part in content
    ):
        return "\n".join(part["text"] for part in content)
    problem = "must have text content (a string or text parts)"
    raise FieldError(problem, f"{where}.content", blames_field=False)
