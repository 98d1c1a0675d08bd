"""The mem0 scope of a search and the pilot tenant its conversation is kept under.

mem0 keeps memories apart by the ``user_id``, ``agent_id`` and ``run_id`` a call names
(mem0 2.x: in ``filters``). A dedup conversation belongs to that scope: it is the pair
(scope, ``conversation_id``), so two users who pick the same conversation id never see
each other's memories or answers. The pilot keeps conversations apart by tenant, so a
scope becomes one: ``"mem0:"`` and a hash of the scope's canonical form (fixed length,
no user id spelt out).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from contextpilot_rag import InvalidInputError

__all__ = ["ENTITY_KEYS", "scope_tenant"]

ENTITY_KEYS = ("user_id", "agent_id", "run_id")
"""The ``filters`` keys that scope a mem0 search."""

_TENANT_PREFIX = "mem0:"
_DIGEST_CHARS = 32  # 128 bits


def scope_tenant(filters: object) -> str:
    """The pilot tenant of the conversations of searches with ``filters`` (what
    ``ContextPilot.conversation`` and ``end_conversation`` take). The scope is their
    ``user_id``/``agent_id``/``run_id`` keys, also inside a top-level ``"AND"`` list
    (the platform API's form); filters that name none (only ``"OR"``/``"NOT"`` terms,
    say) give no scope to keep a conversation in:
    :class:`~contextpilot_rag.errors.InvalidInputError`."""
    entities = sorted(set(_entities(filters)))
    if not entities:
        raise InvalidInputError(
            "a conversation belongs to the scope of its searches: pass filters= with a "
            f"user_id, agent_id or run_id (got {_keys(filters)})"
        )
    canonical = json.dumps(entities, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:_DIGEST_CHARS]
    return _TENANT_PREFIX + digest


def _entities(filters: object) -> Iterator[tuple[str, str, str]]:
    """``(key, form, value)`` of each entity ``filters`` requires: an id as mem0
    compares it (stripped; an int as its string), anything else (an operator such as
    ``{"in": [...]}``) as JSON; ``form`` tells the two apart."""
    if not isinstance(filters, Mapping):
        return
    for key in ENTITY_KEYS:
        if filters.get(key) is not None:
            yield key, *_canonical(filters[key])
    conjunction = filters.get("AND")
    if isinstance(conjunction, list):
        for term in conjunction:
            yield from _entities(term)


def _canonical(value: Any) -> tuple[str, str]:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return "id", str(value).strip()
    return "json", json.dumps(value, sort_keys=True, default=repr)


def _keys(filters: object) -> str:
    if isinstance(filters, Mapping):
        return f"filters with the keys {sorted(map(str, filters))}"
    return f"filters={type(filters).__name__}"
