"""The real-engine benchmark's workloads and runner, against the loopback
OpenAI-compatible server (a prefix-cache engine whose cache is the simulated model:
so the suite's sim-to-real column must agree exactly there)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from contextpilot_rag.bench.corpus import load_mtrag
from contextpilot_rag.bench.engine_suite import run_workload
from contextpilot_rag.bench.engine_workloads import (
    SYSTEM,
    batch_workload,
    multiturn_workload,
    online_workload,
)
from contextpilot_rag.errors import ConfigError
from contextpilot_rag.sim.replay import EngineTokenizer
from contextpilot_rag.testing.openai_server import OpenAICompatibleServer
from contextpilot_rag.tokenizers import default_tokenizer


@dataclass
class _Target:
    server: OpenAICompatibleServer
    block_size: int | None = 16
    kv_cache_tokens: int | None = None

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def model_name(self) -> str:
        return self.server.model

    def reset_prefix_cache(self) -> bool:
        self.server.cache.reset()
        return True


def test_bundled_corpus_is_the_mtrag_subset() -> None:
    corpus = load_mtrag()
    assert len(corpus.passages) == 350
    assert len(corpus.conversations) == 20
    assert all(5 <= len(c.turns) <= 12 for c in corpus.conversations)
    turn = corpus.conversations[0].turns[0]
    assert turn.question and turn.answer
    assert all(corpus.passage(i).text for i in turn.context_ids)
    assert "Apache-2.0" in corpus.attribution


def test_workloads_are_deterministic_and_share_their_requests() -> None:
    first, again = online_workload(seed=3), online_workload(seed=3)
    for arm, same in zip(first.arms, again.arms, strict=True):
        assert [arm.messages(i) for i in range(len(arm))] == [
            same.messages(i) for i in range(len(same))
        ]
    other = online_workload(seed=4)
    assert other.arm("unmodified").messages(0) != first.arm("unmodified").messages(0)
    plain, ours = first.arm("unmodified"), first.arm("contextpilot")
    assert len(plain) == len(ours) == 2 * 3 * 4
    assert plain.messages(0)[0]["content"].startswith(SYSTEM)
    assert ours.messages(0)[0]["content"] == SYSTEM


def test_batch_arm_is_a_permutation_of_the_same_questions() -> None:
    workload = batch_workload(groups=3, questions=3, seed=1)
    plain, ours = workload.arm("unmodified"), workload.arm("contextpilot")

    def question(messages: object) -> str:
        last = list(messages)[-1]["content"]  # type: ignore[call-overload]
        return str(last).rsplit("\n", 1)[-1].removeprefix("Question: ")

    asked = sorted(question(plain.messages(i)) for i in range(len(plain)))
    assert sorted(question(ours.messages(i)) for i in range(len(ours))) == asked


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ConfigError):
        online_workload(k=0)
    with pytest.raises(ConfigError):
        multiturn_workload(turns=40)


def test_suite_matches_the_engine_when_the_engine_is_the_model() -> None:
    tokenizer = default_tokenizer()
    encode = EngineTokenizer(tokenizer)
    workloads = [
        online_workload(topics=1, users_per_topic=2, questions=3),
        batch_workload(groups=2, questions=3),
        multiturn_workload(conversations=2, turns=3, max_tokens=8),
    ]
    with OpenAICompatibleServer(block_size=16) as server:
        target = _Target(server)
        for workload in workloads:
            # this server caches prompts only, not the answers it generates
            run = run_workload(target, workload, tokenize=(encode, lambda answer: []))
            for arm in run.arms:
                assert arm.reset
                assert arm.predicted_computed == arm.computed_tokens, (workload.name, arm.name)
                assert all(s.ttft_s <= s.total_s for s in arm.sent)
            ours, plain = run.arm("contextpilot"), run.arm("unmodified")
            assert ours.cached_tokens > plain.cached_tokens, workload.name
    multiturn = run.arm("contextpilot")
    assert all(s.answer for s in multiturn.sent)  # generated answers were recorded


def test_suite_without_a_tokenizer_leaves_the_prediction_out() -> None:
    with OpenAICompatibleServer() as server:
        run = run_workload(_Target(server), online_workload(topics=1, users_per_topic=1))
    assert run.arms[0].predicted_computed is None
    assert any("tokenize" in note for note in run.notes)
