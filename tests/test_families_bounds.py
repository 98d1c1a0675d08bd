"""The multi-turn lower bound of benchmarks/families.py, by hand."""

from __future__ import annotations

import families

from contextpilot_rag.bench.workloads import WorkloadRequest


def request(session: str, turn: int, *docs: str) -> WorkloadRequest:
    return WorkloadRequest(docs, f"{session} {turn}", session, turn)


def test_first_turns_hit_only_what_one_earlier_first_turn_shares() -> None:
    head, size = 100, 50  # tokens before the first block; tokens per block
    requests = [
        request("a", 0, "x", "y", "z"),
        request("b", 0, "x", "y", "w"),  # shares x, y with a's first turn
        request("a", 1, "w", "x", "v"),  # w was b's, not a's: computed; x is a's
        request("c", 0, "z", "w", "v"),  # one block with a, one with b, v only later
    ]
    rows = [(head, [(d, size) for d in r.doc_ids]) for r in requests]
    slack = families.PAGE_SLACK_TOKENS
    expected = [
        head + 3 * size,  # the first request computes everything
        1 * size,  # w
        2 * size,  # w and v are new to conversation a
        2 * size,  # best earlier first-turn partner shares one block (a: z, or b: w)
    ]
    assert families.computed_lower_bound(requests, rows) == sum(n - slack for n in expected)


def test_the_bound_is_never_negative_per_request() -> None:
    requests = [request("a", 0, "x"), request("b", 0, "x")]
    rows = [(40, [("x", 5)]), (40, [("x", 5)])]  # the second computes nothing: 0, not -15
    assert families.computed_lower_bound(requests, rows) == 45 - families.PAGE_SLACK_TOKENS


def outcome(index: int, ours: float, bound: float, reference: float | None) -> families.Outcome:
    draw = families.Draw(families.ONLINE, index, 0, 2000, 15, 1.0)
    return families.Outcome(draw, ours, 0.05, bound, ours / bound, reference=reference)


def test_a_target_says_whether_the_bounds_allow_it_on_the_held_out_half() -> None:
    versus, hit_ratio = families.TARGETS[4], families.TARGETS[3]
    held_out = [outcome(1, 0.40, 0.45, 0.25), outcome(3, 0.50, 0.60, 0.20)]
    tuning = [outcome(0, 0.10, 0.90, 0.01)]  # ignored: the tuning half
    cells = versus.cells([*held_out, *tuning])
    # ours / reference: 1.60x and 2.50x; the bound allows 1.80x and 3.00x at most
    assert cells[2:] == ("1.60x", "no", "1.80x", "no")
    assert hit_ratio.cells(held_out)[2:] == ("40.0%", "yes", "45.0%", "yes")
    assert families.TARGETS[2].cells(held_out)[4:] == ("-", "-")  # a time has no bound
