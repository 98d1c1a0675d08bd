"""Reorder (Alg. 2): the blocks a request shares with an indexed prefix go first, in
the cached order; the rest follow in an order chosen for *future* sharing.

``"popularity"`` puts the blocks most earlier requests carried first (ties go by block
id, so equal sets start alike whatever their retrieval order), so
two requests whose remainders share popular blocks start them alike; ``"retrieval"``
keeps the retriever's order. The benchmark (docs/benchmarks.md) compares both;
popularity is the default because it wins there.

Given the blocks' token counts, popularity is weighed by them: what a later request
reads from cache is counted in tokens, and a block the next request also carries
extends the shared prefix by its own length. If each block ``b`` comes back in the
next request with a chance ``p_b`` (about its share of earlier requests), a prefix
order reuses ``sum_j tokens_j · p_1 ⋯ p_j`` in expectation, and swapping two
neighbours shows the best order goes by ``tokens · p / (1 − p)``, for blocks far from
certain ``tokens · p``: count times tokens. (The odds form, tried, did no better on
the benchmark families: counts overstate the chance a popular block comes back.)

Blocks do not come back independently, though: requests that paraphrase one question
retrieve most of one set of documents, each with a few others that are popular
anyway. Ordered by popularity alone, those popular strangers go first and cut the
shared prefix where the next paraphrase lacks them. So when the request matched a
cached prefix, the blocks that follow it are first chosen by what the recent requests
carrying that prefix carried (``together``: which of the last ``recent`` requests
carried a block): the block most of them carried (times its tokens), then among those
that carried that one too, and so on, while the chosen block was carried by at least
:data:`FOLLOW_SHARE` of them (and :data:`FOLLOW_AFTER` requests), and by
:data:`FOLLOW_LIFT` times the share of all recent requests that carried it. A weaker
tie says nothing popularity does not (a block most requests carry is carried by most
of any prefix's too), and following it makes equal requests start apart, so the rest
go by popularity as above. The ``families`` section of ``docs/benchmarks.md``
measures it against popularity alone per kind of stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from .blocks import ContextBlock
from .errors import InvalidInputError

__all__ = ["RemainderOrder", "reorder_for_prefix"]

RemainderOrder = Literal["popularity", "retrieval"]


def reorder_for_prefix(
    blocks: Sequence[ContextBlock],
    matched_ids: Sequence[str],
    *,
    remainder: RemainderOrder = "popularity",
    popularity: Callable[[str], int] | None = None,
    tokens: Callable[[str], int] | None = None,
    together: Callable[[str], int] | None = None,
    recent: int = 0,
) -> tuple[ContextBlock, ...]:
    """A permutation of ``blocks``: those named in ``matched_ids`` first, in that
    order, then the others. Ids in ``matched_ids`` that are not among ``blocks``
    (system prompt, history) are skipped. ``popularity(id)``: how many earlier
    requests carried the block; ``tokens(id)``: its size, which weighs it (module
    docstring; ``None``: every block alike); ``together(id)``: which of the last
    ``recent`` requests carried it, as the bits of an int (``None`` or ``recent`` 0:
    popularity alone). Block ids must be distinct
    (:class:`InvalidInputError` otherwise: a repeat has no one place in a permutation;
    the pilot removes repeats first)."""
    by_id: dict[str, ContextBlock] = {block.id: block for block in blocks}
    if len(by_id) != len(blocks):
        raise InvalidInputError("reorder_for_prefix() needs blocks with distinct ids")
    head: list[ContextBlock] = []
    taken: set[str] = set()
    for block_id in matched_ids:
        if block_id in by_id and block_id not in taken:
            head.append(by_id[block_id])
            taken.add(block_id)
    rest = [block for block in blocks if block.id not in taken]
    followed: list[ContextBlock] = []
    if remainder == "popularity" and popularity is not None:
        if together is not None and recent > 0 and head:
            followed = _follow_together(head, rest, together, recent, tokens)
            moved = {block.id for block in followed}
            rest = [block for block in rest if block.id not in moved]
        rest = _by_popularity(rest, popularity, tokens)
    return (*head, *followed, *rest)


FOLLOW_SHARE = 0.6
"""The share of the recent requests carrying a prefix that must also carry a block for
it to follow that prefix ahead of popularity (module docstring; on the benchmark
families a lower share lost on streams of topics, whose blocks all come with their
topic's, and a higher one gained less on near-duplicate streams)."""

FOLLOW_AFTER = 2
"""The fewest recent requests that must carry the prefix and the block."""

FOLLOW_LIFT = 3
"""How many times its share of all recent requests a block's share of those carrying
the prefix must be (without it, streams of independent draws lost on the benchmark
families: their most popular blocks come with any prefix)."""


def _follow_together(
    head: Sequence[ContextBlock],
    rest: Sequence[ContextBlock],
    together: Callable[[str], int],
    recent: int,
    tokens: Callable[[str], int] | None,
) -> list[ContextBlock]:
    """The blocks of ``rest`` that follow ``head`` by what recent requests carried
    with it, in order (module docstring)."""
    carriers = together(head[0].id)
    for block in head[1:]:
        carriers &= together(block.id)
    followed: list[ContextBlock] = []
    left = list(rest)
    while left:
        total = carriers.bit_count()
        if total < FOLLOW_AFTER:
            break
        best: tuple[int, str] | None = None
        chosen, chosen_bits = None, 0
        for block in left:
            bits = together(block.id)
            carried = (carriers & bits).bit_count()
            if carried < FOLLOW_AFTER or carried < FOLLOW_SHARE * total:
                continue
            if carried * recent < FOLLOW_LIFT * total * bits.bit_count():
                continue
            score = (-carried * (1 if tokens is None else tokens(block.id)), block.id)
            if best is None or score < best:
                best, chosen, chosen_bits = score, block, bits
        if chosen is None:
            break
        followed.append(chosen)
        left.remove(chosen)
        carriers &= chosen_bits
    return followed


POPULAR_AFTER = 2
"""Requests a block must have been carried by before its count orders it."""


def _by_popularity(
    rest: Sequence[ContextBlock],
    popularity: Callable[[str], int],
    tokens: Callable[[str], int] | None,
) -> list[ContextBlock]:
    """Blocks carried by at least :data:`POPULAR_AFTER` earlier requests first, by
    count (times tokens, when given) from the highest, ties by id (the same tied
    blocks get the same order in every request); then the others in the retriever's
    order. One earlier request says nothing about which blocks will be shared, and
    the retriever's top documents are the ones related queries share (measured on the
    MTRAG streams of the real-engine suite, with no loss on the synthetic workload)."""
    counts = [popularity(block.id) for block in rest]
    popular = [
        (-count * (1 if tokens is None else tokens(block.id)), block.id, block)
        for block, count in zip(rest, counts, strict=True)
        if count >= POPULAR_AFTER
    ]
    popular.sort(key=lambda entry: entry[:2])
    others = [block for block, count in zip(rest, counts, strict=True) if count < POPULAR_AFTER]
    return [*(entry[2] for entry in popular), *others]
