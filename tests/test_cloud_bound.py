"""The least input cost any strategy could pay (``bench.cloud_bound``): by hand on a
tiny workload, and never above what a real arm of the benchmark pays."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contextpilot_rag.bench.cloud_bound import (
    least_chat_append_cost,
    least_chat_append_costs,
    least_input_cost,
    required_units,
)
from contextpilot_rag.bench.cloud_report import checks, markdown
from contextpilot_rag.bench.cloud_suite import CloudSuiteResult, run_cloud_workload
from contextpilot_rag.bench.cloud_workloads import CloudWorkload, TimedRequest, cloud_workload
from contextpilot_rag.bench.workloads import WorkloadRequest
from contextpilot_rag.cloud import ModelPrice
from contextpilot_rag.sim.replay import synthetic_answer

SYSTEM, DOC_A, DOC_B = "S" * 10, "A" * 100, "B" * 50
SIZES = {SYSTEM: 10, DOC_A: 100, DOC_B: 50, "q0": 5, "q1": 5, "q2": 5}  # answers: 0


def _tiny() -> CloudWorkload:
    """c1 asks twice (its second turn retrieves A again, and B); c2 once, with A and B."""
    turns = [
        (WorkloadRequest(("a",), "q0", "c1", 0), "c1"),
        (WorkloadRequest(("a", "b"), "q1", "c2", 0), "c2"),
        (WorkloadRequest(("b", "a"), "q2", "c1", 1), "c1"),
    ]
    requests = tuple(TimedRequest(r, float(i), user) for i, (r, user) in enumerate(turns))
    return CloudWorkload(
        "multi-turn", 0, "tiny", {"a": DOC_A, "b": DOC_B}, requests, system_prompt=SYSTEM
    )


def test_each_request_carries_its_conversation_so_far_once() -> None:
    first = WorkloadRequest(("a",), "q0", "c1", 0)
    assert required_units(_tiny()) == [
        (SYSTEM, DOC_A, "q0"),
        (SYSTEM, DOC_A, DOC_B, "q1"),
        (SYSTEM, DOC_A, "q0", synthetic_answer(first), DOC_B, "q2"),
    ]


@pytest.mark.parametrize(
    ("bound", "write", "expected"),
    [
        # per request: r0 pays 115; r1 165 less its savings shared with r0 (S, A at
        # 0.9 - 0.25/2 each) = 79.75; r2 170 less the best partner r1 (S, A, B at 0.65)
        # = 52.25; the per-text bound (243.75) is lower
        (least_input_cost, 1.25, 247.0),
        # no write premium: r0 115, r1 165 - 0.9 * 110, r2 170 - 0.9 * 160
        (least_input_cost, None, 207.0),
        # chat-append: c1 (two turns): S, A, q0 written then read once (1.35 each), B
        # and q2 first carried at its second turn, paid (1.0): 210.25; c2 (one turn)
        # pays 165 less what its first turn shares with c1's before the question (S, A)
        # read instead of paid (0.9 each, as c2 does not go on): 375.25 - 99
        (least_chat_append_cost, 1.25, 276.25),
        # no write premium: c1 11 + 110 + 5.5 + 50 + 5, c2 165 - 99
        (least_chat_append_cost, None, 247.5),
    ],
    ids=["any-premium", "any-no-premium", "chat-premium", "chat-no-premium"],
)
def test_the_bounds_by_hand(
    bound: Callable[..., float], write: float | None, expected: float
) -> None:
    price = ModelPrice("anthropic", "m", input=1.0, cache_read=0.1, cache_write_5m=write)
    least = bound(_tiny(), price, lambda text: SIZES.get(text, 0))
    assert least * 1e6 == pytest.approx(expected)
    assert least >= least_input_cost(_tiny(), price, lambda text: SIZES.get(text, 0))


def test_no_arm_pays_less_than_the_bounds() -> None:
    """Every arm sends chat-append prompts (history first, then the new message)."""
    for family, scale in (("multi-turn", 0.04), ("multi-session", 0.02)):
        for run in run_cloud_workload(cloud_workload(family, 1, scale=scale)):
            assert 0 < run.least_cost_usd <= run.least_chat_cost_usd
            assert run.least_chat_cost_usd <= run.least_chat_own_cost_usd
            assert all(arm.cost_usd >= run.least_chat_cost_usd for arm in run.arms)
            assert run.bound >= run.chat_bound >= run.ratio


def test_the_report_says_whether_each_target_is_within_the_bound() -> None:
    runs = tuple(run_cloud_workload(cloud_workload("multi-turn", 2, scale=0.04)))
    result = CloudSuiteResult(runs, {"multi-turn": (2,)}, {}, 0.04)
    for check in checks(result):
        reachable = min(check.chat_bounds) >= 1.6
        assert check.within_bound == ("yes" if reachable else "no")
    text = markdown(result)
    assert "within the chat-append bound" in text and "ours of chat-append bound" in text


def test_a_first_turn_reads_nothing_below_the_minimum_prefix() -> None:
    price = ModelPrice("anthropic", "m", input=1.0, cache_read=0.1, cache_write_5m=1.25)
    count = lambda text: SIZES.get(text, 0)  # noqa: E731
    # c2's first turn shares S and A (110 tokens) with c1's: below a 200-token minimum
    # it reads nothing and pays its 165 tokens like the rest of the chat-append cost
    least = least_chat_append_cost(_tiny(), price, count, min_prefix_tokens=200)
    assert least * 1e6 == pytest.approx(276.25 + 99)
    # the same as reading nothing across conversations at all
    _, own = least_chat_append_costs(_tiny(), price, count)
    assert own == pytest.approx(least)
    assert least_chat_append_cost(_tiny(), price, count, min_prefix_tokens=110) * 1e6 == (
        pytest.approx(276.25)
    )


def test_first_turns_together_read_no_more_than_their_trie_allows() -> None:
    # six one-turn conversations, each on one pair of four 100-token documents: each
    # shares a document with an earlier one (500 tokens by best partners), but their
    # trie has at least 2 + 6 nodes of the 12 documents sent, so at most 400 are read
    pairs = ["12", "13", "14", "23", "24", "34"]
    texts = {name: name * 50 for name in "1234"}
    requests = tuple(
        TimedRequest(WorkloadRequest(tuple(pair), f"q{i}", f"c{i}", 0), float(i), f"c{i}")
        for i, pair in enumerate(pairs)
    )
    workload = CloudWorkload("multi-session", 0, "pairs", texts, requests, system_prompt="")
    sizes = {text: 100 for text in texts.values()}
    price = ModelPrice("anthropic", "m", input=1.0, cache_read=0.1, cache_write_5m=1.25)
    least = least_chat_append_cost(workload, price, lambda text: sizes.get(text, 0))
    assert least * 1e6 == pytest.approx(1200 - 400 * 0.9)  # best partners alone: 1200 - 450
