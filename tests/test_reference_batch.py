"""The harness around the reference ``contextpilot`` batch mode: what it hands back is a
valid plan for the input, indexed by input position, and as good as the reference's own
tree makes it (shared cores first, clusters run together)."""

from __future__ import annotations

import logging
import random

import pytest

pytest.importorskip(
    "contextpilot", reason="the reference contextpilot is not installed (CI does not install it)"
)

from lib import reference_batch
from lib.reference_batch import (
    ReferenceBatchResult,
    run_reference_batch,
)

Contexts = list[list[int]]


def _random_contexts() -> Contexts:
    """30 contexts of 5 distinct codes drawn from a pool of 40."""
    rng = random.Random(7)
    return [rng.sample(range(40), 5) for _ in range(30)]


def _clustered_contexts() -> tuple[Contexts, list[int]]:
    """6 clusters of 5 contexts; a cluster's contexts share a core of 3 codes and each
    adds 2 codes of its own, shuffled. Returns the contexts, shuffled, and their
    clusters."""
    rng = random.Random(11)
    labelled: list[tuple[list[int], int]] = []
    for cluster in range(6):
        core = [100 * cluster + i for i in range(3)]
        for member in range(5):
            own = [100 * cluster + 10 + 2 * member + i for i in range(2)]
            context = core + own
            rng.shuffle(context)
            labelled.append((context, cluster))
    rng.shuffle(labelled)
    return [context for context, _ in labelled], [cluster for _, cluster in labelled]


def _run(contexts: Contexts) -> ReferenceBatchResult:
    result = run_reference_batch(contexts, timeout_s=60.0)
    assert result is not None, "the reference batch should finish on a small input"
    return result


@pytest.fixture(scope="module")
def random_result() -> ReferenceBatchResult:
    return _run(_random_contexts())


def test_every_order_is_a_permutation_of_its_context(random_result: ReferenceBatchResult) -> None:
    contexts = _random_contexts()
    assert len(random_result.orders) == len(contexts)
    for order, context in zip(random_result.orders, contexts, strict=True):
        assert sorted(order) == sorted(context)


def test_schedule_is_a_permutation_of_the_input_indices(
    random_result: ReferenceBatchResult,
) -> None:
    assert sorted(random_result.schedule) == list(range(30))


def test_timing_and_memory_are_reported(random_result: ReferenceBatchResult) -> None:
    assert 0.0 < random_result.seconds < 30.0
    assert random_result.peak_rss_mb > 1.0


def test_results_are_deterministic_across_runs(random_result: ReferenceBatchResult) -> None:
    again = _run(_random_contexts())
    assert again.orders == random_result.orders
    assert again.schedule == random_result.schedule


def test_a_cluster_shares_its_core_as_one_prefix_and_runs_together() -> None:
    contexts, clusters = _clustered_contexts()
    result = _run(contexts)
    for cluster in range(6):
        members = [i for i, label in enumerate(clusters) if label == cluster]
        heads = {result.orders[i][:3] for i in members}
        assert len(heads) == 1, f"cluster {cluster} starts with {heads}"
        assert set(heads.pop()) == set(contexts[members[0]]) & set(contexts[members[1]])
        slots = sorted(result.schedule.index(i) for i in members)
        assert slots == list(range(slots[0], slots[0] + len(members)))


def test_contexts_with_the_same_blocks_get_one_order_and_adjacent_slots() -> None:
    contexts = _random_contexts()[:10]
    contexts += [contexts[3][::-1], sorted(contexts[3])]
    result = _run(contexts)
    assert result.orders[3] == result.orders[10] == result.orders[11]
    slots = sorted(result.schedule.index(i) for i in (3, 10, 11))
    assert slots == list(range(slots[0], slots[0] + 3))


def test_codes_too_large_for_the_reference_give_the_same_plan() -> None:
    contexts, _ = _clustered_contexts()
    offset = 2**40
    shifted = _run([[code + offset for code in context] for context in contexts])
    plain = _run(contexts)
    assert shifted.schedule == plain.schedule
    assert shifted.orders == tuple(tuple(code + offset for code in order) for order in plain.orders)


def test_empty_contexts_stay_empty_and_are_scheduled() -> None:
    result = _run([[1, 2, 3], [], [2, 3, 4], []])
    assert result.orders[1] == result.orders[3] == ()
    assert sorted(result.schedule) == [0, 1, 2, 3]


def test_a_repeated_code_is_rejected() -> None:
    with pytest.raises(ValueError, match="repeats a block code"):
        run_reference_batch([[1, 2], [3, 3]])


def test_a_run_past_the_timeout_returns_none(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=reference_batch.__name__):
        assert run_reference_batch(_random_contexts(), timeout_s=0.01) is None
    assert "timed out" in caplog.text


def test_a_missing_reference_returns_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(reference_batch, "find_spec", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=reference_batch.__name__):
        assert run_reference_batch(_random_contexts()) is None
    assert "not installed" in caplog.text
