"""Specification of the context index: eq. 1 distance, prefix search, insert, evict, bounds."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from contextpilot_rag import (
    ConfigError,
    ContextIndex,
    DuplicateRequestError,
    IndexConfig,
    InvalidInputError,
    RequestId,
)
from contextpilot_rag.index import context_distance

if TYPE_CHECKING:
    from conftest import FakeClock

UNBOUNDED = IndexConfig(capacity_tokens=None, max_nodes=None)


def insert(index: ContextIndex, path: Sequence[str], request_id: str, tokens: int = 1) -> None:
    index.insert(path, [tokens] * len(path), RequestId(request_id))


def unbounded() -> ContextIndex:
    return ContextIndex(UNBOUNDED)


# -- eq. 1 ----------------------------------------------------------------------------


def test_identical_sequences_are_at_distance_zero() -> None:
    assert context_distance(["a", "b", "c"], ["a", "b", "c"]) == 0.0


def test_disjoint_sequences_are_at_distance_one() -> None:
    assert context_distance(["a", "b"], ["c", "d"]) == 1.0


def test_an_empty_sequence_is_at_distance_one() -> None:
    assert context_distance([], ["a"]) == 1.0


def test_partial_overlap_counts_shared_blocks_over_the_longer_sequence() -> None:
    # Shared {a, b} at the same positions: 1 - 2/4, no position term.
    assert context_distance(["a", "b", "c", "d"], ["a", "b"]) == pytest.approx(0.5)


def test_position_term_adds_alpha_times_the_mean_position_gap() -> None:
    # Shared {x, y}; gaps |0-1| and |1-0| average 1; 1 - 2/3 + 0.1 * 1.
    distance = context_distance(["x", "y", "z"], ["y", "x"], alpha=0.1)
    assert distance == pytest.approx(1 - 2 / 3 + 0.1)


def test_distance_is_symmetric() -> None:
    a, b = ["a", "b", "c", "d"], ["d", "b", "e"]
    assert context_distance(a, b) == pytest.approx(context_distance(b, a))


# -- search ---------------------------------------------------------------------------


def test_empty_index_matches_nothing() -> None:
    match = unbounded().search(["a", "b"])
    assert match.blocks == () and match.tokens == 0


def test_search_matches_the_indexed_prefix_in_any_request_order() -> None:
    index = unbounded()
    insert(index, ["a", "b", "c", "t1"], "r1", tokens=3)
    match = index.search(["c", "x", "a", "b"])
    assert match.blocks == ("a", "b", "c")
    assert match.tokens == 9


def test_search_stops_at_the_first_block_the_request_lacks() -> None:
    index = unbounded()
    insert(index, ["a", "b", "c"], "r1")
    assert index.search(["a", "c"]).blocks == ("a",)


def test_search_prefers_the_branch_with_more_matched_tokens() -> None:
    index = unbounded()
    index.insert(["a", "b", "t1"], [1, 1, 1], RequestId("r1"))
    index.insert(["a", "c", "d", "t2"], [1, 1, 1, 1], RequestId("r2"))
    index.insert(["a", "e", "t3"], [1, 5, 1], RequestId("r3"))
    assert index.search(["a", "b", "c", "d", "e"]).blocks == ("a", "e")


def test_search_reports_the_tokens_of_the_matched_blocks() -> None:
    index = unbounded()
    index.insert(["a", "b", "c"], [4, 5, 6], RequestId("r1"))
    assert index.search(["b", "a"]).tokens == 9


def test_search_follows_the_fixed_prefix_in_order_first() -> None:
    index = unbounded()
    insert(index, ["sys", "hist", "a", "b", "t1"], "r1")
    match = index.search(["b", "a"], fixed_prefix=["sys", "hist"])
    assert match.blocks == ("sys", "hist", "a", "b")


def test_a_different_fixed_prefix_matches_nothing() -> None:
    index = unbounded()
    insert(index, ["sys-1", "a", "b"], "r1")
    assert index.search(["a", "b"], fixed_prefix=["sys-2"]).blocks == ()


def test_a_partially_matched_fixed_prefix_stops_the_search() -> None:
    index = unbounded()
    insert(index, ["sys", "h1", "a"], "r1")
    match = index.search(["a"], fixed_prefix=["sys", "h2"])
    assert match.blocks == ("sys",)


def test_fixed_prefix_blocks_are_not_matched_again() -> None:
    index = unbounded()
    insert(index, ["sys", "a", "a2"], "r1")
    insert(index, ["sys", "a", "b"], "r2")
    assert index.search(["a", "b"], fixed_prefix=["sys", "a"]).blocks == ("sys", "a", "b")


def test_search_distance_is_zero_for_a_request_equal_to_an_indexed_path() -> None:
    index = unbounded()
    insert(index, ["a", "b", "c"], "r1")
    assert index.search(["a", "b", "c"]).distance == pytest.approx(0.0)


def test_search_distance_is_one_when_nothing_matches() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "r1")
    assert index.search(["x", "y"]).distance == 1.0


def test_search_changes_nothing() -> None:
    index = unbounded()
    insert(index, ["a", "b", "c"], "r1")
    insert(index, ["a", "d"], "r2")

    def snapshot() -> tuple[object, ...]:
        paths = [index.request_path(RequestId(r)) for r in ("r1", "r2")]
        return (index.stats(), paths, index.search(["a", "b", "d"]))

    before = snapshot()
    index.search(["a", "b", "d"])
    index.search(["a"], fixed_prefix=["a"])
    assert snapshot() == before


def test_search_does_not_count_as_use_for_lru() -> None:
    index = ContextIndex(IndexConfig(capacity_tokens=5, max_nodes=None))
    insert(index, ["a1", "a2"], "old")
    insert(index, ["b1", "b2"], "newer")
    index.search(["a1", "a2"])
    insert(index, ["c1", "c2"], "newest")
    assert RequestId("old") not in index and RequestId("newer") in index


def test_search_finds_the_match_among_ten_thousand_unrelated_contexts() -> None:
    index = unbounded()
    for i in range(10_000):
        insert(index, [f"u{i}", f"v{i}"], f"noise-{i}")
    insert(index, ["a", "b", "c"], "wanted")
    assert index.search(["c", "a", "b", "zz"]).blocks == ("a", "b", "c")


class CountingId(str):
    """A block id that counts how often the index hashes or compares it."""

    touches = 0

    def __hash__(self) -> int:
        CountingId.touches += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        CountingId.touches += 1
        return str.__eq__(self, other)


def test_search_never_inspects_unrelated_contexts() -> None:
    index = unbounded()
    for i in range(2_000):
        insert(index, [CountingId(f"u{i}"), CountingId(f"v{i}")], f"noise-{i}")
    insert(index, ["a", "b"], "wanted")
    CountingId.touches = 0
    match = index.search(["b", "a", "c"])
    assert match.blocks == ("a", "b")
    assert CountingId.touches == 0


# -- insert ---------------------------------------------------------------------------


def test_inserting_a_path_adds_one_node_with_its_tokens() -> None:
    index = unbounded()
    index.insert(["a", "b", "c"], [1, 2, 3], RequestId("r1"))
    stats = index.stats()
    assert (stats.nodes, stats.tokens, stats.requests) == (1, 6, 1)


def test_diverging_paths_split_the_shared_edge() -> None:
    index = unbounded()
    index.insert(["a", "b", "c"], [1, 2, 3], RequestId("r1"))
    index.insert(["a", "b", "d"], [1, 2, 4], RequestId("r2"))
    stats = index.stats()
    assert (stats.nodes, stats.tokens) == (3, 1 + 2 + 3 + 4)
    assert index.request_path(RequestId("r1")) == ("a", "b", "c")
    assert index.request_path(RequestId("r2")) == ("a", "b", "d")


def test_a_path_ending_inside_an_edge_splits_it() -> None:
    index = unbounded()
    insert(index, ["a", "b", "c"], "r1")
    insert(index, ["a", "b"], "r2")
    assert index.stats().nodes == 2
    assert index.request_path(RequestId("r2")) == ("a", "b")


def test_repeating_a_path_adds_no_nodes_or_tokens() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "r1")
    insert(index, ["a", "b"], "r2")
    assert (index.stats().nodes, index.stats().tokens, index.stats().requests) == (1, 2, 2)


def test_request_ids_are_kept_in_the_index() -> None:
    index = unbounded()
    insert(index, ["a"], "r1")
    assert RequestId("r1") in index
    assert RequestId("r2") not in index


def test_duplicate_request_id_is_rejected() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "r1")
    with pytest.raises(DuplicateRequestError):
        insert(index, ["c", "d"], "r1")


def test_duplicate_request_id_changes_nothing() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "r1")
    before = index.stats()
    with pytest.raises(DuplicateRequestError):
        insert(index, ["a", "c"], "r1")
    assert index.stats() == before
    assert index.request_path(RequestId("r1")) == ("a", "b")
    assert index.search(["a", "c"]).blocks == ("a",)


@pytest.mark.parametrize(
    ("path", "tokens", "request_id"),
    [([], [], "r1"), (["a", "b"], [1], "r1"), (["a"], [1], ""), (["a"], [1], 7)],
)
def test_malformed_insert_is_rejected(path: list[str], tokens: list[int], request_id: str) -> None:
    index = unbounded()
    with pytest.raises(InvalidInputError):
        index.insert(path, tokens, request_id)  # type: ignore[arg-type]
    assert index.stats().requests == 0


# -- evict by request id --------------------------------------------------------------


def test_evicting_the_only_request_empties_the_index() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "r1")
    assert index.evict([RequestId("r1")]) == 1
    stats = index.stats()
    assert (stats.nodes, stats.tokens, stats.requests) == (0, 0, 0)


def test_evicting_prunes_the_branch_but_keeps_the_shared_prefix() -> None:
    index = unbounded()
    insert(index, ["a", "b", "c"], "r1")
    insert(index, ["a", "b", "d", "e"], "r2")
    index.evict([RequestId("r2")])
    assert (index.stats().nodes, index.stats().tokens) == (2, 3)
    assert index.search(["a", "b", "c", "d", "e"]).blocks == ("a", "b", "c")


def test_a_prefix_stays_while_another_request_ends_on_it() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "short")
    insert(index, ["a", "b", "c"], "long")
    index.evict([RequestId("long")])
    assert index.stats().tokens == 2
    assert index.search(["a", "b", "c"]).blocks == ("a", "b")


def test_evicting_unknown_ids_is_ignored() -> None:
    index = unbounded()
    insert(index, ["a"], "r1")
    assert index.evict([RequestId("nope"), RequestId("r1"), RequestId("r1")]) == 1
    assert index.stats().requests == 0


def test_evict_rejects_a_bare_string() -> None:
    index = unbounded()
    insert(index, ["a"], "abc")
    with pytest.raises(InvalidInputError):
        index.evict("abc")  # type: ignore[arg-type]
    assert RequestId("abc") in index


def test_an_evicted_request_id_can_be_reused() -> None:
    index = unbounded()
    insert(index, ["a"], "r1")
    index.evict([RequestId("r1")])
    insert(index, ["b"], "r1")
    assert index.request_path(RequestId("r1")) == ("b",)


# -- capacity, node and TTL bounds ----------------------------------------------------


def test_tokens_never_exceed_capacity_over_a_long_random_stream() -> None:
    rng = random.Random(7)
    universe = [f"b{i}" for i in range(40)]
    cost = {block: rng.randint(1, 9) for block in universe}
    index = ContextIndex(IndexConfig(capacity_tokens=120, max_nodes=None))
    for number in range(2_000):
        path = rng.sample(universe, rng.randint(1, 8))
        index.insert(path, [cost[b] for b in path], RequestId(f"r{number}"))
        assert index.stats().tokens <= 120
    assert index.stats().evicted_nodes > 0


def test_lru_evicts_the_stale_prefix_and_keeps_the_reused_one() -> None:
    index = ContextIndex(IndexConfig(capacity_tokens=8, max_nodes=None))
    insert(index, ["a1", "a2", "a3"], "old-a")
    insert(index, ["b1", "b2", "b3"], "old-b")
    insert(index, ["a1", "a2", "a3"], "reuse-a")
    insert(index, ["c1", "c2", "c3"], "new-c")
    assert RequestId("old-b") not in index
    assert all(RequestId(r) in index for r in ("old-a", "reuse-a", "new-c"))
    assert index.search(["a1", "a2", "a3"]).blocks == ("a1", "a2", "a3")
    assert index.search(["b1", "b2", "b3"]).blocks == ()


def test_lru_eviction_removes_leaves_before_their_prefix() -> None:
    index = ContextIndex(IndexConfig(capacity_tokens=4, max_nodes=None))
    insert(index, ["a", "b", "c"], "r1")
    insert(index, ["a", "b", "d"], "r2")
    insert(index, ["x"], "r3")
    assert RequestId("r1") not in index
    assert index.search(["a", "b", "d"]).blocks == ("a", "b", "d")


def test_node_count_never_exceeds_max_nodes() -> None:
    index = ContextIndex(IndexConfig(capacity_tokens=None, max_nodes=4))
    for number in range(20):
        insert(index, [f"x{number}", f"y{number}"], f"r{number}")
        assert index.stats().nodes <= 4
    assert RequestId("r19") in index and RequestId("r0") not in index


def test_ttl_drops_entries_idle_longer_than_the_ttl(clock: FakeClock) -> None:
    index = ContextIndex(IndexConfig(ttl_s=10.0), clock=clock)
    insert(index, ["a", "b"], "idle")
    clock.advance(6)
    insert(index, ["c"], "recent")
    clock.advance(6)
    insert(index, ["d"], "trigger")
    assert RequestId("idle") not in index
    assert RequestId("recent") in index
    assert index.search(["a", "b"]).blocks == ()


def test_ttl_is_measured_from_the_last_use(clock: FakeClock) -> None:
    index = ContextIndex(IndexConfig(ttl_s=10.0), clock=clock)
    insert(index, ["a", "b"], "first")
    clock.advance(8)
    insert(index, ["a", "b"], "reuse")
    clock.advance(8)
    insert(index, ["z"], "trigger")
    assert index.search(["a", "b"]).blocks == ("a", "b")


def test_a_search_skips_paths_idle_past_the_ttl_before_any_insert_drops_them(
    clock: FakeClock,
) -> None:
    index = ContextIndex(IndexConfig(ttl_s=10.0), clock=clock)
    insert(index, ["a", "b", "c"], "old")
    insert(index, ["a", "x"], "branch")  # a split: "a" above two children
    clock.advance(4)
    insert(index, ["a", "b", "d"], "fresh")  # touches "a" and "b", not "c"
    clock.advance(7)  # "old" and "branch" idle 11 s, "fresh" 7 s
    assert index.search(["c", "b", "a"]).blocks == ("a", "b")  # not through "c"
    assert index.search(["x", "a"]).blocks == ("a",)
    clock.advance(4)  # everything idle past the ttl
    assert index.search(["a", "b", "d"]).blocks == ()
    assert index.search(["a"], fixed_prefix=["a"]).blocks == ("a",)  # the fixed prefix stays
    assert RequestId("old") in index  # searching dropped nothing; the next insert does
    insert(index, ["z"], "trigger")
    assert RequestId("old") not in index


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_tokens": 0},
        {"max_nodes": -1},
        {"capacity_tokens": 1.5},
        {"ttl_s": 0},
        {"alpha": 1.0},
        {"search_budget": 0},
        {"capacity_tokens": True},
        {"search_budget": "5"},
        {"search_budget": 2.5},
        {"ttl_s": "10"},
        {"ttl_s": float("inf")},
        {"alpha": float("nan")},
    ],
)
def test_index_config_rejects_out_of_range_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        IndexConfig(**kwargs)  # type: ignore[arg-type]


def test_the_lru_queue_stays_bounded_when_the_engine_evicts_everything() -> None:
    """Memory stays bounded by the live tree, not by the requests ever seen, also when
    no configured bound ever forces an LRU eviction (engine feedback, no capacity)."""
    index = unbounded()
    for n in range(6000):
        insert(index, [f"a{n}", f"b{n}"], f"r{n}")
        index.search(["a0"])  # touches re-queue a leaf too
        index.evict([RequestId(f"r{n}")])
    assert index.stats().nodes == 0
    assert len(index._leaf_heap) <= 1024 + 4  # the amortised compaction's slack


def test_the_lru_queue_stays_bounded_under_repeated_hits() -> None:
    index = unbounded()
    insert(index, ["a", "b"], "kept")
    for n in range(6000):
        insert(index, ["a", "b"], f"again{n}")
        index.evict([RequestId(f"again{n}")])
    assert index.stats().requests == 1
    assert len(index._leaf_heap) <= 4 * index.stats().nodes + 1024 + 1
