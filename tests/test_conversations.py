"""Specification of conversations and de-duplication (Alg. 3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from contextpilot_rag import (
    ConfigError,
    ContextBlock,
    ContextPilot,
    Conversation,
    ConversationStateError,
    InMemoryConversationStore,
    NoteTemplates,
    PilotConfig,
    Prompt,
    Tokenizer,
    Turn,
    UnknownConversationError,
    render_block,
)
from contextpilot_rag.cloud import CloudCacheConfig
from contextpilot_rag.conversations import AWAITING_SLACK, deduplicate

if TYPE_CHECKING:
    from conftest import FakeClock


def doc(name: str) -> ContextBlock:
    return ContextBlock(f"Document {name} says that fact {name} holds.", id=name)


A, B, C, D = BLOCKS = tuple(doc(name) for name in "abcd")


def ids(blocks: tuple[ContextBlock, ...]) -> list[str]:
    return [block.id for block in blocks]


def user_messages(prompt: Prompt) -> list[str]:
    return [m["content"] for m in prompt.messages if m["role"] == "user"]


TURN_NOTES = NoteTemplates(location_group="{labels} (turn {turn})", group_separator="; ")


def turn_pilot(tokenizer: Tokenizer, **options: object) -> ContextPilot:
    """A pilot whose location notes name the turn of each de-duplicated block."""
    config = PilotConfig(notes=TURN_NOTES, **options)  # type: ignore[arg-type]
    return ContextPilot(config, tokenizer=tokenizer)


BY_ID = {block.id: block for block in (A, B, C, D)}


def turn(block_ids: tuple[str, ...]) -> Turn:
    digests = tuple(BY_ID[block_id].digest for block_id in block_ids)
    ones = (1,) * len(block_ids)
    return Turn("cp-1", "message", block_ids, digests, block_ids, ones, "q", 1)


# -- dedup within a conversation ------------------------------------------------------


def test_block_sent_in_turn_one_is_replaced_by_a_note_in_turn_two(tokenizer: Tokenizer) -> None:
    pilot = turn_pilot(tokenizer)
    pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "answer")
    prompt = pilot.optimize([B, C], "two", conversation_id="conv")
    assert ids(prompt.blocks) == ["c"]
    assert ids(prompt.deduplicated) == ["b"]
    last = prompt.messages[-1]["content"]
    assert render_block(B) not in last
    assert last.endswith("Also relevant, shown in earlier turns: b (turn 1)\n\nQuestion: two")


def test_deduplicated_block_is_in_the_turn_the_note_points_at(tokenizer: Tokenizer) -> None:
    pilot = turn_pilot(tokenizer)
    pilot.optimize([A], "one", conversation_id="conv")
    pilot.record_answer("conv", "first answer")
    pilot.optimize([B], "two", conversation_id="conv")
    pilot.record_answer("conv", "second answer")
    prompt = pilot.optimize([B, C], "three", conversation_id="conv")
    assert "b (turn 2)" in prompt.messages[-1]["content"]
    assert render_block(B) in user_messages(prompt)[1]


def test_dedup_never_crosses_conversations(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "one", conversation_id="alice")
    prompt = pilot.optimize([A, B], "one", conversation_id="bob")
    assert ids(prompt.blocks) == ["a", "b"]
    assert prompt.deduplicated == ()


def test_requests_without_a_conversation_are_never_deduplicated(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "one")
    assert pilot.optimize([A, B], "again").deduplicated == ()


def test_turn_with_only_known_blocks_sends_none_in_full(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "answer")
    prompt = pilot.optimize([B, A], "two", conversation_id="conv")
    assert prompt.blocks == () and prompt.boundaries == ()
    assert ids(prompt.deduplicated) == ["b", "a"]


def test_a_turn_without_blocks_enters_the_history(tokenizer: Tokenizer) -> None:
    """A retrieval with no hit: the turn carries the history and its question, is
    answered like any other, and the next turn renders it and still points at the
    blocks of the turn before it."""
    pilot = turn_pilot(tokenizer)
    pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "first answer")
    empty = pilot.optimize([], "thanks! and two?", conversation_id="conv")
    assert empty.blocks == () and empty.stats.blocks_total == 0
    assert [m["role"] for m in empty.messages] == ["system", "user", "assistant", "user"]
    assert empty.messages[-1]["content"].endswith("Question: thanks! and two?")
    pilot.record_answer(empty, "second answer")
    prompt = pilot.optimize([B, C], "three", conversation_id="conv")
    assert [m["content"] for m in prompt.messages[3:5]] == [
        empty.messages[-1]["content"],
        "second answer",
    ]
    assert ids(prompt.blocks) == ["c"] and ids(prompt.deduplicated) == ["b"]
    assert "b (turn 1)" in prompt.messages[-1]["content"]
    assert pilot.conversation("conv").turn_count == 3


def test_a_conversation_may_open_with_a_turn_without_blocks(pilot: ContextPilot) -> None:
    first = pilot.optimize([], "hello?", conversation_id="conv", tenant="t")
    pilot.record_answer(first, "hi", tenant="t")
    prompt = pilot.optimize([A], "one", conversation_id="conv", tenant="t")
    assert ids(prompt.blocks) == ["a"]
    assert [m["content"] for m in prompt.messages[1:3]] == [first.messages[-1]["content"], "hi"]


def test_dedup_off_keeps_every_block(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(dedup=False), tokenizer=tokenizer)
    pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "answer")
    prompt = pilot.optimize([B, C], "two", conversation_id="conv")
    assert sorted(ids(prompt.blocks)) == ["b", "c"]
    assert prompt.deduplicated == ()
    assert render_block(B) in prompt.messages[-1]["content"]


def test_history_blocks_are_not_counted_as_cache_matches_without_dedup(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(PilotConfig(dedup=False), tokenizer=tokenizer)
    pilot.optimize([A, B], "one", conversation_id="conv")
    prompt = pilot.optimize([C, B], "two", conversation_id="conv")
    assert prompt.stats.blocks_matched == 0


def test_history_blocks_are_not_moved_to_the_front_without_dedup(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(dedup=False, remainder="retrieval"), tokenizer=tokenizer)
    pilot.optimize([A, B], "one", conversation_id="conv")
    prompt = pilot.optimize([C, B], "two", conversation_id="conv")
    assert ids(prompt.blocks) == ["c", "b"]


def test_dedup_points_only_at_rendered_turns(tokenizer: Tokenizer) -> None:
    pilot = turn_pilot(tokenizer, max_history_turns=1)
    pilot.optimize([A], "one", conversation_id="conv")
    pilot.optimize([B], "two", conversation_id="conv")
    prompt = pilot.optimize([A, B], "three", conversation_id="conv")
    assert ids(prompt.blocks) == ["a"]
    assert ids(prompt.deduplicated) == ["b"]
    # the window renders one turn (the conversation's second): the note counts from it
    assert "b (turn 1)" in prompt.messages[-1]["content"]


def test_max_history_turns_limits_the_rendered_history(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_history_turns=1), tokenizer=tokenizer)
    pilot.optimize([A], "one", conversation_id="conv")
    pilot.optimize([B], "two", conversation_id="conv")
    prompt = pilot.optimize([C], "three", conversation_id="conv")
    history = user_messages(prompt)[:-1]
    assert len(history) == 1
    assert history[0].endswith("Question: two")


def test_a_history_window_bounds_the_stored_record_and_numbers_the_rendered_turns(
    tokenizer: Tokenizer,
) -> None:
    pilot = turn_pilot(tokenizer, max_history_turns=2)
    for number in range(30):
        pilot.optimize([BLOCKS[number % 4]], f"q{number}", conversation_id="conv")
        pilot.record_answer("conv", f"a{number}")
    record = pilot.conversation("conv")
    assert [t.question for t in record.turns] == ["q28", "q29"]
    assert record.dropped_turns == 28 and record.turn_count == 30
    prompt = pilot.optimize([BLOCKS[29 % 4], C], "q30", conversation_id="conv")
    assert len(user_messages(prompt)) == 3  # the two rendered turns and this one
    label = prompt.label_of(BLOCKS[29 % 4].id)
    # the note counts the turns the prompt renders, not the 28 it dropped: the last
    # answered turn (the conversation's 30th) is the second shown
    assert f"{label} (turn 2)" in prompt.messages[-1]["content"]


def test_a_turn_awaiting_its_answer_is_never_dropped(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_history_turns=1), tokenizer=tokenizer)
    waiting = pilot.optimize([A], "one", conversation_id="conv")
    for number in range(3):
        prompt = pilot.optimize([B], f"q{number}", conversation_id="conv")
        pilot.record_answer(prompt, f"a{number}")
    turns = pilot.conversation("conv").turns
    assert len(turns) == 4 and turns[0].request_id == waiting.request_id  # nothing dropped
    # the turns the window no longer renders keep no text
    assert [bool(t.user_message) for t in turns] == [False, False, False, True]
    assert [t.answer for t in turns] == [None, "", "", "a2"]
    rendered = pilot.optimize([C], "next?", conversation_id="conv")
    assert [m["content"] for m in rendered.messages if m["role"] == "assistant"] == ["a2"]
    pilot.record_answer(rendered, "a3")
    pilot.record_answer(waiting, "late answer")
    pilot.optimize([C], "next", conversation_id="conv")
    assert [t.question for t in pilot.conversation("conv").turns] == ["next"]


def test_a_turn_never_answered_is_dropped_once_the_window_and_its_slack_are_full(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(PilotConfig(max_history_turns=2), tokenizer=tokenizer)
    abandoned = pilot.optimize([A], "abandoned", conversation_id="conv")
    for number in range(2 + AWAITING_SLACK):
        prompt = pilot.optimize([BLOCKS[number % 4]], f"q{number}", conversation_id="conv")
        pilot.record_answer(prompt, f"a{number}")
    record = pilot.conversation("conv")
    assert len(record.turns) == 2 + AWAITING_SLACK  # the window and the slack: no more
    assert record.turns[0].request_id != abandoned.request_id and record.dropped_turns == 1
    assert record.turn_count == 3 + AWAITING_SLACK  # numbers still count every turn
    unrendered, rendered = record.turns[:-2], record.turns[-2:]
    assert all(not t.user_message and not t.block_ids for t in unrendered)  # no text kept
    assert [t.question for t in rendered] == [f"q{AWAITING_SLACK}", f"q{AWAITING_SLACK + 1}"]
    with pytest.raises(ConversationStateError, match="history window"):
        pilot.record_answer(abandoned, "far too late")
    assert pilot.conversation("conv") == record  # the refused answer changed nothing
    prompt = pilot.optimize([C], "more", conversation_id="conv")
    pilot.record_answer("conv", "b")  # one turn awaits: no ambiguity
    assert len(pilot.conversation("conv").turns) == 2  # back to the window


def test_dedup_points_at_the_latest_turn_holding_the_block() -> None:
    result = deduplicate([A, C], [(0, turn(("a",))), (1, turn(("b",))), (2, turn(("a", "d")))])
    assert ids(result.kept) == ["c"]
    assert [(block.id, number) for block, number in result.deduplicated] == [("a", 2)]


# -- history and answers --------------------------------------------------------------


def test_history_replays_each_turns_exact_user_message(pilot: ContextPilot) -> None:
    first = pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "answer one")
    second = pilot.optimize([C], "two", conversation_id="conv")
    assert second.messages[1] == first.messages[-1]


def test_recorded_answer_follows_its_turn_in_the_next_prompt(pilot: ContextPilot) -> None:
    pilot.optimize([A], "one", conversation_id="conv")
    pilot.record_answer("conv", "It is fact a.")
    prompt = pilot.optimize([B], "two", conversation_id="conv")
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert prompt.messages[2]["content"] == "It is fact a."


def test_unanswered_turn_is_replayed_with_a_stand_in_answer(pilot: ContextPilot) -> None:
    """Chat templates such as Gemma's and Mistral's refuse two user messages in a row."""
    pilot.optimize([A], "one", conversation_id="conv")
    prompt = pilot.optimize([B], "two", conversation_id="conv")
    assert [m["role"] for m in prompt.messages] == ["system", "user", "assistant", "user"]
    assert prompt.messages[2]["content"] == PilotConfig().unanswered_text == "(no answer)"


def test_unanswered_text_none_replays_an_unanswered_turn_without_an_assistant_message(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(PilotConfig(unanswered_text=None), tokenizer=tokenizer)
    pilot.optimize([A], "one", conversation_id="conv")
    prompt = pilot.optimize([B], "two", conversation_id="conv")
    assert [m["role"] for m in prompt.messages] == ["system", "user", "user"]


@pytest.mark.parametrize("text", ["", " \n", 5])
def test_unanswered_text_must_have_text(text: object) -> None:
    with pytest.raises(ConfigError, match="unanswered_text"):
        PilotConfig(unanswered_text=text)  # type: ignore[arg-type]


@pytest.mark.parametrize("system", ["Answer briefly.", None])
def test_history_roles_alternate_whichever_turns_are_answered(
    tokenizer: Tokenizer, system: str | None
) -> None:
    config = PilotConfig(system_prompt=system)
    pilot = ContextPilot(config, tokenizer=tokenizer)
    answered = (True, False, False, True, False)
    for number, answer in enumerate(answered):
        prompt = pilot.optimize([BLOCKS[number % 4]], f"q{number}", conversation_id="conv")
        if answer:
            pilot.record_answer(prompt, f"a{number}")
    prompt = pilot.optimize([D], "last", conversation_id="conv")
    roles = [m["role"] for m in prompt.messages if m["role"] != "system"]
    assert roles == ["user", "assistant"] * len(answered) + ["user"]
    shown = [m["content"] for m in prompt.messages if m["role"] == "assistant"]
    assert shown == [f"a{n}" if a else "(no answer)" for n, a in enumerate(answered)]


def test_an_answer_recorded_after_the_stand_in_was_sent_is_not_taken_as_cached(
    tokenizer: Tokenizer,
) -> None:
    """The stand-in and the answer recorded later are different text: the next turn's
    prompt shares the earlier prompt's prefix only up to the stand-in."""

    def third_turn(late: bool) -> Prompt:
        pilot = ContextPilot(tokenizer=tokenizer)
        first = pilot.optimize([A], "one", conversation_id="conv")
        if not late:
            pilot.record_answer(first, "answer one")
        second = pilot.optimize([B], "two", conversation_id="conv")
        if late:
            pilot.record_answer(first, "answer one")
        pilot.record_answer(second, "answer two")
        return pilot.optimize([C], "three", conversation_id="conv")

    in_time, late = third_turn(late=False), third_turn(late=True)
    assert in_time.messages == late.messages  # the same prompt either way
    # in time, the second prompt carried the whole history up to its own question
    assert late.stats.reusable_tokens < in_time.stats.reusable_tokens


def test_answering_the_same_turn_twice_is_a_state_error(pilot: ContextPilot) -> None:
    pilot.optimize([A], "one", conversation_id="conv")
    pilot.record_answer("conv", "first")
    with pytest.raises(ConversationStateError):
        pilot.record_answer("conv", "second")
    assert pilot.conversation("conv").turns[-1].answer == "first"


def test_answering_an_unknown_conversation_is_an_error(pilot: ContextPilot) -> None:
    with pytest.raises(UnknownConversationError):
        pilot.record_answer("never-started", "answer")


def test_reading_an_unknown_conversation_is_an_error(pilot: ContextPilot) -> None:
    with pytest.raises(UnknownConversationError, match="never-started"):
        pilot.conversation("never-started")


def test_a_conversation_with_no_turn_cannot_be_answered() -> None:
    with pytest.raises(ConversationStateError):
        Conversation("conv", system=None).with_answer("answer")


def test_conversation_record_lists_its_turns(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "answer")
    pilot.optimize([B, C], "two", conversation_id="conv")
    record = pilot.conversation("conv")
    assert [t.question for t in record.turns] == ["one", "two"]
    assert [t.block_ids for t in record.turns] == [("a", "b"), ("c",)]
    assert [t.answer for t in record.turns] == ["answer", None]


def test_conversation_keeps_its_first_system_prompt(pilot: ContextPilot) -> None:
    pilot.optimize([A], "one", conversation_id="conv", system="Be brief.")
    prompt = pilot.optimize([B], "two", conversation_id="conv")
    assert prompt.messages[0] == {"role": "system", "content": "Be brief."}


def test_ending_a_conversation_forgets_its_history(pilot: ContextPilot) -> None:
    pilot.optimize([A], "one", conversation_id="conv")
    assert pilot.end_conversation("conv") is True
    prompt = pilot.optimize([A], "again", conversation_id="conv")
    assert prompt.deduplicated == ()
    assert len(pilot.conversation("conv").turns) == 1


def test_ending_an_unknown_conversation_returns_false(pilot: ContextPilot) -> None:
    assert pilot.end_conversation("never-started") is False


# -- store bounds ---------------------------------------------------------------------


def test_store_drops_the_least_recently_used_conversation(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_conversations=2), tokenizer=tokenizer)
    pilot.optimize([A], "q", conversation_id="first")
    pilot.optimize([A], "q", conversation_id="second")
    pilot.optimize([B], "q", conversation_id="first")
    pilot.optimize([A], "q", conversation_id="third")
    with pytest.raises(UnknownConversationError):
        pilot.conversation("second")
    assert len(pilot.conversation("first").turns) == 2


def test_store_expires_idle_conversations(tokenizer: Tokenizer, clock: FakeClock) -> None:
    config = PilotConfig(conversation_ttl_s=60.0)
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=clock)
    pilot.optimize([A], "q", conversation_id="conv")
    clock.advance(61)
    with pytest.raises(UnknownConversationError):
        pilot.record_answer("conv", "too late")


def test_expired_conversation_starts_afresh(tokenizer: Tokenizer, clock: FakeClock) -> None:
    config = PilotConfig(conversation_ttl_s=60.0)
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=clock)
    pilot.optimize([A], "q", conversation_id="conv")
    clock.advance(61)
    prompt = pilot.optimize([A], "q", conversation_id="conv")
    assert prompt.deduplicated == ()
    assert len(prompt.messages) == 2


def test_activity_keeps_a_conversation_alive(tokenizer: Tokenizer, clock: FakeClock) -> None:
    config = PilotConfig(conversation_ttl_s=60.0)
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=clock)
    pilot.optimize([A], "q", conversation_id="conv")
    for _ in range(3):
        clock.advance(40)
        pilot.optimize([B], "q", conversation_id="conv")
    assert len(pilot.conversation("conv").turns) == 4


def test_in_memory_store_is_bounded_by_max_conversations() -> None:
    store = InMemoryConversationStore(max_conversations=3, ttl_s=None)
    for number in range(10):
        store.put(Conversation(f"c{number}", system=None))
    assert len(store) == 3
    assert store.get("c9") is not None and store.get("c6") is None


def test_in_memory_store_get_refreshes_recency() -> None:
    store = InMemoryConversationStore(max_conversations=2, ttl_s=None)
    store.put(Conversation("old", system=None))
    store.put(Conversation("new", system=None))
    store.get("old")
    store.put(Conversation("newest", system=None))
    assert store.get("old") is not None and store.get("new") is None


def test_in_memory_store_expires_by_ttl(clock: FakeClock) -> None:
    store = InMemoryConversationStore(ttl_s=10.0, clock=clock)
    store.put(Conversation("conv", system=None))
    clock.advance(10.5)
    assert store.get("conv") is None
    assert len(store) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_conversations": 0},
        {"max_conversations": True},
        {"max_conversations": 2.5},
        {"ttl_s": 0},
        {"ttl_s": -5.0},
        {"ttl_s": "5"},
        {"ttl_s": float("nan")},
    ],
)
def test_in_memory_store_rejects_bad_bounds(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        InMemoryConversationStore(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("blank", ["", "  \n"])
def test_a_blank_answer_shows_the_stand_in_so_hosted_requests_alternate_too(
    tokenizer: Tokenizer, blank: str
) -> None:
    """Hosted APIs leave a blank text block out with its message: a blank answer (a
    reasoning model that spent its max_tokens, a reply with tool calls only) shows the
    stand-in instead, as if it had none, so the bytes sent before it stay the same."""
    pilot = ContextPilot(PilotConfig(cloud=CloudCacheConfig(enabled=True)), tokenizer=tokenizer)
    first = pilot.optimize([A], "one", conversation_id="conv")
    before = pilot.optimize([B], "two", conversation_id="conv")
    pilot.record_answer(first, blank)
    pilot.record_answer(before, "answer two")
    prompt = pilot.optimize([C], "three", conversation_id="conv")
    assert prompt.messages[2] == {"role": "assistant", "content": "(no answer)"}
    assert before.messages[2] == prompt.messages[2]
    alternating = ["user", "assistant"] * 2 + ["user"]
    assert [m["role"] for m in prompt.to_anthropic()["messages"]] == alternating
    sent = prompt.to_openai_request(cache_control=True)["messages"]
    assert [m["role"] for m in sent if m["role"] != "system"] == alternating
    # the stand-in the second prompt was sent with is still its prefix
    assert prompt.stats.reusable_tokens > sum(
        tokenizer.count(m["content"]) for m in prompt.messages[:3]
    )
