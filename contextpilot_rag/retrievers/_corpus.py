"""The documents a retriever searches, and the argument checks both retrievers share."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..blocks import ContextBlock, is_list_like
from ..errors import BlockConflictError, InvalidInputError


class Corpus:
    """Blocks in insertion order; a block's position is its row in the retriever's
    index. Invariant: ids are unique, and an id keeps the text it was added with.
    Not thread-safe by itself (the retrievers hold a lock around it)."""

    def __init__(self) -> None:
        self._blocks: list[ContextBlock] = []
        self._positions: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __getitem__(self, position: int) -> ContextBlock:
        return self._blocks[position]

    @property
    def blocks(self) -> tuple[ContextBlock, ...]:
        return tuple(self._blocks)

    def new_blocks(self, documents: object) -> list[ContextBlock]:
        """The blocks of ``documents`` not stored yet, in order, exact repeats dropped.
        Stores nothing. Raises :class:`InvalidInputError` for a bad argument and
        :class:`BlockConflictError` for an id given a second, different text."""
        fresh: dict[str, ContextBlock] = {}
        for block in as_blocks(documents):
            known = self._text_of(block.id)
            if known is None and block.id in fresh:
                known = fresh[block.id].text
            if known is None:
                fresh[block.id] = block
            elif known != block.text:
                raise BlockConflictError(
                    f"document id {block.id!r} is already used for a different text; "
                    "give distinct texts distinct ids"
                )
        return list(fresh.values())

    def extend(self, blocks: Sequence[ContextBlock]) -> None:
        """Append blocks that :meth:`new_blocks` returned."""
        for block in blocks:
            self._positions[block.id] = len(self._blocks)
            self._blocks.append(block)

    def scored(self, position: int, score: float) -> ContextBlock:
        """The block at ``position`` with ``score`` set (metadata and id kept)."""
        return dataclasses.replace(self._blocks[position], score=float(score))

    def _text_of(self, block_id: str) -> str | None:
        position = self._positions.get(block_id)
        return None if position is None else self._blocks[position].text


def as_blocks(documents: object) -> list[ContextBlock]:
    """``documents`` as blocks: a :class:`ContextBlock` is kept, a ``str`` becomes a
    block whose id is the hash of its text."""
    if not is_list_like(documents):
        raise InvalidInputError(
            f"documents must be a list of ContextBlock or str, got {type(documents).__name__}"
        )
    blocks = []
    for position, document in enumerate(documents):
        if isinstance(document, ContextBlock):
            blocks.append(document)
        elif isinstance(document, str):
            blocks.append(ContextBlock(document))  # InvalidBlockError when blank
        else:
            raise InvalidInputError(
                f"documents[{position}] is {type(document).__name__}, expected ContextBlock or str"
            )
    return blocks


def check_query(query: object, k: object) -> None:
    """Raise :class:`InvalidInputError` unless ``query`` is a non-blank string and
    ``k`` an int ≥ 1."""
    if not isinstance(query, str):
        raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
    if not query.strip():
        raise InvalidInputError("query is empty; pass the text to search for")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k must be an int >= 1, got {k!r}")
