"""The clustering batch builder (Alg. 4): valid, deterministic plans whose orders and
schedule turn shared blocks into shared prefixes."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag.batch import cluster as cluster_module
from contextpilot_rag.batch.cluster import cluster_plan
from contextpilot_rag.batch.plan import BatchPlan, check_plan
from contextpilot_rag.bench.workloads import online_workload
from contextpilot_rag.errors import ConfigError, InvalidInputError

batches = st.lists(
    st.lists(st.integers(min_value=0, max_value=30), max_size=8, unique=True), max_size=25
)


def sequences(requests: Sequence[Sequence[int]], plan: BatchPlan) -> list[list[int]]:
    """Each request's blocks in the order the plan sends them."""
    return [
        [request[p] for p in order] for request, order in zip(requests, plan.orders, strict=True)
    ]


def shared_prefix_fraction(requests: Sequence[Sequence[int]], plan: BatchPlan) -> float:
    """Block slots that repeat the previous request's prefix, in schedule order."""
    sent = sequences(requests, plan)
    shared = 0
    for before, after in zip(plan.schedule, plan.schedule[1:], strict=False):
        for a, b in zip(sent[before], sent[after], strict=False):
            if a != b:
                break
            shared += 1
    return shared / sum(len(request) for request in requests)


@settings(max_examples=60, deadline=None)
@given(batches, st.integers(min_value=1, max_value=5), st.sampled_from([0.0, 0.001, 0.5]))
def test_plans_are_valid_for_any_batch(
    requests: list[list[int]], neighbors: int, alpha: float
) -> None:
    plan = cluster_plan(requests, alpha=alpha, neighbors_per_block=neighbors)
    check_plan(plan, [len(request) for request in requests])


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from([0.0, 0.5]))
def test_merged_block_lists_give_the_distances_the_slot_grid_gives(
    requests: list[list[int]], alpha: float
) -> None:
    """Pairs with a request longer than the grid width merge their block lists (one
    very long request must not make every pair cost its width squared): the same
    shared counts and gaps, so the same plan, whichever way each pair is compared."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cluster_module, "_GRID_WIDTH", 1_000)  # every pair on the grid
        grid = cluster_plan(requests, alpha=alpha)
        patch.setattr(cluster_module, "_GRID_WIDTH", 0)  # every pair merged
        merged = cluster_plan(requests, alpha=alpha)
    assert merged == grid


@settings(max_examples=40, deadline=None)
@given(batches.filter(bool), st.data())
def test_requests_with_the_same_blocks_get_the_same_sequence(
    requests: list[list[int]], data: st.DataObject
) -> None:
    original = data.draw(st.integers(min_value=0, max_value=len(requests) - 1))
    copy = data.draw(st.permutations(requests[original]))
    plan = cluster_plan([*requests, copy])
    sent = sequences([*requests, copy], plan)
    assert sent[original] == sent[-1]


def test_same_batch_gives_same_plan() -> None:
    rng = random.Random(7)
    requests = [rng.sample(range(60), rng.randint(1, 12)) for _ in range(300)]
    assert cluster_plan(requests) == cluster_plan([list(request) for request in requests])


def test_shared_blocks_come_first_in_the_same_order_and_run_together() -> None:
    requests = [[5, 1, 2, 3], [40, 41, 42], [3, 2, 1, 6], [50, 41, 51], [1, 2, 7]]
    plan = cluster_plan(requests)
    sent = sequences(requests, plan)
    # 1, 2, 3 are shared by requests 0 and 2, and 1, 2 by request 4 as well.
    assert sent[0] == [1, 2, 3, 5]
    assert sent[2] == [1, 2, 3, 6]
    assert sent[4] == [1, 2, 7]
    assert sent[1][0] == sent[3][0] == 41
    assert plan.schedule == (0, 2, 4, 1, 3)


def test_requests_sharing_nothing_keep_blocks_by_popularity_then_code() -> None:
    requests = [[9, 4], [3, 8, 1], [7]]
    plan = cluster_plan(requests)
    check_plan(plan, [2, 3, 1])
    assert sequences(requests, plan) == [[4, 9], [1, 3, 8], [7]]


def test_single_request() -> None:
    plan = cluster_plan([[4, 9, 2]])
    assert plan == BatchPlan(orders=((2, 0, 1),), schedule=(0,))


def test_empty_batch_gives_empty_plan() -> None:
    assert cluster_plan([]) == BatchPlan((), ())


def test_empty_requests_are_planned_too() -> None:
    plan = cluster_plan([[], [3, 1], []])
    check_plan(plan, [0, 2, 0])


def popularity_sorted_plan(requests: Sequence[Sequence[int]]) -> BatchPlan:
    """The simple reference: every request's blocks by popularity (then code), requests
    sorted lexicographically by those sequences."""
    popularity = Counter(code for request in requests for code in request)
    keys = [sorted((-popularity[code], code) for code in request) for request in requests]
    orders = tuple(
        tuple(request.index(code) for _, code in key)
        for request, key in zip(requests, keys, strict=True)
    )
    return BatchPlan(orders, tuple(sorted(range(len(requests)), key=keys.__getitem__)))


def test_shares_more_prefix_than_sorting_by_popularity() -> None:
    workload = online_workload(n_docs=200, n_requests=200, k=10, seed=1)
    requests = [[int(doc[4:]) for doc in request.doc_ids] for request in workload.requests]
    clustered = shared_prefix_fraction(requests, cluster_plan(requests))
    assert clustered > shared_prefix_fraction(requests, popularity_sorted_plan(requests))


def test_every_phase_reports_its_full_total() -> None:
    totals: dict[str, int] = {}
    done: Counter[str] = Counter()

    def progress(label: str, total: int) -> Callable[[int], None]:
        totals[label] = total
        return lambda n: done.update({label: n})

    cluster_plan([[1, 2, 3], [3, 2, 4], [5, 1]], progress=progress)
    assert set(totals) == {
        "batch: cluster pairs",
        "batch: cluster distances",
        "batch: cluster merges",
        "batch: cluster orders",
    }
    assert dict(done) == totals


@pytest.mark.parametrize("requests", [[[1, -2]], [[3, 1, 3]]])
def test_negative_or_repeated_codes_are_rejected(requests: list[list[int]]) -> None:
    with pytest.raises(InvalidInputError):
        cluster_plan(requests)


@pytest.mark.parametrize(("neighbors", "alpha"), [(0, 0.001), (4, -1.0), (4, float("nan"))])
def test_bad_settings_are_rejected(neighbors: int, alpha: float) -> None:
    with pytest.raises(ConfigError):
        cluster_plan([[1]], alpha=alpha, neighbors_per_block=neighbors)
