"""The soak workload (``benchmarks/soak.py``): an endless stream of conversation turns
from many tenants, with new conversations starting all the time.

``active`` conversations are open at once; each turn continues one of them, drawn at
random, and a conversation that has had its planned number of turns (``min_turns`` to
``max_turns``) is left, never ended, and a new one of a random tenant takes its place,
so that the pilot's store must drop the old ones by its own bounds. A turn carries
``blocks_per_turn`` blocks: one or two shared blocks (``ContextBlock(shared=True)``,
the same public corpus for every tenant) and the tenant's own blocks, about a third of
them retrieved again from the conversation's earlier turns (de-duplication fires), the
rest drawn from the tenant's corpus with Zipf-like popularity (prefixes recur). The
stream is a function of ``seed`` alone.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from contextpilot_rag import ContextBlock

__all__ = ["SoakShape", "SoakTurn", "SoakWorkload"]


@dataclass(frozen=True)
class SoakShape:
    tenants: int = 50
    docs_per_tenant: int = 200
    shared_docs: int = 100
    active: int = 500  # conversations open at once
    min_turns: int = 2
    max_turns: int = 10
    blocks_per_turn: int = 6

    def __post_init__(self) -> None:
        if min(self.tenants, self.docs_per_tenant, self.shared_docs, self.active) < 1:
            raise ValueError("SoakShape counts must be >= 1")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError("SoakShape needs 1 <= min_turns <= max_turns")
        if not 3 <= self.blocks_per_turn <= self.docs_per_tenant:
            raise ValueError("SoakShape.blocks_per_turn must be in 3..docs_per_tenant")


@dataclass(frozen=True)
class SoakTurn:
    tenant: str
    conversation_id: str
    blocks: tuple[ContextBlock, ...]
    query: str
    answer: str


@dataclass
class _Open:
    tenant: int
    conversation_id: str
    turns_left: int
    turn: int = 0
    shown: list[ContextBlock] = field(default_factory=list)  # private blocks, first seen order


def _document(owner: str, number: int) -> str:
    facts = " ".join(f"Fact {k} on topic {number} of {owner}." for k in range(12))
    return f"{owner}, document {number}. {facts}"


def _zipf_weights(count: int) -> list[float]:
    return list(itertools.accumulate(1.0 / (rank + 1) for rank in range(count)))


class SoakWorkload:
    """The turn stream of one ``shape`` and ``seed``: call :meth:`next_turn` forever."""

    def __init__(self, shape: SoakShape, seed: int = 0) -> None:
        self.shape = shape
        self._rng = random.Random(seed)
        self.tenant_names = [f"tenant-{t:03d}" for t in range(shape.tenants)]
        self._shared = [
            ContextBlock(_document("the public corpus", i), id=f"pub-{i}", shared=True)
            for i in range(shape.shared_docs)
        ]
        self._corpora = [
            [ContextBlock(_document(name, i), id=f"doc-{i}") for i in range(shape.docs_per_tenant)]
            for name in self.tenant_names
        ]
        self._shared_weights = _zipf_weights(shape.shared_docs)
        self._private_weights = _zipf_weights(shape.docs_per_tenant)
        self._numbers = itertools.count()
        self._open = [self._start() for _ in range(shape.active)]

    def next_turn(self) -> SoakTurn:
        slot = self._rng.randrange(len(self._open))
        conversation = self._open[slot]
        blocks = self._blocks(conversation)
        conversation.turn += 1
        conversation.turns_left -= 1
        if conversation.turns_left == 0:
            self._open[slot] = self._start()
        number, name = conversation.turn, conversation.conversation_id
        return SoakTurn(
            tenant=self.tenant_names[conversation.tenant],
            conversation_id=name,
            blocks=blocks,
            query=f"Question {number} of {name}: what do the documents say about it?",
            answer=f"Answer {number} of {name}: the documents say several things about it.",
        )

    def _start(self) -> _Open:
        shape = self.shape
        return _Open(
            tenant=self._rng.randrange(shape.tenants),
            conversation_id=f"conv-{next(self._numbers)}",
            turns_left=self._rng.randint(shape.min_turns, shape.max_turns),
        )

    def _blocks(self, conversation: _Open) -> tuple[ContextBlock, ...]:
        rng, k = self._rng, self.shape.blocks_per_turn
        shared = self._draw(self._shared, self._shared_weights, rng.randint(1, 2))
        private_count = k - len(shared)
        again = rng.sample(conversation.shown, min(len(conversation.shown), private_count // 3))
        corpus = self._corpora[conversation.tenant]
        fresh = self._draw(corpus, self._private_weights, private_count - len(again), again)
        for block in fresh:
            if block not in conversation.shown:
                conversation.shown.append(block)
        blocks = [*shared, *again, *fresh]
        rng.shuffle(blocks)  # a retriever's ranking, not the corpus order
        return tuple(blocks)

    def _draw(
        self,
        corpus: Sequence[ContextBlock],
        weights: Sequence[float],
        count: int,
        taken: Sequence[ContextBlock] = (),
    ) -> list[ContextBlock]:
        """``count`` distinct blocks of ``corpus`` not in ``taken``, by popularity."""
        chosen: list[ContextBlock] = []
        while len(chosen) < count:
            block = self._rng.choices(corpus, cum_weights=weights)[0]
            if block not in chosen and block not in taken:
                chosen.append(block)
        return chosen
