"""Execution orders for a batch whose requests already have their final block order.

Both schedulers only look at the final sequences (block codes, in sending order), so
they work for any builder.

- :func:`prefix_tree_schedule` (default): depth-first over the prefix tree of the final
  sequences, bigger subtrees first. Requests sharing a prefix run back to back, so a
  prefix is reused while it is still cached even when the cache is far smaller than the
  batch (capacity-aware by construction).
- :func:`grouped_schedule`: the paper's Alg. 5 — group requests by their first block,
  larger groups first, longer sequences first within a group.
"""

from __future__ import annotations

from collections.abc import Sequence

from .trie import PrefixTrie

__all__ = ["grouped_schedule", "prefix_tree_schedule"]


def prefix_tree_schedule(sequences: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Request indices, depth first over the prefix tree of ``sequences``: at each
    node the requests ending there first, then the children by subtree size
    (descending; ties: first seen). Deterministic; O(total blocks)."""
    root = PrefixTrie()
    for index, sequence in enumerate(sequences):
        root.add(sequence, index)
    order: list[int] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.extend(node.ending)
        # dicts keep insertion order, and sorted() is stable: ties stay first-seen.
        children = sorted(node.children.values(), key=lambda child: -child.size)
        stack.extend(reversed(children))
    return tuple(order)


def grouped_schedule(sequences: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Alg. 5: group by first block, larger groups first (ties: first seen); within a
    group, longer sequences first (ties: input order). Deterministic."""
    groups: dict[int | None, list[int]] = {}
    for index, sequence in enumerate(sequences):
        groups.setdefault(sequence[0] if sequence else None, []).append(index)
    ordered = sorted(groups.values(), key=lambda members: -len(members))
    return tuple(
        index
        for members in ordered
        for index in sorted(members, key=lambda member: -len(sequences[member]))
    )
