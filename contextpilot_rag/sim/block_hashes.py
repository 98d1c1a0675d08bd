"""Chained block hashes: the key an engine's prefix cache gives a full block of tokens.

Block ``i``'s hash is ``hash((hash of block i - 1, tokens of block i))``, the first
block's parent being :data:`ROOT_HASH`, so equal hashes stand for equal whole prefixes
(up to a 64-bit collision). Only full blocks are hashed; a partial last block has no
key. Hashes of int tuples are not salted, so the keys are stable across processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["ROOT_HASH", "chained_block_hashes", "iter_block_hashes"]

ROOT_HASH = 0
"""The parent hash of every prompt's first block."""


def iter_block_hashes(token_ids: Sequence[int], block_tokens: int) -> Iterator[int]:
    """Chained hashes of the full ``block_tokens`` blocks of ``token_ids``, first block
    first: entry ``i`` identifies the whole prefix up to block ``i``."""
    tokens = tuple(token_ids)
    parent = ROOT_HASH
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = hash((parent, tokens[start : start + block_tokens]))
        yield parent


def chained_block_hashes(token_ids: Sequence[int], block_tokens: int) -> tuple[int, ...]:
    """:func:`iter_block_hashes` of ``token_ids``, as a tuple."""
    return tuple(iter_block_hashes(token_ids, block_tokens))
