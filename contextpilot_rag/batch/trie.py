"""A prefix trie of block-code sequences: which requests of a batch share which prefix.

Invariant: a node stands for the code path from the root to it; its ``size`` counts
the sequences added through it (ending there or below), ``ending`` lists the indices
of those ending there, in the order they were added, and ``children`` are keyed by the
next code, in first-seen order.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PrefixTrie"]


class PrefixTrie:
    """One node of the trie; the root stands for the empty prefix."""

    __slots__ = ("children", "ending", "size")

    def __init__(self) -> None:
        self.children: dict[int, PrefixTrie] = {}
        self.ending: list[int] = []
        self.size = 0

    def add(self, sequence: Sequence[int], index: int) -> int:
        """Add ``sequence`` as sequence ``index``; returns the length of its longest
        prefix that an earlier sequence already had. O(len(sequence))."""
        node, seen = self, 0
        node.size += 1
        for code in sequence:
            child = node.children.get(code)
            if child is None:  # every later code is new too
                child = node.children[code] = PrefixTrie()
            else:
                seen += 1
            node = child
            node.size += 1
        node.ending.append(index)
        return seen
