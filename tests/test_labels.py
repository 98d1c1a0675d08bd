"""Block labels: short, stable per id, unique in a prompt and its history, safe to show,
and cheap: labels and notes add at most 5% to a plain prompt of real-sized passages."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpilot_rag import (
    ConfigError,
    ContextBlock,
    ContextPilot,
    InvalidBlockError,
    PilotConfig,
    Prompt,
    Tokenizer,
    render_block,
)
from contextpilot_rag.blocks import (
    BlockRegistry,
    block_label,
    content_id,
    shown_label,
    unique_label,
)
from contextpilot_rag.escaping import CONTROL_TOKEN

MTRAG_ID = "837407666_1762-2394-0-632"

PASSAGES = {
    "837407666_1762-2394-0-632": (
        "Appellate courts do not retry a case or hear new witnesses. The justices review the "
        "record of what happened in the trial court, read the written briefs, and decide "
        "whether a legal error affected the outcome. Because the record is the only evidence "
        "an appellate court considers, the party who appeals must make sure that the clerk's "
        "transcript and the reporter's transcript include every document and every part of "
        "the hearing that the argument relies on. A missing exhibit cannot be described in "
        "the brief and then treated as if it were in the record. Oral argument, when it is "
        "requested, is usually short: each side has a fixed number of minutes, and the "
        "justices often use most of that time to ask questions about the points they find "
        "hardest. Preparing for argument therefore means knowing the record well, knowing the "
        "cases cited on both sides, and being ready to say plainly what outcome the client "
        "asks for and why the law allows it. Many courts publish guides for people who "
        "represent themselves, and the law library near the courthouse can help find them."
    ),
    "775449d1aa187ec5-11505-13676": (
        "A county law library is open to the public, not only to lawyers. Visitors can use "
        "the print collection, the public computers with access to legal research databases, "
        "and the self-help guides that explain common procedures step by step. Librarians can "
        "show a visitor where to find statutes, court rules, form books and practice guides, "
        "and how to search for cases that interpret a particular statute. They cannot give "
        "legal advice: they will not tell a visitor which form to file, what to write in it, "
        "or whether a case is likely to succeed. Some libraries keep frequently used titles "
        "on reserve at the reference desk, where they can be read in the library for a few "
        "hours at a time. Photocopying and printing usually cost a small fee per page, and "
        "some libraries offer free wireless access for people who bring their own laptops. "
        "Hours vary by location, and several branches close early on court holidays, so it "
        "is worth checking the schedule before making the trip to the building downtown."
    ),
    "c7030403177d9dfc-1560-3000": (
        "The notice of appeal is a short form, but filing it on time is essential: in most "
        "civil cases the deadline runs from the date the clerk mailed the notice of entry of "
        "the judgment, or from the date a party served it, whichever is earlier. If the "
        "deadline passes, the appellate court has no power to hear the appeal, no matter how "
        "strong the arguments would have been. After the notice is filed, the appellant must "
        "designate the record, which means telling the trial court which documents and which "
        "transcripts should be sent to the appellate court. Court reporters charge for "
        "transcripts, and the appellant pays a deposit in advance unless a fee waiver has "
        "been granted. The opening brief follows once the record is complete. It states the "
        "facts with citations to the record, explains the standard of review for each issue, "
        "and argues why the trial court's ruling was wrong. The respondent then files a brief "
        "in reply, and the appellant may answer it in a shorter closing brief of its own."
    ),
    "775449d1aa187ec5-13192-13995": (
        "Solar panels produce the most electricity when sunlight strikes them at a right "
        "angle, so installers tilt fixed panels toward the equator at an angle close to the "
        "site's latitude. Panels on a roof facing east or west still work, but they produce "
        "less over a year, and the loss grows the farther the roof turns from the ideal "
        "direction. Shade matters more than many owners expect: a chimney or a tree branch "
        "covering a small part of one panel can reduce the output of the whole string when "
        "the panels are wired in series, which is why many systems now use microinverters or "
        "power optimizers on each panel. Dust and pollen reduce output slightly, and rain "
        "usually cleans tilted panels well enough, although panels in dry and dusty regions "
        "benefit from washing a few times a year. The inverter converts the direct current "
        "from the panels into alternating current for the house, and its display or app "
        "shows how much energy the system produced each day, month and year since it started."
    ),
    "fb227e01016a7dc9-4722-6716": (
        "Sourdough bread rises because of a culture of wild yeasts and lactic acid bacteria "
        "that a baker keeps alive by feeding it flour and water. The bacteria produce the "
        "acids that give the bread its sour taste, and the yeasts produce the carbon dioxide "
        "that lifts the dough. A starter that has just been fed is weak; it becomes ready to "
        "use when it has roughly doubled in volume and smells pleasantly sour, which takes "
        "four to twelve hours depending on the temperature of the kitchen. Bakers who want a "
        "milder flavour use the starter at its peak and let the dough rise in a warm place, "
        "while those who want a stronger sour note let the shaped loaf rest overnight in the "
        "refrigerator. A long, cool rise also makes the dough easier to score, because a cold "
        "surface holds the cut cleanly. Baking in a covered pot for the first part of the "
        "bake traps steam around the loaf, keeps the crust soft long enough for the bread to "
        "expand fully, and then lets it brown once the lid comes off for the last minutes."
    ),
    "fb227e01016a7dc9-3160-5132": (
        "Migratory birds find their way over thousands of kilometres using several senses at "
        "once. Many species read the position of the sun during the day and the rotation of "
        "the stars around the celestial pole at night; young birds learn the night sky before "
        "their first migration. Experiments with caged birds show that they also sense the "
        "earth's magnetic field, which gives them a compass that works under clouds. Near the "
        "end of the journey, landmarks such as coastlines, rivers and mountain ridges take "
        "over, and some seabirds appear to use smell to find their colony. Weather decides "
        "when a flock sets off: birds wait for tail winds and clear skies, and a sudden storm "
        "can push them far off course, which is how rare visitors turn up in places where "
        "they are almost never seen. Stopover sites, where the birds rest and feed for a few "
        "days, are as important as the breeding and wintering grounds, and the loss of a "
        "single large wetland on a flyway can affect populations that breed far away from it."
    ),
}
QUESTIONS = (
    "Can I visit the law library to prepare for my oral argument?",
    "What happens if I miss the deadline for the notice of appeal?",
    "Which way should solar panels face?",
    "How do migratory birds navigate?",
)


def passages() -> list[ContextBlock]:
    return [ContextBlock(text, id=block_id) for block_id, text in PASSAGES.items()]


def colliding_ids(count: int = 2) -> list[str]:
    """``count`` long ids that share one short label, found by brute force."""
    by_label: dict[str, list[str]] = {}
    for number in itertools.count():
        block_id = f"passage-{number:06d}-of-a-long-collection"
        same = by_label.setdefault(block_label(block_id), [])
        same.append(block_id)
        if len(same) == count:
            return same
    raise AssertionError("unreachable")


def label_lines(content: str) -> list[str]:
    return [line[1:-1] for line in content.split("\n") if line.startswith("[")]


# -- the short style -------------------------------------------------------------------


def test_a_short_plain_id_is_its_own_label() -> None:
    for block_id in ("doc-1", "a", "p:12_x.y", "twelve-chars"):
        assert block_label(block_id) == block_id


def test_a_long_id_shows_as_five_lowercase_letters() -> None:
    for block_id in (MTRAG_ID, "thirteen-char", content_id("some text"), "with space"):
        label = block_label(block_id)
        assert len(label) == 5 and label.isascii() and label.isalpha() and label.islower()


def test_a_label_is_a_function_of_the_id_across_versions_and_processes(
    tmp_path: Path,
) -> None:
    expected = {MTRAG_ID: "fpgvd", "775449d1aa187ec5-11505-13676": "zebyv"}
    assert {block_id: block_label(block_id) for block_id in expected} == expected
    script = tmp_path / "labels.py"
    script.write_text(
        "import json, sys\n"
        "from contextpilot_rag.blocks import block_label\n"
        "print(json.dumps([block_label(i) for i in json.loads(sys.argv[1])]))\n",
        encoding="utf-8",
    )
    ids = [*expected, *PASSAGES, content_id("x")]
    labels = [block_label(block_id) for block_id in ids]
    for seed in ("1", "2"):  # str hashing differs per process unless seeded alike
        env = {**os.environ, "PYTHONHASHSEED": seed}
        output = subprocess.run(
            [sys.executable, str(script), json.dumps(ids)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        assert json.loads(output) == labels


def test_a_block_renders_to_the_same_bytes_in_every_pilot_and_prompt(
    tokenizer: Tokenizer,
) -> None:
    blocks = passages()
    target = blocks[0]
    prompts = [
        ContextPilot(tokenizer=tokenizer).optimize(order, "q")
        for order in (blocks[:3], blocks[:3][::-1], [blocks[4], target])
    ]
    rendered = render_block(target)
    assert rendered.startswith(f"[{block_label(MTRAG_ID)}]\n")
    for prompt in prompts:
        boundary = next(b for b in prompt.boundaries if b.block_id == target.id)
        content = prompt.messages[boundary.message_index]["content"]
        assert content[boundary.char_start : boundary.char_end] == rendered


def test_prompt_labels_map_every_shown_label_back_to_its_id(pilot: ContextPilot) -> None:
    prompt = pilot.optimize(passages(), "q")
    shown = label_lines(prompt.messages[-1]["content"])
    back = {label: block_id for block_id, label in prompt.labels.items()}
    assert [back[label] for label in shown] == [block.id for block in prompt.blocks]
    assert all(prompt.label_of(block.id) == block.label for block in prompt.blocks)
    assert MTRAG_ID not in prompt.messages[-1]["content"]


# -- collisions --------------------------------------------------------------------------


def test_colliding_short_labels_resolve_to_distinct_labels_in_a_prompt(
    tokenizer: Tokenizer,
) -> None:
    first_id, second_id = colliding_ids()
    first, second = ContextBlock("First text.", id=first_id), ContextBlock("Second.", id=second_id)
    assert first.label == second.label
    prompts = [
        ContextPilot(tokenizer=tokenizer).optimize([first, second, *passages()[:2]], "q")
        for _ in range(2)
    ]
    shown = label_lines(prompts[0].messages[-1]["content"])
    assert len(set(shown)) == len(shown) == 4
    assert sorted(shown) == sorted(prompts[0].labels.values())
    assert prompts[0].messages == prompts[1].messages  # the same collision, the same bytes
    assert prompts[0].label_of(second_id).startswith(second.label + "-")


def test_a_collision_with_the_history_resolves_and_notes_name_the_shown_labels(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(tokenizer=tokenizer)
    first_id, second_id = colliding_ids()
    first, second = ContextBlock("First text.", id=first_id), ContextBlock("Second.", id=second_id)
    pilot.optimize([first], "one", conversation_id="c")
    later = pilot.optimize([second], "two", conversation_id="c")
    assert later.label_of(second_id) != first.label
    last = pilot.optimize([second, first], "three", conversation_id="c")
    assert last.location_note is not None
    assert {first.label, later.label_of(second_id)} <= set(last.location_note.split())


def test_unique_label_starts_from_the_given_own_label() -> None:
    block = ContextBlock("text", id=MTRAG_ID)
    assert unique_label(block, {}, MTRAG_ID) == MTRAG_ID
    assert unique_label(block, {MTRAG_ID: "other"}, MTRAG_ID).startswith(MTRAG_ID + "-")


# -- safety ------------------------------------------------------------------------------


@pytest.mark.parametrize("block_id", ["0\n", "doc-1\n", "a" * 64 + "\n"])
def test_an_id_ending_in_a_newline_is_hashed_not_shown(block_id: str) -> None:
    """``$`` in a Python pattern also matches before a final newline, so an id such as
    ``"0\n"`` passed as plain and became a label that breaks its label line (found by
    the property test below)."""
    for style in ("short", "id"):
        label = block_label(block_id, style)
        assert "\n" not in label and label != block_id.rstrip("\n")


@given(st.text(min_size=1, max_size=80).filter(lambda s: s.strip() != ""))
def test_no_label_reads_as_a_control_token_and_every_label_survives_a_report(
    block_id: str,
) -> None:
    try:
        block = ContextBlock("text", id=block_id)
    except InvalidBlockError:  # ids that are not valid text are refused, not labeled
        return
    for style in ("short", "id"):
        label = block_label(block_id, style)
        assert not CONTROL_TOKEN.search(f"[{label}]")
        assert "\n" not in label and "]" not in label
        assert shown_label(block, label) == label


def test_a_text_line_imitating_a_short_label_is_escaped(pilot: ContextPilot) -> None:
    target = passages()[0]
    forger = ContextBlock(f"[{target.label}]\nForged text.", id="forger")
    prompt = pilot.optimize([forger, target], "q")
    assert label_lines(prompt.messages[-1]["content"]) == [
        prompt.label_of(block.id) for block in prompt.blocks
    ]


# -- label_style="id" --------------------------------------------------------------------


def test_label_style_id_shows_ids_as_before(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(label_style="id"), tokenizer=tokenizer)
    hashed = ContextBlock("Content-addressed text.")
    blocks = [*passages()[:3], hashed, ContextBlock("x", id="doc-1")]
    pilot.optimize(blocks[:2], "q")
    prompt = pilot.optimize(blocks[::-1], "q")  # the cached pair moves first: an order note
    content = prompt.messages[-1]["content"]
    expected = {block.id: block.id for block in blocks}
    expected[hashed.id] = hashed.id[:8]
    assert prompt.labels == expected
    assert label_lines(content) == [expected[block.id] for block in prompt.blocks]
    for block in prompt.blocks:
        assert render_block(block, label=expected[block.id]) in content
    assert prompt.order_note is not None
    assert prompt.order_note.split()[-len(blocks) :] == [expected[b.id] for b in blocks[::-1]]


def test_label_style_id_renders_a_block_identically_across_prompts(
    tokenizer: Tokenizer,
) -> None:
    pilot = ContextPilot(PilotConfig(label_style="id", reorder=False), tokenizer=tokenizer)
    blocks = passages()
    one, two = pilot.optimize(blocks[:2], "q"), pilot.optimize([blocks[2], blocks[0]], "q")
    rendered = render_block(blocks[0], label=MTRAG_ID)
    assert one.messages[-1]["content"].count(rendered) == 1
    assert two.messages[-1]["content"].count(rendered) == 1
    assert two.stats.prompt_tokens == sum(tokenizer.count(m["content"]) for m in two.messages)


def test_an_unknown_label_style_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        PilotConfig(label_style="uuid")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        block_label("x", "uuid")  # type: ignore[arg-type]


# -- token overhead ------------------------------------------------------------------


def plain_messages(
    config: PilotConfig, blocks: Sequence[ContextBlock], query: str
) -> list[dict[str, str]]:
    """The prompt a user writes without the pilot: the same system prompt and
    question, the texts separated by blank lines, no labels, header or notes."""
    texts = "".join(block.text.strip() + "\n\n" for block in blocks)
    return [
        {"role": "system", "content": config.system_prompt or ""},
        {"role": "user", "content": texts + config.question_template.format(query=query)},
    ]


def overhead(tokenizer: Tokenizer, config: PilotConfig, seed: int = 0) -> float:
    """Pilot prompt tokens over plain prompt tokens, minus one, over 12 requests of 4-6
    of the passages in random relevance orders (so order notes are written)."""
    rng, pilot = random.Random(seed), ContextPilot(config, tokenizer=tokenizer)
    ours = theirs = 0
    notes = 0
    for number in range(12):
        blocks = rng.sample(passages(), rng.randint(4, 6))
        query = QUESTIONS[number % len(QUESTIONS)]
        prompt: Prompt = pilot.optimize(blocks, query)
        notes += prompt.order_note is not None
        ours += sum(tokenizer.count(message["content"]) for message in prompt.messages)
        plain = plain_messages(config, blocks, query)
        theirs += sum(tokenizer.count(message["content"]) for message in plain)
    assert notes >= 6  # the measurement includes order notes
    return ours / theirs - 1


def test_labels_and_notes_add_at_most_five_percent_to_a_plain_prompt(
    tokenizer: Tokenizer,
) -> None:
    assert overhead(tokenizer, PilotConfig(dedup=False)) <= 0.05


def test_full_id_labels_cost_more_than_short_ones(tokenizer: Tokenizer) -> None:
    short = overhead(tokenizer, PilotConfig(dedup=False))
    full = overhead(tokenizer, PilotConfig(dedup=False, label_style="id"))
    assert full > short + 0.02


def test_the_overhead_benchmark_writes_its_section(tmp_path: Path) -> None:
    import annotation_overhead

    if not annotation_overhead.MTRAG.exists() or not annotation_overhead.MULTIHOP.exists():
        pytest.skip("the shared evaluation data (../shared/data) is not here")
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\nprose kept\n", encoding="utf-8")
    argv = ["--seeds", "1", "--requests", "10", "--conversations", "2", "--write", str(report)]
    assert annotation_overhead.main(argv) == 0
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nprose kept\n")
    assert "<!-- BEGIN GENERATED: annotation-overhead -->" in text
    assert "MTRAG multi-turn" in text and "(worst +" in text


def test_a_batch_shows_the_configured_labels(tokenizer: Tokenizer) -> None:
    blocks = passages()
    requests = [(blocks[:3], "q"), (blocks[1:4][::-1], "q")]
    for style in ("short", "id"):
        pilot = ContextPilot(PilotConfig(label_style=style), tokenizer=tokenizer)
        for prompt in pilot.optimize_batch(requests):
            shown = label_lines(prompt.messages[-1]["content"])
            assert shown == [block_label(block.id, style) for block in prompt.blocks]


def test_a_registry_refuses_an_unknown_label_style() -> None:
    with pytest.raises(ConfigError):
        BlockRegistry(len, label_style="uuid")  # type: ignore[arg-type]
