"""Specification of the ContextPilot facade and the Prompt it returns."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from contextpilot_rag import (
    BlockConflictError,
    ConfigError,
    ContextBlock,
    ContextPilot,
    ContextPilotError,
    ConversationStateError,
    EmptyContextError,
    IndexConfig,
    InvalidBlockError,
    InvalidInputError,
    OversizeBlockError,
    PilotConfig,
    Tokenizer,
    UnknownConversationError,
    render_block,
)
from contextpilot_rag.cloud import CloudCacheConfig
from contextpilot_rag.pilot import _TextCache


def doc(name: str) -> ContextBlock:
    return ContextBlock(f"Document {name} says that fact {name} holds.", id=name)


A, B, C, D, X = (doc(name) for name in "abcdx")


def ids(blocks: tuple[ContextBlock, ...]) -> list[str]:
    return [block.id for block in blocks]


def common_prefix_length(first: str, second: str) -> int:
    """How many leading characters the two texts share."""
    for position, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return position
    return min(len(first), len(second))


# -- messages -------------------------------------------------------------------------


def test_messages_are_system_then_user_in_openai_format(pilot: ContextPilot) -> None:
    prompt = pilot.optimize([A, B], "What holds?")
    assert [m["role"] for m in prompt.messages] == ["system", "user"]
    assert all(set(m) == {"role", "content"} for m in prompt.messages)
    assert all(isinstance(m["content"], str) for m in prompt.messages)


def test_user_message_holds_header_blocks_and_question(pilot: ContextPilot) -> None:
    content = pilot.optimize([A, B], "What holds?").messages[-1]["content"]
    assert content == "Context documents:\n\n" + render_block(A) + render_block(B) + (
        "Question: What holds?"
    )


def test_system_argument_replaces_the_default_system_prompt(pilot: ContextPilot) -> None:
    prompt = pilot.optimize([A], "q", system="Answer in French.")
    assert prompt.messages[0] == {"role": "system", "content": "Answer in French."}


def test_no_system_message_when_none_is_configured(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(system_prompt=None), tokenizer=tokenizer)
    assert [m["role"] for m in pilot.optimize([A], "q").messages] == ["user"]


def test_system_into_user_opens_the_first_user_message_with_the_system_prompt(
    tokenizer: Tokenizer,
) -> None:
    folded = ContextPilot(PilotConfig(system_into_user=True), tokenizer=tokenizer)
    plain = ContextPilot(tokenizer=tokenizer)
    prompt, unfolded = (p.optimize([A, B], "q", system="Be brief.") for p in (folded, plain))
    assert [m["role"] for m in prompt.messages] == ["user"]
    assert prompt.messages[0]["content"] == "Be brief.\n\n" + unfolded.messages[1]["content"]
    assert prompt.text == unfolded.text  # the same bytes, one message fewer
    for boundary in prompt.boundaries:  # block positions count the folded head
        content = prompt.messages[boundary.message_index]["content"]
        block = A if boundary.block_id == "a" else B
        assert content[boundary.char_start : boundary.char_end] == render_block(block)
    head_tokens = tokenizer.count("Be brief.\n\n") + tokenizer.count("Context documents:\n\n")
    assert prompt.boundaries[0].token_start == head_tokens


def test_system_into_user_folds_once_and_keeps_the_history_byte_stable(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(PilotConfig(system_into_user=True), tokenizer=tokenizer)
    turns = []
    for turn, blocks in enumerate(([A], [B], [C], [D])):
        turns.append(pilot.optimize(blocks, f"q{turn}", conversation_id="conv"))
        pilot.record_answer("conv", f"answer {turn}")
    system = PilotConfig().system_prompt
    assert system is not None
    for earlier, later in itertools.pairwise(turns):
        sent = earlier.messages
        assert later.messages[: len(sent)] == sent  # every turn extends the last one
    last = turns[-1].messages
    assert [m["role"] for m in last] == ["user", "assistant"] * 3 + ["user"]
    assert sum(m["content"].count(system) for m in last) == 1
    assert last[0]["content"].startswith(system + "\n\n")


def test_system_into_user_opens_the_first_turn_a_history_window_shows(
    tokenizer: Tokenizer,
) -> None:
    config = PilotConfig(system_into_user=True, max_history_turns=1, system_prompt="S.")
    pilot = ContextPilot(config, tokenizer=tokenizer)
    for turn, blocks in enumerate(([A], [B], [C])):
        prompt = pilot.optimize(blocks, f"q{turn}", conversation_id="conv")
        pilot.record_answer("conv", f"answer {turn}")
    contents = [m["content"] for m in prompt.messages]
    assert contents[0].startswith("S.\n\nContext documents:") and "q1" in contents[0]
    assert not any(content.startswith("S.") for content in contents[1:])


def test_system_into_user_and_a_prompt_without_system_fold_nothing(
    tokenizer: Tokenizer,
) -> None:
    config = PilotConfig(system_into_user=True, system_prompt=None)
    prompt = ContextPilot(config, tokenizer=tokenizer).optimize([A], "q")
    unfolded = ContextPilot(PilotConfig(system_prompt=None), tokenizer=tokenizer).optimize([A], "q")
    assert prompt.messages == unfolded.messages


def test_custom_question_template_and_header(tokenizer: Tokenizer) -> None:
    config = PilotConfig(context_header="DOCS\n", question_template="Q: {query}?")
    content = ContextPilot(config, tokenizer=tokenizer).optimize([A], "why").messages[-1]
    assert content["content"] == "DOCS\n" + render_block(A) + "Q: why?"


def test_query_braces_are_kept_verbatim(pilot: ContextPilot) -> None:
    content = pilot.optimize([A], "what is {x}?").messages[-1]["content"]
    assert content.endswith("Question: what is {x}?")


def test_text_joins_message_contents(pilot: ContextPilot) -> None:
    prompt = pilot.optimize([A], "q")
    assert prompt.text == prompt.messages[0]["content"] + "\n\n" + prompt.messages[1]["content"]


def test_to_openai_returns_mutable_copies(pilot: ContextPilot) -> None:
    prompt = pilot.optimize([A], "q")
    messages = prompt.to_openai()
    messages[-1]["content"] = "tampered"
    messages.append({"role": "assistant", "content": "extra"})
    assert prompt.messages[-1]["content"].endswith("Question: q")
    assert len(prompt.to_openai()) == 2


# -- blocks and boundaries ------------------------------------------------------------


def test_blocks_are_the_final_order_and_original_blocks_the_input(pilot: ContextPilot) -> None:
    pilot.optimize([A, B, C], "first")
    prompt = pilot.optimize([C, X, A, B], "second")
    assert ids(prompt.blocks) == ["a", "b", "c", "x"]
    assert ids(prompt.original_blocks) == ["c", "x", "a", "b"]


def test_exact_repeats_within_a_call_are_sent_once(pilot: ContextPilot) -> None:
    prompt = pilot.optimize([A, B, A], "q")
    assert ids(prompt.blocks) == ["a", "b"]
    assert prompt.messages[-1]["content"].count(render_block(A)) == 1


def test_any_iterable_of_blocks_is_accepted(pilot: ContextPilot) -> None:
    prompt = pilot.optimize((block for block in (A, B)), "q")  # type: ignore[arg-type]
    assert ids(prompt.blocks) == ["a", "b"]


def test_boundaries_slice_each_rendered_block_out_of_its_message(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "first")
    prompt = pilot.optimize([D, B, A, C], "second")
    assert [b.block_id for b in prompt.boundaries] == ids(prompt.blocks)
    for boundary, block in zip(prompt.boundaries, prompt.blocks, strict=True):
        content = prompt.messages[boundary.message_index]["content"]
        assert content[boundary.char_start : boundary.char_end] == render_block(block)


def test_boundary_tokens_are_each_blocks_token_count(
    pilot: ContextPilot, tokenizer: Tokenizer
) -> None:
    prompt = pilot.optimize([A, B, C], "q")
    for boundary, block in zip(prompt.boundaries, prompt.blocks, strict=True):
        assert boundary.token_end - boundary.token_start == tokenizer.count(render_block(block))


def test_boundary_tokens_are_contiguous(pilot: ContextPilot) -> None:
    prompt = pilot.optimize([A, B, C], "q")
    pairs = itertools.pairwise(prompt.boundaries)
    assert all(first.token_end == second.token_start for first, second in pairs)


def test_first_block_starts_after_system_prompt_and_header_tokens(
    pilot: ContextPilot, tokenizer: Tokenizer
) -> None:
    prompt = pilot.optimize([A, B], "q")
    expected = tokenizer.count(prompt.messages[0]["content"]) + tokenizer.count(
        "Context documents:\n\n"
    )
    assert prompt.boundaries[0].token_start == expected


def test_token_offsets_count_the_history_messages(
    pilot: ContextPilot, tokenizer: Tokenizer
) -> None:
    pilot.optimize([A], "one", conversation_id="conv")
    pilot.record_answer("conv", "Fact a holds.")
    prompt = pilot.optimize([B], "two", conversation_id="conv")
    before = sum(tokenizer.count(m["content"]) for m in prompt.messages[:-1])
    boundary = prompt.boundaries[0]
    assert boundary.message_index == len(prompt.messages) - 1
    assert boundary.token_start == before + tokenizer.count("Context documents:\n\n")


# -- stats ----------------------------------------------------------------------------


def test_first_request_reuses_nothing(pilot: ContextPilot) -> None:
    stats = pilot.optimize([A, B], "q").stats
    assert (stats.blocks_total, stats.blocks_matched, stats.reusable_tokens) == (2, 0, 0)


def test_identical_repeat_reuses_everything_up_to_the_question(pilot: ContextPilot) -> None:
    pilot.optimize([A, B, C], "q")
    prompt = pilot.optimize([A, B, C], "q")
    assert prompt.stats.blocks_matched == 3
    assert prompt.stats.reusable_tokens == prompt.boundaries[-1].token_end > 0


def test_stats_count_matched_and_deduplicated_blocks(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "warm the cache")
    pilot.optimize([C], "one", conversation_id="conv")
    prompt = pilot.optimize([A, C, B, D], "two", conversation_id="conv")
    stats = prompt.stats
    assert (stats.blocks_total, stats.blocks_deduplicated) == (4, 1)
    assert stats.blocks_matched == 0  # the conversation's own prefix holds no a, b


def test_matched_ids_are_the_blocks_of_the_prefix_sent_before(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "first")
    prompt = pilot.optimize([C, B, A], "second")
    assert prompt.matched_ids == {"a", "b"} == set(ids(prompt.blocks[:2]))
    assert pilot.optimize([X], "third").matched_ids == frozenset()


def test_deduplicated_ids_are_the_blocks_left_to_the_location_note(
    pilot: ContextPilot,
) -> None:
    pilot.optimize([C], "one", conversation_id="conv")
    prompt = pilot.optimize([A, C, B], "two", conversation_id="conv")
    assert prompt.deduplicated_ids == {"c"} == set(ids(prompt.deduplicated))
    assert prompt.matched_ids.isdisjoint(prompt.deduplicated_ids)


def test_placed_blocks_are_the_sent_then_the_deduplicated_each_once(
    pilot: ContextPilot,
) -> None:
    pilot.optimize([C], "one", conversation_id="conv")
    prompt = pilot.optimize([A, C, B, A], "two", conversation_id="conv")
    assert prompt.placed_blocks == (*prompt.blocks, *prompt.deduplicated)
    assert sorted(ids(prompt.placed_blocks)) == ["a", "b", "c"]
    assert ids(prompt.placed_blocks)[-1] == "c"


def test_prompt_tokens_cover_blocks_and_tail(pilot: ContextPilot) -> None:
    stats = pilot.optimize([A, B], "q").stats
    assert stats.tail_tokens > 0
    assert stats.prompt_tokens > stats.tail_tokens


# -- reordering for prefix reuse ------------------------------------------------------


def test_shared_blocks_are_moved_to_the_cached_prefix(pilot: ContextPilot) -> None:
    pilot.optimize([A, B, C, D], "first")
    assert ids(pilot.optimize([C, B, A, X], "second").blocks) == ["a", "b", "c", "x"]


def test_reordering_lengthens_the_prefix_shared_with_the_earlier_prompt(
    tokenizer: Tokenizer,
) -> None:
    def shared_prefix(config: PilotConfig) -> int:
        pilot = ContextPilot(config, tokenizer=tokenizer)
        first = pilot.optimize([A, B, C, D], "first").messages[-1]["content"]
        second = pilot.optimize([C, B, A, X], "second").messages[-1]["content"]
        return common_prefix_length(first, second)

    assert shared_prefix(PilotConfig()) > shared_prefix(PilotConfig(reorder=False))


def test_reorder_off_keeps_retrieval_order(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(reorder=False), tokenizer=tokenizer)
    pilot.optimize([A, B, C], "first")
    assert ids(pilot.optimize([C, B, A], "second").blocks) == ["c", "b", "a"]


def test_unmatched_blocks_follow_popularity(pilot: ContextPilot) -> None:
    # Every indexed path starts with c: no match below. d was carried by three
    # requests, x by two, a by one: a keeps its retrieval place among the rest.
    pilot.optimize([C, D], "one")
    pilot.optimize([C, D, X], "two")
    pilot.optimize([C, D, X, A], "three")
    assert ids(pilot.optimize([B, A, X, D], "four").blocks) == ["d", "x", "b", "a"]


def test_retrieval_remainder_keeps_unmatched_blocks_in_input_order(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(PilotConfig(remainder="retrieval"), tokenizer=tokenizer)
    pilot.optimize([C, D], "one")  # every indexed path starts with c: no match below
    pilot.optimize([C, D, X], "two")
    assert ids(pilot.optimize([A, X, B, D], "three").blocks) == ["a", "x", "b", "d"]


def test_a_different_system_prompt_shares_no_prefix(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "q", system="first system")
    prompt = pilot.optimize([A, B], "q", system="second system")
    assert prompt.stats.reusable_tokens == 0


# -- request ids and evict ------------------------------------------------------------


def test_request_ids_are_unique(pilot: ContextPilot) -> None:
    request_ids = {pilot.optimize([A], f"q{n}").request_id for n in range(20)}
    assert len(request_ids) == 20


def test_each_request_is_indexed_under_its_id(pilot: ContextPilot) -> None:
    pilot.optimize([A], "q")
    pilot.optimize([B], "q", conversation_id="conv")
    assert pilot.index_stats().requests == 2


def test_evict_forgets_a_request_in_the_index(pilot: ContextPilot) -> None:
    first = pilot.optimize([A, B], "q")
    assert pilot.evict([first.request_id]) == 1
    assert pilot.index_stats().requests == 0
    assert pilot.optimize([B, A], "q").stats.blocks_matched == 0


def test_evict_ignores_unknown_request_ids(pilot: ContextPilot) -> None:
    pilot.optimize([A], "q")
    assert pilot.evict(["cp-unknown"]) == 0
    assert pilot.index_stats().requests == 1


@pytest.mark.parametrize("request_ids", ["cp-000000001", 42, None])
def test_evict_needs_an_iterable_of_ids(pilot: ContextPilot, request_ids: object) -> None:
    pilot.optimize([A], "q")
    with pytest.raises(InvalidInputError):
        pilot.evict(request_ids)  # type: ignore[arg-type]
    assert pilot.index_stats().requests == 1


def test_index_stays_within_capacity(tokenizer: Tokenizer) -> None:
    config = PilotConfig(index=IndexConfig(capacity_tokens=400))
    pilot = ContextPilot(config, tokenizer=tokenizer)
    for number in range(30):
        pilot.optimize([doc(f"n{number}"), doc(f"m{number}")], "q")
        assert pilot.index_stats().tokens <= 400


# -- bad input ------------------------------------------------------------------------


def test_empty_block_list_is_an_empty_context_error(pilot: ContextPilot) -> None:
    with pytest.raises(EmptyContextError):
        pilot.optimize([], "q")


@pytest.mark.parametrize(
    "blocks",
    [None, "just a string", b"bytes", A, 42, {"a": A}, ["plain text"], [A, None]],
    ids=["none", "str", "bytes", "single-block", "int", "dict", "list-of-str", "list-with-none"],
)
def test_blocks_must_be_a_list_of_context_blocks(pilot: ContextPilot, blocks: object) -> None:
    with pytest.raises(InvalidBlockError):
        pilot.optimize(blocks, "q")  # type: ignore[arg-type]


def test_invalid_block_error_is_an_invalid_input_error() -> None:
    assert issubclass(InvalidBlockError, InvalidInputError)


@pytest.mark.parametrize("query", [None, 42, b"bytes", ["q"]])
def test_query_must_be_a_str(pilot: ContextPilot, query: object) -> None:
    with pytest.raises(InvalidInputError):
        pilot.optimize([A], query)  # type: ignore[arg-type]


@pytest.mark.parametrize("conversation_id", [42, "", b"conv"])
def test_conversation_id_must_be_a_non_empty_str(
    pilot: ContextPilot, conversation_id: object
) -> None:
    with pytest.raises(InvalidInputError):
        pilot.optimize([A], "q", conversation_id=conversation_id)  # type: ignore[arg-type]


def test_system_must_be_a_str(pilot: ContextPilot) -> None:
    with pytest.raises(InvalidInputError):
        pilot.optimize([A], "q", system=42)  # type: ignore[arg-type]


def test_answer_must_be_a_str(pilot: ContextPilot) -> None:
    pilot.optimize([A], "q", conversation_id="conv")
    with pytest.raises(InvalidInputError):
        pilot.record_answer("conv", None)  # type: ignore[arg-type]


def test_one_id_for_two_texts_in_a_call_is_a_conflict(pilot: ContextPilot) -> None:
    with pytest.raises(BlockConflictError):
        pilot.optimize([ContextBlock("one text", id="k"), ContextBlock("other", id="k")], "q")


def test_one_id_for_two_texts_across_calls_is_a_conflict(pilot: ContextPilot) -> None:
    pilot.optimize([ContextBlock("one text", id="k")], "q")
    with pytest.raises(BlockConflictError):
        pilot.optimize([ContextBlock("other text", id="k")], "q")


def test_block_over_max_block_tokens_is_rejected(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_block_tokens=20), tokenizer=tokenizer)
    with pytest.raises(OversizeBlockError):
        pilot.optimize([A, ContextBlock("many words " * 50)], "q")


def test_block_at_max_block_tokens_is_accepted(tokenizer: Tokenizer) -> None:
    limit = tokenizer.count(render_block(A))
    pilot = ContextPilot(PilotConfig(max_block_tokens=limit), tokenizer=tokenizer)
    assert ids(pilot.optimize([A], "q").blocks) == ["a"]


def test_errors_share_one_base_class() -> None:
    errors = [
        BlockConflictError,
        ConfigError,
        ConversationStateError,
        EmptyContextError,
        InvalidInputError,
        OversizeBlockError,
        UnknownConversationError,
    ]
    assert all(issubclass(error, ContextPilotError) for error in errors)


def test_unknown_conversation_error_message_is_readable(pilot: ContextPilot) -> None:
    with pytest.raises(UnknownConversationError) as caught:
        pilot.record_answer("ghost", "answer")
    assert str(caught.value).startswith("no live conversation 'ghost'")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"remainder": "random"},
        {"question_template": "no placeholder"},
        {"question_template": "{query} and {context}"},
        {"max_block_tokens": 0},
        {"max_history_turns": -1},
        {"system_prompt": 42},
        {"max_observed_prompts": -1},
        {"max_observed_prompts": 1.5},
        {"max_observed_prompts": True},
        {"max_history_turns": True},
        {"max_block_tokens": True},
        {"max_conversations": 0},
        {"block_registry_size": 0},
        {"conversation_ttl_s": "10"},
        {"conversation_ttl_s": float("nan")},
        {"context_header": None},
        {"notes": None},
        {"question_template": 5},
        {"reorder": "no"},
        {"system_into_user": "yes"},
        {"system_into_user": True, "cloud": CloudCacheConfig(enabled=True)},
        {"index": None},
    ],
)
def test_pilot_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        PilotConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["query", "system"])
def test_a_question_or_system_prompt_longer_than_a_block_may_be_is_refused(
    tokenizer: Tokenizer, field: str
) -> None:
    """Both are tokenized while the pilot's lock is held: an unbounded one would stall
    every other caller."""
    pilot = ContextPilot(PilotConfig(max_block_chars=1_000), tokenizer=tokenizer)
    long = {"query": "q?", "system": None, field: "x" * 1_001}
    with pytest.raises(InvalidInputError, match="1,001 characters"):
        pilot.optimize([ContextBlock("a document")], long["query"], system=long["system"])
    with pytest.raises(InvalidInputError, match="1,001 characters"):
        pilot.optimize_batch([([ContextBlock("a document")], long["query"])], system=long["system"])
    assert pilot.index_stats().requests == 0


def test_recurring_text_caches_hold_a_bounded_number_of_characters() -> None:
    cache: _TextCache[int] = _TextCache(max_entries=100, max_chars=1_000)
    for number in range(50):
        cache.put(f"{number:03d}" + "p" * 97, number)  # 100 characters each
        assert cache.chars <= 1_000
    assert cache.get("049" + "p" * 97) == 49
    cache.put("x" * 5_000, 1)  # larger than the whole budget: not kept
    assert cache.get("x" * 5_000) is None and cache.chars <= 1_000


@pytest.mark.parametrize("tolerance", ["x", float("nan"), -0.1, 1.5, True])
def test_observe_cache_refuses_a_bad_tolerance(pilot: ContextPilot, tolerance: object) -> None:
    prompt = pilot.optimize([ContextBlock("a document")], "q")
    with pytest.raises(InvalidInputError, match="tolerance"):
        pilot.observe_cache(prompt, 0, 10, tolerance=tolerance)  # type: ignore[arg-type]


# -- a failed call changes nothing ----------------------------------------------------

FailingCall = Callable[[ContextPilot], object]

FAILING_CALLS: dict[str, FailingCall] = {
    "conflict-across-calls": lambda p: p.optimize(
        [C, ContextBlock("a different text", id="a")], "q", conversation_id="conv"
    ),
    "conflict-within-call": lambda p: p.optimize(
        [C, ContextBlock("a different text", id="c")], "q", conversation_id="conv"
    ),
    "empty-blocks": lambda p: p.optimize([], "q"),  # (a conversation's turn may have none)
    "oversize-block": lambda p: p.optimize(
        [C, ContextBlock("many words " * 100)], "q", conversation_id="conv"
    ),
    "query-not-str": lambda p: p.optimize([C], 7, conversation_id="conv"),  # type: ignore[arg-type]
    "blocks-a-str": lambda p: p.optimize("abc", "q", conversation_id="conv"),  # type: ignore[arg-type]
    "conversation-id-not-str": lambda p: p.optimize([C], "q", conversation_id=7),  # type: ignore[arg-type]
    "answered-twice": lambda p: p.record_answer("conv", "again"),
    "answer-unknown-conversation": lambda p: p.record_answer("ghost", "answer"),
    "evict-bare-str": lambda p: p.evict("cp-000000001"),
    "observe-unknown-request-id": lambda p: p.observe_cache("cp-999999999", 0, 1000),
    "observe-not-a-prompt": lambda p: p.observe(7, {"cache_n": 0, "prompt_n": 9}),  # type: ignore[arg-type]
    "observe-count-not-int": lambda p: p.observe_cache("cp-000000002", 0.5, 1000),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("failing_call", FAILING_CALLS.values(), ids=FAILING_CALLS.keys())
def test_failed_call_leaves_the_state_as_it_was(
    tokenizer: Tokenizer, failing_call: FailingCall
) -> None:
    config = PilotConfig(max_block_tokens=100)
    clean, noisy = (ContextPilot(config, tokenizer=tokenizer) for _ in range(2))
    for pilot in (clean, noisy):
        pilot.optimize([A, B], "one", conversation_id="conv")
        pilot.record_answer("conv", "answer one")
        pilot.optimize([D, A], "unrelated")

    with pytest.raises(ContextPilotError):
        failing_call(noisy)

    assert noisy.index_stats() == clean.index_stats()
    assert noisy.conversation("conv") == clean.conversation("conv")
    expected = clean.optimize([B, C, A], "two", conversation_id="conv")
    assert noisy.optimize([B, C, A], "two", conversation_id="conv") == expected


def _docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(text=f"Document {n}: " + f"{n} facts. " * 40, id=n) for n in names]


def test_a_predicted_hit_the_engine_did_not_serve_is_trimmed_from_the_index(
    pilot: ContextPilot,
) -> None:
    first = pilot.optimize(_docs("a", "b", "c"), "Q1?")
    second = pilot.optimize(_docs("a", "b", "d"), "Q2?")
    unrelated = pilot.optimize(_docs("x", "y"), "Q3?")
    assert second.stats.blocks_matched == 2 and pilot.index_stats().requests == 3
    with pytest.raises(InvalidInputError):
        pilot.observe_cache(second, 5, 4)
    assert pilot.observe_cache(second, 900, 1000) == 0  # served about as predicted
    assert pilot.index_stats().requests == 3
    assert pilot.observe_cache(second, 10, 1000) == 1  # predicted a hit, got none
    stats = pilot.index_stats()
    assert stats.requests == 2  # the first request's entry went; the second and x/y stay
    third = pilot.optimize(_docs("a", "b", "e"), "Q4?")
    assert [b.id for b in third.blocks][:2] == ["a", "b"]  # still matched, via the second
    assert pilot.observe_cache(first, 0, 1000) == 0  # no longer indexed: nothing to do
    assert pilot.observe_cache(unrelated, 0, 1000) == 0  # it predicted no block hit


# -- observing by request id ----------------------------------------------------------


def test_observe_by_request_id_acts_as_observe_with_the_prompt(tokenizer: Tokenizer) -> None:
    by_prompt, by_id = ContextPilot(tokenizer=tokenizer), ContextPilot(tokenizer=tokenizer)
    for pilot in (by_prompt, by_id):
        pilot.optimize(_docs("a", "b", "c"), "Q1?")
    second = by_prompt.optimize(_docs("a", "b", "d"), "Q2?")
    second_id = by_id.optimize(_docs("a", "b", "d"), "Q2?").request_id
    miss = {"cache_n": 10, "prompt_n": 990}
    assert by_prompt.observe(second, miss) == by_id.observe(second_id, miss) == 1
    assert by_prompt.index_stats() == by_id.index_stats()
    assert by_id.observe_cache(second_id, 900, 1000) == 0


def test_an_unknown_request_id_is_refused_naming_the_bound(pilot: ContextPilot) -> None:
    pilot.optimize(_docs("a"), "Q?")
    with pytest.raises(InvalidInputError, match=r"cp-999999999.*max_observed_prompts=4096"):
        pilot.observe("cp-999999999", {"cache_n": 0, "prompt_n": 10})


def test_only_the_most_recent_prompts_are_remembered(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_observed_prompts=2), tokenizer=tokenizer)
    first, second, third = (pilot.optimize(_docs(n), "Q?") for n in "abc")
    with pytest.raises(InvalidInputError, match="older than"):
        pilot.observe_cache(first.request_id, 0, 100)
    for prompt in (second, third):
        assert pilot.observe_cache(prompt.request_id, 0, 100) == 0
    assert pilot.observe_cache(first, 0, 100) == 0  # the Prompt itself always works


def test_max_observed_prompts_zero_remembers_none(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_observed_prompts=0), tokenizer=tokenizer)
    prompt = pilot.optimize(_docs("a"), "Q?")
    with pytest.raises(InvalidInputError):
        pilot.observe_cache(prompt.request_id, 0, 100)
    assert pilot.observe_cache(prompt, 0, 100) == 0


def test_batch_prompts_are_remembered_by_request_id(pilot: ContextPilot) -> None:
    prompts = pilot.optimize_batch([(_docs("a", "b"), "Q1?"), (_docs("b", "a", "c"), "Q2?")])
    shared = next(prompt for prompt in prompts if prompt.stats.blocks_matched)
    assert pilot.observe_cache(shared.request_id, 0, 1000) == 1
