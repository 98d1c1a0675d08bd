"""The LlamaIndex path of the real-engine benchmark (``bench.llamaindex_path``) against
the loopback OpenAI-compatible engine: a query engine streaming through ``OpenAILike``,
plain and with the ContextPilot postprocessor and event handler."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.llms.openai_like")
pytest.importorskip("llama_index.postprocessor.contextpilot")

from contextpilot_rag import ContextPilot, PilotConfig
from contextpilot_rag.bench.engine_workloads import SYSTEM, online_workload
from contextpilot_rag.bench.llamaindex_path import (
    llamaindex_available,
    run_llamaindex_arm,
)
from contextpilot_rag.testing import OpenAICompatibleServer


def test_the_llamaindex_path_sends_one_call_per_query_and_the_pilot_learns_from_each() -> None:
    assert llamaindex_available()
    requests = online_workload(topics=1, users_per_topic=3, questions=3, k=4, seed=1).requests
    arms = {}
    for name, pilot in (
        ("plain", None),
        ("ours", ContextPilot(PilotConfig(system_prompt=SYSTEM))),
    ):
        with OpenAICompatibleServer(block_size=16) as server:
            arms[name] = run_llamaindex_arm(name, server, requests, pilot=pilot)
            bodies = list(server.requests)
        assert len(bodies) == len(requests)  # one LLM call a query: all passages at once
        for request, body in zip(requests, bodies, strict=True):
            system, user = body["messages"]
            assert system == {"role": "system", "content": SYSTEM}
            words = " ".join(user["content"].split())  # LlamaIndex normalises line ends
            assert all(" ".join(block.text.split())[:80] in words for block in request.blocks)
            assert user["content"].endswith(request.question)
            assert body["stream"] is True and body["max_tokens"] == 1
    (plain, no_handler), (ours, handler) = arms["plain"], arms["ours"]
    assert no_handler is None
    assert handler.counts.observed == len(requests)  # every usage report reached the pilot
    assert all(s.prompt_tokens > 0 and s.answer for s in (*plain.sent, *ours.sent))
    assert all(s.ttft_s <= s.total_s for s in ours.sent)
    # the same passages, reordered to share cached prefixes
    assert ours.cached_tokens > plain.cached_tokens


def test_the_suite_reports_the_llamaindex_path_beside_its_plain_arm() -> None:
    from contextpilot_rag.bench.engine_report import markdown, rich_tables, run_suite

    with OpenAICompatibleServer(block_size=16) as server:
        result = run_suite(
            server,
            ["llamaindex"],
            sizes={"online": {"topics": 1, "users_per_topic": 2, "questions": 2, "k": 3}},
            family_seeds=0,
        )
    (run,) = result.runs
    assert [arm.name for arm in run.arms] == [
        "llamaindex, unmodified",
        "llamaindex + contextpilot",
    ]
    assert run.notes == ("event handler observed 4 of 4 engine usage reports",)
    text = markdown(result)
    assert "**llamaindex** — 1 topics × 2 users × 2 questions" in text
    assert "**Targets**" not in text  # no target covers this path: no empty table
    assert [table.title for table in rich_tables(result)][-1] != "targets (issue 20)"


def test_a_context_window_that_splits_the_passages_is_refused() -> None:
    from contextpilot_rag.errors import ConfigError

    requests = online_workload(topics=1, users_per_topic=1, questions=1, k=4).requests
    # a window below the prompt: LlamaIndex fits the passages into several calls
    with (
        OpenAICompatibleServer(block_size=16) as server,
        pytest.raises(ConfigError, match=r"one LLM call per query, saw [2-9]"),
    ):
        run_llamaindex_arm("plain", server, requests, pilot=None, context_window=1_200)
