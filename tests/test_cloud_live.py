"""The live cloud benchmark (``bench --suite cloud --live``), driven through the official
``anthropic`` and ``openai`` SDKs against the loopback cloud emulator
(contextpilot_rag.testing.cloud_server) instead of the providers: what each response
reports is read back and billed, and matches what the in-process emulator predicts for
the same request bodies; arms and runs never read each other's cache entries; the
budget, the key and bad options are refused before anything is sent; a failing API or
a spend past the budget stops the run with a ProviderError. Offline: loopback only."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag.bench import cloud_live
from contextpilot_rag.bench.cloud_live import (
    OPENAI_MAX_TOKENS,
    LiveOptions,
    live_markdown,
    reasoning_effort,
    run_live_suite,
)
from contextpilot_rag.bench.cloud_suite import OURS
from contextpilot_rag.bench.cloud_workloads import CloudWorkload, cloud_workload
from contextpilot_rag.cli import main
from contextpilot_rag.errors import ConfigError, ProviderError
from contextpilot_rag.testing.cloud_server import CloudCacheServer

pytest.importorskip("anthropic", reason="anthropic is not installed (pip install -e '.[dev]')")
pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[dev]')")

FAST = {"time_scale": 0.001, "workers": 1, "max_usd": 20.0, "api_key": "test"}


@pytest.fixture
def server() -> Iterator[CloudCacheServer]:
    with CloudCacheServer() as emulator:  # real time: the run's send times are scaled down
        yield emulator


def _base(server: CloudCacheServer, provider: str) -> str:
    return server.anthropic_base_url if provider == "anthropic" else server.openai_base_url


def _workloads() -> list[CloudWorkload]:
    return [cloud_workload("multi-turn", 1, 0.02), cloud_workload("multi-session", 2, 0.005)]


def _system_text(body: dict[str, Any]) -> str:
    if "system" in body:
        return str(body["system"][0]["text"])
    return str(body["messages"][0]["content"])


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_measured_usage_is_read_back_and_matches_the_prediction(
    server: CloudCacheServer, provider: str
) -> None:
    workloads = _workloads()
    options = LiveOptions(provider, base_url=_base(server, provider), **FAST)
    result = run_live_suite(workloads, options)

    sent = server.requests
    arms = 3
    assert len(sent) == arms * sum(len(w.requests) for w in workloads)
    assert result.spent_usd > 0 and len(result.run_id) == 8
    for run in result.runs:
        assert [a.name for a in run.measured.arms] == [a.name for a in run.predicted.arms]
        for measured, predicted in zip(run.measured.arms, run.predicted.arms, strict=True):
            assert measured.requests == predicted.requests > 0
            assert measured.cache_read_tokens == predicted.cache_read_tokens
            assert measured.cache_write_tokens == predicted.cache_write_tokens
            assert measured.uncached_tokens == predicted.uncached_tokens
            assert measured.cost_usd == pytest.approx(predicted.cost_usd)
    talk = result.runs[0]
    assert talk.measured.ours.cache_read_tokens > 0  # the provider served the pilot's prefixes
    assert talk.measured.ratio > 1.1  # and it cost less than the cheaper common practice
    if provider == "anthropic":
        ours = [r for r in sent if f", arm {arms}]" in _system_text(r.body)]
        assert ours and max(len(r.cache_control_paths) for r in ours) >= 2
        assert all(len(r.cache_control_paths) <= 4 for r in sent)
    else:
        ours = [r for r in sent if f", arm {arms}]" in _system_text(r.body)]
        assert all(r.body.get("prompt_cache_key") for r in ours)
        # GPT-5 refuses a cap that fits no visible token: a few, at the least reasoning
        assert all(r.body["max_completion_tokens"] == OPENAI_MAX_TOKENS for r in sent)
        assert all(r.body["reasoning_effort"] == "none" for r in sent)  # gpt-5.4
    assert "measured" in live_markdown(result) and OURS in live_markdown(result)


def test_a_gpt_56_run_sends_the_plans_breakpoints_and_matches_the_prediction(
    server: CloudCacheServer,
) -> None:
    options = LiveOptions("openai", model="gpt-5.6-terra", base_url=server.openai_base_url, **FAST)
    result = run_live_suite(_workloads(), options)
    for run in result.runs:
        for measured, predicted in zip(run.measured.arms, run.predicted.arms, strict=True):
            assert measured.cache_read_tokens == predicted.cache_read_tokens
            assert measured.cache_write_tokens == predicted.cache_write_tokens
            assert measured.uncached_tokens == predicted.uncached_tokens
    talk = result.runs[0]
    assert talk.measured.arm(OURS).cache_write_tokens > 0  # gpt-5.6 reports its writes
    assert talk.measured.ratio > 1.1
    ours = [r for r in server.requests if ", arm 3]" in json.dumps(r.body["messages"][0])]
    assert ours and all(r.body["prompt_cache_options"]["mode"] == "explicit" for r in ours)
    marked = [
        part
        for r in ours
        for message in r.body["messages"]
        for part in message["content"]
        if "prompt_cache_breakpoint" in part
    ]
    assert marked


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_the_spend_counts_the_output_tokens_each_response_reports(
    server: CloudCacheServer, provider: str
) -> None:
    options = LiveOptions(provider, base_url=_base(server, provider), **{**FAST, "max_tokens": 16})
    result = run_live_suite([cloud_workload("multi-turn", 1, 0.02)], options)
    inputs = sum(arm.cost_usd for run in result.runs for arm in run.measured.arms)
    field = "output_tokens" if provider == "anthropic" else "completion_tokens"
    answered = sum(r.usage[field] for r in server.requests)
    assert answered > 0
    outputs = answered * (result.price.output or 0.0) / 1e6
    assert result.spent_usd == pytest.approx(inputs + outputs) and outputs > 0


def test_arms_and_runs_never_read_each_others_entries(server: CloudCacheServer) -> None:
    workloads = [cloud_workload("multi-turn", 1, 0.02)]
    options = LiveOptions("anthropic", base_url=server.anthropic_base_url, **FAST)
    first = run_live_suite(workloads, options)
    second = run_live_suite(workloads, options)  # same server, caches still warm

    assert first.run_id != second.run_id
    lines = {_system_text(r.body).split("\n", 1)[0] for r in server.requests}
    assert len(lines) == 2 * 3  # one line per run and arm, every system prompt salted
    # a cold emulator predicts each run: a read of another run's or arm's entries differs
    for run in (*first.runs, *second.runs):
        for measured, predicted in zip(run.measured.arms, run.predicted.arms, strict=True):
            assert measured.cache_read_tokens == predicted.cache_read_tokens


def test_a_run_that_could_cost_more_than_the_budget_sends_nothing(
    server: CloudCacheServer,
) -> None:
    options = LiveOptions(
        "anthropic", base_url=server.anthropic_base_url, **{**FAST, "max_usd": 0.01}
    )
    with pytest.raises(ConfigError, match=r"could cost up to .* over max_usd 0.01"):
        run_live_suite(_workloads(), options, scale=0.02)
    assert server.requests == []


def _at(scale: float) -> list[CloudWorkload]:
    return [cloud_workload("multi-turn", 1, scale), cloud_workload("multi-session", 2, scale / 4)]


def test_a_run_over_the_budget_names_a_scale_that_fits(server: CloudCacheServer) -> None:
    # at 1 USD the proportional guess (0.1 x budget / worst case) would still be over:
    # each workload's least size and its system prompts do not shrink with the scale
    options = LiveOptions(
        "anthropic", base_url=server.anthropic_base_url, **{**FAST, "max_usd": 1.0}
    )
    with pytest.raises(ConfigError, match=r"lower the workload scale \(--scale\) to ") as refused:
        run_live_suite(_at(0.1), options, scale=0.1, workloads_at=_at)
    assert server.requests == []
    named = float(str(refused.value).rsplit(" ", 1)[1])
    assert cloud_live.SMALLEST_SCALE <= named < 0.1
    result = run_live_suite(_at(named), options, scale=named)  # within the budget: it runs
    assert server.requests and result.spent_usd <= 1.0


def test_a_budget_below_the_smallest_run_names_the_budget_it_needs(
    server: CloudCacheServer,
) -> None:
    options = LiveOptions(
        "anthropic", base_url=server.anthropic_base_url, **{**FAST, "max_usd": 0.01}
    )
    with pytest.raises(
        ConfigError, match=r"even the smallest workloads could cost up to"
    ) as refused:
        run_live_suite(_at(0.1), options, scale=0.1, workloads_at=_at)
    assert server.requests == []
    needed = float(str(refused.value).split("up to ")[2].split(" USD")[0])
    enough = LiveOptions(
        "anthropic", base_url=server.anthropic_base_url, **{**FAST, "max_usd": needed + 0.01}
    )
    smallest = _at(cloud_live.SMALLEST_SCALE)
    assert run_live_suite(smallest, enough).spent_usd <= needed + 0.01
    with pytest.raises(ConfigError, match="could cost up to"):  # and no less will do
        run_live_suite(smallest, options)


def test_no_key_is_refused_before_anything_is_sent(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    options = LiveOptions("openai", base_url=server.openai_base_url, **{**FAST, "api_key": None})
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        run_live_suite(_workloads(), options)
    assert server.requests == []


@pytest.mark.parametrize(
    "changes",
    [
        {"provider": "gemini"},
        {"time_scale": 0},
        {"time_scale": 2.0},
        {"workers": 0},
        {"max_tokens": 0},
        {"retries": -1},
        {"max_usd": -1.0},
        {"timeout_s": float("nan")},
        {"model": "no-such-model"},
        {"base_url": ""},
    ],
)
def test_bad_options_are_config_errors(changes: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"provider": "anthropic", **FAST, **changes}
    with pytest.raises(ConfigError):
        LiveOptions(**settings)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_failing_api_stops_the_run_with_a_provider_error() -> None:
    options = LiveOptions(
        "anthropic",
        base_url=f"http://127.0.0.1:{_closed_port()}",
        **{**FAST, "timeout_s": 2.0, "retries": 0},
    )
    failed = r"seed [12], system breakpoint, request 1: Connection error"
    with pytest.raises(ProviderError, match=failed):
        run_live_suite(_workloads(), options)


class _KeyEchoingAPI(BaseHTTPRequestHandler):
    """An API (or a gateway before one) that quotes the key it was sent in its 401."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("x-api-key") or self.headers.get("Authorization")
        self.send_error(401, explain=f"key {key} is not valid")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_an_api_error_quoting_the_key_is_reported_without_it(provider: str) -> None:
    api = ThreadingHTTPServer(("127.0.0.1", 0), _KeyEchoingAPI)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        base_url = f"http://127.0.0.1:{api.server_address[1]}"
        options = LiveOptions(provider, base_url=base_url, **{**FAST, "api_key": "sk-L1veKey"})
        with pytest.raises(ProviderError, match=r"(?s)request 1: .*401.*key .*\*\*\*") as failed:
            run_live_suite(_workloads(), options)
    finally:
        api.shutdown()
        api.server_close()
    assert "sk-L1veKey" not in str(failed.value)
    assert failed.value.__cause__ is None and failed.value.__suppress_context__  # nor chained


def test_a_base_url_with_credentials_is_refused(server: CloudCacheServer) -> None:
    url = server.openai_base_url.replace("http://", "http://gateway:G4tewayPw@")
    with pytest.raises(ConfigError, match="carries credentials") as refused:
        LiveOptions("openai", base_url=url, **FAST)
    assert "G4tewayPw" not in str(refused.value) and "***@127.0.0.1" in str(refused.value)
    with pytest.raises(ConfigError, match="carries credentials or a query") as refused:
        LiveOptions("openai", base_url=server.openai_base_url + "?key=K3yInQuery", **FAST)
    assert "K3yInQuery" not in str(refused.value)


def test_the_sdks_base_url_variable_is_checked_and_reported(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --base-url: the SDK reads ``ANTHROPIC_BASE_URL``. A URL with credentials
    there is refused before anything is sent; a plain one is the run's reported URL."""
    with_password = server.anthropic_base_url.replace("http://", "http://gw:G4tewayPw@")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", with_password)
    options = LiveOptions("anthropic", **FAST)
    with pytest.raises(ConfigError, match="carries credentials") as refused:
        run_live_suite(_workloads(), options)
    assert "G4tewayPw" not in str(refused.value) and not server.requests
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_base_url)
    result = run_live_suite(_workloads(), options)
    assert result.base_url == server.anthropic_base_url.rstrip("/")
    assert server.anthropic_base_url.rstrip("/") in live_markdown(result)


def test_a_spend_past_the_budget_stops_sending(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the estimate made too small, so the budget check passes and the spend overtakes it
    monkeypatch.setattr(cloud_live, "TOKEN_MARGIN", 0.05)
    workloads = [cloud_workload("multi-turn", 1, 0.02)]
    total = 3 * len(workloads[0].requests)
    budget = {**FAST, "max_usd": 0.03}
    options = LiveOptions("anthropic", base_url=server.anthropic_base_url, **budget)
    with pytest.raises(ProviderError, match=r"passed max_usd 0\.03.*\(0\.0[3-9]\d* USD spent"):
        run_live_suite(workloads, options)
    assert 0 < len(server.requests) < total


def test_an_interrupted_run_says_what_it_spent(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # Ctrl-C while waiting for the third send time
        waits.append(seconds)
        if len(waits) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cloud_live.time, "sleep", sleep)
    workloads = [cloud_workload("multi-turn", 1, 0.02)]
    options = LiveOptions("anthropic", base_url=server.anthropic_base_url, **FAST)
    with pytest.raises(ProviderError, match=r"interrupted \(0\.\d+ USD spent before"):
        run_live_suite(workloads, options)
    assert 0 < len(server.requests) < 3 * len(workloads[0].requests)


def test_the_command_measures_on_the_given_api(
    server: CloudCacheServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    markdown = tmp_path / "live.md"
    common = ["bench", "--suite", "cloud", "--live", "--scale", "0.02"]
    code = main(
        [
            *common,
            "--provider",
            "anthropic",
            "--base-url",
            server.anthropic_base_url,
            "--time-scale",
            "0.001",
            "--workers",
            "1",
            "--max-usd",
            "20",
            "--families",
            "multi-turn",
            "--markdown",
            str(markdown),
            "--json",
            str(tmp_path / "live.json"),
            "--plot",
            str(tmp_path / "live.png"),
        ]
    )
    assert code == 0
    saved = json.loads((tmp_path / "live.json").read_text(encoding="utf-8"))
    assert saved["provider"] == "anthropic" and saved["spent_usd"] > 0
    assert [arm["name"] for arm in saved["runs"][0]["measured"]["arms"]][-1] == OURS
    assert (tmp_path / "live.png").stat().st_size > 0
    text = markdown.read_text(encoding="utf-8")
    assert "multi-turn seed 0" in text and "baseline / ours, measured" in text
    assert len(server.requests) > 0
    sent = len(server.requests)
    assert main([*common, "--provider", "both"]) == 2
    assert main(["bench", "--live", "--provider", "anthropic"]) == 2  # not the engine suite
    assert main([*common, "--provider", "openai", "--families", "chat"]) == 2
    over = ["bench", "--suite", "cloud", "--live", "--provider", "anthropic", "--max-usd", "3"]
    capsys.readouterr()
    assert (
        main(
            [
                *over,
                "--scale",
                "0.2",
                "--families",
                "multi-turn",
                "--base-url",
                server.anthropic_base_url,
            ]
        )
        == 2
    )
    assert "lower the workload scale (--scale) to 0.0" in " ".join(capsys.readouterr().out.split())
    assert len(server.requests) == sent  # refused before sending anything


@pytest.mark.parametrize(
    ("model", "effort"),
    [("gpt-5.4", "none"), ("gpt-5.6-terra", "none"), ("gpt-5", "minimal"),
     ("gpt-5-mini", "minimal"), ("o4-mini", "low"), ("gpt-4.1", None), ("gpt-4o", None)],
)  # fmt: skip
def test_openai_runs_ask_for_the_least_reasoning_each_model_takes(
    model: str, effort: str | None
) -> None:
    assert reasoning_effort(model) == effort


@pytest.mark.parametrize("max_usd", [float("inf"), float("nan")])
def test_a_budget_that_is_no_finite_number_is_refused(max_usd: float) -> None:
    with pytest.raises(ConfigError, match="max_usd"):
        LiveOptions("anthropic", max_usd=max_usd)


def test_a_conversations_next_turn_leaves_only_after_its_previous_one_is_answered(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a time scale that makes every send time due at once, with workers to spare,
    a turn still waits for the answer to the turn before it (a provider serves a cache
    entry only after the response that wrote it)."""
    spans: list[tuple[str, int, float, float]] = []
    real_sender = cloud_live._sender

    def timed_sender(options: LiveOptions, client: Any) -> Any:
        send = real_sender(options, client)

        def timed(body: dict[str, Any]) -> Any:
            started = time.monotonic()
            time.sleep(0.02)  # a slow answer: an early next turn would overlap it
            response = send(body)
            first = body["messages"][0]["content"]  # the conversation's opening turn
            opening = "".join(part["text"] for part in first) if isinstance(first, list) else first
            sender = _system_text(body).splitlines()[0] + opening
            spans.append((sender, len(body["messages"]), started, time.monotonic()))
            return response

        return timed

    monkeypatch.setattr(cloud_live, "_sender", timed_sender)
    options = LiveOptions("anthropic", base_url=server.anthropic_base_url, **{**FAST, "workers": 8})
    run_live_suite([cloud_workload("multi-turn", 1, 0.02)], options)
    by_sender: dict[str, list[tuple[int, float, float]]] = {}
    for sender, turn, started, ended in spans:
        by_sender.setdefault(sender, []).append((turn, started, ended))
    checked = 0
    for turns in by_sender.values():
        ordered = sorted(turns)
        for (_, _, ended), (_, started, _) in itertools.pairwise(ordered):
            assert started >= ended
            checked += 1
    assert checked > 0


def _flaky_sender(monkeypatch: pytest.MonkeyPatch, failures: list[BaseException]) -> list[int]:
    """Replace the run's sender by one that raises ``failures`` on the first calls (then
    sends for real); returns the list of calls made, by size of the failures left."""
    real_sender = cloud_live._sender
    calls: list[int] = []

    def flaky(options: LiveOptions, client: Any) -> Any:
        send = real_sender(options, client)

        def maybe(body: dict[str, Any]) -> Any:
            calls.append(len(failures))
            if failures:
                raise failures.pop(0)
            return send(body)

        return maybe

    monkeypatch.setattr(cloud_live, "_sender", flaky)
    return calls


def _sdk_error(kind: str) -> BaseException:
    import anthropic
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1/v1/messages")
    if kind == "timeout":
        return anthropic.APITimeoutError(request=request)
    status = {"rate": 429, "overloaded": 529, "server": 500}[kind]
    response = httpx.Response(status, headers={"retry-after": "0"}, request=request)
    error_class = anthropic.RateLimitError if status == 429 else anthropic.InternalServerError
    return error_class("refused", response=response, body=None)


def test_refusals_that_processed_nothing_are_sent_again(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _flaky_sender(monkeypatch, [_sdk_error("rate"), _sdk_error("overloaded")])
    options = LiveOptions("anthropic", base_url=server.anthropic_base_url, **FAST)
    result = run_live_suite([cloud_workload("multi-turn", 1, 0.02)], options)
    assert calls[:3] == [2, 1, 0]  # the first request, twice refused, then sent
    assert len(server.requests) == sum(r.measured.arms[0].requests for r in result.runs) * 3


@pytest.mark.parametrize("kind", ["timeout", "server"])
def test_a_failure_that_may_have_been_billed_is_not_retried_and_counts_at_its_most(
    server: CloudCacheServer, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    calls = _flaky_sender(monkeypatch, [_sdk_error(kind)])
    options = LiveOptions("anthropic", base_url=server.anthropic_base_url, **FAST)
    with pytest.raises(ProviderError, match=r"\((0\.\d*[1-9]\d*) USD spent"):
        run_live_suite([cloud_workload("multi-turn", 1, 0.02)], options)
    assert calls == [1] and not server.requests


def test_a_run_that_stops_still_reports_the_requests_every_arm_answered(
    server: CloudCacheServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 7th request fails (a server error, not retried): the first two requests of
    the workload were answered in all three arms, and the money they cost still buys
    their comparison, measured beside predicted, marked incomplete; exit status 1."""
    real_sender = cloud_live._sender
    calls: list[int] = []

    def failing_seventh(options: LiveOptions, client: Any) -> Any:
        send = real_sender(options, client)

        def maybe(body: dict[str, Any]) -> Any:
            calls.append(1)
            if len(calls) == 7:
                raise _sdk_error("server")
            return send(body)

        return maybe

    monkeypatch.setattr(cloud_live, "_sender", failing_seventh)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    out = tmp_path / "live.json"
    argv = ["bench", "--suite", "cloud", "--live", "--scale", "0.02", "--provider", "anthropic"]
    argv += ["--base-url", server.anthropic_base_url, "--time-scale", "0.001", "--workers", "1"]
    argv += ["--max-usd", "20", "--families", "multi-turn", "--json", str(out)]
    assert main(argv) == 1
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["stopped"] and "USD spent" in saved["stopped"]
    (run,) = saved["runs"]
    assert [arm["requests"] for arm in run["measured"]["arms"]] == [2, 2, 2]
    assert [arm["requests"] for arm in run["predicted"]["arms"]] == [2, 2, 2]
    measured, predicted = run["measured"]["arms"][0], run["predicted"]["arms"][0]
    assert measured["cache_write_5m_tokens"] == predicted["cache_write_5m_tokens"]  # same requests
