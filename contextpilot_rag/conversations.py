"""Conversation history and de-duplication (Alg. 3).

A conversation is an immutable record of its turns: the exact user message each turn
sent (so history re-renders to the same bytes and stays a cached prefix), the blocks
that message carried in full, and the assistant's answer once recorded. A block that
some turn in the rendered history already carries is replaced by a location note;
dedup never looks at another conversation.

Stores own the records and are bounded: at most ``max_conversations`` (least recently
used dropped first) and none idle longer than ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from .blocks import ContextBlock
from .errors import ConfigError, ConversationStateError

__all__ = [
    "Conversation",
    "ConversationStore",
    "DedupResult",
    "InMemoryConversationStore",
    "Turn",
    "deduplicate",
]


@dataclass(frozen=True)
class Turn:
    """One exchange. ``block_ids`` are the blocks ``user_message`` carries in full,
    in order; ``tail_id`` names the rest of the turn (notes, question, answer) in the
    context index."""

    user_message: str
    block_ids: tuple[str, ...]
    block_tokens: tuple[int, ...]
    question: str
    tail_id: str
    tail_tokens: int
    answer: str | None = None
    answer_tokens: int = 0


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    system: str | None
    turns: tuple[Turn, ...] = ()

    def with_turn(self, turn: Turn) -> Conversation:
        return replace(self, turns=(*self.turns, turn))

    def with_answer(self, text: str, tokens: int = 0) -> Conversation:
        if not self.turns:
            raise ConversationStateError(
                f"conversation {self.conversation_id!r} has no turn to answer yet"
            )
        last = self.turns[-1]
        if last.answer is not None:
            raise ConversationStateError(
                f"the last turn of conversation {self.conversation_id!r} is already answered; "
                "call optimize() for the next turn first"
            )
        answered = replace(last, answer=text, answer_tokens=tokens)
        return replace(self, turns=(*self.turns[:-1], answered))

    def visible_turns(self, max_turns: int | None) -> tuple[tuple[int, Turn], ...]:
        """The turns rendered into the next prompt, with their 0-based numbers."""
        first = 0 if max_turns is None else max(0, len(self.turns) - max_turns)
        return tuple((number, self.turns[number]) for number in range(first, len(self.turns)))


@dataclass(frozen=True)
class DedupResult:
    kept: tuple[ContextBlock, ...]
    deduplicated: tuple[tuple[ContextBlock, int], ...]  # (block, turn that holds it)


def deduplicate(
    blocks: Sequence[ContextBlock], visible_turns: Sequence[tuple[int, Turn]]
) -> DedupResult:
    """Alg. 3: split ``blocks`` into those to send and those already carried by a
    visible turn (pointing at the latest such turn)."""
    held_in: dict[str, int] = {}
    for number, turn in visible_turns:
        for block_id in turn.block_ids:
            held_in[block_id] = number
    kept = tuple(block for block in blocks if block.id not in held_in)
    duplicated = tuple((block, held_in[block.id]) for block in blocks if block.id in held_in)
    return DedupResult(kept, duplicated)


@runtime_checkable
class ConversationStore(Protocol):
    """Where conversations live. Implementations must be safe for concurrent use and
    bounded; ``put`` replaces the whole record atomically."""

    def get(self, conversation_id: str) -> Conversation | None: ...

    def put(self, conversation: Conversation) -> None: ...

    def delete(self, conversation_id: str) -> bool: ...

    def __len__(self) -> int: ...


class InMemoryConversationStore:
    """An LRU of conversations in this process, with an idle TTL."""

    def __init__(
        self,
        *,
        max_conversations: int = 10_000,
        ttl_s: float | None = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(max_conversations, int) or max_conversations < 1:
            raise ConfigError("max_conversations must be a positive int")
        if ttl_s is not None and not ttl_s > 0:
            raise ConfigError("conversation ttl_s must be > 0 or None")
        self._max = max_conversations
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, tuple[float, Conversation]] = OrderedDict()

    def get(self, conversation_id: str) -> Conversation | None:
        with self._lock:
            self._expire()
            entry = self._records.get(conversation_id)
            if entry is None:
                return None
            self._records[conversation_id] = (self._clock(), entry[1])
            self._records.move_to_end(conversation_id)
            return entry[1]

    def put(self, conversation: Conversation) -> None:
        with self._lock:
            self._records[conversation.conversation_id] = (self._clock(), conversation)
            self._records.move_to_end(conversation.conversation_id)
            while len(self._records) > self._max:
                self._records.popitem(last=False)

    def delete(self, conversation_id: str) -> bool:
        with self._lock:
            return self._records.pop(conversation_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)

    def _expire(self) -> None:
        if self._ttl_s is None:
            return
        deadline = self._clock() - self._ttl_s
        while self._records:
            oldest_id, (stamp, _) = next(iter(self._records.items()))
            if stamp >= deadline:
                return
            del self._records[oldest_id]
