"""Property specification: under any interleaving of optimize / record_answer / evict /
expiry over several conversations whose documents change text, every block a caller
passes is either in the prompt with its current text, or named by a note that points
at a turn of the rendered history that showed exactly that text. A refused call changes
nothing; an answer lands on the turn it was recorded for."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag import (
    BlockConflictError,
    ContextBlock,
    ContextPilot,
    ConversationStateError,
    PilotConfig,
    Prompt,
    Tokenizer,
    UnknownConversationError,
    render_block,
)

CONVERSATIONS = ("c1", "c2", "c3")


class Clock:
    """A clock that moves only when told to (one per example, so no fixture)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def block(name: str, version: int, chosen_id: bool) -> ContextBlock:
    text = f"Document {name} (edition {version}) states fact {name}{version}.\n[{name}]"
    return ContextBlock(text, id=name if chosen_id else None)


block_choices = st.builds(block, st.sampled_from("abcde"), st.integers(1, 3), st.booleans())
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("ask"),
            st.sampled_from(CONVERSATIONS),
            st.lists(block_choices, min_size=1, max_size=4),
        ),
        st.tuples(st.just("answer"), st.integers(0, 40), st.just(())),
        st.tuples(st.just("evict"), st.integers(0, 40), st.just(())),
        st.tuples(st.just("wait"), st.sampled_from([10.0, 70.0]), st.just(())),
    ),
    min_size=1,
    max_size=25,
)
configs = st.builds(
    PilotConfig,
    block_registry_size=st.sampled_from([2, 1000]),
    max_history_turns=st.sampled_from([None, 2]),
    max_conversations=st.sampled_from([2, 100]),
    conversation_ttl_s=st.just(60.0),
    dedup=st.booleans(),
)


@dataclass
class Run:
    pilot: ContextPilot
    clock: Clock
    prompts: list[Prompt] = field(default_factory=list)

    def snapshot(self, conversation_id: str | None) -> object:
        record = None
        if conversation_id is not None:
            try:
                record = self.pilot.conversation(conversation_id)
            except UnknownConversationError:
                record = None
        return self.pilot.index_stats(), record


def check_blocks_accounted(pilot: ContextPilot, prompt: Prompt, blocks: list[ContextBlock]) -> None:
    guard = pilot.config.structure_guard()
    last = prompt.messages[-1]["content"]
    history = [m["content"] for m in prompt.messages[:-1] if m["role"] == "user"]
    sent = {b.id: b for b in prompt.blocks}
    noted = {b.id: b for b in prompt.deduplicated}
    for passed in dict.fromkeys(blocks):
        label = prompt.label_of(passed.id)
        shown = render_block(passed, guard, label=label)
        if passed.id in sent:
            assert sent[passed.id].text == passed.text
            assert last.count(shown) == 1
        else:
            assert noted[passed.id].text == passed.text
            assert prompt.location_note is not None and label in prompt.location_note.split()
            assert any(shown in message for message in history)


def ask(run: Run, conversation_id: str, blocks: list[ContextBlock]) -> None:
    before = run.snapshot(conversation_id)
    try:
        prompt = run.pilot.optimize(blocks, "what holds?", conversation_id=conversation_id)
    except BlockConflictError:
        assert run.snapshot(conversation_id) == before
        return
    check_blocks_accounted(run.pilot, prompt, blocks)
    run.prompts.append(prompt)


def answer(run: Run, number: int) -> None:
    if not run.prompts:
        return
    prompt = run.prompts[number % len(run.prompts)]
    text = f"answer to {prompt.request_id}"
    before = run.snapshot(prompt.conversation_id)
    try:
        run.pilot.record_answer(prompt, text)
    except (ConversationStateError, UnknownConversationError):
        assert run.snapshot(prompt.conversation_id) == before
        return
    assert prompt.conversation_id is not None
    turns = run.pilot.conversation(prompt.conversation_id).turns
    assert [t.answer for t in turns if t.request_id == prompt.request_id] == [text]


@settings(max_examples=120, deadline=None)
@given(operations=operations, config=configs)
def test_every_block_is_sent_as_it_is_now_or_noted_where_that_text_was_shown(
    tokenizer: Tokenizer,
    operations: list[tuple[str, object, object]],
    config: PilotConfig,
) -> None:
    clock = Clock()
    run = Run(ContextPilot(config, tokenizer=tokenizer, clock=clock), clock)
    for kind, argument, blocks in operations:
        if kind == "ask":
            ask(run, str(argument), list(blocks))  # type: ignore[call-overload]
        elif kind == "answer":
            answer(run, int(argument))  # type: ignore[call-overload]
        elif kind == "evict" and run.prompts:
            run.pilot.evict([run.prompts[int(argument) % len(run.prompts)].request_id])  # type: ignore[call-overload]
        elif kind == "wait":
            clock.advance(float(argument))  # type: ignore[arg-type]
