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

A request can also be stuck where no single move helps: two requests sharing many
blocks, each held in place by a prefix the other lacks. *Joint* moves (``pairs``) take
a request with each of its heaviest partners by shared weight, lift both, put both
under the heaviest path inside the blocks they share, followed by the rest of those
blocks, and keep the best such pair where the tree gets lighter (exactly: the nodes
only the two passed through, against the nodes their new sequences add).
``plan_batch`` runs one pass of them on the refined plan it keeps (:class:`Refiner`
lets it refine several plans and go on with the best without rebuilding the tree).

Cost: per request, the removal and insertion are O(k) and the search visits the tree
nodes whose path lies inside the request's blocks and the tails hanging from them, at
most ``_VISIT_LIMIT`` of them (each O(k)); memory is one tree node per distinct prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["refine_sequences"]

_VISIT_LIMIT = 64  # tree nodes and partner tails searched per request
_MIN_GAIN = 1e-9  # a joint move must make the tree lighter by more than rounding


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
        blocks: set[int],
        weights: Sequence[float],
        tails: tuple[int, Sequence[Sequence[int]], Sequence[_Node]] | None = None,
    ) -> _Place:
        """The heaviest place for a lifted request of blocks ``blocks`` among the paths
        whose blocks all lie in ``blocks`` and, given ``tails`` (the request's row,
        every request's sequence, the request's path), the partner tails below their
        branching nodes (depth first, at most ``_VISIT_LIMIT`` nodes and tails)."""
        row, current, lifted = tails if tails is not None else (-1, (), ())
        on_path = set(lifted)
        deeper = 1 if tails is not None else 0  # with tails, a count-1 child is a tail
        total = sum(weights[block] for block in blocks)
        # the best so far, as locals (this loop runs for every request of a pass)
        best_weight = 0.0
        best_path: tuple[int, ...] = ()
        best_partner: int | None = None
        best_common: tuple[int, ...] = ()
        stack: list[tuple[_Node, float, tuple[int, ...]]] = [(self.root, 0.0, ())]
        visits = 0
        while stack and visits < _VISIT_LIMIT and best_weight < total:
            node, weight, path = stack.pop()
            visits += 1
            if weight > best_weight:
                best_weight, best_path, best_partner, best_common = weight, path, None, ()
            for block, child in node.children.items():
                count = child.count
                if count > deeper and block in blocks:
                    stack.append((child, weight + weights[block], (*path, block)))
                elif deeper and count == 1:  # a tail: at least what following it gives
                    visits += 1
                    partner = child.rows - (row if child in on_path else 0)
                    tail = current[partner][len(path) :]
                    common = blocks.intersection(tail)
                    gained = weight
                    for code in common:
                        gained += weights[code]
                    if gained > best_weight:
                        ordered = tuple(code for code in tail if code in common)
                        best_weight, best_path = gained, path
                        best_partner, best_common = partner, ordered
        return _Place(best_weight, best_path, best_partner, best_common)

    def added_weight(self, sequences: Sequence[Sequence[int]], weights: Sequence[float]) -> float:
        """The weight of the nodes that inserting ``sequences`` would add (nodes no
        request passes through count as absent)."""
        added: set[tuple[int, ...]] = set()
        total = 0.0
        for sequence in sequences:
            node: _Node | None = self.root
            for depth, block in enumerate(sequence):
                child = node.children.get(block) if node is not None else None
                node = child if child is not None and child.count else None
                if node is None:
                    prefix = tuple(sequence[: depth + 1])
                    if prefix not in added:
                        added.add(prefix)
                        total += weights[block]
        return total


def refine_sequences(
    sequences: Sequence[Sequence[int]],
    weights: Sequence[float],
    rank: Sequence[int],
    *,
    passes: int = 1,
    pairs: int = 0,
) -> list[list[int]]:
    """Improved block sequences for a batch (see the module docstring).
    ``sequences[i]``: request ``i``'s blocks in the plan's order (distinct codes);
    ``weights[code]``: the block's tokens; ``rank[code]``: its popularity rank (0 most
    popular) for the blocks after the shared part. ``pairs`` > 0: after the passes,
    one pass of *joint* moves (each request with each of its ``pairs`` heaviest
    partners by shared weight: both go under the heaviest path inside the blocks they
    share, then the rest of those blocks, where that makes the tree lighter). The
    result shares at least as many weighted tokens in an unbounded prefix cache as the
    input."""
    _check_counts(passes=passes, pairs=pairs)
    refiner = Refiner(sequences, weights, rank)
    refiner.single_passes(passes)
    refiner.joint_pass(pairs)
    return refiner.sequences


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be an int >= 0, got {value!r}")


class Refiner:
    """The moves of :func:`refine_sequences` on one plan, step by step, so a caller can
    refine several plans and go on with the best (``plan_batch`` does).
    :attr:`sequences` are the current sequences; :meth:`shared` what they share."""

    def __init__(
        self, sequences: Sequence[Sequence[int]], weights: Sequence[float], rank: Sequence[int]
    ) -> None:
        self.sequences = [list(sequence) for sequence in sequences]
        self.weights = weights
        self.rank = rank
        self.tree = _Tree()
        self.paths = [
            self.tree.insert(sequence, row) for row, sequence in enumerate(self.sequences)
        ]

    def shared(self) -> float:
        """The weight the sequences share: every block sent after a prefix an earlier
        sequence sent (the total less the tree's weight, as ``shared_tokens``)."""
        weights = self.weights
        total = sum(weights[code] for sequence in self.sequences for code in sequence)
        stack = list(self.tree.root.children.values())
        tree = 0.0
        while stack:
            node = stack.pop()
            tree += weights[node.block]
            stack.extend(node.children.values())
        return total - tree

    def single_passes(self, passes: int) -> None:
        """Up to ``passes`` passes of single moves, stopping after one that moves none."""
        for _ in range(passes):
            if not self._single_moves():
                break

    def joint_pass(self, pairs: int) -> None:
        """One pass of joint moves with each request's ``pairs`` heaviest partners
        (none for 0)."""
        if pairs > 0:
            self._joint_moves(_heaviest_partners(self.sequences, self.weights, pairs))

    def _by_rank(self, codes: set[int]) -> list[int]:
        rank = self.rank
        return sorted(codes, key=lambda code: (rank[code], code))

    def _place(self, row: int, sequence: list[int]) -> None:
        self.sequences[row] = sequence
        self.paths[row] = self.tree.insert(sequence, row)

    def _take_out(self, row: int) -> None:
        self.tree.lift(self.paths[row])
        self.tree.remove(self.paths[row], row)

    def _shared_before(self, row: int) -> float:
        weights = self.weights
        before = 0.0
        for node in self.paths[row]:
            if node.count < 2:
                break
            before += weights[node.block]
        return before

    def _single_moves(self) -> int:
        tree, weights, current = self.tree, self.weights, self.sequences
        moved = 0
        for row, sequence in enumerate(current):
            path = self.paths[row]
            before = self._shared_before(row)
            tree.lift(path)
            blocks = set(sequence)
            found = tree.best_place(blocks, weights, (row, current, path))
            if found.weight <= before:
                tree.restore(path)
                continue
            tree.remove(path, row)
            shared = [*found.path, *found.common]
            if found.partner is not None:
                partner = found.partner
                self._take_out(partner)
                tail = set(current[partner][len(found.path) :]).difference(found.common)
                self._place(partner, [*shared, *self._by_rank(tail)])
            self._place(row, [*shared, *self._by_rank(blocks.difference(shared))])
            moved += 1
        return moved

    def _joint_moves(self, partners: Sequence[Sequence[tuple[int, float]]]) -> None:
        tree, weights, current, paths = self.tree, self.weights, self.sequences, self.paths
        by_rank = self._by_rank
        for row in range(len(current)):
            best: tuple[float, int, list[int], list[int]] | None = None
            mine_before = self._shared_before(row)
            for other, share in partners[row]:
                # a pair gains at most twice what it shares less what both share with
                # others now (shared_before also counts what they share with each
                # other: a cheap filter that may skip a rare small gain, never a loss)
                if 2 * share <= mine_before + self._shared_before(other):
                    continue
                both = (paths[row], paths[other])
                for path in both:
                    tree.lift(path)
                freed = sum(
                    {id(n): weights[n.block] for p in both for n in p if not n.count}.values()
                )
                common = set(current[row]).intersection(current[other])
                head = list(tree.best_place(common, weights).path)
                head += by_rank(common.difference(head))
                mine = [*head, *by_rank(set(current[row]).difference(common))]
                theirs = [*head, *by_rank(set(current[other]).difference(common))]
                gain = freed - tree.added_weight((mine, theirs), weights)
                for path in both:
                    tree.restore(path)
                if gain > _MIN_GAIN and (best is None or gain > best[0]):
                    best = (gain, other, mine, theirs)
            if best is not None:
                _, other, mine, theirs = best
                self._take_out(row)
                self._take_out(other)
                self._place(row, mine)
                self._place(other, theirs)


def _heaviest_partners(
    sequences: Sequence[Sequence[int]], weights: Sequence[float], count: int
) -> list[list[tuple[int, float]]]:
    """Per request, up to ``count`` (other request, block weight it shares) pairs, the
    heaviest first (at least one block shared); from each block's list of holders."""
    n = len(sequences)
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=n)
    flat = np.fromiter((c for s in sequences for c in s), dtype=np.int64, count=int(lengths.sum()))
    holders = np.repeat(np.arange(n, dtype=np.int64), lengths)[np.argsort(flat, kind="stable")]
    codes = np.sort(flat)
    starts = np.searchsorted(codes, flat, side="left")
    ends = np.searchsorted(codes, flat, side="right")
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    block_weight = np.asarray(weights, dtype=np.float64)
    partners: list[list[tuple[int, float]]] = []
    for row in range(n):
        slots = range(int(offsets[row]), int(offsets[row + 1]))
        if not slots:
            partners.append([])
            continue
        spans = [holders[starts[slot] : ends[slot]] for slot in slots]
        sharing = np.bincount(
            np.concatenate(spans),
            weights=np.repeat(block_weight[flat[offsets[row] : offsets[row + 1]]],
                              [len(span) for span in spans]),
            minlength=n,
        )  # fmt: skip
        sharing[row] = 0.0
        top = np.argpartition(-sharing, count)[:count] if count < n else np.arange(n)
        top = top[np.argsort(-sharing[top], kind="stable")]
        partners.append([(int(o), float(sharing[o])) for o in top if sharing[o] > 0])
    return partners
