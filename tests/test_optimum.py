"""The small-instance optimum of batch prefix sharing (contextpilot_rag.bench.optimum)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations, product

import pytest

from contextpilot_rag.batch import plan_batch
from contextpilot_rag.bench.optimum import (
    best_partner_bound,
    best_partner_shares,
    optimal_hits,
    plan_hits,
    random_instance,
    seen_before_bound,
    separation_bound,
    separation_width,
)


def brute_force_hits(requests: Sequence[Sequence[int]]) -> float:
    """Every block order of every request, and every execution order."""
    best = 0.0
    for sequences in product(*(permutations(request) for request in requests)):
        for order in permutations(range(len(requests))):
            best = max(best, plan_hits([sequences[i] for i in order]))
    return best


def ours_hits(requests: Sequence[Sequence[int]]) -> float:
    plan = plan_batch(requests)
    sequences = [
        [request[p] for p in order] for request, order in zip(requests, plan.orders, strict=True)
    ]
    return plan_hits([sequences[i] for i in plan.schedule])


TINY = [
    random_instance(seed, n_requests=4, blocks_per_request=3, vocabulary=5) for seed in range(8)
]


def test_plan_hits_counts_the_longest_prefix_shared_with_any_earlier_request() -> None:
    assert plan_hits([(1, 2, 3), (1, 2, 4), (1, 5), (1, 2, 4)]) == 2 + 1 + 3
    # a hit under the provider's minimum is no hit: the third request's one block
    assert plan_hits([(1, 2, 3), (1, 2, 4), (1, 5), (1, 2, 4)], min_hit=2) == 2 + 3


@pytest.mark.parametrize("requests", TINY)
def test_optimum_equals_brute_force_on_tiny_instances(requests: list[tuple[int, ...]]) -> None:
    assert optimal_hits(requests).hits == brute_force_hits(requests)


@pytest.mark.parametrize("requests", TINY)
def test_optimal_sequences_reach_the_optimum_and_are_permutations(
    requests: list[tuple[int, ...]],
) -> None:
    plan = optimal_hits(requests)
    assert [sorted(s) for s in plan.sequences] == [sorted(r) for r in requests]
    assert plan_hits(plan.sequences) == plan.hits


def test_weighted_optimum_prefers_sharing_the_heavy_block() -> None:
    requests = [(1, 2), (1, 3), (2, 3)]
    weights = {1: 10.0, 2: 1.0, 3: 1.0}
    plan = optimal_hits(requests, weights)
    assert plan.hits == 10.0
    assert plan_hits(plan.sequences, weights) == 10.0


@pytest.mark.parametrize("seed", range(20))
def test_ours_never_exceeds_the_optimum_nor_the_optimum_the_bound(seed: int) -> None:
    requests = random_instance(seed, n_requests=7, blocks_per_request=4, vocabulary=8)
    optimum = optimal_hits(requests).hits
    assert ours_hits(requests) <= optimum <= seen_before_bound(requests)


def test_duplicate_requests_hit_in_full() -> None:
    assert optimal_hits([(3, 1, 2), (2, 3, 1)]).hits == 3


@pytest.mark.parametrize("seed", range(30))
def test_the_best_partner_bound_holds_and_can_be_tighter_than_seen_before(seed: int) -> None:
    requests = random_instance(seed, n_requests=6, blocks_per_request=3, vocabulary=7)
    weights = {block: float(1 + (block * 7 + seed) % 5) for block in range(7)}
    optimum = optimal_hits(requests, weights).hits
    assert optimum <= best_partner_bound(requests, weights)
    # arrival order fixed: the given sequences in the given order stay within it too
    assert plan_hits(requests, weights) <= best_partner_bound(requests, weights, earlier_only=True)


def test_best_partner_bound_by_hand() -> None:
    # {1,2,3} shares 2 blocks with {1,2,4}, 1 with {3,5}; the first to run hits nothing
    requests = [(1, 2, 3), (1, 2, 4), (3, 5)]
    assert best_partner_bound(requests) == (2 + 2 + 1) - 1
    assert best_partner_bound(requests, earlier_only=True) == 0 + 2 + 1
    # four copies of one pair: every block occurs 4 times, both bounds agree on 6
    assert best_partner_bound([(1, 2)] * 4) == seen_before_bound([(1, 2)] * 4) == 6
    # three requests pairwise sharing one distinct block: seen-before allows 3, the
    # partner bound 2 (each shares one block with its best partner, the first hits
    # nothing); the optimum is 1 (two of them can start with their common block)
    triangle = [(1, 2), (2, 3), (3, 1)]
    assert seen_before_bound(triangle) == 3
    assert best_partner_bound(triangle) == 2
    assert optimal_hits(triangle).hits == 1
    assert best_partner_bound([]) == 0


def test_best_partner_shares_per_request() -> None:
    requests = [(1, 2, 3), (1, 2, 4), (3, 5)]
    assert best_partner_shares(requests).tolist() == [2, 2, 1]
    assert best_partner_shares(requests, earlier_only=True).tolist() == [0, 2, 1]
    weights = {1: 10.0, 2: 1.0, 3: 5.0, 4: 1.0, 5: 1.0}
    assert best_partner_shares(requests, weights).tolist() == [11.0, 11.0, 5.0]
    assert best_partner_shares([]).tolist() == []


def test_separation_bound_by_hand() -> None:
    # all six pairs of {1,2,3,4}: a request shares one block with four others, so the
    # partner bound allows 6 - 1 = 5 hits. At depth 0, {1,2} and {3,4} share nothing:
    # the trie has at least 2 root children; at depth 1 all six part: 2 + 6 = 8 nodes
    # of the 12 blocks sent, at most 4 hits. The optimum is 3 (only three requests hold
    # any one block, and the other three hold no common block).
    pairs = [(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)]
    assert best_partner_bound(pairs) == 5
    assert separation_bound(pairs, levels=2) == 4
    assert optimal_hits(pairs).hits == 3
    # identical requests never part: everything after the first copy hits
    assert separation_bound([(1, 2)] * 4, levels=2) == 6
    # nothing shared: nothing hits
    assert separation_bound([(1, 2), (3, 4)], levels=2) == 0
    assert separation_bound([(1, 2)], levels=2) == separation_bound([], levels=2) == 0


@pytest.mark.parametrize("seed", range(30))
def test_separation_bound_holds_with_weights_on_any_grid(seed: int) -> None:
    requests = random_instance(seed, n_requests=6, blocks_per_request=3, vocabulary=7)
    weights = {block: float(1 + (block * 7 + seed) % 5) for block in range(7)}
    optimum = optimal_hits(requests, weights).hits
    for levels in (1, 3, 7, 40):
        assert optimum <= separation_bound(requests, weights, levels=levels) + 1e-9


def test_separation_bound_is_tighter_on_a_zipf_batch() -> None:
    requests = [
        random_instance(seed, n_requests=1, blocks_per_request=6, vocabulary=60)[0]
        for seed in range(150)
    ]
    ours = ours_hits(requests)
    bound = separation_bound(requests, levels=6)
    assert ours <= bound < best_partner_bound(requests)


def test_separation_width_counts_requests_that_must_part_by_a_depth() -> None:
    pairs = [(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)]
    # below one block, only pairs sharing nothing must part: {1,2} and {3,4}
    assert separation_width(pairs, None, 0.5) == 2
    # past one block every pair has parted; requests no heavier than the depth count not
    assert separation_width(pairs, None, 1.5) == 6
    assert separation_width(pairs, None, 2.0) == 0
    # weights move the depths: block 1 weighs 3, so (1, 2) and (1, 3) stay together to 3
    weights = {1: 3.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert separation_width([(1, 2), (1, 3)], weights, 2.5) == 1
    assert separation_width([(1, 2), (1, 3)], weights, 3.0) == 2
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="depth"):
            separation_width(pairs, None, bad)


def test_separation_bound_rejects_bad_levels() -> None:
    with pytest.raises(ValueError, match="levels"):
        separation_bound([(1, 2), (1, 3)], levels=0)
    with pytest.raises(ValueError, match="min_prefix"):
        separation_bound([(1, 2), (1, 3)], min_prefix=-1.0)
