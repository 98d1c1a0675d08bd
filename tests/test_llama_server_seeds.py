"""The several-seeds report of benchmarks/llama_server_routing.py (no engine needed:
the report is built from summaries)."""

from __future__ import annotations

import argparse

import llama_server_routing as bench


def summary(policy: str, mean_s: float) -> bench.Summary:
    return bench.Summary(policy, 32, mean_s, mean_s, 2 * mean_s, 100, 50)


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
    assert "| 0 | 4.50 | 3.00 | 1.50× |" in text
    assert "| 1 | 4.00 | 2.00 | 2.00× |" in text
    assert "min 1.50×, median 1.75×, max 2.00× over 2 seeds" in text
    assert text.rstrip().endswith("at least 1.5× on every seed: met.")


def test_one_seed_below_the_target_fails_it() -> None:
    text = report(
        {
            0: [summary("round-robin", 4.0), summary("combined", 2.0)],
            1: [summary("round-robin", 4.0), summary("combined", 2.9)],
        }
    )
    assert "min 1.38×" in text and text.rstrip().endswith("not met.")
