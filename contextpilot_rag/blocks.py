"""Context blocks: the unit that is reordered, de-duplicated and cached.

A block's identity is its ``id``; by default the id is a hash of its text, so the same
text is the same block wherever it comes from. A block always renders to the same bytes
(:func:`render_block`): its label is derived from the id, never from its position, which
is what lets an engine reuse the cached tokens of a block at the same prefix offset.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NewType, TypeGuard

from .errors import (
    BlockConflictError,
    ConfigError,
    EmptyContextError,
    InvalidBlockError,
    OversizeBlockError,
)

__all__ = [
    "BlockId",
    "BlockRegistry",
    "ContextBlock",
    "RegisteredBlock",
    "block_label",
    "content_id",
    "render_block",
    "validate_blocks",
]

BlockId = NewType("BlockId", str)

_ID_HEX_CHARS = 16
_LABEL_HEX_CHARS = 8
_SAFE_LABEL = re.compile(r"^[A-Za-z0-9_.:\-]{1,32}$")
_CONTENT_ID = re.compile(rf"^[0-9a-f]{{{_ID_HEX_CHARS}}}$")


def content_id(text: str) -> BlockId:
    """The default id of a block: a short SHA-256 of its text."""
    return BlockId(hashlib.sha256(text.encode("utf-8")).hexdigest()[:_ID_HEX_CHARS])


@dataclass(frozen=True, eq=False)
class ContextBlock:
    """One retrieved document, chunk or memory.

    ``id`` defaults to :func:`content_id` of ``text``. ``score`` is the retriever's
    relevance score (informational). ``metadata`` is copied into a read-only mapping.
    Equality and hashing use ``(id, text)``; metadata and score do not change identity.
    """

    text: str
    id: str = field(default=None)  # type: ignore[assignment]
    score: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    label: str = field(init=False, repr=False, compare=False)
    """The position-independent label used in the rendered prompt and notes."""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InvalidBlockError(
                f"ContextBlock.text must be str, got {type(self.text).__name__}"
            )
        if not self.text.strip():
            raise InvalidBlockError("ContextBlock.text is empty; drop empty blocks before passing")
        if self.id is None:
            object.__setattr__(self, "id", content_id(self.text))
        elif not isinstance(self.id, str) or not self.id:
            raise InvalidBlockError(f"ContextBlock.id must be a non-empty str, got {self.id!r}")
        if self.score is not None and (
            isinstance(self.score, bool) or not isinstance(self.score, (int, float))
        ):
            raise InvalidBlockError(f"ContextBlock.score must be a number, got {self.score!r}")
        if not isinstance(self.metadata, Mapping):
            raise InvalidBlockError("ContextBlock.metadata must be a mapping")
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "label", block_label(self.id))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ContextBlock):
            return NotImplemented
        return self.id == other.id and self.text == other.text

    def __hash__(self) -> int:
        return hash((self.id, self.text))


def block_label(block_id: str) -> str:
    """A short printable label for a block id, depending on the id only: the id
    itself when it is short and plain, the first 8 characters of a content-hash id,
    otherwise 8 hex characters of a hash of the id (labels are repeated in notes, so
    every token counts)."""
    if _CONTENT_ID.match(block_id):
        return block_id[:_LABEL_HEX_CHARS]
    if _SAFE_LABEL.match(block_id):
        return block_id
    return hashlib.sha256(block_id.encode("utf-8")).hexdigest()[:_LABEL_HEX_CHARS]


def render_block(block: ContextBlock) -> str:
    """The exact text a block contributes to a prompt (same bytes at any position)."""
    return f"[{block.label}]\n{block.text.strip()}\n\n"


def is_list_like(value: object) -> TypeGuard[Iterable[object]]:
    """An iterable that is not a string, bytes or a mapping: what a list argument
    may be."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


def validate_blocks(blocks: object) -> tuple[ContextBlock, ...]:
    """Check a request's blocks: a non-empty sequence of :class:`ContextBlock`, no id
    used for two different texts. Exact repeats (same id, same text) are collapsed
    to their first occurrence. Raises before anything is stored."""
    if not is_list_like(blocks):
        raise InvalidBlockError(
            f"blocks must be a list of ContextBlock, got {type(blocks).__name__}"
        )
    unique: dict[str, ContextBlock] = {}
    for position, block in enumerate(blocks):
        if not isinstance(block, ContextBlock):
            raise InvalidBlockError(
                f"blocks[{position}] is {type(block).__name__}, expected ContextBlock "
                "(wrap text with ContextBlock(text))"
            )
        seen = unique.get(block.id)
        if seen is None:
            unique[block.id] = block
        elif seen.text != block.text:
            raise BlockConflictError(
                f"block id {block.id!r} is used for two different texts in one request"
            )
    if not unique:
        raise EmptyContextError("no context blocks given; pass at least one ContextBlock")
    return tuple(unique.values())


@dataclass(frozen=True)
class RegisteredBlock:
    """What the registry remembers of a block: its text, its rendering, the token
    count of that rendering and of its label as notes cite it (after a space)."""

    text: str
    rendered: str
    tokens: int
    label_tokens: int


class BlockRegistry:
    """Block id → text, rendering and token count, for the ids seen recently.

    Three jobs: it caches token counts (each block is tokenized once while it stays
    here), it catches an id reused for a different text across calls, and it counts
    how many requests carried each block (its popularity). Bounded to ``capacity``
    ids, least recently used dropped first. Not thread-safe by itself.
    """

    def __init__(self, count_tokens: Callable[[str], int], *, capacity: int = 200_000) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ConfigError("block registry capacity must be a positive int")
        self._count = count_tokens
        self._capacity = capacity
        self._entries: OrderedDict[str, RegisteredBlock] = OrderedDict()
        self._requests_with: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def popularity(self, block_id: str) -> int:
        """How many committed requests carried ``block_id`` (while it stayed here)."""
        return self._requests_with.get(block_id, 0)

    def resolve(
        self, blocks: Sequence[ContextBlock], max_tokens: int | None
    ) -> tuple[RegisteredBlock, ...]:
        """The entries of ``blocks`` (new ones computed, nothing stored). Raises
        :class:`BlockConflictError` or :class:`OversizeBlockError`."""
        resolved = []
        for block in blocks:
            entry = self._entries.get(block.id)
            if entry is None:
                rendered = render_block(block)
                entry = RegisteredBlock(
                    block.text, rendered, self._count(rendered), self._count(" " + block.label)
                )
            elif entry.text is not block.text and entry.text != block.text:
                raise BlockConflictError(
                    f"block id {block.id!r} was registered with a different text; "
                    "distinct texts need distinct ids"
                )
            if max_tokens is not None and entry.tokens > max_tokens:
                raise OversizeBlockError(
                    f"block {block.id!r} has {entry.tokens} tokens, over "
                    f"max_block_tokens={max_tokens}; split it into smaller chunks"
                )
            resolved.append(entry)
        return tuple(resolved)

    def commit(self, blocks: Sequence[ContextBlock], entries: Sequence[RegisteredBlock]) -> None:
        """Store (or refresh) the entries :meth:`resolve` returned for one request."""
        counts, stored = self._requests_with, self._entries
        for block, entry in zip(blocks, entries, strict=True):
            block_id = block.id
            if block_id in stored:
                stored.move_to_end(block_id)  # same text: resolve() checked it
            else:
                stored[block_id] = entry
            counts[block_id] = counts.get(block_id, 0) + 1
        while len(self._entries) > self._capacity:
            dropped, _ = self._entries.popitem(last=False)
            counts.pop(dropped, None)
