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


@pytest.mark.parametrize("requests", ["10", "14"])
def test_demo_runs_at_the_documented_minimum_of_requests(
    requests: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--engine", "sim", "--requests", requests]) == 0
    assert "hit ratio" in capsys.readouterr().out


def test_demo_rejects_a_negative_seed_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--engine", "sim", "--requests", "20", "--seed", "-1"]) == 2
    assert "--seed must be >= 0" in capsys.readouterr().out


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


def test_bench_against_an_endpoint_that_does_not_answer_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"]) == 1
    assert "error: cannot reach http://127.0.0.1:9/v1" in capsys.readouterr().out


def test_bench_against_a_url_that_is_not_an_api_root_exits_1_before_sending(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with OpenAICompatibleServer() as server:
        wrong = server.base_url.removesuffix("/v1") + "/v2"
        assert main(["bench", "--endpoint", wrong, "--model", server.model]) == 1
        assert server.requests == []
    assert "HTTP 404" in capsys.readouterr().out


def test_bench_on_an_engine_that_fails_its_requests_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(messages: object) -> str:
        raise RuntimeError("the model crashed")

    with OpenAICompatibleServer(reply=broken) as server:
        args = ["bench", "--endpoint", server.base_url, "--model", server.model]
        assert main([*args, "--workloads", "online"]) == 1
    assert "error: the engine failed" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--json", "--markdown", "--plot"])
def test_bench_outputs_that_cannot_be_written_are_refused_before_the_run(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "500")  # the message on one line
    with OpenAICompatibleServer() as server:
        args = ["bench", "--endpoint", server.base_url, "--model", server.model]
        assert main([*args, flag, str(tmp_path)]) == 2  # a directory
        assert server.requests == []
    cloud = ["bench", "--suite", "cloud", "--scale", "0.05", "--provider", "openai"]
    assert main([*cloud, flag, str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "is a directory" in out and "Emulated" not in out  # the suite never started


def test_demo_plot_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    with OpenAICompatibleServer() as server:
        args = ["demo", "--endpoint", server.base_url, "--model", server.model]
        assert main([*args, "--plot", str(tmp_path)]) == 2
        assert server.requests == []


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    import contextpilot_rag

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"contextpilot-rag {contextpilot_rag.__version__}"
