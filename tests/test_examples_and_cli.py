"""The shipped examples and the command line run end to end, offline."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from contextpilot_rag.bench.commands import DEMO_PASSES
from contextpilot_rag.cli import main
from contextpilot_rag.testing.openai_server import OpenAICompatibleServer

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
    assert main(["demo", "--engine", "sim", "--requests", "40"]) == 0
    out = capsys.readouterr().out
    assert "unmodified" in out and "ours" in out
    assert "hit ratio" in out


def test_demo_rejects_a_workload_too_small_to_measure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--engine", "sim", "--requests", "3"]) == 2
    assert "at least 10" in capsys.readouterr().out


def _needs_the_langchain_path() -> None:
    """The real-engine demo and the suite's ``langchain`` workload run a LangChain chain;
    skip where it is not installed (the core's own lower-bounds run, ``make test-lowest``)."""
    pytest.importorskip("langchain_openai")
    pytest.importorskip("langchain_contextpilot")


def test_real_engine_demo_runs_against_any_openai_compatible_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``demo --endpoint``: the LangChain chain (several users at once) and the
    multi-turn conversation, each unmodified and through the pilot, against a real
    loopback HTTP engine that reports cached tokens."""
    _needs_the_langchain_path()
    png = tmp_path / "demo.png"
    monkeypatch.setenv("COLUMNS", "200")  # the table as a wide terminal shows it
    with OpenAICompatibleServer(block_size=16) as server:
        code = main(
            ["demo", "--endpoint", server.base_url, "--model", server.model, "--plot", str(png)]
        )
        sent = len(server.requests)
    out = capsys.readouterr().out
    assert code == 0
    assert "Scenario 1: 4 users at once" in out
    assert "5-turn chat" in out and "speed-up" in out
    assert "Q&A history" in out and "reorder only" in out
    warm_up = 3  # throwaway requests before the conversation's first pass
    assert sent == DEMO_PASSES * (2 * 12 + 4 * 5) + warm_up
    assert png.stat().st_size > 10_000


def test_bench_engine_suite_against_an_endpoint_writes_json_and_markdown(tmp_path: Path) -> None:
    _needs_the_langchain_path()
    report, table = tmp_path / "suite.json", tmp_path / "suite.md"
    with OpenAICompatibleServer(block_size=16) as server:
        args = ["bench", "--suite", "engine", "--endpoint", server.base_url]
        args += ["--model", server.model, "--workloads", "batch,langchain"]
        assert main([*args, "--json", str(report), "--markdown", str(table)]) == 0
    data = json.loads(report.read_text())
    names = [w["name"] for w in data["workloads"]]
    assert names == ["batch", "langchain"]
    batch = data["workloads"][0]["arms"]
    assert [arm["name"] for arm in batch] == ["unmodified", "contextpilot"]
    assert batch[1]["cached_tokens"] > batch[0]["cached_tokens"]
    assert "langchain path: cached tokens vs direct pilot" in table.read_text()


def test_endpoint_without_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--endpoint", "http://127.0.0.1:9/v1"]) == 2
    assert "--endpoint needs --model" in capsys.readouterr().out


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    import contextpilot_rag

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"contextpilot-rag {contextpilot_rag.__version__}"
