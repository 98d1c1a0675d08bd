"""The ``contextpilot`` request field, read as ``contextpilot-rag serve`` reads it.

A chat request carries its documents in one structured field (the OpenAI SDKs send it
with ``extra_body={"contextpilot": {...}}``; LiteLLM's proxy receives it as a top-level
key of the request body)::

    "contextpilot": {
        "documents": ["plain text", {"id": "doc-7", "text": "...", "score": 0.82,
                                     "metadata": {...}, "shared": false}, ...],  # >= 1
        "conversation_id": "chat-42",   # optional: history + de-duplication
        "tenant": "acme",               # optional: pilot, index and routes per tenant
        "system": "Answer from the documents."   # optional: the system prompt
    }

The field and the chat messages are validated by :mod:`contextpilot_rag.request_field`;
every error is an :class:`~contextpilot_rag.errors.InvalidInputError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contextpilot_rag import ContextBlock
from contextpilot_rag.request_field import (
    FIELD,
    chat_question,
    check_messages,
    parse_pilot_fields,
)

__all__ = ["FIELD", "PilotRequest", "pop_field", "read_pilot_request"]


@dataclass(frozen=True)
class PilotRequest:
    """What the pilot needs of one request: the documents as blocks (retrieval order),
    the question, the system prompt and the optional conversation and tenant."""

    documents: tuple[ContextBlock, ...]
    query: str
    system: str | None = None
    conversation_id: str | None = None
    tenant: str | None = None


def pop_field(data: dict[str, Any]) -> object | None:
    """Remove the field from a request's keyword arguments (top level, or inside
    ``extra_body``) and return it; ``None`` when the request has none. Removed, so it
    is never sent on to a provider and a second hook finds nothing to apply."""
    value: object = data.pop(FIELD, None)
    extra = data.get("extra_body")
    if isinstance(extra, dict) and FIELD in extra:
        extra = dict(extra)
        nested = extra.pop(FIELD)
        data["extra_body"] = extra
        if not extra:
            del data["extra_body"]
        value = nested if value is None else value
    return value


def read_pilot_request(field: object, messages: object) -> PilotRequest:
    """Validate the field and the request's chat ``messages`` into a :class:`PilotRequest`."""
    fields = parse_pilot_fields(field)
    query, system = chat_question(check_messages(messages), fields)
    return PilotRequest(
        documents=fields.documents,
        query=query,
        system=system,
        conversation_id=fields.conversation_id,
        tenant=fields.tenant,
    )
