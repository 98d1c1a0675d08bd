"""Property specification: whatever documents, questions and answers contain, the
prompt's structure is the pilot's alone. No message content (the trusted system prompt
aside) holds a chat-template control token of any family, so templating the messages
opens exactly one message per message; the last user message has one label line per
block sent, one line per note, one question line."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpilot_rag import (
    ContextBlock,
    ContextPilot,
    InvalidInputError,
    NoteTemplates,
    PilotConfig,
    Tokenizer,
)
from contextpilot_rag.blocks import LabelStyle
from contextpilot_rag.escaping import CONTROL_TOKEN

Messages = Sequence[Mapping[str, str]]

# Each family: how its template wraps messages, and the control strings it uses.


def chatml(messages: Messages) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def llama3(messages: Messages) -> str:
    turns = (
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        for m in messages
    )
    return "<|begin_of_text|>" + "".join(turns)


def gemma(messages: Messages) -> str:
    roles = {"assistant": "model"}
    turns = (
        f"<start_of_turn>{roles.get(m['role'], 'user')}\n{m['content']}<end_of_turn>\n"
        for m in messages
    )
    return "<bos>" + "".join(turns)


def llama2(messages: Messages) -> str:
    out = []
    for m in messages:
        if m["role"] == "system":
            out.append(f"<s>[INST] <<SYS>>\n{m['content']}\n<</SYS>>\n\n")
        elif m["role"] == "user":
            out.append(f"{m['content']} [/INST]" if out else f"<s>[INST] {m['content']} [/INST]")
        else:
            out.append(f" {m['content']} </s><s>[INST] ")
    return "".join(out)


def deepseek(messages: Messages) -> str:
    tags = {"user": "<｜User｜>", "assistant": "<｜Assistant｜>", "system": ""}
    return "<｜begin▁of▁sentence｜>" + "".join(tags[m["role"]] + m["content"] for m in messages)


def phi3(messages: Messages) -> str:
    return "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)


FAMILIES: dict[str, tuple[Callable[[Messages], str], tuple[str, ...]]] = {
    "chatml": (chatml, ("<|im_start|>", "<|im_end|>", "<|endoftext|>")),
    "llama3": (
        llama3,
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    ),
    "gemma": (gemma, ("<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>")),
    "llama2-mistral": (llama2, ("<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>")),
    "deepseek": (
        deepseek,
        ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
    ),
    "phi3": (phi3, ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")),
}
ALL_CONTROL = (
    *(token for _, tokens in FAMILIES.values() for token in tokens),
    "<tool_call>",
    "[TOOL_CALLS]",
    "<|start_of_role|>",
)

PIECES = (
    *ALL_CONTROL,
    "\n",
    "\r",
    "\u2028",
    "\n\n",
    "[a]",
    "[x1]",
    "\u200b",
    "\uff3b",
    "\uff3d",
    "<",
    "|",
    ">",
    "Most relevant first:",
    "ALSO RELEVANT, shown in earlier turns:",
    "Question:",
    "Context documents:",
    "  ",
)
texts = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(PIECES)), max_size=12).map("".join)
block_texts = texts.filter(lambda text: bool(text.strip()))


def visible(line: str) -> str:
    """What a reader sees of a line: compatibility forms folded, format characters
    dropped, spaces collapsed, case folded."""
    folded = unicodedata.normalize("NFKC", line)
    kept = "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")
    return " ".join(kept.split()).casefold()


def structure(content: str) -> tuple[list[str], int, int, int]:
    """Label lines, order-note lines, location-note lines and question lines."""
    lines = [visible(line) for line in content.splitlines()]
    labels = [line[1:-1] for line in lines if re.fullmatch(r"\[[^\]]*\]", line)]
    return (
        labels,
        sum(line.startswith("most relevant first:") for line in lines),
        sum(line.startswith("also relevant, shown in earlier turns:") for line in lines),
        sum(line.startswith("question:") for line in lines),
    )


turns = st.lists(
    st.tuples(st.lists(block_texts, min_size=1, max_size=4), texts, texts), min_size=1, max_size=3
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=turns, label_style=st.sampled_from(["short", "id"]))
def test_no_text_forges_a_message_a_label_or_a_note(
    tokenizer: Tokenizer, turns: list[tuple[list[str], str, str]], label_style: LabelStyle
) -> None:
    pilot = ContextPilot(PilotConfig(label_style=label_style), tokenizer=tokenizer)
    shared = ContextBlock("A document every turn retrieves.")
    for number, (contents, query, answer) in enumerate(turns):
        blocks = [ContextBlock(text) for text in contents]
        blocks += [shared] if number % 2 else [shared, *blocks[:1]]
        try:
            prompt = pilot.optimize(blocks, query, conversation_id="conv")
        except InvalidInputError:  # a lone surrogate from st.text(): refused, typed
            continue
        untrusted = [m for m in prompt.messages if m["role"] != "system"]
        for message in untrusted:
            assert CONTROL_TOKEN.search(message["content"]) is None
        for name, (template, tokens) in FAMILIES.items():
            plain = [{**m, "content": "x"} for m in prompt.messages]
            for token in tokens:
                assert template(prompt.messages).count(token) == template(plain).count(token), (
                    name,
                    token,
                )
        labels, orders, locations, questions = structure(prompt.messages[-1]["content"])
        assert labels == [visible(prompt.label_of(block.id)) for block in prompt.blocks]
        assert (orders, locations, questions) == (
            int(prompt.order_note is not None),
            int(prompt.location_note is not None),
            1,
        )
        if answer.strip():
            pilot.record_answer(prompt, answer)


@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_escaping_is_idempotent(text: str) -> None:
    """Adapters escape a text before the pilot renders it: the second pass must not
    change it."""
    guard = PilotConfig().structure_guard()
    once = guard.escape(text)
    assert guard.escape(once) == once


def test_a_guard_with_more_lead_ins_escapes_them_and_reads_notes_as_before() -> None:
    guard = PilotConfig().structure_guard()
    wider = guard.with_lead_ins("contextpilot_label:")
    assert guard.escape("contextpilot_label: [x]\n") == "contextpilot_label: [x]\n"
    assert wider.escape("contextpilot_label: [x]\n") == "\\contextpilot_label: [x]\n"
    assert wider.escape("Question: forged\n") == guard.escape("Question: forged\n")
    note = "ALSO RELEVANT, shown in earlier turns: [a] (turn 1)"
    assert guard.is_note(note) and wider.is_note(note)
    assert not wider.is_note("Question: forged") and not wider.is_note("contextpilot_label: x")
    # a note template without a lead-in is kept as one
    bare = PilotConfig(notes=NoteTemplates(order="{labels}")).structure_guard()
    wider_bare = bare.with_lead_ins("contextpilot_label:")
    assert bare.is_note("[a], [b]") and wider_bare.is_note("[a], [b]")
    assert bare.is_note("contextpilot_label: x") and not wider_bare.is_note("contextpilot_label: x")
