"""The several-seeds report of benchmarks/llama_server_routing.py (no engine needed:
the report is built from summaries)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def test_a_label_passes_its_options_to_the_policy_and_keeps_its_address() -> None:
    policy = bench.labelled_policy("combined+eviction_weight=1+eviction_horizon_s=20:slots")
    assert policy.config.eviction_weight == 1.0  # type: ignore[attr-defined]
    assert policy.config.eviction_horizon_s == 20.0  # type: ignore[attr-defined]
    counted = bench.labelled_policy("combined+recorded_boundaries=12")
    assert counted.config.recorded_boundaries == 12  # type: ignore[attr-defined]
    assert isinstance(counted.config.recorded_boundaries, int)  # type: ignore[attr-defined]
    assert bench.labelled_policy("combined+tail_discount=0.5").config.tail_discount == 0.5  # type: ignore[attr-defined]
    assert bench.policy_spec("combined+eviction_weight=1:slots") == ("combined", True)
    assert bench.policy_spec("round-robin") == ("round-robin", False)


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("combined+eviction_weight:slots", "is not OPTION=NUMBER"),
        ("combined+eviction_weight=high", "is not OPTION=NUMBER"),
        ("combined+=1", "is not OPTION=NUMBER"),
        ("combined+eviction_weight=-1", "eviction_weight must be >= 0"),
        ("combined+no_such_knob=1", "no_such_knob"),
        ("nonsense", "unknown routing policy"),
    ],
)
def test_a_bad_label_is_refused_before_any_engine_starts(
    label: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["llama_server_routing.py", "--policies", label])
    monkeypatch.setattr(bench, "find_llama_server", lambda root: pytest.fail("engine looked up"))
    with pytest.raises(SystemExit, match=message):
        bench.main()


def test_chat_seeds_need_one_rate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["x", "--workload", "chat", "--seeds", "0,1", "--conversation-rates", "0.03,0.06"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(bench, "find_llama_server", lambda root: pytest.fail("engine looked up"))
    with pytest.raises(SystemExit):
        bench.main()
    assert "give --conversation-rates a single value" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["chat-heavy", "llama-server-", "llama-server-Heavy", "llama-server-a b"]
)
def test_a_bad_section_name_is_refused_before_any_engine_starts(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["x", "--section", name])
    monkeypatch.setattr(bench, "find_llama_server", lambda root: pytest.fail("engine looked up"))
    with pytest.raises(SystemExit):
        bench.main()
    assert "--section" in capsys.readouterr().err


def test_the_report_goes_to_the_section_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "benchmarks.md"
    argv = ["x", "--workload", "chat", "--seeds", "0", "--conversation-rates", "0.2"]
    argv += ["--section", "llama-server-chat-seeds-heavy", "--write", str(docs)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(bench, "find_llama_server", lambda root: tmp_path / "llama-server")
    commands: list[str] = []

    def report(policies: object, engine: object, args: object, command: str) -> str:
        commands.append(command)
        return "the report"

    monkeypatch.setattr(bench, "chat_seeds_benchmark", report)
    bench.main()
    text = docs.read_text(encoding="utf-8")
    assert "<!-- BEGIN GENERATED: llama-server-chat-seeds-heavy -->" in text
    assert "the report" in text and "llama-server-chat-seeds -->" not in text
    assert "--section llama-server-chat-seeds-heavy" in commands[0]


def chat_summary(policy: str, mean_s: float, cached: int) -> bench.Summary:
    return bench.Summary(policy, 48, mean_s, mean_s, 2 * mean_s, cached, 1000 - cached)


def test_chat_seeds_compare_every_run_with_the_first_policy_of_its_repeat() -> None:
    a, b = "combined:slots", "combined+eviction_weight=1:slots"
    runs = {
        0: [
            [chat_summary(a, 10.0, 400), chat_summary(b, 8.0, 500)],  # 1.25×, +10 points
            [chat_summary(a, 6.0, 600), chat_summary(b, 7.5, 550)],  # 0.80×, −5 points
        ],
        1: [
            [chat_summary(a, 9.0, 420), chat_summary(b, 6.0, 520)],  # 1.50×
            [chat_summary(a, 9.0, 400), chat_summary(b, 4.5, 600)],  # 2.00×
        ],
    }
    text = bench.chat_seeds_markdown(
        runs, [a, b], 0.06, args(workload="chat", repeats=2), "python x"
    )
    assert f"| 0 | {a} | 8.00 (6.00–10.00) | 50.0% (40.0%–60.0%) | – |" in text
    assert f"| 0 | {b} | 7.75 (7.50–8.00) | 52.5% (50.0%–55.0%) | 1.02× (0.80×–1.25×) |" in text
    assert f"| 1 | {b} | 5.25 (4.50–6.00) | 56.0% (52.0%–60.0%) | 1.75× (1.50×–2.00×) |" in text
    assert "- runs: 8; spread: cold-fleet runs" in text
    assert (
        f"- `{b}` against `{a}` over all 4 runs: mean TTFT lower in 3, median ratio 1.38× "
        "(worst seed's median 1.02×), cached share +10.0 points" in text
    )
