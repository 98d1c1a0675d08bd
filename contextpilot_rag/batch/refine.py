"""Local search after a batch plan: move each request to where it shares the most.

A builder decides top down: once a group splits on a block, a request holding two
popular blocks stays under the first, even where it would share a longer prefix under
the second. This pass takes the plan's prefix tree (the trie of its sequences) and, one
request at a time, lifts the request's sequence out and puts it back where it shares
the most weight, keeping the move only where that beats the prefix the request shared
before (so the tree never gets heavier). Two kinds of place:

- an existing path whose blocks all lie in the request's own (the heaviest such path);
- a *partner's tail*: below a branching node whose path lies in the request's blocks,
  another request may continue alone (its tail: nodes no one else passes). Nobody else
  depends on the order of that tail, so the partner can put the blocks it has in common
  with the request first, and the request follows it through them. The request gains
  the node's path plus the common blocks, the partner loses nothing.

After the shared part the request's other blocks (and a moved partner's) follow by
popularity, as in the builders. Passes (one by default) repeat until a pass moves
nothing or the limit is reached.

Cost: per request, the removal and insertion are O(k) and the search visits the tree
nodes whose path lies inside the request's blocks and the tails hanging from them, at
most ``_VISIT_LIMIT`` of them (each O(k)); memory is one tree node per distinct prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["refine_sequences"]

_VISIT_LIMIT = 64  # tree nodes and partner tails searched per request


class _Node:
    __slots__ = ("block", "children", "count", "parent", "rows")

    def __init__(self, block: int, parent: _Node | None) -> None:
        self.block = block
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.count = 0
        # the sum of the rows passing through (lifting leaves it): where one request
        # passes, its row, so a tail's owner is found without walking the tail
        self.rows = 0


@dataclass
class _Place:
    """Where a lifted request shares the most: ``path`` (block codes from the root),
    then, when ``partner`` is set, the blocks ``common`` that request ``partner`` moves
    to the front of its tail (the part of its sequence after ``path``)."""

    weight: float
    path: tuple[int, ...] = ()
    partner: int | None = None
    common: tuple[int, ...] = ()


class _Tree:
    """The trie of the plan's sequences. A request under consideration is *lifted*:
    its path's counts drop by one but its nodes stay, so keeping the request (the
    usual outcome) costs no allocation; nodes with count 0 are invisible to the search
    and deleted when the request moves."""

    def __init__(self) -> None:
        self.root = _Node(-1, None)

    def insert(self, sequence: Sequence[int], row: int) -> list[_Node]:
        node, path = self.root, []
        for block in sequence:
            child = node.children.get(block)
            if child is None:
                child = node.children[block] = _Node(block, node)
            child.count += 1
            child.rows += row
            path.append(child)
            node = child
        return path

    @staticmethod
    def lift(path: Sequence[_Node]) -> None:
        for node in path:
            node.count -= 1

    @staticmethod
    def restore(path: Sequence[_Node]) -> None:
        for node in path:
            node.count += 1

    @staticmethod
    def remove(path: Sequence[_Node], row: int) -> None:
        """Take lifted ``row`` out for good: delete the nodes no other request passes
        through."""
        for node in reversed(path):
            node.rows -= row
            if node.count == 0 and node.parent is not None:
                del node.parent.children[node.block]

    def best_place(
        self,
        row: int,
        blocks: set[int],
        weights: Sequence[float],
        current: Sequence[Sequence[int]],
        lifted: Sequence[_Node],
    ) -> _Place:
        """The heaviest place for lifted ``row`` (blocks ``blocks``) among the paths
        whose blocks all lie in ``blocks`` and the partner tails below their branching
        nodes (depth first, at most ``_VISIT_LIMIT`` nodes and tails); ``current``:
        every request's sequence; ``lifted``: ``row``'s path."""
        on_path = set(lifted)
        total = sum(weights[block] for block in blocks)
        best = _Place(0.0)
        stack: list[tuple[_Node, float, tuple[int, ...]]] = [(self.root, 0.0, ())]
        visits = 0
        while stack and visits < _VISIT_LIMIT and best.weight < total:
            node, weight, path = stack.pop()
            visits += 1
            if weight > best.weight:
                best = _Place(weight, path)
            for block, child in node.children.items():
                if child.count > 1 and block in blocks:
                    stack.append((child, weight + weights[block], (*path, block)))
                elif child.count == 1:  # a tail: it shares at least what following it would
                    visits += 1
                    partner = child.rows - (row if child in on_path else 0)
                    common = tuple(c for c in current[partner][len(path) :] if c in blocks)
                    gained = weight + sum(weights[code] for code in common)
                    if gained > best.weight:
                        best = _Place(gained, path, partner, common)
        return best


def refine_sequences(
    sequences: Sequence[Sequence[int]],
    weights: Sequence[float],
    rank: Sequence[int],
    *,
    passes: int = 1,
) -> list[list[int]]:
    """Improved block sequences for a batch (see the module docstring).
    ``sequences[i]``: request ``i``'s blocks in the plan's order (distinct codes);
    ``weights[code]``: the block's tokens; ``rank[code]``: its popularity rank (0 most
    popular) for the blocks after the shared part. The result shares at least as many
    weighted tokens in an unbounded prefix cache as the input."""
    current = [list(sequence) for sequence in sequences]
    tree = _Tree()
    paths = [tree.insert(sequence, row) for row, sequence in enumerate(current)]

    def by_rank(codes: set[int]) -> list[int]:
        return sorted(codes, key=lambda code: (rank[code], code))

    def place(row: int, sequence: list[int]) -> None:
        current[row] = sequence
        paths[row] = tree.insert(sequence, row)

    for _ in range(passes):
        moved = 0
        for row, sequence in enumerate(current):
            path = paths[row]
            before = 0.0
            for node in path:
                if node.count < 2:
                    break
                before += weights[node.block]
            tree.lift(path)
            blocks = set(sequence)
            found = tree.best_place(row, blocks, weights, current, path)
            if found.weight <= before:
                tree.restore(path)
                continue
            tree.remove(path, row)
            shared = [*found.path, *found.common]
            if found.partner is not None:
                partner = found.partner
                tree.lift(paths[partner])
                tree.remove(paths[partner], partner)
                tail = set(current[partner][len(found.path) :]).difference(found.common)
                place(partner, [*shared, *by_rank(tail)])
            place(row, [*shared, *by_rank(blocks.difference(shared))])
            moved += 1
        if not moved:
            break
    return current
