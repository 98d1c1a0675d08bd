"""The real-engine benchmark's workloads and runner, against the loopback
OpenAI-compatible server (a prefix-cache engine whose cache is the simulated model:
so the suite's sim-to-real column must agree exactly there)."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest

from contextpilot_rag.bench.corpus import load_mtrag
from contextpilot_rag.bench.engine_report import SuiteResult, _family_rows, markdown
from contextpilot_rag.bench.engine_suite import _p95, reset_cache, run_workload, simulate_family
from contextpilot_rag.bench.engine_workloads import (
    QA_HISTORY,
    REORDER_ONLY,
    SYSTEM,
    EngineWorkload,
    batch_workload,
    multiturn_workload,
    online_workload,
)
from contextpilot_rag.errors import ConfigError
from contextpilot_rag.sim.prefix_cache import PrefixCacheModel, salted_tokens
from contextpilot_rag.sim.replay import EngineTokenizer
from contextpilot_rag.testing.openai_server import OpenAICompatibleServer
from contextpilot_rag.tokenizers import default_tokenizer


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
    assert len(plain) == len(ours) == 2 * 6 * 5
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


def test_multiturn_arms_follow_their_application_patterns() -> None:
    workload = multiturn_workload(conversations=1, turns=3, max_tokens=4)
    assert workload.pairs == (("unmodified", "contextpilot"), (QA_HISTORY, REORDER_ONLY))
    sent: dict[str, list[list[dict[str, str]]]] = {}
    for arm in workload.arms:
        for i in range(len(arm)):
            sent.setdefault(arm.name, []).append([dict(m) for m in arm.messages(i)])
            arm.answered(i, f"answer {i}")
    texts = {b.id: b.text for r in workload.requests for b in r.blocks}
    repeated = {
        b.id for r in workload.requests[1:] for b in r.blocks if b in workload.requests[0].blocks
    }
    assert repeated, "the fixture conversation re-retrieves a document"
    last = workload.requests[-1]

    def count(messages: list[dict[str, str]], block_id: str) -> int:
        return sum(m["content"].count(texts[block_id]) for m in messages)

    # documents kept in the history: unmodified repeats them, the pilot sends each once
    for block_id in repeated:
        assert count(sent["unmodified"][-1], block_id) >= 2
        assert count(sent["contextpilot"][-1], block_id) == 1
    # Q&A history: only this turn's documents, in the system message, then the answers
    for name in (QA_HISTORY, REORDER_ONLY):
        messages = sent[name][-1]
        assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 2 + ["user"]
        assert messages[2]["content"] == "answer 0" and messages[-1]["content"] == last.question
        assert all(count(messages[:1], b.id) == 1 for b in last.blocks)
    assert sent[QA_HISTORY][-1][1:] == sent[REORDER_ONLY][-1][1:]


def test_multiturn_queries_carry_the_conversations_questions() -> None:
    every = multiturn_workload(conversations=1, turns=4, max_tokens=4).requests
    previous = multiturn_workload(conversations=1, turns=4, max_tokens=4, query_history=1)
    questions = [r.question for r in every]
    assert [r.query for r in every] == [" ".join(questions[: i + 1]) for i in range(4)]
    assert [r.query for r in previous.requests] == [questions[0]] + [
        f"{a} {b}" for a, b in itertools.pairwise(questions)
    ]
    alone = multiturn_workload(conversations=1, turns=4, max_tokens=4, query_history=0)
    assert [r.query for r in alone.requests] == questions


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ConfigError):
        online_workload(k=0)
    with pytest.raises(ConfigError):
        multiturn_workload(turns=40)
    with pytest.raises(ConfigError):
        multiturn_workload(query_history=-1)


def test_suite_matches_the_engine_when_the_engine_is_the_model() -> None:
    tokenizer = default_tokenizer()
    encode = EngineTokenizer(tokenizer)
    workloads = [
        online_workload(topics=1, users_per_topic=2, questions=3),
        batch_workload(groups=2, questions=3),
        multiturn_workload(conversations=2, turns=3, max_tokens=8),
    ]
    with OpenAICompatibleServer(block_size=16) as server:
        for workload in workloads:
            # this server caches prompts only, not the answers it generates
            run = run_workload(server, workload, tokenize=(encode, lambda answer: []))
            for arm in run.arms:
                assert arm.reset
                assert arm.predicted_computed == arm.computed_tokens, (workload.name, arm.name)
                assert all(s.ttft_s <= s.total_s for s in arm.sent)
            (plain_name, ours_name), *others = run.pairs
            plain, ours = run.arm(plain_name), run.arm(ours_name)
            assert ours.computed_tokens < plain.computed_tokens, workload.name
            for plain_name, ours_name in others:
                assert run.baseline_of(ours_name).name == plain_name
                assert run.arm(ours_name).computed_tokens <= run.arm(plain_name).computed_tokens
    multiturn = run.arm("contextpilot")
    assert all(s.answer for s in multiturn.sent)  # generated answers were recorded


def test_suite_without_a_tokenizer_leaves_the_prediction_out() -> None:
    with OpenAICompatibleServer() as server:
        run = run_workload(server, online_workload(topics=1, users_per_topic=1))
    assert run.arms[0].predicted_computed is None
    assert any("tokenize" in note for note in run.notes)


def test_family_first_seed_is_the_engine_runs_ratio() -> None:
    # The family simulation and an engine run of the same seed agree (the loopback
    # engine's cache is the simulated model): the table's "first seed" column is
    # what the engine run measured.
    encode = EngineTokenizer(default_tokenizer())

    def build(seed: int) -> EngineWorkload:
        return online_workload(topics=1, users_per_topic=3, questions=3, seed=seed)

    new_cache = functools.partial(PrefixCacheModel, block_size=16, capacity_tokens=None)
    family = simulate_family("online", build, [5, 6, 7], encode, new_cache=new_cache)
    assert family.seeds == (5, 6, 7) and len(family.reductions) == 3
    assert len(set(family.reductions)) > 1  # the seeds are different workloads
    with OpenAICompatibleServer(block_size=16) as server:
        run = run_workload(server, build(5), tokenize=(encode, lambda answer: []))
    plain, ours = run.arm("unmodified"), run.arm("contextpilot")
    assert family.reductions[0] == pytest.approx(plain.computed_tokens / ours.computed_tokens)
    assert family.hit_ratios[0] == pytest.approx(1 - ours.computed_tokens / ours.prompt_tokens)
    rows = _family_rows([family])
    assert rows[0][0] == "online" and rows[0][-1] == f"{family.reductions[0]:.2f}x"


def test_repeated_passes_replay_each_arms_prompts_and_report_the_median() -> None:
    encode = EngineTokenizer(default_tokenizer())
    workload = multiturn_workload(conversations=2, turns=3, max_tokens=8)
    with OpenAICompatibleServer(block_size=16) as server:
        run = run_workload(server, workload, tokenize=(encode, lambda answer: []), repeats=3)
        sent = [body["messages"] for body in server.requests]
        single = run_workload(server, online_workload(topics=1, users_per_topic=1))
    for arm in run.arms:
        assert len(arm.prefill_passes_s) == 3, arm.name
        assert arm.prefill_s == sorted(arm.prefill_passes_s)[1]
        # a replayed pass sends the first pass's token ids (answers included): the
        # first pass's prediction still matches what the engine computed
        assert arm.predicted_computed == arm.computed_tokens, arm.name
        assert arm.as_json()["prefill_passes_s"] == list(arm.prefill_passes_s)
    # warm-up, then pass 1 in the arms' order, pass 2 reversed, pass 3 in order again
    per_arm, arms = len(run.arms[0].sent), len(run.arms)
    passes = [
        sent[-3 * arms * per_arm :][i * arms * per_arm : (i + 1) * arms * per_arm] for i in range(3)
    ]
    assert len(sent) > 3 * arms * per_arm  # the warm-up requests came first
    assert passes[0] == passes[2]
    first_arm, last_arm = passes[0][:per_arm], passes[0][-per_arm:]
    assert passes[1][:per_arm] == last_arm and passes[1][-per_arm:] == first_arm
    assert single.arms[0].prefill_passes_s == ()


@pytest.mark.parametrize("repeats", [0, -1, 1.5, True])
def test_repeats_must_be_a_whole_number_of_passes(repeats: object) -> None:
    workload = online_workload(topics=1, users_per_topic=1)
    with OpenAICompatibleServer() as server, pytest.raises(ConfigError, match="repeats"):
        run_workload(server, workload, repeats=repeats)  # type: ignore[arg-type]
    assert server.requests == []  # refused before anything was sent


@pytest.mark.parametrize("command", [["bench", "--suite", "engine"], ["demo"]])
def test_without_rank_bm25_the_real_engine_runs_exit_2_before_any_engine_is_looked_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    import sys

    from contextpilot_rag import engines
    from contextpilot_rag.cli import main

    monkeypatch.setitem(sys.modules, "rank_bm25", None)  # not installed
    monkeypatch.setattr(engines, "installed_engine", lambda *a, **k: pytest.fail("looked up"))
    assert main(command) == 2
    assert "contextpilot-rag[bm25]" in " ".join(capsys.readouterr().out.split())


def test_bench_refuses_zero_repeats_before_any_engine_is_looked_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contextpilot_rag import engines
    from contextpilot_rag.cli import main

    monkeypatch.setattr(engines, "installed_engine", lambda *a, **k: pytest.fail("looked up"))
    assert main(["bench", "--suite", "engine", "--repeats", "0"]) == 2


def test_the_table_gives_the_range_of_an_arms_passes() -> None:
    from contextpilot_rag.bench.engine_report import _rows
    from contextpilot_rag.bench.engine_suite import ArmRun, Sent, WorkloadRun

    sent = (Sent(2.0, 2.5, 100, 40, "a"), Sent(3.0, 3.5, 100, 60, "b"))
    arms = (
        ArmRun("unmodified", sent, True, prefill_passes_s=(5.0, 4.0, 6.5)),
        ArmRun("contextpilot", sent, True),
    )
    rows = _rows(WorkloadRun("online", "two requests", arms))
    assert rows[0][4] == "5.0 (4.0–6.5)"
    assert rows[1][4] == "5.0"  # one pass: no range


def test_interleaved_arms_keep_their_own_caches_under_salts() -> None:
    encode = EngineTokenizer(default_tokenizer())
    workload = multiturn_workload(conversations=2, turns=3, max_tokens=8)
    with OpenAICompatibleServer(block_size=16) as server:
        run = run_workload(
            server,
            workload,
            tokenize=(encode, lambda answer: []),
            repeats=2,
            interleave=True,
        )
        bodies = server.requests
    arms = len(run.arms)
    for arm in run.arms:
        # each arm's cache behaves as if it had the engine to itself
        assert arm.predicted_computed == arm.computed_tokens, arm.name
        assert len(arm.prefill_passes_s) == 2
    salted = [body for body in bodies if "cache_salt" in body]
    assert len(salted) == 2 * arms * len(workload.requests)
    first_pass = [body["cache_salt"] for body in salted[: arms * len(workload.requests)]]
    rounds = [first_pass[i * arms : (i + 1) * arms] for i in range(len(workload.requests))]
    assert all(len(set(names)) == arms for names in rounds)  # every arm once a round
    assert rounds[0][0] != rounds[1][0]  # the arm going first rotates
    assert any("cache_salt" in note for note in run.notes)
    plain = run.arm("unmodified")
    assert run.arm("contextpilot").computed_tokens < plain.computed_tokens


def test_aspeedup_over_passes_is_the_median_of_each_passs_ratio() -> None:
    from contextpilot_rag.bench.engine_report import speedup
    from contextpilot_rag.bench.engine_suite import ArmRun, Sent

    sent = (Sent(1.0, 1.0, 100, 0, "a"),)
    plain = ArmRun("unmodified", sent, True, prefill_passes_s=(13.0, 30.0, 11.0))
    ours = ArmRun("contextpilot", sent, True, prefill_passes_s=(10.0, 20.0, 10.5))
    # each pass times both arms side by side: the median of 1.3, 1.5 and 11 / 10.5,
    # not the ratio of the arms' median passes (13 / 10.5)
    assert speedup(plain, ours) == (1.3, (1.3, 1.5, 11 / 10.5))
    single = ArmRun("unmodified", (Sent(3.0, 3.0, 100, 0, "a"),), True)
    assert speedup(single, ArmRun("contextpilot", sent, True)) == (3.0, ())


def test_interleaved_arms_that_outgrow_the_cache_are_predicted_as_they_compete() -> None:
    # Under salts the arms share one engine cache: where their blocks do not all fit,
    # they evict each other's, and the prediction (one model, the arms salted apart)
    # must follow, with a note that the arms were not measured as if alone.
    encode = EngineTokenizer(default_tokenizer())
    workload = online_workload(topics=1, users_per_topic=3, questions=3, k=4, seed=2)
    runs = {}
    for capacity in (None, 1_024):
        with OpenAICompatibleServer(block_size=16, cache_capacity_tokens=capacity) as server:
            runs[capacity] = run_workload(
                server, workload, tokenize=(encode, lambda answer: []), interleave=True
            )
    for capacity, run in runs.items():
        for arm in run.arms:
            assert arm.predicted_computed == arm.computed_tokens, (capacity, arm.name)
    roomy, tight = runs[None], runs[1_024]
    assert not any("outgrew" in note for note in roomy.notes)
    assert any("outgrew the engine's cache (1,024 tokens" in note for note in tight.notes)
    # competing for the cache cost hits (so a model per arm would have mispredicted)
    assert sum(a.computed_tokens for a in tight.arms) > sum(a.computed_tokens for a in roomy.arms)


def test_salted_prompts_share_no_block_in_one_cache_model() -> None:

    prompt = list(range(100, 164))
    assert salted_tokens(prompt, None) == prompt
    assert salted_tokens([], "a") == []
    cache = PrefixCacheModel(block_size=16, capacity_tokens=64)
    cache.admit(salted_tokens(prompt, "a"))
    assert cache.lookup(salted_tokens(prompt, "a")) == 48  # the last token is computed
    assert cache.lookup(salted_tokens(prompt, "b")) == 0
    assert cache.lookup(prompt) == 0
    assert salted_tokens(prompt, "b")[1:] == prompt[1:]  # only the first id changes
    assert cache.evicted_tokens == 0
    cache.admit(salted_tokens(prompt, "b"))  # 4 more blocks into a 4-block cache
    assert cache.evicted_tokens == 64
    assert cache.lookup(salted_tokens(prompt, "a")) == 0
    cache.reset()
    assert cache.evicted_tokens == 0


def test_the_suites_kv_cache_holds_its_arms_in_either_dtype() -> None:
    from contextpilot_rag.bench.engine_report import suite_kv_cache_gib

    def ample(dtype: str) -> int:
        return suite_kv_cache_gib(dtype, available_bytes=64 * 2**30)

    # float32 takes twice the bytes a token: twice the GiB for the same tokens
    assert ample("float32") == 2 * ample("bfloat16")
    # SmolLM2-135M: 30 layers × 2 (K, V) × 3 KV heads × 64 dims × 2 bytes in bf16;
    # the online workload's two arms hold about 200k tokens
    bf16_tokens = ample("bfloat16") * 2**30 // (30 * 2 * 3 * 64 * 2)
    assert bf16_tokens > 200_000
    assert 1 <= suite_kv_cache_gib() <= ample("float32")


def test_the_suites_kv_cache_fits_the_memory_the_engine_can_take() -> None:
    from contextpilot_rag.bench.engine_report import ENGINE_HEADROOM_GIB, suite_kv_cache_gib

    gib = 2**30
    # 12 GiB wanted in float32; a node with 9.7 GiB available (seen on a 2-core AMD
    # machine, where vLLM refused the 12) gets what is left after the engine's headroom
    assert suite_kv_cache_gib("float32", available_bytes=int(9.7 * gib)) == int(
        9.7 - ENGINE_HEADROOM_GIB
    )
    assert suite_kv_cache_gib("bfloat16", available_bytes=int(9.7 * gib)) == 6
    # never under 1 GiB (vLLM's smallest): the engine then says what is missing
    assert suite_kv_cache_gib("float32", available_bytes=gib) == 1


def test_p95_is_the_nearest_rank() -> None:
    assert _p95([float(n) for n in range(1, 31)]) == 29.0  # ceil(0.95 * 30) = 29th
    assert _p95([float(n) for n in range(1, 21)]) == 19.0
    assert _p95([float(n) for n in range(1, 61)]) == 57.0
    assert _p95([4.0]) == 4.0


class _Restarting:
    """The loopback engine presented as llama-server, whose cache reset is a restart."""

    kind = "llama-server"

    def __init__(self, server: OpenAICompatibleServer) -> None:
        self.server = server
        self.base_url, self.model_name = server.base_url, server.model_name
        self.block_size, self.kv_cache_tokens = 16, None

    def reset_prefix_cache(self) -> bool:
        return self.server.reset_prefix_cache()


def test_a_reset_that_restarts_the_engine_warms_it_up_again() -> None:
    """Each arm on llama-server starts on a fresh process: it gets the warm-up the first
    arm had, in prompts that share nothing with the arms' own."""
    workload = online_workload(topics=1, users_per_topic=1, questions=2)
    with OpenAICompatibleServer(block_size=16) as server:
        run = run_workload(_Restarting(server), workload)  # type: ignore[arg-type]
        asked = [body["messages"][0]["content"] for body in server.requests]
    warm_ups = [n for n, content in enumerate(asked) if content.startswith("warm-up")]
    per_arm = len(workload.arms[0])
    # once before the first arm, and again after each arm's reset
    assert len(warm_ups) == 3 * (1 + len(run.arms))
    assert len(asked) == len(warm_ups) + per_arm * len(run.arms)
    with OpenAICompatibleServer(block_size=16) as server:
        assert reset_cache(server) is True  # vLLM-like: a reset, no warm-up
        assert server.requests == []


def test_parts_not_run_are_named_in_the_section() -> None:
    result = SuiteResult({"model": "m", "block_size": 16, "kv_cache_tokens": 100})
    result.skipped.append("langchain: the framework is not installed")
    assert "Not run: langchain: the framework is not installed" in markdown(result)
    assert result.as_json()["skipped"] == ["langchain: the framework is not installed"]


def test_framework_arms_on_a_cache_not_reset_are_named() -> None:
    from contextpilot_rag.bench.engine_report import _not_reset
    from contextpilot_rag.bench.engine_suite import ArmRun

    arms = (ArmRun("plain", (), reset=True), ArmRun("ours", (), reset=False))
    assert _not_reset(*arms) == ("ours: the engine's cache could not be reset",)


def test_the_prediction_follows_each_engine_kinds_cache_rules() -> None:
    from types import SimpleNamespace

    from contextpilot_rag.bench.engine_suite import prediction_cache
    from contextpilot_rag.sim.slot_cache import LlamaServerCacheModel

    def engine(kind: str, *flags: str) -> Any:
        return SimpleNamespace(kind=kind, flags=flags, block_size=16, kv_cache_tokens=4096)

    vllm, note = prediction_cache(engine("vllm"))
    cache = vllm()
    assert isinstance(cache, PrefixCacheModel) and not note
    assert (cache.block_size, cache.capacity_tokens) == (16, 4096)
    llama, note = prediction_cache(engine("llama-server", "-m", "x.gguf", "-np", "1"))
    slot = llama()
    assert isinstance(slot, LlamaServerCacheModel) and "slot_cache" in note
    slot.admit(list(range(100)))
    slot.admit(list(range(1000, 1100)))
    assert slot.saved_prompts == 1  # the host-memory prompt cache is on by default
    (alone, note) = prediction_cache(engine("llama-server", "--cache-ram", "0"))
    alone_cache = alone()
    alone_cache.admit(list(range(100)))
    alone_cache.admit(list(range(1000, 1100)))
    assert isinstance(alone_cache, LlamaServerCacheModel) and alone_cache.saved_prompts == 0
    assert "--cache-ram 0" in note
    # several slots are not modelled: an unbounded prefix cache, the most they reuse
    many, note = prediction_cache(engine("llama-server", "-np", "4"))
    assert isinstance(many(), PrefixCacheModel) and "4 slots" in note
    assert many() is not many()  # a fresh model per arm
