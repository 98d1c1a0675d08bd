"""Local search after a batch plan: move each request to where it shares the most.

A builder decides top down: once a group splits on a block, a request holding two
popular blocks stays under the first, even where it would share a longer prefix under
the second. This pass takes the plan's prefix tree (the trie of its sequences) and, one
request at a time, removes the request's sequence and puts it back along the heaviest
path the rest of the tree offers inside its own blocks; it keeps the move only where
that path outweighs the prefix the request shared before (so the tree never gets
heavier). After the path the request's other blocks follow by popularity, as in the
builders. Passes (one by default) repeat until a pass moves nothing or the limit is
reached.

Cost: per request, the removal and insertion are O(k) and the search visits the tree
nodes whose path lies inside the request's blocks, at most ``_VISIT_LIMIT`` of them
(each O(k)); memory is one tree node per distinct prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["refine_sequences"]

_VISIT_LIMIT = 64  # tree nodes searched per request


class _Node:
    __slots__ = ("block", "children", "count", "parent")

    def __init__(self, block: int, parent: _Node | None) -> None:
        self.block = block
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.count = 0


class _Tree:
    """The trie of the plan's sequences. A request under consideration is *lifted*:
    its path's counts drop by one but its nodes stay, so keeping the request (the
    usual outcome) costs no allocation; nodes with count 0 are invisible to the search
    and deleted when the request moves."""

    def __init__(self) -> None:
        self.root = _Node(-1, None)

    def insert(self, sequence: Sequence[int]) -> list[_Node]:
        node, path = self.root, []
        for block in sequence:
            child = node.children.get(block)
            if child is None:
                child = node.children[block] = _Node(block, node)
            child.count += 1
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
    def prune(path: Sequence[_Node]) -> None:
        """Delete the lifted path's nodes no other request passes through."""
        for node in reversed(path):
            if node.count == 0 and node.parent is not None:
                del node.parent.children[node.block]

    def heaviest_inside(self, blocks: set[int], weights: Sequence[float]) -> list[int]:
        """The heaviest root path of other requests whose blocks all lie in
        ``blocks`` (depth first, at most ``_VISIT_LIMIT`` nodes)."""
        total = sum(weights[block] for block in blocks)
        best_weight = 0.0
        best_path: tuple[int, ...] = ()
        stack: list[tuple[_Node, float, tuple[int, ...]]] = [(self.root, 0.0, ())]
        visits = 0
        while stack and visits < _VISIT_LIMIT:
            node, weight, path = stack.pop()
            visits += 1
            if weight > best_weight:
                best_weight, best_path = weight, path
                if total <= best_weight:  # every block on the path: nothing heavier
                    break
            children = node.children
            for block in children.keys() & blocks:
                child = children[block]
                if child.count:
                    stack.append((child, weight + weights[block], (*path, block)))
        return list(best_path)


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
    popular) for the blocks after the shared path. The result shares at least as many
    weighted tokens in an unbounded prefix cache as the input."""
    current = [list(sequence) for sequence in sequences]
    tree = _Tree()
    paths = [tree.insert(sequence) for sequence in current]
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
            shared = tree.heaviest_inside(blocks, weights)
            if sum(weights[block] for block in shared) <= before:
                tree.restore(path)
                continue
            tree.prune(path)
            rest = sorted(blocks.difference(shared), key=lambda code: (rank[code], code))
            current[row] = [*shared, *rest]
            paths[row] = tree.insert(current[row])
            moved += 1
        if not moved:
            break
    return current
