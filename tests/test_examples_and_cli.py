"""The shipped examples and the command line run end to end, offline."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from contextpilot_rag.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_example_runs_and_beats_the_unmodified_prompt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = runpy.run_path(str(EXAMPLES / "quickstart.py"))
    ratios = namespace["main"]()
    out = capsys.readouterr().out
    assert ratios["contextpilot_rag"] > ratios["unmodified"]
    assert "deduplicated ['seine', 'eiffel']" in out
    assert "Most relevant first: metro seine louvre notre" in out


def test_demo_prints_baseline_and_optimized_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--requests", "40"]) == 0
    out = capsys.readouterr().out
    assert "unmodified" in out and "ours" in out
    assert "hit ratio" in out


def test_demo_rejects_a_workload_too_small_to_measure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--requests", "3"]) == 2
    assert "at least 10" in capsys.readouterr().out
