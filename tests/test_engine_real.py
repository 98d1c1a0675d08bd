"""Against the real vLLM CPU build (skipped where ``contextpilot-rag engine install``
has not been run): the pilot learns from the engine's usage reports what the engine
no longer holds, and the real-engine demo leaves no process behind, also on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.bench.corpus import load_mtrag
from contextpilot_rag.engines import RunningEngine, installed_engine, start_engine

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        installed_engine("vllm") is None,
        reason="vLLM CPU build not installed (run: contextpilot-rag engine install --engine vllm)",
    ),
]


@pytest.fixture(scope="module")
def vllm() -> Iterator[RunningEngine]:
    with start_engine("vllm", block_size=32, kv_cache_gib=1) as engine:
        yield engine


def _send(engine: RunningEngine, messages: object) -> dict[str, object]:
    body = {"model": engine.model_name, "messages": messages, "max_tokens": 1}
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return dict(response.json())


def _cached_share(usage: dict[str, object]) -> float:
    from contextpilot_rag.usage import parse_cache_usage

    reported = parse_cache_usage(usage)
    return reported.cached_tokens / reported.prompt_tokens


def test_the_index_learns_an_eviction_from_one_usage_report(vllm: RunningEngine) -> None:
    passages = load_mtrag().passages
    b = [ContextBlock(p.text, id=p.id) for p in passages[:6]]
    sequence = [
        (b[:4], "What do these passages say?"),
        ([b[2], b[0], b[1], b[4]], "And the first one?"),
    ]
    observed, blind = ContextPilot(), ContextPilot()  # blind: never told anything
    for blocks, question in sequence:
        prompt = observed.optimize(blocks, question)
        blind.optimize(blocks, question)
        assert observed.observe(prompt, _send(vllm, prompt.messages)) == 0  # as predicted
    assert vllm.reset_prefix_cache()  # the engine forgets everything
    third = observed.optimize([b[0], b[1], b[5]], "Anything else?")
    blind.optimize([b[0], b[1], b[5]], "Anything else?")
    assert third.stats.blocks_matched >= 2  # predicted from the first two requests ...
    assert observed.observe(third, _send(vllm, third.messages)) >= 1  # ... learnt: gone
    # the first request's four blocks again: the blind pilot still predicts all of them
    # cached; the observed one only what the engine has cached since (the third prompt)
    fourth = observed.optimize([b[3], b[2], b[1], b[0]], "Once more?")
    control = blind.optimize([b[3], b[2], b[1], b[0]], "Once more?")
    assert control.stats.blocks_matched == 4
    assert fourth.stats.blocks_matched <= 2
    predicted = fourth.stats.reusable_tokens / fourth.stats.prompt_tokens
    assert predicted <= _cached_share(_send(vllm, fourth.messages)) + 0.1


def _api_servers() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"vllm.entrypoints.openai.api_server" in cmdline:
                found.add(int(entry.name))
    return found


def test_demo_stops_its_engine_on_ctrl_c(tmp_path: Path) -> None:
    before = _api_servers()
    demo = subprocess.Popen(
        [sys.executable, "-m", "contextpilot_rag.cli", "demo", "--plot", str(tmp_path / "d.png")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_api_servers() - before):
            time.sleep(0.5)
        started = _api_servers() - before
        assert started, "the demo did not start an engine"
        time.sleep(5)
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        demo.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and started & _api_servers():
            time.sleep(0.5)
        assert not started & _api_servers()
    finally:
        if demo.poll() is None:
            demo.kill()
