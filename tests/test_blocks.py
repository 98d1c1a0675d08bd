"""Specification of ContextBlock: identity, immutability, validation and rendering."""

from __future__ import annotations

import dataclasses

import pytest

from contextpilot_rag import (
    ContextBlock,
    ContextPilot,
    InvalidBlockError,
    PilotConfig,
    Prompt,
    Tokenizer,
    content_id,
    render_block,
)
from contextpilot_rag.blocks import block_label


def test_id_defaults_to_the_content_hash() -> None:
    block = ContextBlock("Paris is the capital of France.")
    assert block.id == content_id("Paris is the capital of France.")


def test_same_text_gets_the_same_id() -> None:
    assert ContextBlock("same words").id == ContextBlock("same words").id


def test_different_texts_get_different_ids() -> None:
    assert ContextBlock("one text").id != ContextBlock("another text").id


def test_explicit_id_is_kept() -> None:
    assert ContextBlock("text", id="doc-7").id == "doc-7"


def test_blocks_are_immutable() -> None:
    block = ContextBlock("text")
    with pytest.raises(dataclasses.FrozenInstanceError):
        block.text = "changed"  # type: ignore[misc]


def test_blocks_are_hashable_and_equal_by_id_and_text() -> None:
    first = ContextBlock("text", id="a", score=0.9, metadata={"source": "x"})
    second = ContextBlock("text", id="a", score=0.1)
    assert first == second
    assert len({first, second}) == 1


def test_same_id_with_other_text_is_a_different_block() -> None:
    assert ContextBlock("text", id="a") != ContextBlock("other", id="a")


def test_metadata_is_read_only() -> None:
    block = ContextBlock("text", metadata={"source": "wiki"})
    with pytest.raises(TypeError):
        block.metadata["source"] = "changed"  # type: ignore[index]


def test_metadata_is_copied_from_the_callers_dict() -> None:
    metadata = {"source": "wiki"}
    block = ContextBlock("text", metadata=metadata)
    metadata["source"] = "changed"
    assert block.metadata["source"] == "wiki"


@pytest.mark.parametrize("text", ["", "   \n\t", None, 42, b"bytes"])
def test_text_must_be_a_non_empty_str(text: object) -> None:
    with pytest.raises(InvalidBlockError):
        ContextBlock(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_id", [7, "", b"id"])
def test_id_must_be_a_non_empty_str(block_id: object) -> None:
    with pytest.raises(InvalidBlockError):
        ContextBlock("text", id=block_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_id", ["\x00t4:acme:doc-1", "\x00sys:x", "\x00tail:cp-1"])
def test_an_id_in_the_pilots_own_key_space_is_refused(block_id: str) -> None:
    """A tenant's registry keys and the pilot's index keys start with NUL: an id of that
    form would reach another tenant's blocks (docs/tenants.md)."""
    with pytest.raises(InvalidBlockError, match="reserved"):
        ContextBlock("text", id=block_id)
    assert ContextBlock("text", id="doc\x00x").id == "doc\x00x"  # only a leading NUL


@pytest.mark.parametrize("score", [True, "0.5", [0.5]])
def test_score_must_be_a_number(score: object) -> None:
    with pytest.raises(InvalidBlockError):
        ContextBlock("text", score=score)  # type: ignore[arg-type]


@pytest.mark.parametrize("score", [0, 0.75, -1.5, None])
def test_numeric_or_missing_score_is_accepted(score: float | None) -> None:
    assert ContextBlock("text", score=score).score == score


def test_metadata_must_be_a_mapping() -> None:
    with pytest.raises(InvalidBlockError):
        ContextBlock("text", metadata=[("k", "v")])  # type: ignore[arg-type]


def test_invalid_block_error_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        ContextBlock(None)  # type: ignore[arg-type]


def test_short_plain_id_is_its_own_label() -> None:
    assert ContextBlock("text", id="doc-1").label == "doc-1"


def test_long_or_unusual_id_gets_a_stable_hashed_label() -> None:
    block_id = "https://example.org/a very long path/with spaces?and=query"
    label = ContextBlock("text", id=block_id).label
    assert label == block_label(block_id)
    assert label.isascii() and label.isalpha() and label.islower() and len(label) == 5


def test_label_depends_on_the_id_only() -> None:
    assert ContextBlock("one", id="x y").label == ContextBlock("two", id="x y").label


def test_rendering_holds_the_label_and_the_text() -> None:
    rendered = render_block(ContextBlock("  Some text.  ", id="doc-1"))
    assert rendered == "[doc-1]\nSome text.\n\n"


def test_a_block_renders_to_the_same_bytes_at_any_position(tokenizer: Tokenizer) -> None:
    target = ContextBlock("The target passage.", id="target")
    others = [ContextBlock(f"Filler passage {i}.", id=f"f{i}") for i in range(3)]
    config = PilotConfig(reorder=False)
    first = ContextPilot(config, tokenizer=tokenizer).optimize([target, *others], "q")
    last = ContextPilot(config, tokenizer=tokenizer).optimize([*others, target], "q")
    assert first.boundaries[0].block_id == "target"
    assert last.boundaries[-1].block_id == "target"

    def target_text(prompt: Prompt) -> str:
        boundary = next(b for b in prompt.boundaries if b.block_id == "target")
        content = prompt.messages[boundary.message_index]["content"]
        return content[boundary.char_start : boundary.char_end]

    assert target_text(first) == target_text(last) == render_block(target)


def test_the_registry_remembers_which_recent_requests_carried_each_block() -> None:
    from contextpilot_rag.blocks import BlockRegistry

    registry = BlockRegistry(len, window=3)
    registry.count_carried(["a", "b"])
    registry.count_carried(["b", "c", "b"])  # a repeat counts once
    registry.count_carried(["a", "c"])
    assert (registry.together("a") & registry.together("c")).bit_count() == 1
    assert registry.together("b").bit_count() == 2
    assert registry.recent == 3
    registry.count_carried(["d"])  # the oldest request, the first, is forgotten
    assert [registry.together(key).bit_count() for key in "abcd"] == [1, 1, 2, 1]
    assert registry.recent == 3  # the window's size, once full
    registry.count_carried(["d"])
    registry.count_carried(["d"])
    # only the window's requests are held: nothing of the forgotten ones remains
    assert [registry.together(key) for key in "abc"] == [0, 0, 0]
    assert len(registry._together) == 1  # the bound is the point
    assert registry.popularity("a") == 2  # popularity counts are not windowed


def test_a_registry_without_a_window_remembers_no_requests() -> None:
    from contextpilot_rag.blocks import BlockRegistry

    registry = BlockRegistry(len)
    registry.count_carried(["a", "b"])
    assert registry.together("a") == 0 and registry.popularity("a") == 1
    assert registry.recent == 0


@pytest.mark.parametrize("window", [-1, 1.5, True, "8"])
def test_a_bad_window_is_a_config_error(window: object) -> None:
    from contextpilot_rag import ConfigError
    from contextpilot_rag.blocks import BlockRegistry

    with pytest.raises(ConfigError, match="window"):
        BlockRegistry(len, window=window)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="together_window"):
        PilotConfig(together_window=window)  # type: ignore[arg-type]


def test_an_id_longer_than_an_id_may_be_is_refused_without_being_quoted_whole() -> None:
    from contextpilot_rag.blocks import MAX_ID_CHARS

    ContextBlock("text", id="u" * MAX_ID_CHARS)  # a long URL fits
    with pytest.raises(InvalidBlockError, match="over the 4,096") as refused:
        ContextBlock("text", id="u" * 10_000_000)
    assert len(str(refused.value)) < 200
    with pytest.raises(InvalidBlockError) as refused:
        ContextBlock("text", id=b"x" * 10_000_000)  # type: ignore[arg-type]
    assert len(str(refused.value)) < 200


def test_a_conversation_id_longer_than_an_id_may_be_is_refused_before_any_state(
    tokenizer: Tokenizer,
) -> None:
    from contextpilot_rag import InvalidInputError

    pilot = ContextPilot(tokenizer=tokenizer)
    with pytest.raises(InvalidInputError, match="conversation_id has") as refused:
        pilot.optimize([ContextBlock("text", id="a")], "q", conversation_id="c" * 10_000_000)
    assert len(str(refused.value)) < 200
    assert pilot.index_stats().requests == 0
