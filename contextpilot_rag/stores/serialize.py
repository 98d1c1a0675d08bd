"""The stored form of a :class:`~contextpilot_rag.conversations.Conversation`.

Compact UTF-8 JSON, versioned by its ``format`` field so that a newer version of the
library can read older records and an older one refuses newer records
(:class:`~contextpilot_rag.errors.StoreFormatError`) instead of misreading them::

    {"format": 1, "id": "<conversation id>", "system": "<text>" | null,
     "turns": [[request_id, user_message, block_ids, block_digests, block_labels,
                block_tokens, question, tail_tokens, answer | null, answer_tokens], ...],
     "cache_key": "<prompt_cache_key>", "dropped": <turns no longer stored>}

``cache_key`` is written only when the conversation has one, ``dropped`` only when it
is above 0; a record without them (as earlier versions wrote) reads as ``None`` and 0,
and an earlier version reading a record with them ignores them (its later turns then
take a key of their own, and its turn numbers start again from the turns stored).

A turn is a positional array (its field names would outweigh short turns); it keeps
everything de-duplication needs: the ids of the blocks the turn carried in full with
the content digest of the text it showed for each.
"""

from __future__ import annotations

import json

from ..conversations import Conversation, Turn
from ..errors import StoreFormatError

__all__ = ["FORMAT", "decode_conversation", "encode_conversation"]

FORMAT = 1
_TURN_FIELDS = 10


def encode_conversation(conversation: Conversation) -> bytes:
    """The stored form of ``conversation``."""
    record: dict[str, object] = {
        "format": FORMAT,
        "id": conversation.conversation_id,
        "system": conversation.system,
        "turns": [_encode_turn(turn) for turn in conversation.turns],
    }
    if conversation.cache_key is not None:
        record["cache_key"] = conversation.cache_key
    if conversation.dropped_turns:
        record["dropped"] = conversation.dropped_turns
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_conversation(data: bytes | str, conversation_id: str) -> Conversation:
    """The conversation stored as ``data`` under ``conversation_id``; a record of
    another format, another id or a damaged one is a :class:`StoreFormatError`."""
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreFormatError(f"conversation {conversation_id!r}: not a JSON record") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else None
        raise StoreFormatError(
            f"conversation {conversation_id!r} is stored in format {found!r}; this version "
            f"reads format {FORMAT} (upgrade contextpilot-rag, or clear the store)"
        )
    if record.get("id") != conversation_id:
        raise StoreFormatError(f"the record under {conversation_id!r} is another conversation's")
    system, turns = record.get("system"), record.get("turns")
    cache_key, dropped = record.get("cache_key"), record.get("dropped", 0)
    if (
        (system is not None and not isinstance(system, str))
        or not isinstance(turns, list)
        or (cache_key is not None and not isinstance(cache_key, str))
        or not isinstance(dropped, int)
        or isinstance(dropped, bool)
        or dropped < 0
    ):
        raise StoreFormatError(f"conversation {conversation_id!r}: damaged record")
    try:
        decoded = tuple(_decode_turn(t) for t in turns)
        return Conversation(conversation_id, system, decoded, cache_key, dropped)
    except (TypeError, ValueError) as exc:
        raise StoreFormatError(f"conversation {conversation_id!r}: damaged turn ({exc})") from exc


def _encode_turn(turn: Turn) -> list[object]:
    return [
        turn.request_id,
        turn.user_message,
        turn.block_ids,
        turn.block_digests,
        turn.block_labels,
        turn.block_tokens,
        turn.question,
        turn.tail_tokens,
        turn.answer,
        turn.answer_tokens,
    ]


def _decode_turn(fields: object) -> Turn:
    if not isinstance(fields, list) or len(fields) != _TURN_FIELDS:
        raise ValueError(f"a turn is a list of {_TURN_FIELDS} fields")
    (
        request_id,
        user_message,
        ids,
        digests,
        labels,
        tokens,
        question,
        tail,
        answer,
        answer_tokens,
    ) = fields
    turn = Turn(
        request_id=_text(request_id),
        user_message=_text(user_message),
        block_ids=tuple(_text(item) for item in _list(ids)),
        block_digests=tuple(_text(item) for item in _list(digests)),
        block_labels=tuple(_text(item) for item in _list(labels)),
        block_tokens=tuple(_count(item) for item in _list(tokens)),
        question=_text(question),
        tail_tokens=_count(tail),
        answer=None if answer is None else _text(answer),
        answer_tokens=_count(answer_tokens),
    )
    sizes = {len(turn.block_ids), len(turn.block_digests), len(turn.block_labels)}
    if sizes != {len(turn.block_tokens)}:
        raise ValueError("a turn's block fields differ in length")
    return turn


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"expected a count, got {value!r}")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value
