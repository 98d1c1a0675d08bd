"""Greedy prefix-tree build for a batch: split groups on their most shared block.

Starting from the whole batch, take the block whose sharing reuses the most tokens —
(requests of the group still holding it − 1) × its token count; the requests holding it
form a child group whose prefix gets that block next, the others go on splitting at the
same depth. A group of one, or a group whose members share
nothing more, ends in leaves: each leaf's remaining blocks follow by global popularity.
The recursion *is* a prefix tree (each child group shares its parent's prefix plus one
block), and visiting it depth first, biggest split first, is the schedule: requests that
share a prefix run back to back, longest shared prefixes together.

Cost: every split does numpy work proportional to its group's remaining slots, and with
Zipf-like popularity the leftover group shrinks geometrically, so a batch costs about
O(N · k · depth) vectorised work plus O(tree nodes) Python steps; memory is O(N · k).
Groups below ``_SMALL_GROUP`` requests are split in plain Python (numpy's per-call
overhead dominates there), with a one-level lookahead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .plan import BatchPlan, Progress, check_requests, no_progress, orders_of

__all__ = ["greedy_plan"]

_SMALL_GROUP = 24
_LOOKAHEAD = 6
_PAD = -1

IntArray = npt.NDArray[np.int64]


class _Builder:
    """One build. ``codes``: N × K block codes padded with -1; ``live``: which slots
    are not yet placed in their request's prefix."""

    def __init__(
        self,
        requests: Sequence[Sequence[int]],
        weights: Sequence[float] | None,
        progress: Progress,
    ) -> None:
        n = len(requests)
        width = max((len(request) for request in requests), default=0)
        codes = np.full((n, width), _PAD, dtype=np.int64)
        for row, request in enumerate(requests):
            codes[row, : len(request)] = request
        self.codes = codes
        self.live = codes != _PAD
        flat = codes[self.live]
        self.popularity: IntArray = np.bincount(flat) if flat.size else np.zeros(0, np.int64)
        size = self.popularity.size
        self.weights = (
            np.ones(size) if weights is None else np.asarray(weights, dtype=np.float64)[:size]
        )
        self.sequences: list[list[int]] = [[] for _ in range(n)]
        self.schedule: list[int] = []
        self._advance = progress("batch: prefix tree", n)

    # -- ordering helpers -------------------------------------------------------------

    def _rank_key(self, code: int) -> tuple[int, int]:
        """Most popular first, then the smaller code: a total, deterministic order."""
        return (-int(self.popularity[code]), code)

    def _finish(self, row: int, prefix: list[int]) -> None:
        """``row`` becomes a leaf: its prefix, then its other blocks by popularity."""
        rest = [int(code) for code in self.codes[row][self.live[row]]]
        rest.sort(key=self._rank_key)
        self.sequences[row] = [*prefix, *rest]
        self.schedule.append(row)
        self._advance(1)

    # -- splitting ----------------------------------------------------------------------

    def split(self, rows: IntArray, prefix: list[int]) -> None:
        """Place ``rows`` (all sharing ``prefix``) in the tree, depth first."""
        while rows.size:
            if rows.size <= _SMALL_GROUP:
                self._split_small([int(row) for row in rows], prefix)
                return
            block, holders = self._most_shared(rows)
            if block is None:
                for row in rows:
                    self._finish(int(row), prefix)
                return
            self._place(rows[holders], block)
            self.split(rows[holders], [*prefix, block])
            rows = rows[~holders]

    def _gains(
        self, codes: IntArray, live: npt.NDArray[np.bool_]
    ) -> tuple[IntArray, npt.NDArray[np.float64]]:
        """Blocks held by at least two of the rows, and the tokens a split on each
        would reuse: (holders - 1) · weight."""
        values = codes[live]
        if values.size * 4 < self.popularity.size:  # sparse: do not touch every code
            present, counts = np.unique(values, return_counts=True)
        else:
            counts = np.bincount(values, minlength=self.popularity.size)
            present = np.arange(counts.size)
        shared = counts >= 2
        present, counts = present[shared], counts[shared]
        return present, (counts - 1) * self.weights[present]

    def _most_shared(self, rows: IntArray) -> tuple[int | None, npt.NDArray[np.bool_]]:
        """The block to split ``rows`` on: the one whose sharing reuses the most
        tokens (ties: more popular, then smaller code), and which rows hold it;
        ``None`` if no block is held by two rows. (Looking one level further down,
        as small groups do, changed nothing measurable here.)"""
        codes, live = self.codes[rows], self.live[rows]
        present, gain = self._gains(codes, live)
        if not present.size:
            return None, np.zeros(rows.size, dtype=bool)
        tied = present[gain == gain.max()]
        block = min((int(code) for code in tied), key=self._rank_key)
        holders = ((codes == block) & live).any(axis=1)
        return block, holders

    def _place(self, rows: IntArray, block: int) -> None:
        hit = (self.codes[rows] == block) & self.live[rows]
        live = self.live[rows]
        live[hit] = False
        self.live[rows] = live

    def _split_small(self, rows: list[int], prefix: list[int]) -> None:
        """The same splitting, for a small group, on Python sets."""
        remaining = {row: self._remaining(row) for row in rows}
        self._split_sets(rows, prefix, remaining)

    def _remaining(self, row: int) -> set[int]:
        return {int(code) for code in self.codes[row][self.live[row]]}

    def _split_sets(
        self, rows: list[int], prefix: list[int], remaining: dict[int, set[int]]
    ) -> None:
        while rows:
            if len(rows) == 1:
                self._finish_set(rows[0], prefix, remaining)
                return
            counts = Counter(code for row in rows for code in remaining[row])
            gains = {
                code: (count - 1) * float(self.weights[code])
                for code, count in counts.items()
                if count >= 2
            }
            if not gains:
                for row in rows:
                    self._finish_set(row, prefix, remaining)
                return
            block = self._best_by_lookahead(rows, gains, remaining)
            holders = [row for row in rows if block in remaining[row]]
            for row in holders:
                remaining[row].discard(block)
            self._split_sets(holders, [*prefix, block], remaining)
            rows = [row for row in rows if row not in set(holders)]

    def _best_by_lookahead(
        self, rows: list[int], gains: dict[int, float], remaining: dict[int, set[int]]
    ) -> int:
        """Among the few best immediate gains, the block whose split also allows the
        best split one level down (first of the ties in gain order). In small groups a
        wrong split costs a larger share: this adds 0.1-0.2 points of hit ratio on the
        benchmark for ~25% more planning time."""
        top = sorted(gains, key=lambda code: (-gains[code], self._rank_key(code)))[:_LOOKAHEAD]
        best_code, best_score = top[0], -1.0
        for code in top:
            holders = [row for row in rows if code in remaining[row]]
            below = Counter(c for row in holders for c in remaining[row] if c != code)
            further = max(
                ((count - 1) * float(self.weights[c]) for c, count in below.items() if count >= 2),
                default=0.0,
            )
            score = gains[code] + further
            if score > best_score:
                best_code, best_score = code, score
        return best_code

    def _finish_set(self, row: int, prefix: list[int], remaining: dict[int, set[int]]) -> None:
        rest = sorted(remaining[row], key=self._rank_key)
        self.sequences[row] = [*prefix, *rest]
        self.schedule.append(row)
        self._advance(1)


def greedy_plan(
    requests: Sequence[Sequence[int]],
    *,
    weights: Sequence[float] | None = None,
    progress: Progress = no_progress,
) -> BatchPlan:
    """Plan a batch by greedy prefix-tree splitting (see the module docstring).
    ``requests[i]`` holds distinct non-negative block codes; ``weights[code]`` (e.g.
    the block's token count; default 1) weighs a split: the block whose sharing
    saves the most, (holders - 1) · weight, goes next."""
    check_requests(requests, weights)
    if not requests:
        return BatchPlan((), ())
    builder = _Builder(requests, weights, progress)
    builder.split(np.arange(len(requests), dtype=np.int64), [])
    return BatchPlan(orders_of(requests, builder.sequences), tuple(builder.schedule))
