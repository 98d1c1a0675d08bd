"""Eq. 1 of the ContextPilot paper: the distance between two block sequences.

``d(A, B) = 1 - |A ∩ B| / max(|A|, |B|) + alpha · mean_{b ∈ A ∩ B} |pos_A(b) - pos_B(b)|``

The first term is 0 for equal sets and 1 for disjoint ones; the second (small alpha)
prefers sequences that already hold the shared blocks at similar positions.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_ALPHA", "context_distance"]

DEFAULT_ALPHA = 0.001


def context_distance(a: Sequence[str], b: Sequence[str], alpha: float = DEFAULT_ALPHA) -> float:
    """Eq. 1 distance between two sequences of block ids (1.0 when either is empty
    or they share nothing)."""
    if not a or not b:
        return 1.0
    position_in_b = {block: position for position, block in enumerate(b)}
    shared = 0
    gap_sum = 0
    for position, block in enumerate(a):
        other = position_in_b.get(block)
        if other is not None:
            shared += 1
            gap_sum += abs(position - other)
    if shared == 0:
        return 1.0
    return 1.0 - shared / max(len(a), len(b)) + alpha * gap_sum / shared
