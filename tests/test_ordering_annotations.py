"""Specification of reordering (Alg. 2) and of the order and location notes."""

from __future__ import annotations

import pytest

from contextpilot_rag import (
    ConfigError,
    ContextBlock,
    ContextPilot,
    NoteTemplates,
    PilotConfig,
    Tokenizer,
    ordering,
)
from contextpilot_rag.annotations import location_note, order_note
from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.ordering import reorder_for_prefix

TEMPLATES = NoteTemplates()


def doc(name: str) -> ContextBlock:
    return ContextBlock(f"Document {name} says that fact {name} holds.", id=name)


A, B, C, D, E = (doc(name) for name in "abcde")
X, Y, Z = (doc(name) for name in "xyz")


def ids(blocks: tuple[ContextBlock, ...]) -> list[str]:
    return [block.id for block in blocks]


# -- reorder_for_prefix ---------------------------------------------------------------


def test_matched_blocks_come_first_in_cached_order() -> None:
    result = reorder_for_prefix([A, B, C, D], ["c", "a"], remainder="retrieval")
    assert ids(result) == ["c", "a", "b", "d"]


def test_matched_ids_outside_the_request_are_skipped() -> None:
    result = reorder_for_prefix([A, B, C], ["sys", "c", "tail"], remainder="retrieval")
    assert ids(result) == ["c", "a", "b"]


@pytest.mark.parametrize("matched", [["a"], []])
def test_a_repeated_block_is_refused_rather_than_lost_or_kept_twice(matched: list[str]) -> None:
    with pytest.raises(InvalidInputError, match="distinct"):
        reorder_for_prefix([A, B, A], matched, remainder="retrieval")


def test_remainder_follows_popularity_most_popular_first() -> None:
    popularity = {"b": 2, "d": 5}.get
    result = reorder_for_prefix(
        [A, B, C, D], ["a"], remainder="popularity", popularity=lambda i: popularity(i, 0)
    )
    assert ids(result) == ["a", "d", "b", "c"]


def test_popular_ties_are_broken_by_block_id() -> None:
    # Equal counts (of blocks seen often enough) sort by id, not by retrieval order,
    # so two requests holding the same tied blocks in different orders start them alike.
    counts = {"a": 0, "b": 2, "c": 0, "d": 2, "e": 0}
    first = reorder_for_prefix(
        [E, D, C, B, A], [], remainder="popularity", popularity=counts.__getitem__
    )
    second = reorder_for_prefix(
        [C, D, B, E, A], [], remainder="popularity", popularity=counts.__getitem__
    )
    assert ids(first)[:2] == ids(second)[:2] == ["b", "d"]


def test_blocks_seen_once_keep_the_retrievers_order_after_popular_ones() -> None:
    # One earlier request says nothing about sharing: such blocks follow the popular
    # ones in the order the retriever ranked them (not by count, not by id).
    counts = {"a": 1, "b": 0, "c": 3, "d": 1, "e": 0}
    result = reorder_for_prefix(
        [E, D, C, B, A], [], remainder="popularity", popularity=counts.__getitem__
    )
    assert ids(result) == ["c", "e", "d", "b", "a"]


def _weighed(counts: dict[str, int], tokens: dict[str, int] | None) -> list[str]:
    """E, D, C, B, A (retrieval order) reordered by ``counts`` weighed by ``tokens``."""
    return ids(
        reorder_for_prefix(
            [E, D, C, B, A],
            [],
            remainder="popularity",
            popularity=counts.__getitem__,
            tokens=None if tokens is None else tokens.__getitem__,
        )
    )


def test_popularity_is_weighed_by_tokens() -> None:
    # b: 3 requests x 100 tokens outweighs d: 5 x 40; c (2 x 100) outweighs d too;
    # blocks seen once stay after the popular ones whatever their length.
    counts = {"a": 1, "b": 3, "c": 2, "d": 5, "e": 0}
    tokens = {"a": 1000, "b": 100, "c": 100, "d": 40, "e": 10}
    assert _weighed(counts, tokens) == ["b", "c", "d", "e", "a"]
    assert _weighed(counts, None) == ["d", "b", "c", "e", "a"]


def test_equal_weights_tie_by_block_id() -> None:
    counts = {"a": 0, "b": 4, "c": 0, "d": 2, "e": 0}
    tokens = {"a": 5, "b": 50, "c": 5, "d": 100, "e": 5}
    result = _weighed(counts, tokens)
    assert result[:2] == ["b", "d"]  # 200 tokens each


def test_the_pilot_puts_the_longer_of_two_equally_popular_blocks_first(
    tokenizer: Tokenizer,
) -> None:
    # ids tie the other way: by count alone "a-short" would go first
    short = ContextBlock("Short note.", id="a-short")
    long = ContextBlock("A long passage of many words. " * 20, id="b-long")
    pilot = ContextPilot(tokenizer=tokenizer)
    for number in range(2):
        pilot.optimize([ContextBlock(f"Filler {number}.", id=f"f{number}"), short, long], "Q?")
    prompt = pilot.optimize([short, long, ContextBlock("New.", id="new")], "Q?")
    assert [block.id for block in prompt.blocks][:2] == ["b-long", "a-short"]


def _carried_by(requests: list[str]) -> dict[str, int]:
    """Per block, the bits of the recent requests (strings of block names) carrying it."""
    bits: dict[str, int] = {}
    for number, request in enumerate(requests):
        for name in request:
            bits[name] = bits.get(name, 0) | 1 << number
    return bits


def _follow(
    requests: list[str], matched: list[str], tokens: dict[str, int] | None = None
) -> tuple[list[str], list[str]]:
    """A, B, C, D reordered after ``matched`` with and without what ``requests`` (the
    recent ones) carried together; popularity counted over the same requests."""
    together = _carried_by(requests)
    popularity = {name: together.get(name, 0).bit_count() for name in "abcd"}
    options = {
        "popularity": popularity.__getitem__,
        "tokens": None if tokens is None else tokens.__getitem__,
    }
    followed = reorder_for_prefix(
        [A, B, C, D],
        matched,
        together=lambda i: together.get(i, 0),
        recent=len(requests),
        **options,  # type: ignore[arg-type]
    )
    alone = reorder_for_prefix([A, B, C, D], matched, **options)  # type: ignore[arg-type]
    return ids(followed), ids(alone)


def test_blocks_carried_with_the_matched_prefix_follow_it_before_popular_ones() -> None:
    # c came in 3 of the 4 recent requests with a and in none of the other 8; d is more
    # popular (7 requests) but came with a in 2: after the matched a, c goes first
    requests = ["ac", "acd", "ac", "ad", "de", "de", "bd", "d", "d", "e", "b", "e"]
    followed, alone = _follow(requests, ["a"])
    assert followed == ["a", "c", "d", "b"]
    assert alone == ["a", "d", "c", "b"]


def test_a_weak_tie_to_the_matched_prefix_leaves_the_popularity_order() -> None:
    # c came with a in 2 of 4 requests (under FOLLOW_SHARE): popularity decides
    followed, alone = _follow(["ac", "ac", "ad", "ab", "de", "de", "d"], ["a"])
    assert followed == alone == ["a", "d", "c", "b"]


def test_a_block_most_requests_carry_does_not_follow_a_prefix_for_coming_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every request with a carried b, but so did 7 of all 9: b comes with anything, and
    # the longer c (weighed by its tokens) keeps its place ahead of it
    requests = ["ab", "ab", "ab", "bc", "bc", "bc", "bc", "c", "c"]
    tokens = {"a": 10, "b": 10, "c": 100, "d": 10}
    assert _follow(requests, ["a"], tokens) == (["a", "c", "b", "d"], ["a", "c", "b", "d"])
    monkeypatch.setattr(ordering, "FOLLOW_LIFT", 0)
    assert _follow(requests, ["a"], tokens)[0] == ["a", "b", "c", "d"]


def test_without_a_matched_prefix_nothing_follows_together() -> None:
    followed, alone = _follow(["cb", "cb", "cb", "d", "d", "d", "d", "a", "a", "a"], [])
    assert followed == alone == ["d", "a", "b", "c"]


def _last_order(tokenizer: Tokenizer, window: int, filler_tenant: str | None = None) -> list[str]:
    """The order of [d, z, x] after the requests the test below describes, four of them
    (one new block each) sent under ``filler_tenant``, or left out with ``"-"``."""
    pilot = ContextPilot(PilotConfig(together_window=window), tokenizer=tokenizer)
    for blocks in ([Z, C, X], [X, Z, A, C], [B, D], [Y, D]):
        pilot.optimize(blocks, "Q?")
    if filler_tenant != "-":
        for number in range(4):
            pilot.optimize([doc(f"f{number}")], "Q?", tenant=filler_tenant)
    return ids(pilot.optimize([D, Z, X], "Q?").blocks)


def test_the_pilot_orders_what_follows_the_matched_prefix_by_what_came_with_it(
    tokenizer: Tokenizer,
) -> None:
    # The two earlier requests with z cached the path z, c, x (c and x were new, so
    # the retriever's order stood), those with d the paths b, d and y, d; four more
    # carried one new block each. The last request has z, d and x but not c: it
    # matches z alone, and d and x were carried by two of the eight requests each.
    # Popularity alone ties them and puts d first (by id); both requests that carried z
    # carried x too, so x follows z and the next request with z and x reads both.
    assert _last_order(tokenizer, 1024) == ["z", "x", "d"]
    assert _last_order(tokenizer, 0) == ["z", "d", "x"]
    # without the four others x came with a third of the requests, as often as with z
    # (FOLLOW_LIFT): no tie beyond popularity
    assert _last_order(tokenizer, 1024, "-") == ["z", "d", "x"]


def test_a_tenants_requests_do_not_change_what_follows_for_requests_without_one(
    tokenizer: Tokenizer,
) -> None:
    # the four others sent by a tenant: requests without a tenant are ordered as if
    # they had not been (each tenant's order uses popularity alone)
    assert _last_order(tokenizer, 1024, "acme") == _last_order(tokenizer, 1024, "-")


def test_retrieval_remainder_ignores_popularity() -> None:
    result = reorder_for_prefix([A, B, C, D], ["b"], remainder="retrieval", popularity={"d": 9}.get)
    assert ids(result) == ["b", "a", "c", "d"]


def test_without_popularity_the_remainder_keeps_retrieval_order() -> None:
    assert ids(reorder_for_prefix([C, A, B], [])) == ["c", "a", "b"]


def test_reorder_is_a_permutation_of_its_input() -> None:
    result = reorder_for_prefix([E, A, D, B, C], ["b", "x", "e"], popularity=lambda _: 0)
    assert sorted(ids(result)) == ["a", "b", "c", "d", "e"]
    assert len(result) == 5


# -- notes ----------------------------------------------------------------------------


def test_no_order_note_when_nothing_moved() -> None:
    assert order_note([A, B, C], [A, B, C], TEMPLATES) is None


def test_no_order_note_when_the_shown_subset_keeps_relative_order() -> None:
    assert order_note([A, B, C], [A, C], TEMPLATES) is None


def test_order_note_lists_the_original_ranking_by_label() -> None:
    note = order_note([A, B, C], [C, A, B], TEMPLATES)
    assert note is not None
    assert note == "Most relevant first: a b c"


def test_location_note_names_each_block_by_label_earliest_turn_first() -> None:
    note = location_note([(C, 2), (A, 0), (B, 2)], TEMPLATES)
    assert note == "Also relevant, shown in earlier turns: a c b"


def test_location_note_can_name_the_one_based_turn_of_each_group() -> None:
    templates = NoteTemplates(location_group="{labels} (turn {turn})", group_separator="; ")
    note = location_note([(C, 2), (A, 0), (B, 2)], templates)
    assert note == "Also relevant, shown in earlier turns: a (turn 1); c b (turn 3)"


def test_no_location_note_without_deduplicated_blocks() -> None:
    assert location_note([], TEMPLATES) is None


def test_custom_templates_shape_the_notes() -> None:
    templates = NoteTemplates(
        order="RANKING {labels}",
        location="SEE {groups}",
        location_group="{labels}@{turn}",
        separator=" ",
        group_separator=" | ",
    )
    assert order_note([A, B], [B, A], templates) == "RANKING a b"
    assert location_note([(A, 0), (B, 1), (C, 1)], templates) == "SEE a@1 | b c@2"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"order": "no placeholder"},
        {"location": "no groups here"},
        {"location_group": "turn {turn} only"},
        {"separator": None},
        {"order": None},
    ],
)
def test_template_missing_a_placeholder_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        NoteTemplates(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"order": "{labels} {unknown}"},
        {"location": "{groups} {0}"},
        {"location_group": "{labels} {turn"},
    ],
)
def test_template_with_an_unknown_placeholder_is_a_config_error(
    kwargs: dict[str, object],
) -> None:
    with pytest.raises(ConfigError):
        NoteTemplates(**kwargs)  # type: ignore[arg-type]


# -- notes in the prompt --------------------------------------------------------------


def last_message(pilot: ContextPilot, blocks: list[ContextBlock], **kwargs: str) -> str:
    return pilot.optimize(blocks, "what holds?", **kwargs).messages[-1]["content"]


def test_prompt_has_no_order_note_when_retrieval_order_is_kept(pilot: ContextPilot) -> None:
    content = last_message(pilot, [A, B, C])
    assert "Most relevant first" not in content


def test_prompt_gets_an_order_note_when_blocks_moved(pilot: ContextPilot) -> None:
    pilot.optimize([A, B, C], "first")
    prompt = pilot.optimize([C, B, A, D], "second")
    assert ids(prompt.blocks)[:3] == ["a", "b", "c"]
    assert "Most relevant first: c b a d" in prompt.messages[-1]["content"]


def test_notes_follow_all_blocks_in_the_user_message(pilot: ContextPilot) -> None:
    pilot.optimize([E], "makes e the cached prefix, so it moves to the front")
    first = pilot.optimize([A, B, E], "turn one", conversation_id="conv")
    pilot.record_answer("conv", "answer one")
    second = pilot.optimize([C, B, D, A], "turn two", conversation_id="conv")
    for prompt, note in ((first, "Most relevant first"), (second, "shown in earlier turns: b a")):
        content = prompt.messages[-1]["content"]
        blocks_end = prompt.boundaries[-1].char_end
        assert note in content[blocks_end:]
        assert note not in content[:blocks_end]


def test_after_history_the_remainder_keeps_retrieval_order(pilot: ContextPilot) -> None:
    # Nothing after a conversation's history is shared with other requests, so the new
    # blocks keep the retriever's order; the one the history holds ranks last, so the
    # prompt read in order (blocks, then the location note) is the ranking: no order note.
    pilot.optimize([D, C], "makes d and c popular")
    pilot.optimize([A], "turn one", conversation_id="conv")
    pilot.record_answer("conv", "answer one")
    prompt = pilot.optimize([B, C, D, A], "turn two", conversation_id="conv")
    assert ids(prompt.blocks) == ["b", "c", "d"]
    assert prompt.notes == ("Also relevant, shown in earlier turns: a",)


def test_a_deduplicated_block_that_outranks_a_sent_one_keeps_its_rank(
    pilot: ContextPilot,
) -> None:
    # The sent blocks keep their relative order, but the history's block ranked above
    # d: without an order note the prompt would not say so.
    pilot.optimize([A], "turn one", conversation_id="conv")
    pilot.record_answer("conv", "answer one")
    prompt = pilot.optimize([B, C, A, D], "turn two", conversation_id="conv")
    assert ids(prompt.blocks) == ["b", "c", "d"]
    assert prompt.notes == (
        "Most relevant first: b c a d",
        "Also relevant, shown in earlier turns: a",
    )


def test_notes_come_before_the_question(pilot: ContextPilot) -> None:
    pilot.optimize([A, B], "first")
    content = last_message(pilot, [B, A])
    assert content.index("Most relevant first") < content.index("Question: what holds?")
    assert content.endswith("Question: what holds?")


def test_prompt_uses_custom_note_templates(tokenizer: Tokenizer) -> None:
    config = PilotConfig(
        notes=NoteTemplates(order="ORDER {labels}", location="SEEN {groups}", separator=";")
    )
    pilot = ContextPilot(config, tokenizer=tokenizer)
    pilot.optimize([A, B], "one", conversation_id="conv")
    pilot.record_answer("conv", "ok")
    content = last_message(pilot, [C, B, D], conversation_id="conv")
    assert "SEEN b" in content
    pilot.optimize([A, B, C], "other")
    assert "ORDER c;b;a" in last_message(pilot, [C, B, A])


def test_annotate_off_adds_no_notes(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(annotate=False), tokenizer=tokenizer)
    pilot.optimize([A, B], "one")
    prompt = pilot.optimize([B, A], "two")
    content = prompt.messages[-1]["content"]
    assert content[prompt.boundaries[-1].char_end :] == "Question: two"


def test_prompt_exposes_its_notes_as_rendered(pilot: ContextPilot) -> None:
    pilot.optimize([A, B, C], "first")
    prompt = pilot.optimize([C, B, A], "second")
    assert prompt.notes == ("Most relevant first: c b a",)
    assert prompt.messages[-1]["content"].endswith("Most relevant first: c b a\n\nQuestion: second")
    assert pilot.optimize([D], "third").notes == ()
