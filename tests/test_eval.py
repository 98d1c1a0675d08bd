"""``contextpilot-rag eval``: the metrics, the statistics, evidence retention, the task
file, and whole runs against the loopback OpenAI-compatible engine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextpilot_rag import ContextBlock, ContextPilot, render_block
from contextpilot_rag.cli import main
from contextpilot_rag.errors import ConfigError
from contextpilot_rag.evaluation import arms as arms_module
from contextpilot_rag.evaluation.arms import ARM_NAMES, arm_spec, build_prompts
from contextpilot_rag.evaluation.client import Endpoint, complete_all
from contextpilot_rag.evaluation.metrics import (
    answerability,
    citations_valid,
    declines,
    normalize_answer,
    rouge_l,
    token_f1,
)
from contextpilot_rag.evaluation.report import MetricSummary
from contextpilot_rag.evaluation.retention import ExpectedBlock, lost_blocks
from contextpilot_rag.evaluation.stats import (
    MIN_CLUSTERS,
    MIN_RESAMPLES,
    bootstrap_mean,
    paired_difference,
    significant_drop,
    too_few_clusters,
)
from contextpilot_rag.evaluation.tasks import (
    TaskFileError,
    load_jsonl_tasks,
    mtrag_tasks,
    parse_jsonl_tasks,
)
from contextpilot_rag.testing import OpenAICompatibleServer

LEAD_IN = "Also relevant, shown in earlier turns:"
RIVERS = 12


# -- metrics -------------------------------------------------------------------------


def test_normalisation_is_squad_s() -> None:
    assert normalize_answer("The  Cat, a dog!  An owl.") == "cat dog owl"


def test_token_f1_matches_a_hand_computed_value() -> None:
    # "cat sat on mat" vs "cat is on mat": 3 common of 4 and 4 -> P = R = 0.75
    assert token_f1("The cat sat on the mat.", ["A cat is on the mat"]) == pytest.approx(0.75)


def test_token_f1_takes_the_best_reference_and_needs_one() -> None:
    assert token_f1("north to town 3", ["south", "North to town 3!"]) == 1.0
    assert token_f1("anything", []) is None
    assert token_f1("", [""]) == 1.0  # both empty after normalisation
    assert token_f1("the", ["cat"]) == 0.0


def test_rouge_l_matches_a_hand_computed_value() -> None:
    pytest.importorskip("rouge_score", reason="rouge-score (the eval extra) is not installed")
    # LCS of "the cat sat on the mat" and "the cat is on the mat" is 5 of 6 tokens
    assert rouge_l("the cat sat on the mat", ["the cat is on the mat"]) == pytest.approx(5 / 6)
    assert rouge_l("the cat sat on the mat", ["dog", "the cat sat on the mat"]) == 1.0
    assert rouge_l("x", []) is None


@pytest.mark.parametrize(
    "answer",
    [
        "The documents do not provide an answer to the question.",
        "I'm sorry, I don't have information about that.",
        "Unfortunately, I do not have information on how to do it.",
        "I don\u2019t know.",
        "There is no information about version 6 in the documents.",
    ],
)
def test_refusals_are_declines(answer: str) -> None:
    assert declines(answer)


def test_an_answer_is_not_a_decline_even_if_it_later_says_something_is_missing() -> None:
    answer = "Yes, you can visit the law library. " + "It has guides. " * 20
    assert not declines(answer + "The opening hours are not mentioned.")
    assert not declines("Yes, you can visit the law library to do legal research.")


def test_answerability_rewards_declining_only_unanswerable_tasks() -> None:
    refusal, answer = "The documents do not say.", "It flows north."
    assert answerability(refusal, answerable=False) == 1.0
    assert answerability(answer, answerable=False) == 0.0
    assert answerability(answer, answerable=True) == 1.0
    assert answerability(refusal, answerable=True) == 0.0
    assert answerability(answer, answerable=None) is None


def test_citations_are_valid_only_when_every_cited_label_is_in_the_prompt() -> None:
    assert citations_valid("North [abcde], says [fghij].", {"abcde", "fghij"}) == 1.0
    assert citations_valid("North [abcde], says [zzzzz].", {"abcde", "fghij"}) == 0.0
    assert citations_valid("North, it says.", {"abcde"}) is None


# -- statistics ----------------------------------------------------------------------


def test_the_bootstrap_interval_is_deterministic_for_a_seed_and_covers_the_mean() -> None:
    values = [0.1, 0.9, 0.4, 0.5, 0.7, 0.2, 0.8, 0.3, 0.6, 0.55]
    clusters = ["a", "a", "b", "b", "c", "d", "d", "e", "f", "f"]
    first = bootstrap_mean(values, clusters, seed=7)
    again = bootstrap_mean(values, clusters, seed=7)
    other = bootstrap_mean(values, clusters, seed=8)
    assert first == again
    assert first is not None and other is not None
    assert first != other
    assert first.low < first.mean < first.high
    assert first.mean == pytest.approx(sum(values) / len(values))
    assert first.n == len(values)
    assert bootstrap_mean([], []) is None


def _scores(rng_seed: int, n: int) -> list[float]:
    import random

    rng = random.Random(rng_seed)
    return [rng.uniform(0.4, 1.0) for _ in range(n)]


def test_the_drop_flag_triggers_on_an_arm_that_answers_worse() -> None:
    baseline = _scores(1, 40)
    worse = [score - 0.2 if i % 4 else score for i, score in enumerate(baseline)]
    clusters = [f"c{i // 2}" for i in range(40)]
    difference = paired_difference(baseline, worse, clusters)
    assert difference is not None and difference.high < 0
    assert significant_drop(difference)
    assert not significant_drop(difference, tolerance=0.5)  # smaller than the tolerance


def test_the_drop_flag_stays_down_for_an_identical_arm_and_for_noise() -> None:
    baseline = _scores(2, 40)
    clusters = [f"c{i}" for i in range(40)]
    same = paired_difference(baseline, list(baseline), clusters)
    assert same is not None and same.mean == 0.0 and not significant_drop(same)
    noisy = paired_difference(baseline, _scores(3, 40), clusters)
    assert noisy is not None and noisy.low < 0 < noisy.high
    assert not significant_drop(noisy)


@pytest.mark.parametrize("conversations", [1, 2, MIN_CLUSTERS - 1])
def test_no_drop_is_called_on_fewer_conversations_than_a_verdict_needs(
    conversations: int,
) -> None:
    """One conversation makes every resample the same (an interval of zero width around
    any difference); a few make it far too narrow. Such a run shows the difference and
    reads "few", never DROP."""
    baseline = [0.5] * 4 * conversations
    worse = [0.49 if n % 4 == 3 else 0.5 for n in range(len(baseline))]  # one turn each
    clusters = [f"c{n // 4}" for n in range(len(baseline))]
    difference = paired_difference(baseline, worse, clusters)
    assert difference is not None and difference.high < 0 and difference.clusters == conversations
    assert too_few_clusters(difference) and not significant_drop(difference)
    summary = MetricSummary("f1", bootstrap_mean(worse, clusters), difference, False)
    assert summary.flag == "few"


@pytest.mark.parametrize("resamples", [1, MIN_RESAMPLES - 1, True, 2.5])
def test_too_few_resamples_are_refused(resamples: object) -> None:
    with pytest.raises(ConfigError, match="resamples"):
        bootstrap_mean([0.1, 0.2], resamples=resamples)  # type: ignore[arg-type]


def test_a_paired_difference_uses_only_tasks_both_arms_score() -> None:
    difference = paired_difference([1.0, None, 0.5], [0.0, 1.0, None], ["a", "b", "c"])
    assert difference is not None and difference.n == 1 and difference.mean == -1.0


# -- evidence retention --------------------------------------------------------------


def _blocks(*names: str) -> list[ContextBlock]:
    return [
        ContextBlock(f"Passage {name}: the river {name} flows north.", id=name) for name in names
    ]


def _expected(blocks: Sequence[ContextBlock]) -> list[ExpectedBlock]:
    return [ExpectedBlock(b.id, b.label, render_block(b)) for b in blocks]


def test_retention_holds_for_a_pilot_prompt_and_detects_a_dropped_block() -> None:
    blocks = _blocks("doc-1", "doc-2", "doc-3")
    messages = [dict(m) for m in ContextPilot().optimize(blocks, "Where?").messages]
    assert lost_blocks(messages, _expected(blocks), LEAD_IN) == ()
    messages[-1]["content"] = messages[-1]["content"].replace(render_block(blocks[1]), "")
    assert lost_blocks(messages, _expected(blocks), LEAD_IN) == ("doc-2",)


def test_retention_detects_a_block_cut_short() -> None:
    blocks = _blocks("doc-1", "doc-2")
    messages = [dict(m) for m in ContextPilot().optimize(blocks, "Where?").messages]
    messages[-1]["content"] = messages[-1]["content"].replace("river doc-1 flows north", "river")
    assert lost_blocks(messages, _expected(blocks), LEAD_IN) == ("doc-1",)


def test_a_deduplicated_block_needs_both_the_history_and_a_note() -> None:
    pilot = ContextPilot()
    first = pilot.optimize(_blocks("doc-1", "doc-2"), "Where?", conversation_id="c")
    pilot.record_answer(first, "North.")
    blocks = _blocks("doc-1", "doc-3")
    second = pilot.optimize(blocks, "And then?", conversation_id="c")
    assert second.deduplicated_ids == {"doc-1"}
    messages = [dict(m) for m in second.messages]
    assert lost_blocks(messages, _expected(blocks), LEAD_IN) == ()
    without_note = [*messages[:-1], {**messages[-1], "content": second.messages[-1]["content"]}]
    without_note[-1]["content"] = re.sub(
        rf"^{re.escape(LEAD_IN)}.*$", "", without_note[-1]["content"], flags=re.M
    )
    assert lost_blocks(without_note, _expected(blocks), LEAD_IN) == ("doc-1",)
    without_history = [messages[0], messages[-1]]
    assert lost_blocks(without_history, _expected(blocks), LEAD_IN) == ("doc-1",)


@pytest.mark.parametrize(("contexts", "window"), [("reference", 2), ("bm25", None)])
def test_every_arm_retains_every_block_on_mtrag(contexts: str, window: int | None) -> None:
    tasks = mtrag_tasks(contexts=contexts, limit=60)
    for name in ARM_NAMES:
        prompts = build_prompts(arm_spec(name), tasks, max_history_turns=window)
        assert [p.lost for p in prompts if p.lost] == [], name
    dedup = build_prompts(arm_spec("reordered+dedup+notes"), tasks, max_history_turns=window)
    assert sum(p.deduplicated for p in dedup) > 0


@pytest.mark.parametrize("name", ARM_NAMES)
def test_a_turn_without_its_reference_before_later_turns_is_a_config_error(name: str) -> None:
    """Tasks built in Python (not through the task file's checks): a turn whose answer
    the later turns' history needs, but without a reference, is refused up front."""
    first, second = mtrag_tasks(contexts="reference", limit=2)
    assert first.conversation_id == second.conversation_id
    tasks = [replace(first, references=()), second]
    with pytest.raises(ConfigError, match="needs a reference"):
        build_prompts(arm_spec(name), tasks)
    assert len(build_prompts(arm_spec(name), [first, replace(second, references=())])) == 2


# -- tasks ---------------------------------------------------------------------------


def test_mtrag_tasks_are_every_turn_with_its_answerability() -> None:
    reference = mtrag_tasks(contexts="reference")
    assert len(reference) == 159
    assert len({t.conversation_id for t in reference}) == 20
    labels = [t.answerable for t in reference]
    assert (labels.count(True), labels.count(False), labels.count(None)) == (150, 7, 2)
    assert all(not t.documents for t in reference if t.answerable is False)
    assert all(len(t.references) == 1 for t in reference)
    retrieved = mtrag_tasks(contexts="bm25", top_k=4)
    assert all(len(t.documents) == 4 for t in retrieved)
    assert [t.question for t in retrieved] == [t.question for t in reference]
    assert mtrag_tasks(contexts="bm25", top_k=4, limit=20) == retrieved[:20]


def test_a_task_file_reports_every_invalid_line_with_its_number(tmp_path: Path) -> None:
    good = {"question": "Where?", "documents": ["The river flows north."], "reference": "north"}
    lines = [
        json.dumps(good),
        "",
        "{not json",
        json.dumps({**good, "refrence": "typo"}),
        json.dumps({**good, "documents": "one string"}),
        json.dumps({**good, "answerable": "yes"}),
        json.dumps({**good, "history": [{"role": "robot", "content": "hi"}]}),
        json.dumps(["a", "list"]),
        json.dumps({"conversation_id": "c", "turn": 1, "question": "q1", "documents": []}),
        json.dumps({"conversation_id": "c", "turn": 2, "question": "q2", "documents": []}),
    ]
    with pytest.raises(TaskFileError) as caught:
        parse_jsonl_tasks(lines, source="tasks.jsonl")
    problems = dict(caught.value.problems)
    assert sorted(problems) == [3, 4, 5, 6, 7, 8, 9]
    assert "not valid JSON" in problems[3]
    assert "refrence" in problems[4]
    assert "'documents' must be a list" in problems[5]
    assert "answerable" in problems[6]
    assert "role" in problems[7]
    assert "JSON object" in problems[8]
    assert "needs a 'reference'" in problems[9]  # turn 1 is history for turn 2
    assert "tasks.jsonl:3: not valid JSON" in str(caught.value)


def test_task_lines_end_only_at_newlines(tmp_path: Path) -> None:
    """JSON allows U+2028, U+2029 and U+0085 unescaped in a string; they end no line."""
    task = {"question": "first\u2028second?", "documents": ["doc \u0085 x\u2029"], "reference": "x"}
    path = tmp_path / "tasks.jsonl"
    line = json.dumps(task, ensure_ascii=False)
    path.write_bytes((line + "\r\n" + line.replace('", "doc', '",\r"doc') + "\r\n").encode())
    tasks = load_jsonl_tasks(path)
    assert [t.question for t in tasks] == ["first\u2028second?"] * 2
    assert tasks[1].task_id == "line-2"


def test_an_unparseable_number_or_nesting_is_an_invalid_line() -> None:
    lines = ['{"question": "q", "documents": [], "turn": ' + "1" * 5000 + "}", "[" * 100_000]
    with pytest.raises(TaskFileError) as caught:
        parse_jsonl_tasks(lines, source="tasks.jsonl")
    problems = dict(caught.value.problems)
    assert "digits" in problems[1] and "nested too deeply" in problems[2]


def test_lone_surrogates_in_history_or_reference_are_invalid_lines(
    tmp_path: Path, server: OpenAICompatibleServer, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"question": "q", "documents": ["a"]}
    lines = [
        json.dumps({**good, "history": [{"role": "user", "content": "\ud800"}]}),
        json.dumps({**good, "reference": "\ud800 x"}),
        json.dumps({**good, "reference": ["ok", "x \udfff"]}),
        json.dumps({**good, "conversation_id": "c", "reference": "\ud800"}),
        json.dumps({**good, "conversation_id": "c", "question": "q2"}),
    ]
    path, out = tmp_path / "tasks.jsonl", tmp_path / "results.json"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["eval", "--tasks", str(path), "--endpoint", server.base_url, "--model", "m"]
    assert main([*argv, "--out", str(out)]) == 2
    text = capsys.readouterr().out
    assert "tasks.jsonl:1: history[0].content holds a character" in text
    assert "tasks.jsonl:2: 'reference' holds" in text
    assert "tasks.jsonl:3: reference[1] holds" in text
    assert "tasks.jsonl:4: 'reference' holds" in text
    assert server.requests == [] and not out.exists()


def test_a_task_file_replays_conversations_in_turn_order() -> None:
    lines = [
        json.dumps({"conversation_id": "c", "turn": 2, "question": "q2", "documents": []}),
        json.dumps({"question": "alone", "documents": [{"id": "d", "text": "Text."}]}),
        json.dumps(
            {"conversation_id": "c", "turn": 1, "question": "q1", "documents": [], "reference": "a"}
        ),
    ]
    tasks = parse_jsonl_tasks(lines)
    assert [t.task_id for t in tasks] == ["c#1", "c#2", "line-2"]
    assert tasks[2].documents[0].id == "d"


def test_the_task_file_example_in_the_docs_is_valid() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "eval.md").read_text("utf-8")
    example = re.search(r"```json\n(.*?)```", text, re.S)
    assert example is not None
    tasks = parse_jsonl_tasks(example.group(1).splitlines())
    assert [t.task_id for t in tasks] == ["line-1", "c1#1", "c1#2", "line-4"]


def test_one_document_id_names_one_text_in_a_task_file() -> None:
    lines = [
        json.dumps({"question": "q", "documents": [{"id": "d", "text": "One."}]}),
        json.dumps({"question": "q", "documents": [{"id": "d", "text": "Two."}]}),
    ]
    with pytest.raises(TaskFileError, match=r"<tasks>:2: document id 'd' has another text"):
        parse_jsonl_tasks(lines)


# -- the HTTP client -----------------------------------------------------------------


def _chat(text: str | None) -> dict[str, Any]:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }


def test_transient_failures_are_retried_and_client_errors_are_final() -> None:
    calls: list[str] = []

    def respond(request: httpx.Request) -> httpx.Response:
        question = json.loads(request.content)["messages"][-1]["content"]
        calls.append(question)
        if question == "flaky" and calls.count("flaky") < 3:
            return httpx.Response(503, text="busy")
        if question == "too long":
            return httpx.Response(400, text="context length exceeded")
        if question in ("thinks", "blank"):  # a reasoning model out of max_tokens
            return httpx.Response(200, json=_chat(None if question == "thinks" else " \n"))
        return httpx.Response(200, json=_chat(f"re: {question}"))

    endpoint = Endpoint("http://engine.test/v1", "m")
    questions = ("flaky", "too long", "fine", "thinks", "blank")
    requests = [[{"role": "user", "content": q}] for q in questions]
    done = complete_all(endpoint, requests, backoff_s=0.0, transport=httpx.MockTransport(respond))
    assert [d.text for d in done] == ["re: flaky", None, "re: fine", None, None]
    assert [d.attempts for d in done] == [3, 1, 1, 1, 1]
    assert done[1].error is not None and "400" in done[1].error
    assert all("no answer text" in str(d.error) for d in done[3:])  # scored as nothing
    assert done[0].prompt_tokens == 10


# -- whole runs ----------------------------------------------------------------------


def _river_tasks(path: Path) -> Path:
    """Conversations of two turns; turn 2 asks again about turn 1's first document."""
    lines = []
    for n in range(RIVERS):
        fact = {"id": f"r{n}", "text": f"The river {n} flows north to town {n}."}
        other = {"id": f"o{n}", "text": f"The hill {n} is green in spring."}
        third = {"id": f"t{n}", "text": f"The road {n} is paved with stone."}
        common = {"conversation_id": f"c{n}", "answerable": True}
        lines.append(
            {**common, "turn": 1, "question": f"Where does river {n} flow?",
             "documents": [fact, other], "reference": f"north to town {n}"}
        )  # fmt: skip
        lines.append(
            {**common, "turn": 2, "question": f"And river {n} again?",
             "documents": [third, fact], "reference": f"north to town {n}"}
        )  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


def _reads_only_this_turn(messages: list[dict[str, Any]]) -> str:
    """A model that reads only the last message: it finds the river's document there,
    or gives up (as a model would when the document is only in the history)."""
    last = str(messages[-1]["content"])
    river = re.search(r"river (\d+)", last.splitlines()[-1])
    if river:
        for line in last.splitlines():
            if line.startswith(f"The river {river.group(1)} flows"):
                return line
    return "I don't know."


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(reply=lambda messages: "The passages answer it.") as running:
        yield running


def test_eval_on_mtrag_writes_results_plot_and_a_generated_section(
    tmp_path: Path, server: OpenAICompatibleServer, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("rouge_score", reason="rouge-score (the eval extra) is not installed")
    out, png, doc = tmp_path / "results.json", tmp_path / "eval.png", tmp_path / "eval.md"
    doc.write_text("# Eval\n\nprose kept\n", encoding="utf-8")
    argv = ["eval", "--tasks", "mtrag", "--endpoint", server.base_url, "--model", "m"]
    argv += ["--limit", "6", "--max-tokens", "16", "--out", str(out), "--plot", str(png)]
    assert main([*argv, "--write", str(doc)]) == 0
    assert len(server.requests) == 6 * 4
    assert {r["max_tokens"] for r in server.requests} == {16}
    results = json.loads(out.read_text(encoding="utf-8"))
    assert list(results["arms"]) == list(ARM_NAMES[:4])
    assert all(arm["retention"]["all_retained"] for arm in results["arms"].values())
    assert len(results["tasks"]) == 6
    later = results["tasks"][1]["arms"]["unmodified"]
    assert later["answer"] == "The passages answer it." and later["scores"]["f1"] is not None
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Eval\n\nprose kept\n")
    assert "<!-- BEGIN GENERATED: eval-mtrag -->" in text
    assert "- command: `contextpilot-rag eval --tasks mtrag" in text
    assert "| reordered+dedup+notes | token F1 |" in text
    if png.exists():
        assert png.stat().st_size > 5_000
    assert "evidence retention" in capsys.readouterr().out


def test_later_turns_carry_the_earlier_turns_in_every_arm(
    tmp_path: Path, server: OpenAICompatibleServer
) -> None:
    tasks = _river_tasks(tmp_path / "rivers.jsonl")
    argv = ["eval", "--tasks", str(tasks), "--endpoint", server.base_url, "--model", "m"]
    assert main([*argv, "--limit", "2", "--concurrency", "1"]) == 0
    turn_two = [r["messages"] for r in server.requests if len(r["messages"]) > 2]
    assert len(turn_two) == 4  # one per arm
    for messages in turn_two:
        assert messages[1]["role"] == "user" and messages[2]["content"] == "north to town 0"


def test_a_drop_is_flagged_for_the_worse_arm_only_and_exits_4(tmp_path: Path) -> None:
    pytest.importorskip("rouge_score", reason="rouge-score (the eval extra) is not installed")
    tasks, out = _river_tasks(tmp_path / "rivers.jsonl"), tmp_path / "results.json"
    with OpenAICompatibleServer(reply=_reads_only_this_turn) as engine:
        argv = ["eval", "--tasks", str(tasks), "--endpoint", engine.base_url, "--model", "m"]
        assert main([*argv, "--out", str(out)]) == 4
    arms = json.loads(out.read_text(encoding="utf-8"))["arms"]
    for name in ("reordered", "reordered+notes"):  # the same answers as unmodified
        f1 = arms[name]["metrics"]["f1"]
        assert f1["difference_vs_unmodified"]["mean"] == 0.0 and not f1["significant_drop"]
    dedup = arms["reordered+dedup+notes"]
    assert dedup["metrics"]["f1"]["significant_drop"]
    assert dedup["deduplicated_blocks"] == RIVERS
    assert dedup["retention"]["all_retained"]  # the block is in the history, with a note


def test_a_lost_block_fails_the_run_with_exit_3(
    tmp_path: Path, server: OpenAICompatibleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def loses_the_first_block(messages: Any, expected: Any, lead_in: str) -> tuple[str, ...]:
        return tuple(block.block_id for block in expected)[:1]

    monkeypatch.setattr(arms_module, "lost_blocks", loses_the_first_block)
    tasks, out = _river_tasks(tmp_path / "rivers.jsonl"), tmp_path / "results.json"
    argv = ["eval", "--tasks", str(tasks), "--endpoint", server.base_url, "--model", "m"]
    assert main([*argv, "--limit", "2", "--arms", "reordered", "--out", str(out)]) == 3
    retention = json.loads(out.read_text(encoding="utf-8"))["arms"]["reordered"]["retention"]
    assert not retention["all_retained"]
    assert retention["lost"][0] == {"task_id": "c0#1", "block_id": "r0"}


def test_an_invalid_task_file_is_a_usage_error_naming_the_line(
    tmp_path: Path, server: OpenAICompatibleServer, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "documents": []}\n{"question": 3}\n', encoding="utf-8")
    endpoint = ["--endpoint", server.base_url, "--model", "m"]
    assert main(["eval", "--tasks", str(path), *endpoint]) == 2
    assert "bad.jsonl:2: 'question' must be a non-empty string" in capsys.readouterr().out
    rivers = str(_river_tasks(tmp_path / "rivers.jsonl"))
    assert main(["eval", "--tasks", rivers, *endpoint, "--contexts", "bm25"]) == 2
    assert "a task file has its own" in capsys.readouterr().out
    assert server.requests == []


def test_an_unreachable_endpoint_exits_6(tmp_path: Path) -> None:
    argv = ["eval", "--tasks", "mtrag", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"]
    assert main([*argv, "--limit", "1"]) == 6


@pytest.mark.parametrize("where", ["--out", "--plot", "--write"])
def test_an_output_that_cannot_be_written_is_refused_before_any_request(
    tmp_path: Path, server: OpenAICompatibleServer, where: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    argv = ["eval", "--tasks", "mtrag", "--endpoint", server.base_url, "--model", "m"]
    assert main([*argv, "--limit", "1", where, str(tmp_path)]) == 2  # a directory
    assert main([*argv, "--limit", "1", where, str(blocker / "x")]) == 2  # under a file
    assert server.requests == []


def test_a_bad_section_name_is_refused_before_any_request(
    tmp_path: Path, server: OpenAICompatibleServer
) -> None:
    argv = ["eval", "--tasks", "mtrag", "--endpoint", server.base_url, "--model", "m"]
    argv += ["--limit", "1", "--write", str(tmp_path / "eval.md"), "--section", "two words"]
    assert main(argv) == 2
    assert server.requests == []


@pytest.mark.parametrize("timeout", ["nan", "inf", "0"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_a_usage_error(
    server: OpenAICompatibleServer, timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "--tasks", "mtrag", "--endpoint", server.base_url, "--model", "m"]
    assert main([*argv, "--limit", "1", "--timeout-s", timeout]) == 2
    assert "timeout_s must be a finite number > 0" in capsys.readouterr().out
    assert server.requests == []


def test_the_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = capsys.readouterr().out
    for code in ("0", "2", "3", "4", "5", "6"):
        assert re.search(rf"^\s+{code}\s+\w", help_text, re.M), code
