"""Conversation history and de-duplication (Alg. 3).

A conversation is an immutable record of its turns: the exact user message each turn
sent (so history re-renders to the same bytes and stays a cached prefix), the blocks
that message carried in full, and the assistant's answer once recorded. A block that
some turn in the rendered history already carries is replaced by a location note;
dedup never looks at another conversation.

Stores own the records and are bounded: at most ``max_conversations`` (least recently
used dropped first) and none idle longer than ``ttl_s``. A store shared by several
processes (:mod:`contextpilot_rag.stores`: SQLite, Redis) is also *versioned*
(:class:`VersionedConversationStore`): every write gives the record a new version, and a
turn is written only if the record is still at the version it was planned from
(compare-and-set), so concurrent writers never lose or duplicate a turn.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from ._numbers import is_finite_positive, is_int
from .blocks import ContextBlock
from .errors import BlockConflictError, ConfigError, ConversationStateError

__all__ = [
    "Conversation",
    "ConversationStore",
    "DedupResult",
    "InMemoryConversationStore",
    "StoredConversation",
    "Turn",
    "VersionedConversationStore",
    "deduplicate",
    "versioned",
]


@dataclass(frozen=True)
class Turn:
    """One exchange. ``block_ids`` are the blocks ``user_message`` carries in full,
    in order, with the content digest of the text it showed for each
    (``block_digests``) and the label it showed them under (``block_labels``);
    ``request_id`` is the prompt's, and names the rest of the turn (notes, question)
    in the context index (``tail_id``) as well as the answer (``answer_id``)."""

    request_id: str
    user_message: str
    block_ids: tuple[str, ...]
    block_digests: tuple[str, ...]
    block_labels: tuple[str, ...]
    block_tokens: tuple[int, ...]
    question: str
    tail_tokens: int
    answer: str | None = None
    answer_tokens: int = 0

    @property
    def tail_id(self) -> str:
        return f"\x00tail:{self.request_id}"

    @property
    def answer_id(self) -> str:
        return f"\x00answer:{self.request_id}"


AWAITING_SLACK = 1024
"""Turns a record keeps beyond its history window while one of them awaits its answer
(each without its text): an answer recorded up to that many turns late still finds its
turn (:meth:`Conversation.with_turn`)."""


@dataclass(frozen=True)
class Conversation:
    """A conversation's record: its system prompt and its turns, in order, and the
    ``prompt_cache_key`` its first turn got (``None``: none planned), which its later
    turns keep (``docs/cloud.md``). ``dropped_turns`` earlier turns are no longer
    stored (a history window renders none of them): turn numbers count them, so
    ``turns[i]`` is turn ``dropped_turns + i``."""

    conversation_id: str
    system: str | None
    turns: tuple[Turn, ...] = ()
    cache_key: str | None = None
    dropped_turns: int = 0

    @property
    def turn_count(self) -> int:
        """Every turn the conversation has had, stored or dropped."""
        return self.dropped_turns + len(self.turns)

    def with_turn(self, turn: Turn, keep: int | None = None) -> Conversation:
        """The record with ``turn`` appended. ``keep``: the history window (``None``:
        every turn is rendered and stored). The record stores at most ``keep`` turns,
        dropping the oldest answered ones; a turn older than the window that still
        awaits its answer stays (with every turn after it) so that a late answer finds
        it, but the turns the window no longer renders keep only what answering them
        needs (their request id; no text), and the record never holds more than
        ``keep +`` :data:`AWAITING_SLACK` turns: past that the oldest go, answered or
        not (a turn never answered, an abandoned call, would otherwise keep every later
        one)."""
        turns = (*self.turns, turn)
        if keep is None:
            return replace(self, turns=turns)
        drop = 0
        excess = len(turns) - keep
        while drop < excess and turns[drop].answer is not None:
            drop += 1
        drop = max(drop, excess - AWAITING_SLACK)
        turns = turns[drop:]
        outside = len(turns) - keep
        if outside > 0:
            turns = (*map(_unrendered, turns[:outside]), *turns[outside:])
        return replace(self, turns=turns, dropped_turns=self.dropped_turns + drop)

    def without_turn(self, request_id: str) -> Conversation:
        """The record without turn ``request_id`` (unchanged when it has none)."""
        return replace(self, turns=tuple(t for t in self.turns if t.request_id != request_id))

    def awaiting_answer(self) -> tuple[Turn, ...]:
        """The turns whose answer is not recorded yet, earliest first."""
        return tuple(turn for turn in self.turns if turn.answer is None)

    def with_answer(
        self, text: str, tokens: int = 0, *, request_id: str | None = None
    ) -> Conversation:
        """The record with ``text`` as the answer of the turn ``request_id`` names.
        Without ``request_id`` the turn is the only one awaiting an answer: with
        several awaiting, which one ``text`` answers is ambiguous and refused."""
        number = self._turn_to_answer(request_id)
        answered = replace(self.turns[number], answer=text, answer_tokens=tokens)
        return replace(self, turns=(*self.turns[:number], answered, *self.turns[number + 1 :]))

    def _turn_to_answer(self, request_id: str | None) -> int:
        name = self.conversation_id
        if request_id is not None:
            for number in range(len(self.turns) - 1, -1, -1):
                if self.turns[number].request_id == request_id:
                    if self.turns[number].answer is not None:
                        raise ConversationStateError(
                            f"turn {request_id!r} of conversation {name!r} is already answered"
                        )
                    return number
            raise ConversationStateError(
                f"conversation {name!r} has no turn {request_id!r} (another conversation's "
                "prompt, a turn lost when the conversation expired, or one so far behind "
                "the history window that its record no longer keeps it)"
            )
        waiting = [number for number, turn in enumerate(self.turns) if turn.answer is None]
        if not waiting:
            raise ConversationStateError(
                f"conversation {name!r} has no turn awaiting an answer; call optimize() "
                "for the next turn first"
            )
        if len(waiting) > 1:
            raise ConversationStateError(
                f"{len(waiting)} turns of conversation {name!r} await an answer, so which "
                "one this answers is ambiguous; pass the Prompt (record_answer(prompt, text))"
            )
        return waiting[0]

    def visible_turns(self, max_turns: int | None) -> tuple[tuple[int, Turn], ...]:
        """The turns rendered into the next prompt, with their 0-based turn numbers."""
        first = 0 if max_turns is None else max(0, len(self.turns) - max_turns)
        return tuple(
            (self.dropped_turns + index, self.turns[index])
            for index in range(first, len(self.turns))
        )


def _unrendered(turn: Turn) -> Turn:
    """``turn`` as a record keeps one its history window no longer renders: its request
    id and whether it is answered, nothing a prompt or de-duplication would read."""
    answer = None if turn.answer is None else ""
    if not turn.user_message and not turn.block_ids and turn.answer == answer:
        return turn
    return Turn(turn.request_id, "", (), (), (), (), "", 0, answer)


@dataclass(frozen=True)
class DedupResult:
    kept: tuple[ContextBlock, ...]
    deduplicated: tuple[tuple[ContextBlock, int], ...]  # (block, turn that holds it)


def deduplicate(
    blocks: Sequence[ContextBlock], visible_turns: Sequence[tuple[int, Turn]]
) -> DedupResult:
    """Alg. 3: split ``blocks`` into those to send and those already carried by a
    visible turn (pointing at the latest such turn). A block counts as carried only
    when that turn showed exactly its text (same content digest); a visible turn that
    showed another text under the block's id is a :class:`BlockConflictError`, raised
    before anything changes."""
    held_in: dict[str, tuple[int, str]] = {}
    for number, turn in visible_turns:
        for block_id, digest in zip(turn.block_ids, turn.block_digests, strict=True):
            held_in[block_id] = (number, digest)
    kept: list[ContextBlock] = []
    duplicated: list[tuple[ContextBlock, int]] = []
    for block in blocks:
        held = held_in.get(block.id)
        if held is None:
            kept.append(block)
        elif held[1] == block.digest:
            duplicated.append((block, held[0]))
        else:
            raise BlockConflictError(
                f"block id {block.id!r} was shown in turn {held[0] + 1} of this conversation "
                "with a different text; give a changed text a new id (or leave ids unset)"
            )
    return DedupResult(tuple(kept), tuple(duplicated))


@runtime_checkable
class ConversationStore(Protocol):
    """Where conversations live. Implementations must be safe for concurrent use and
    bounded; ``put`` replaces the whole record atomically. ``forgotten`` tells a
    conversation the store dropped (expired or evicted) from one it never held or
    that was deleted, for as long as the store remembers its drops."""

    def get(self, conversation_id: str) -> Conversation | None: ...

    def put(self, conversation: Conversation) -> None: ...

    def delete(self, conversation_id: str) -> bool: ...

    def forgotten(self, conversation_id: str) -> bool: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class StoredConversation:
    """What a versioned store holds under one id, read at one instant: the record
    and its ``version`` (0: none held), and, when none is held, whether the store
    dropped one (``forgotten``, as :meth:`ConversationStore.forgotten` tells)."""

    conversation: Conversation | None
    version: int
    forgotten: bool = False


@runtime_checkable
class VersionedConversationStore(ConversationStore, Protocol):
    """A :class:`ConversationStore` whose writes can be made conditional, for
    writers that do not share one lock (threads of several pilots, processes).

    Every write stores the record under a new version, never reused for that id (a
    deleted or dropped record does not give its version back); no record is version
    0. ``put_if_version`` writes only when the record is still at
    ``expected_version`` (0: only when none is held), atomically with that check,
    and tells whether it wrote; ``put`` writes unconditionally."""

    def get_versioned(self, conversation_id: str) -> StoredConversation: ...

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool: ...


class _UnversionedStore:
    """A plain :class:`ConversationStore` seen as a versioned one: every write
    succeeds. Right for a store only one pilot writes, under the pilot's lock."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    def get(self, conversation_id: str) -> Conversation | None:
        return self.store.get(conversation_id)

    def put(self, conversation: Conversation) -> None:
        self.store.put(conversation)

    def delete(self, conversation_id: str) -> bool:
        return self.store.delete(conversation_id)

    def forgotten(self, conversation_id: str) -> bool:
        return self.store.forgotten(conversation_id)

    def __len__(self) -> int:
        return len(self.store)

    def get_versioned(self, conversation_id: str) -> StoredConversation:
        conversation = self.store.get(conversation_id)
        if conversation is not None:
            return StoredConversation(conversation, 1)
        return StoredConversation(None, 0, self.store.forgotten(conversation_id))

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        self.store.put(conversation)
        return True


def versioned(store: ConversationStore) -> VersionedConversationStore:
    """``store`` itself when it is versioned; else a view of it whose conditional
    writes always succeed (a store written by one pilot only, as before versions)."""
    if isinstance(store, VersionedConversationStore):
        return store
    return _UnversionedStore(store)


class InMemoryConversationStore:
    """An LRU of conversations in this process, with an idle TTL. It remembers the
    ids of the last ``max_conversations`` conversations it dropped (by TTL or LRU),
    so that :meth:`forgotten` can tell a lost history from a new conversation.
    Versioned (:class:`VersionedConversationStore`): versions count this store's
    writes."""

    def __init__(
        self,
        *,
        max_conversations: int = 10_000,
        ttl_s: float | None = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not is_int(max_conversations) or max_conversations < 1:
            raise ConfigError(
                f"max_conversations must be a positive int, got {max_conversations!r}"
            )
        if ttl_s is not None and not is_finite_positive(ttl_s):
            raise ConfigError(
                f"conversation ttl_s must be a finite number > 0 or None, got {ttl_s!r}"
            )
        self._max = max_conversations
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # id -> (last access, record, version), least recently used first
        self._records: OrderedDict[str, tuple[float, Conversation, int]] = OrderedDict()
        self._dropped: OrderedDict[str, None] = OrderedDict()
        self._versions = itertools.count(1)

    def get(self, conversation_id: str) -> Conversation | None:
        return self.get_versioned(conversation_id).conversation

    def get_versioned(self, conversation_id: str) -> StoredConversation:
        with self._lock:
            self._expire()
            entry = self._records.get(conversation_id)
            if entry is None:
                return StoredConversation(None, 0, conversation_id in self._dropped)
            self._records[conversation_id] = (self._clock(), entry[1], entry[2])
            self._records.move_to_end(conversation_id)
            return StoredConversation(entry[1], entry[2])

    def put(self, conversation: Conversation) -> None:
        with self._lock:
            self._write(conversation)

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        with self._lock:
            self._expire()
            entry = self._records.get(conversation.conversation_id)
            if (0 if entry is None else entry[2]) != expected_version:
                return False
            self._write(conversation)
            return True

    def _write(self, conversation: Conversation) -> None:
        conversation_id = conversation.conversation_id
        self._records[conversation_id] = (self._clock(), conversation, next(self._versions))
        self._records.move_to_end(conversation_id)
        self._dropped.pop(conversation_id, None)
        while len(self._records) > self._max:
            self._drop(self._records.popitem(last=False)[0])

    def delete(self, conversation_id: str) -> bool:
        with self._lock:
            self._dropped.pop(conversation_id, None)
            return self._records.pop(conversation_id, None) is not None

    def forgotten(self, conversation_id: str) -> bool:
        with self._lock:
            self._expire()
            return conversation_id in self._dropped

    def _drop(self, conversation_id: str) -> None:
        self._dropped[conversation_id] = None
        self._dropped.move_to_end(conversation_id)
        while len(self._dropped) > self._max:
            self._dropped.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)

    def _expire(self) -> None:
        if self._ttl_s is None:
            return
        deadline = self._clock() - self._ttl_s
        while self._records:
            oldest_id, (stamp, _, _) = next(iter(self._records.items()))
            if stamp >= deadline:
                return
            del self._records[oldest_id]
            self._drop(oldest_id)
