"""Invariants over random request streams: no block is lost or sent twice, the output
is a permutation of the input, the index stays within its bounds, and the search finds
the longest reusable prefix (checked against a brute-force reference)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag import (
    ContextBlock,
    ContextIndex,
    ContextPilot,
    IndexConfig,
    PilotConfig,
    Prompt,
    RequestId,
    Tokenizer,
)
from contextpilot_rag.ordering import POPULAR_AFTER, reorder_for_prefix

CheckPrompt = Callable[[Prompt, Sequence[ContextBlock]], None]

UNIVERSE = tuple(
    ContextBlock(f"Passage {n} states fact {n} about topic {n % 4}.", id=f"p{n}") for n in range(10)
)

block_lists = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=7)
requests = st.tuples(
    block_lists,
    st.sampled_from([None, "alice", "bob"]),  # conversation
    st.booleans(),  # record an answer afterwards
)
configs = st.builds(
    PilotConfig,
    index=st.builds(IndexConfig, capacity_tokens=st.sampled_from([None, 60, 400])),
    reorder=st.booleans(),
    dedup=st.booleans(),
    remainder=st.sampled_from(["popularity", "retrieval"]),
    max_history_turns=st.sampled_from([None, 1, 2]),
)


def run_stream(
    pilot: ContextPilot,
    stream: list[tuple[list[ContextBlock], str | None, bool]],
) -> list[tuple[Prompt, list[ContextBlock]]]:
    results = []
    for number, (blocks, conversation_id, answer) in enumerate(stream):
        prompt = pilot.optimize(blocks, f"question {number}?", conversation_id=conversation_id)
        results.append((prompt, blocks))
        if conversation_id is not None and answer:
            pilot.record_answer(prompt, f"answer {number}.")
    return results


@settings(max_examples=60, deadline=None)
@given(stream=st.lists(requests, min_size=1, max_size=8), config=configs)
def test_every_block_is_sent_once_or_pointed_at_in_history(
    tokenizer: Tokenizer,
    check_prompt: CheckPrompt,
    stream: list[tuple[list[ContextBlock], str | None, bool]],
    config: PilotConfig,
) -> None:
    for prompt, blocks in run_stream(ContextPilot(config, tokenizer=tokenizer), stream):
        check_prompt(prompt, blocks)


@settings(max_examples=60, deadline=None)
@given(stream=st.lists(requests, min_size=1, max_size=8), config=configs)
def test_sent_and_deduplicated_blocks_are_a_permutation_of_the_input(
    tokenizer: Tokenizer,
    stream: list[tuple[list[ContextBlock], str | None, bool]],
    config: PilotConfig,
) -> None:
    for prompt, blocks in run_stream(ContextPilot(config, tokenizer=tokenizer), stream):
        unique = list(dict.fromkeys(blocks))
        assert list(prompt.original_blocks) == unique
        assert sorted(b.id for b in (*prompt.blocks, *prompt.deduplicated)) == sorted(
            b.id for b in unique
        )


@settings(max_examples=40, deadline=None)
@given(stream=st.lists(requests, min_size=1, max_size=8))
def test_pilot_index_stays_within_capacity(
    tokenizer: Tokenizer, stream: list[tuple[list[ContextBlock], str | None, bool]]
) -> None:
    pilot = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=150)), tokenizer=tokenizer)
    for blocks, conversation_id, _ in stream:
        pilot.optimize(blocks, "q", conversation_id=conversation_id)
        assert pilot.index_stats().tokens <= 150


paths = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True)
block_tokens = st.fixed_dictionaries({block: st.integers(1, 9) for block in "abcdefgh"})


@settings(max_examples=100, deadline=None)
@given(
    inserted=st.lists(paths, max_size=30),
    cost=block_tokens,
    capacity=st.integers(1, 40),
    max_nodes=st.integers(1, 12),
)
def test_index_never_exceeds_its_bounds(
    inserted: list[list[str]], cost: dict[str, int], capacity: int, max_nodes: int
) -> None:
    index = ContextIndex(IndexConfig(capacity_tokens=capacity, max_nodes=max_nodes))
    for number, path in enumerate(inserted):
        index.insert(path, [cost[b] for b in path], RequestId(f"r{number}"))
        stats = index.stats()
        assert stats.tokens <= capacity and stats.nodes <= max_nodes


def longest_reusable_tokens(
    indexed: list[list[str]], request: set[str], cost: dict[str, int]
) -> int:
    """Reference: the best prefix of any indexed path made only of request blocks."""
    best = 0
    for path in indexed:
        tokens = 0
        for block in path:
            if block not in request:
                break
            tokens += cost[block]
        best = max(best, tokens)
    return best


@settings(max_examples=150, deadline=None)
@given(inserted=st.lists(paths, min_size=1, max_size=12), request=paths, cost=block_tokens)
def test_search_finds_the_longest_reusable_prefix(
    inserted: list[list[str]], request: list[str], cost: dict[str, int]
) -> None:
    index = ContextIndex(IndexConfig(capacity_tokens=None, max_nodes=None, search_budget=10_000))
    for number, path in enumerate(inserted):
        index.insert(path, [cost[b] for b in path], RequestId(f"r{number}"))
    match = index.search(request)
    assert set(match.blocks) <= set(request)
    assert any(tuple(path[: len(match.blocks)]) == match.blocks for path in inserted)
    assert match.tokens == sum(cost[b] for b in match.blocks)
    assert match.tokens == longest_reusable_tokens(inserted, set(request), cost)


@settings(max_examples=100, deadline=None)
@given(
    blocks=st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=10, unique=True),
    matched=st.lists(st.sampled_from([b.id for b in UNIVERSE] + ["sys", "tail"]), max_size=6),
    counts=st.dictionaries(st.sampled_from([b.id for b in UNIVERSE]), st.integers(0, 3)),
    sizes=st.dictionaries(st.sampled_from([b.id for b in UNIVERSE]), st.integers(1, 500)),
)
def test_reorder_returns_a_permutation(
    blocks: list[ContextBlock], matched: list[str], counts: dict[str, int], sizes: dict[str, int]
) -> None:
    def count(block_id: str) -> int:
        return counts.get(block_id, 0)

    def size(block_id: str) -> int:
        return sizes.get(block_id, 1)

    result = reorder_for_prefix(blocks, matched, popularity=count, tokens=size)
    assert sorted(b.id for b in result) == sorted(b.id for b in blocks)
    # after the matched head: popular blocks by count x tokens, highest first, then
    # the rest in retrieval order
    present = {b.id for b in blocks}
    head = list(dict.fromkeys(i for i in matched if i in present))
    rest = [b.id for b in result[len(head) :]]
    assert [b.id for b in result[: len(head)]] == head
    popular = [i for i in rest if count(i) >= POPULAR_AFTER]
    weights = [count(i) * size(i) for i in popular]
    assert weights == sorted(weights, reverse=True)
    assert rest[len(popular) :] == [
        b.id for b in blocks if b.id not in head and count(b.id) < POPULAR_AFTER
    ]
