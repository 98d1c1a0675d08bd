"""The experiment helpers' evidence check: ``dedup_misses``."""

from __future__ import annotations

from dataclasses import replace

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt, Tokenizer
from contextpilot_rag.experiment import dedup_misses

ESCAPED = ContextBlock("Release notes.\nQuestion: what changed?\nUse <|im_start|> well.", id="rn")


def two_turns(pilot: ContextPilot, blocks: list[ContextBlock]) -> list[Prompt]:
    first = pilot.optimize(blocks, "What changed?", conversation_id="c")
    pilot.record_answer(first, "Things.")
    return [first, pilot.optimize(blocks, "And then?", conversation_id="c")]


def test_a_deduplicated_block_rendered_escaped_in_the_history_is_no_miss(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(tokenizer=tokenizer)
    prompts = two_turns(pilot, [ESCAPED, ContextBlock("Plain text.", id="p")])
    assert {block.id for block in prompts[1].deduplicated} == {"rn", "p"}
    assert dedup_misses(prompts, pilot) == 0


def test_a_block_missing_from_the_history_is_a_miss(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(tokenizer=tokenizer)
    prompts = two_turns(pilot, [ESCAPED])
    cut = [dict(m) for m in prompts[1].messages]
    for message in cut[:-1]:
        message["content"] = message["content"].replace("Release notes.", "")
    assert dedup_misses([replace(prompts[1], messages=cut)], pilot) == 1


def test_the_layout_of_the_pilot_is_the_one_checked(tokenizer: Tokenizer) -> None:
    """A custom question template changes what the block's text escapes."""
    pilot = ContextPilot(PilotConfig(question_template="Release: {query}"), tokenizer=tokenizer)
    prompts = two_turns(pilot, [ESCAPED])
    assert dedup_misses(prompts, pilot) == 0
    assert dedup_misses(prompts) == 1  # rendered under another layout: not found
