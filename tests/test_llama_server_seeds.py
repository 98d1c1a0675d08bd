"""The several-seeds report of benchmarks/llama_server_routing.py (no engine needed:
the report is built from summaries)."""

from __future__ import annotations

import argparse
import sys

import llama_server_routing as bench
import pytest


def summary(policy: str, mean_s: float, reuse: float | None = 1.0) -> bench.Summary:
    return bench.Summary(policy, 32, mean_s, mean_s, 2 * mean_s, 100, 50, history_reuse=reuse)


def args(**overrides: object) -> argparse.Namespace:
    values = vars(bench.parser().parse_args([])) | {"seeds": "0,1"} | overrides
    return argparse.Namespace(**values)


def report(by_seed: dict[int, list[bench.Summary]]) -> str:
    ratioed = {seed: bench.with_ratios(rows) for seed, rows in by_seed.items()}
    return bench.seeds_markdown(ratioed, ["round-robin", "combined"], args(), "python x")


def test_every_seed_gets_its_ratio_and_the_worst_seed_decides() -> None:
    text = report(
        {
            0: [summary("round-robin", 4.5), summary("combined", 3.0)],
            1: [summary("round-robin", 4.0), summary("combined", 2.0)],
        }
    )
    assert "| 0 | 4.50 | 100.0% | 3.00 | 100.0% | 1.50× |" in text
    assert "| 1 | 4.00 | 100.0% | 2.00 | 100.0% | 2.00× |" in text
    assert "min 1.50×, median 1.75×, max 2.00× over 2 seeds" in text
    assert "at least 1.5× on every seed: met." in text


def test_one_seed_below_the_target_fails_it() -> None:
    text = report(
        {
            0: [summary("round-robin", 4.0), summary("combined", 2.0)],
            1: [summary("round-robin", 4.0), summary("combined", 2.9)],
        }
    )
    assert "min 1.38×" in text and "on every seed: not met." in text


def row(user: str, turn: int, prompt: int, cached: int) -> bench.Row:
    return bench.Row("combined", user, turn, "http://x/v1", 1.0, 2.0, prompt, cached)


def test_history_reuse_is_the_share_of_each_previous_prompt_served_from_cache() -> None:
    rows = [
        row("a", 0, 1000, 0),  # first turns count for nothing
        row("a", 1, 1600, 1000),  # all of turn 0's 1,000
        row("b", 0, 800, 150),
        row("b", 1, 1500, 150),  # 150 of 800: moved to a replica without it
        row("a", 2, 2200, 1700),  # more than the previous prompt counts as all of it
    ]
    assert bench.history_reuse(rows) == (1000 + 150 + 1600) / (1000 + 800 + 1600)
    assert bench.history_reuse(rows[:1]) is None
    assert bench.summarise("combined", rows).history_reuse == bench.history_reuse(rows)


def test_the_report_gives_the_worst_seeds_history_reuse() -> None:
    text = report(
        {
            0: [summary("round-robin", 4.5, 0.6), summary("combined", 3.0, 1.0)],
            1: [summary("round-robin", 4.0, 0.5), summary("combined", 2.0, 0.98)],
        }
    )
    assert "| 1 | 4.00 | 50.0% | 2.00 | 98.0% | 2.00× |" in text
    assert "Previous prompt served from cache on later turns: min 98.0% over the seeds." in text


def test_repeated_runs_of_a_seed_give_median_ratios_with_their_range() -> None:
    runs = [
        bench.with_ratios([summary("round-robin", 4.5, 0.6), summary("combined", 3.0, 1.0)]),
        bench.with_ratios([summary("round-robin", 4.0, 0.8), summary("combined", 2.0, 0.98)]),
        bench.with_ratios([summary("round-robin", 3.0, 0.7), summary("combined", 2.5, 0.96)]),
    ]
    combined = {s.policy: s for s in bench.combine_repeats(runs)}["combined"]
    assert combined.rr_over_this == 1.5  # the median of 1.50×, 2.00× and 1.20×
    assert combined.rr_spread == (1.2, 2.0)
    assert combined.ttft_mean_s == 2.5 and combined.history_reuse == 0.98
    assert bench.combine_repeats(runs[:1]) == runs[0]  # one run: as it is
    text = bench.seeds_markdown(
        {0: bench.combine_repeats(runs)},
        ["round-robin", "combined"],
        args(repeats=3),
        "python x",
    )
    assert "| 0 | 4.00 | 70.0% | 2.50 | 98.0% | 1.50× (1.20–2.00×) |" in text
    assert "- runs: 3; spread: 3 runs per seed" in text


def test_repeats_below_one_is_refused_before_any_engine_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["llama_server_routing.py", "--seeds", "0", "--repeats", "0"])
    monkeypatch.setattr(bench, "find_llama_server", lambda root: pytest.fail("engine looked up"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
