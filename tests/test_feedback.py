"""Specification of CallFeedback: which pilot prompt a framework's model call answered,
over the framework's tree of runs, and what is reported to the pilot. The framework
handlers (tests/integrations/test_*_feedback.py) map their callbacks onto it."""

from __future__ import annotations

import threading
from typing import Any, Literal

import pytest

from contextpilot_rag import ConfigError, ContextBlock, ContextPilot, PilotConfig, Prompt
from contextpilot_rag.feedback import CallFeedback, FeedbackCounts

HIT = {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 900}}
MISS = {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 0}}


class RecordingPilot(ContextPilot):
    """A real pilot that also records which request ids it was told about."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.observed: list[str] = []

    def observe_cache(self, prompt: Any, cached_tokens: int, prompt_tokens: int, **kw: Any) -> int:
        self.observed.append(str(prompt))
        return super().observe_cache(prompt, cached_tokens, prompt_tokens, **kw)


@pytest.fixture
def pilot(tokenizer: Any) -> RecordingPilot:
    return RecordingPilot(tokenizer=tokenizer)


def ask(pilot: ContextPilot, *names: str) -> Prompt:
    blocks = [ContextBlock(f"Document {n}: " + f"{n} facts. " * 40, id=n) for n in names]
    return pilot.optimize(blocks, "Q?")


def chain(feedback: CallFeedback, root: str, request_id: str) -> None:
    """A root run whose retriever child returned ``request_id``'s documents."""
    feedback.run_started(root, None)
    feedback.run_started(f"{root}/retriever", root)
    feedback.prompt_sent(f"{root}/retriever", request_id)
    feedback.run_ended(f"{root}/retriever")


def model_call(feedback: CallFeedback, run: str, parent: str | None, usage: object) -> None:
    feedback.run_started(run, parent)
    feedback.model_started(run)
    feedback.model_ended(run, usage)


def test_a_model_call_is_paired_with_the_prompt_retrieved_under_its_root(
    pilot: RecordingPilot,
) -> None:
    feedback = CallFeedback(pilot)
    prompt = ask(pilot, "a", "b")
    chain(feedback, "root", prompt.request_id)
    model_call(feedback, "root/llm", "root", HIT)
    feedback.run_ended("root")
    assert pilot.observed == [prompt.request_id]
    assert feedback.counts == FeedbackCounts(observed=1)


def test_interleaved_roots_each_get_their_own_prompt(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    first, second = ask(pilot, "a"), ask(pilot, "b")
    chain(feedback, "one", first.request_id)
    chain(feedback, "two", second.request_id)
    model_call(feedback, "two/llm", "two", HIT)
    model_call(feedback, "one/llm", "one", HIT)
    assert pilot.observed == [second.request_id, first.request_id]


def test_a_retrieval_whose_run_ended_pairs_with_a_later_call_only_when_alone(
    pilot: RecordingPilot,
) -> None:
    feedback = CallFeedback(pilot)
    first, second, third = ask(pilot, "a"), ask(pilot, "b"), ask(pilot, "c")
    chain(feedback, "retrieval-1", first.request_id)
    feedback.run_ended("retrieval-1")
    model_call(feedback, "llm-1", None, HIT)
    assert pilot.observed == [first.request_id]

    for number, prompt in ((2, second), (3, third)):
        chain(feedback, f"retrieval-{number}", prompt.request_id)
        feedback.run_ended(f"retrieval-{number}")
    model_call(feedback, "llm-2", None, HIT)  # two wait: no guess, and both are dropped
    model_call(feedback, "llm-3", None, HIT)
    assert pilot.observed == [first.request_id]
    assert feedback.counts == FeedbackCounts(observed=1, unmatched=2)


@pytest.mark.parametrize("leftovers", ["any", "standalone"])
def test_a_model_call_inside_a_tree_takes_a_leftover_unless_only_standalone_calls_may(
    pilot: RecordingPilot, leftovers: Literal["any", "standalone"]
) -> None:
    feedback = CallFeedback(pilot, leftovers=leftovers)
    leftover = ask(pilot, "a")
    chain(feedback, "retrieval", leftover.request_id)
    feedback.run_ended("retrieval")
    feedback.run_started("chat", None)  # a chain fed from elsewhere, or a condense step
    model_call(feedback, "chat/llm", "chat", HIT)
    feedback.run_ended("chat")
    if leftovers == "any":
        assert pilot.observed == [leftover.request_id]
        return
    assert pilot.observed == [] and feedback.counts == FeedbackCounts(unmatched=1)
    model_call(feedback, "llm", None, HIT)  # made on its own: the leftover is its
    assert pilot.observed == [leftover.request_id]


def test_an_unknown_leftover_rule_is_a_config_error(pilot: RecordingPilot) -> None:
    with pytest.raises(ConfigError):
        CallFeedback(pilot, leftovers="some")  # type: ignore[arg-type]


def test_a_model_call_under_only_the_models_own_runs_is_made_on_its_own(
    pilot: RecordingPilot,
) -> None:
    """LlamaIndex runs one LLM call as nested spans of the LLM's methods."""
    feedback = CallFeedback(pilot, leftovers="standalone")
    leftover = ask(pilot, "a")
    chain(feedback, "retrieval", leftover.request_id)
    feedback.run_ended("retrieval")
    feedback.run_started("llm.complete", None, of_model=True)
    model_call(feedback, "llm.complete/inner", "llm.complete", HIT)
    assert pilot.observed == [leftover.request_id]


def test_two_retrievals_under_one_root_are_ambiguous(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    chain(feedback, "root", ask(pilot, "a").request_id)
    feedback.run_started("root/other", "root")
    feedback.prompt_sent("root/other", ask(pilot, "b").request_id)
    model_call(feedback, "root/llm", "root", HIT)
    assert pilot.observed == [] and feedback.counts.unmatched == 1


def test_the_same_prompt_reported_twice_under_one_root_is_one_prompt(
    pilot: RecordingPilot,
) -> None:
    feedback = CallFeedback(pilot)
    prompt = ask(pilot, "a")
    chain(feedback, "root", prompt.request_id)
    feedback.prompt_sent("root", prompt.request_id)  # an outer retriever passing it on
    model_call(feedback, "root/llm", "root", HIT)
    assert pilot.observed == [prompt.request_id]


def test_a_prompt_is_claimed_by_one_model_call_only(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    prompt = ask(pilot, "a")
    chain(feedback, "root", prompt.request_id)
    model_call(feedback, "root/llm-1", "root", HIT)
    model_call(feedback, "root/llm-2", "root", HIT)
    assert pilot.observed == [prompt.request_id]
    assert feedback.counts == FeedbackCounts(observed=1, unmatched=1)


def test_a_model_call_inside_another_is_ignored(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    prompt = ask(pilot, "a")
    chain(feedback, "root", prompt.request_id)
    feedback.run_started("root/chat", "root")
    feedback.model_started("root/chat")
    model_call(feedback, "root/chat/complete", "root/chat", HIT)
    feedback.model_ended("root/chat", HIT)
    assert pilot.observed == [prompt.request_id]
    assert feedback.counts == FeedbackCounts(observed=1)


def test_an_answer_without_cache_information_is_counted_not_observed(
    pilot: RecordingPilot,
) -> None:
    feedback = CallFeedback(pilot)
    chain(feedback, "root", ask(pilot, "a").request_id)
    model_call(feedback, "root/llm", "root", {"prompt_tokens": 1000})
    model_call(feedback, "lone", None, None)
    assert pilot.observed == []
    assert feedback.counts == FeedbackCounts(no_usage=1, unmatched=1)


def test_a_failed_model_call_is_never_observed(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    chain(feedback, "root", ask(pilot, "a").request_id)
    feedback.run_started("root/llm", "root")
    feedback.model_started("root/llm")
    feedback.model_failed("root/llm")
    feedback.model_ended("root/llm", HIT)  # a late end of a failed run pairs with nothing
    assert pilot.observed == [] and feedback.counts.unmatched == 1


def failed_call(feedback: CallFeedback, run: str, parent: str | None) -> None:
    feedback.run_started(run, parent)
    feedback.model_started(run)
    feedback.model_failed(run)
    feedback.run_ended(run)


def test_a_failed_model_call_leaves_its_prompt_to_the_retry_under_its_root(
    pilot: RecordingPilot,
) -> None:
    feedback = CallFeedback(pilot)
    prompt = ask(pilot, "a")
    chain(feedback, "root", prompt.request_id)
    feedback.run_started("root/retry", "root")
    failed_call(feedback, "root/retry/llm-1", "root/retry")
    model_call(feedback, "root/retry/llm-2", "root/retry", HIT)
    assert pilot.observed == [prompt.request_id]
    assert feedback.counts == FeedbackCounts(observed=1)


def test_a_retry_after_a_failure_never_takes_a_stray_leftover(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    stray, prompt = ask(pilot, "a"), ask(pilot, "b")
    chain(feedback, "stray", stray.request_id)
    feedback.run_ended("stray")
    chain(feedback, "root", prompt.request_id)
    failed_call(feedback, "root/llm-1", "root")
    model_call(feedback, "root/llm-2", "root", HIT)
    assert pilot.observed == [prompt.request_id]


def test_a_prompt_a_failed_call_returned_never_leaves_its_tree(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    chain(feedback, "root", ask(pilot, "a").request_id)
    failed_call(feedback, "root/llm", "root")
    feedback.run_ended("root")  # no retry: the chain failed
    model_call(feedback, "llm", None, HIT)
    assert pilot.observed == [] and feedback.counts == FeedbackCounts(unmatched=1)


def test_observing_refused_by_the_pilot_is_counted_and_never_raised(tokenizer: Any) -> None:
    pilot = ContextPilot(PilotConfig(max_observed_prompts=0), tokenizer=tokenizer)
    feedback = CallFeedback(pilot)
    chain(feedback, "root", ask(pilot, "a").request_id)
    model_call(feedback, "root/llm", "root", HIT)
    assert feedback.counts == FeedbackCounts(failed=1)


def test_an_observed_miss_evicts_and_is_counted(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    ask(pilot, "a", "b", "c")
    second = ask(pilot, "a", "b", "d")
    chain(feedback, "root", second.request_id)
    model_call(feedback, "root/llm", "root", MISS)
    assert feedback.counts == FeedbackCounts(observed=1, evicted=1)
    assert pilot.index_stats().requests == 1


def test_runs_that_never_end_are_forgotten_oldest_first(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot, max_runs=8)
    prompt = ask(pilot, "a")
    for number in range(100):
        feedback.run_started(f"run-{number}", None)
        feedback.prompt_sent(f"run-{number}", prompt.request_id)
        feedback.run_started(f"llm-{number}", f"run-{number}")
        feedback.model_started(f"llm-{number}")
    sizes = [len(getattr(feedback, name)) for name in ("_parents", "_pending", "_calls")]
    assert max(sizes) <= 8 and len(feedback._orphans) <= 8


def test_max_runs_must_be_a_positive_int(pilot: RecordingPilot) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError):
            CallFeedback(pilot, max_runs=bad)  # type: ignore[arg-type]


def test_concurrent_chains_from_threads_are_each_paired(pilot: RecordingPilot) -> None:
    feedback = CallFeedback(pilot)
    prompts = [ask(pilot, f"doc-{n}") for n in range(32)]

    def run(number: int) -> None:
        root = f"root-{number}"
        chain(feedback, root, prompts[number].request_id)
        model_call(feedback, f"{root}/llm", root, HIT)
        feedback.run_ended(root)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(pilot.observed) == sorted(prompt.request_id for prompt in prompts)
    assert feedback.counts == FeedbackCounts(observed=32)
