"""Breakpoints that pay (docs/cloud.md): a write that will not be read back costs
more than no cache, so the planner keeps a candidate only when its expected reads
× the read saving beat the write premium, above the model's minimum, at most 4."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt, Tokenizer
from contextpilot_rag.cloud import (
    ANTHROPIC_RULES,
    OPENAI_RULES,
    Breakpoint,
    CachePlan,
    CloudCacheConfig,
    ProviderRules,
    ReuseCandidate,
    plan_breakpoints,
    rules_for,
)
from contextpilot_rag.cloud.continuation import CHAIN_TURNS, chained_turns
from contextpilot_rag.errors import ConfigError, InvalidInputError
from contextpilot_rag.index import IndexConfig
from contextpilot_rag.sim.provider_cache import TTL_5M_S, AnthropicCacheModel, CacheBlock
from contextpilot_rag.tenants import TenantConfig


def _candidate(
    kind: str = "system", tokens: int = 2000, reads: float = 1.0, **more: int
) -> ReuseCandidate:
    return ReuseCandidate(kind, 0, 0, tokens, reads, **more)  # type: ignore[arg-type]


def test_a_write_nobody_reads_is_skipped() -> None:
    plan = plan_breakpoints([_candidate(reads=0)], ANTHROPIC_RULES)
    assert plan.breakpoints == () and "would not pay" in plan.skipped[0].reason


def test_one_expected_read_pays_for_a_five_minute_write() -> None:
    plan = plan_breakpoints([_candidate(reads=1)], ANTHROPIC_RULES)
    (kept,) = plan.breakpoints
    assert kept.saving_tokens == pytest.approx(2000 * (0.9 - 0.25))


def test_a_one_hour_write_needs_more_reads() -> None:
    assert plan_breakpoints([_candidate(reads=1)], ANTHROPIC_RULES, ttl="1h").breakpoints == ()
    assert plan_breakpoints([_candidate(reads=2)], ANTHROPIC_RULES, ttl="1h").breakpoints


def test_a_prefix_under_the_models_minimum_is_skipped() -> None:
    candidate = _candidate(tokens=2000, reads=5)
    assert plan_breakpoints([candidate], ANTHROPIC_RULES, model="claude-sonnet-4-5").breakpoints
    plan = plan_breakpoints([candidate], ANTHROPIC_RULES, model="claude-haiku-4-5-20251001")
    assert plan.breakpoints == () and "minimum 4096" in plan.skipped[0].reason


def test_a_cached_prefix_is_kept_even_without_later_reads() -> None:
    plan = plan_breakpoints([_candidate(reads=0, cached_tokens=2000)], ANTHROPIC_RULES)
    (kept,) = plan.breakpoints
    assert kept.saving_tokens == pytest.approx(2000 * 0.9)


def test_the_best_end_of_the_shared_blocks_wins() -> None:
    shallow = ReuseCandidate("shared_blocks", 1, 0, 2000, 3.0)
    deep = ReuseCandidate("shared_blocks", 1, 2, 4000, 0.2)
    plan = plan_breakpoints([shallow, deep], ANTHROPIC_RULES)
    assert [kept.candidate for kept in plan.breakpoints] == [shallow]
    assert plan.skipped[0].reason == "another end of it pays more"


def test_spare_breakpoints_go_to_shallower_shared_ends_that_cost_no_write() -> None:
    system = ReuseCandidate("system", 0, 0, 1200, 10.0)
    one = ReuseCandidate("shared_blocks", 1, 0, 1600, 6.0)
    two = ReuseCandidate("shared_blocks", 1, 1, 2000, 5.0)
    three = ReuseCandidate("shared_blocks", 1, 2, 2400, 4.0)
    plan = plan_breakpoints([system, one, two, three], ANTHROPIC_RULES)
    # 2,400 tokens written once; readers sharing one or two blocks read their own end
    assert [kept.candidate for kept in plan.breakpoints] == [system, one, two, three]
    savings = {kept.candidate: kept.saving_tokens for kept in plan.breakpoints}
    assert savings[one] == pytest.approx((6.0 - 5.0) * 0.9 * (1600 - 1200))
    assert savings[two] == pytest.approx((5.0 - 4.0) * 0.9 * (2000 - 1200))
    assert all(
        "no write" in kept.reason for kept in plan.breakpoints if kept.candidate in (one, two)
    )
    assert not plan.skipped


def test_spare_breakpoints_fill_the_budget_below_the_deepest_write_only() -> None:
    system = ReuseCandidate("system", 0, 0, 1200, 10.0)
    one = ReuseCandidate("shared_blocks", 1, 0, 1600, 6.0)
    two = ReuseCandidate("shared_blocks", 1, 1, 2000, 6.0)  # the same readers as one
    three = ReuseCandidate("shared_blocks", 1, 2, 2400, 4.0)
    tail = ReuseCandidate("tail", 1, -1, 2600, 0.9)
    plan = plan_breakpoints([system, one, two, three, tail], ANTHROPIC_RULES)
    # two pays most on its own; the tail writes up to 2,600 anyway, so three is free:
    # its four readers read 400 tokens more than at two; one adds no reader to two's
    assert [kept.candidate for kept in plan.breakpoints] == [system, two, three, tail]
    extra = next(kept for kept in plan.breakpoints if kept.candidate is three)
    assert extra.saving_tokens == pytest.approx(4.0 * 0.9 * (2400 - 2000))
    assert [skipped.candidate for skipped in plan.skipped] == [one]
    # nothing is free past the deepest write: without the tail, three stays out
    plan = plan_breakpoints([system, one, two, three], ANTHROPIC_RULES)
    assert [kept.candidate for kept in plan.breakpoints] == [system, two]


def test_an_end_under_the_minimum_does_not_hide_one_that_pays() -> None:
    short = ReuseCandidate("shared_blocks", 1, 2, 900, 8.0)  # saves more, cannot be cached
    long = ReuseCandidate("shared_blocks", 1, 3, 1100, 2.0)
    plan = plan_breakpoints([short, long], ANTHROPIC_RULES)
    assert [kept.candidate for kept in plan.breakpoints] == [long]
    assert "under the minimum" in plan.skipped[0].reason


def test_never_more_breakpoints_than_the_provider_allows() -> None:
    rules = ProviderRules("strict", max_breakpoints=2)
    candidates = [
        ReuseCandidate(kind, n, 0, 2000 * (n + 1), 5.0)  # type: ignore[arg-type]
        for n, kind in enumerate(("system", "shared_blocks", "history", "tail"))
    ]
    plan = plan_breakpoints(candidates, rules)
    assert len(plan.breakpoints) == 2
    assert sum("over the limit" in skipped.reason for skipped in plan.skipped) == 2
    assert len(plan_breakpoints(candidates, ANTHROPIC_RULES).breakpoints) == 4


def test_without_a_lookback_limit_the_tail_takes_the_historys_read_and_slot() -> None:
    """On OpenAI's breakpoint models a request reads the longest cached prefix before
    any breakpoint: beside a tail, a history breakpoint only spends a slot."""
    candidates = [
        _candidate("system", 2000, 3.0),
        _candidate("history", 5000, 1.0, cached_tokens=4800),
        _candidate("tail", 5400, 1.0),
    ]
    limited = plan_breakpoints(candidates, ANTHROPIC_RULES)  # a lookback of 20 blocks
    assert [kept.kind for kept in limited.breakpoints] == ["system", "history", "tail"]
    gpt56 = rules_for("openai", "gpt-5.6-terra")
    unlimited = plan_breakpoints(candidates, gpt56, ttl="30m")
    assert [kept.kind for kept in unlimited.breakpoints] == ["system", "tail"]
    tail = unlimited.breakpoints[-1]
    assert tail.candidate.cached_tokens == 4800 and "reads 4800 cached tokens" in tail.reason
    saved = [kept.saving_tokens for kept in limited.breakpoints]
    assert tail.saving_tokens == pytest.approx(saved[1] + saved[2])  # nothing lost
    assert [s.candidate.kind for s in unlimited.skipped] == ["history"]
    assert "no lookback limit" in unlimited.skipped[0].reason
    alone = plan_breakpoints(candidates[:2], gpt56, ttl="30m")
    assert [kept.kind for kept in alone.breakpoints] == ["system", "history"]  # it reads


def test_openai_rules_place_no_breakpoints() -> None:
    plan = plan_breakpoints([_candidate(reads=9)], OPENAI_RULES)
    assert plan.breakpoints == () and "automatically" in plan.skipped[0].reason


def test_rules_are_data_with_per_model_minimums() -> None:
    assert rules_for("anthropic") is ANTHROPIC_RULES
    assert ANTHROPIC_RULES.min_tokens("claude-opus-4-1-20250805") == 1024
    assert ANTHROPIC_RULES.min_tokens("claude-3-5-haiku-20241022") == 2048
    assert ANTHROPIC_RULES.min_tokens(None) == 1024
    assert ANTHROPIC_RULES.write_premium("5m") == pytest.approx(0.25)
    assert ANTHROPIC_RULES.write_premium("1h") == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_breakpoints": -1},
        {"ttl_s": {"5m": 300.0}, "write_multiplier": {"1h": 2.0}},
        {"read_multiplier": 0},
        {"model_min_tokens": {"m": -5}},
        {"request_retention": {"24h": "24h"}},  # not a lifetime of ttl_s
        {"request_retention": {"5m": ""}},
        {"request_retention": {"5m": 5}},
        {"ttl_s": {"5m": "300"}, "write_multiplier": {"5m": 1.25}},
        {"ttl_s": [300], "write_multiplier": {"5m": 1.25}},
        {"write_multiplier": {"5m": "1.25", "1h": 2.0}},
        {"read_multiplier": "0.1"},
        {"read_multiplier": float("nan")},
        {"model_min_tokens": {"m": True}},
        {"model_min_tokens": ["m"]},
    ],
)
def test_bad_rules_are_config_errors(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ProviderRules("p", **bad)  # type: ignore[arg-type]


def test_unknown_provider_and_bad_candidates_are_refused() -> None:
    with pytest.raises(ConfigError):
        rules_for("nobody")
    with pytest.raises(InvalidInputError):
        plan_breakpoints(["system"], ANTHROPIC_RULES)  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        plan_breakpoints(None, ANTHROPIC_RULES)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        plan_breakpoints([_candidate()], "anthropic")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "everything"},
        {"prefix_tokens": "2000"},
        {"prefix_tokens": -1},
        {"message_index": True},
        {"part": -2},
        {"expected_reads": float("nan")},
        {"expected_reads": "1"},
        {"cached_tokens": 1.5},
        {"index_depth": -3},
        {"basis": None},
    ],
)
def test_a_malformed_candidate_is_refused_when_made(fields: dict[str, Any]) -> None:
    good = {"kind": "system", "message_index": 0, "part": 0, "prefix_tokens": 2000}
    with pytest.raises(InvalidInputError, match="ReuseCandidate"):
        ReuseCandidate(**{**good, "expected_reads": 1.0, **fields})


def _docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(f"Document {n}. " + f"{n} fact. " * 300, id=n) for n in names]


@pytest.fixture
def cloud_pilot(tokenizer: Tokenizer) -> ContextPilot:
    config = PilotConfig(system_prompt="Rules. " * 1200, cloud=CloudCacheConfig(enabled=True))
    return ContextPilot(config, tokenizer=tokenizer)


def test_the_first_request_writes_only_the_system_prompt_a_later_one_may_read(
    cloud_pilot: ContextPilot,
) -> None:
    """Nothing is known yet: the blocks are nobody's, and the system prompt is expected
    back as often as a new system prompt is (the prior, one half: worth a write)."""
    prompt = cloud_pilot.optimize(_docs("a", "b"), "Q?")
    assert prompt.cache_plan is not None
    [kept] = prompt.cache_plan.breakpoints
    assert kept.kind == "system" and kept.candidate.expected_reads == pytest.approx(0.5)
    assert "seen anew" in kept.candidate.basis


def test_popular_blocks_get_a_breakpoint_before_any_request_repeats_them(
    cloud_pilot: ContextPilot,
) -> None:
    """Blocks carried by many requests are placed first and get a breakpoint for the
    requests expected to share them, even when this exact order is new."""
    for query in ("Q1?", "Q2?", "Q3?"):
        cloud_pilot.optimize(_docs("p", f"x{query}"), query)
    prompt = cloud_pilot.optimize(_docs("new", "p"), "Q4?")
    assert prompt.blocks[0].id == "p" and prompt.stats.blocks_matched == 1
    plan = prompt.cache_plan
    assert plan is not None
    shared = [kept for kept in plan.breakpoints if kept.kind == "shared_blocks"]
    assert shared and shared[0].candidate.part == 0  # after p, not after "new"


def test_a_conversation_places_history_and_tail_breakpoints(cloud_pilot: ContextPilot) -> None:
    first = cloud_pilot.optimize(_docs("a", "b"), "Q1?", conversation_id="c")
    cloud_pilot.record_answer(first, "A1")
    second = cloud_pilot.optimize(_docs("c"), "Q2?", conversation_id="c")
    plan = second.cache_plan
    assert plan is not None
    kinds = [kept.kind for kept in plan.breakpoints]
    assert "history" in kinds and "tail" in kinds
    history = next(kept for kept in plan.breakpoints if kept.kind == "history")
    assert history.candidate.cached_tokens > 0  # the first turn's tail breakpoint
    assert history.position == (len(second.messages) - 2, -1)


def test_the_plan_is_exposed_with_its_inputs(cloud_pilot: ContextPilot) -> None:
    cloud_pilot.optimize(_docs("a"), "Q1?")
    prompt = cloud_pilot.optimize(_docs("a"), "Q2?")
    plan = prompt.cache_plan
    assert plan is not None and plan.provider == "anthropic" and plan.ttl == "5m"
    system = plan.breakpoints[0]
    assert system.kind == "system" and system.candidate.expected_reads == 1
    assert "recent requests share the system prompt" in system.candidate.basis
    assert plan.expected_saving_tokens > 0
    assert plan.expected_saving_usd(3.0) == pytest.approx(plan.expected_saving_tokens * 3e-6)


def test_the_index_counts_recent_requests_sharing_a_prefix() -> None:
    from contextpilot_rag.index import ContextIndex, RequestId

    now = [0.0]
    index = ContextIndex(clock=lambda: now[0])
    index.insert(["s", "a", "b"], [1, 1, 1], RequestId("old"))
    now[0] = 100.0
    index.insert(["s", "a", "c"], [1, 1, 1], RequestId("r1"))
    index.insert(["s", "x"], [1, 1], RequestId("r2"))
    assert index.recent_sharing(["s"], since=0.0) == 3
    assert index.recent_sharing(["s"], since=50.0) == 2
    assert index.recent_sharing(["s", "a"], since=50.0) == 1
    assert index.recent_sharing(["s", "a"], since=50.0, limit=1) == 1
    assert index.recent_sharing(["s", "z"], since=0.0) == 0
    assert index.recent_sharing([], since=0.0) == 0


class _SharedUpTo:
    """Reuse signals of a prompt whose index path recent requests share up to
    ``depth``; every block equally popular, nothing cached."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def recent_sharing(self, depth: int) -> int:
        return 8 if depth <= self.depth else 0

    def block_share(self, count: int) -> float:
        return 1.0

    def cached(self, depth: int) -> bool:
        return False


def test_spare_breakpoints_go_just_past_where_recent_requests_left_the_path() -> None:
    """Popularity alone rates every end of equally popular blocks alike; later requests
    that follow this path past where recent ones left it mostly leave it within a
    block or two, so the breakpoints that cost no write go there, not to the end."""
    from contextpilot_rag.cloud.forecast import PromptShape, reuse_candidates

    ends = tuple(1500 + 300 * count for count in range(1, 9))
    shape = PromptShape(1500, 1, 0, (), ends, ends[-1] + 50, 1, 0, True)
    candidates = reuse_candidates(shape, _SharedUpTo(2), 0.9)
    shared = [c.expected_reads for c in candidates if c.kind == "shared_blocks"]
    assert shared[:4] == [8, 8, 4, 2]  # shared by recent ones, first past, then halved
    plan = plan_breakpoints(candidates, ANTHROPIC_RULES)
    parts = [kept.candidate.part for kept in plan.breakpoints if kept.kind == "shared_blocks"]
    assert parts and parts[0] == 1 and max(parts) <= 3
    assert [kept.kind for kept in plan.breakpoints][-1] == "tail"


class _CachedAt:
    """Signals: nothing shared; a breakpoint believed cached at these index depths."""

    def __init__(self, *depths: int) -> None:
        self._depths = set(depths)

    def recent_sharing(self, depth: int) -> int:
        return 0

    def block_share(self, count: int) -> float:
        return 0.0

    def cached(self, depth: int) -> bool:
        return depth in self._depths


@pytest.mark.parametrize(
    ("cached_at", "lookback", "expected"),
    [
        ((9, 4), 20, 3000),  # the previous turn's prefix: the deepest one
        ((4,), 20, 1800),  # the previous turn wrote none: the one before
        ((4,), 15, 0),  # 15 content blocks after it: out of the lookback's reach
        ((4,), None, 1800),  # no lookback limit
        ((), 20, 0),
    ],
)
def test_the_history_reads_the_deepest_prefix_an_earlier_turn_cached_within_reach(
    cached_at: tuple[int, ...], lookback: int | None, expected: int
) -> None:
    from contextpilot_rag.cloud.forecast import PromptShape, reuse_candidates

    # two history turns: through the previous one's tail (depth 9) 3,000 tokens, 1
    # content block (its answer) before the history's end; through the first one's
    # (depth 4) 1,800 tokens, 15 blocks before it
    turn_ends = ((9, 3000, 1), (4, 1800, 15))
    shape = PromptShape(0, 4, 3200, turn_ends, (3500,), 3600, 10, 2, True)
    candidates = reuse_candidates(shape, _CachedAt(*cached_at), 0.9, lookback_blocks=lookback)
    history = next(c for c in candidates if c.kind == "history")
    assert history.cached_tokens == expected


def test_continuations_start_from_the_rule_of_succession() -> None:
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0)
    assert tracker.probability(0, 0.0) == pytest.approx(1 / 2)
    assert tracker.probability(3, 0.0) == pytest.approx(4 / 5)


def test_continuations_learn_where_conversations_stop() -> None:
    """Conversations of exactly two turns: a first turn is always followed, a second
    never, so the second turn's tail stops looking worth a write."""
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0)
    for number in range(20):
        start = number * 1000.0
        tracker.observe(number, 0, start)
        tracker.observe(number, 0, start + 1)  # a retry of the same turn counts once
        tracker.observe(number, 1, start + 30)
    assert tracker.probability(0, 20_000.0) > 0.9
    assert tracker.probability(1, 20_000.0) < 0.1


def test_continuations_learn_how_soon_a_next_turn_comes() -> None:
    """Turns 30 s apart: a next turn within a minute is as likely as one within the
    lifetime, one within 10 s unlikely; until a gap is seen, the lifetime is assumed."""
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0)
    assert tracker.gap_quantile(0.95) == 300.0
    assert tracker.returns_within(0, 10.0, 0.0) == tracker.probability(0, 0.0)
    for number in range(20):
        start = number * 1000.0
        for turn in range(3):
            tracker.observe(number, turn, start + 30.0 * turn)
    now = 20_000.0
    assert tracker.gap_quantile(0.95) == pytest.approx(30.0)
    assert tracker.returns_within(0, 60.0, now) == pytest.approx(tracker.probability(0, now))
    assert tracker.returns_within(0, 10.0, now) < 0.1 * tracker.probability(0, now)


def test_a_next_turn_after_the_cache_expired_does_not_count_as_followed() -> None:
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0, prior_weight=1.0)
    tracker.observe("c", 0, 0.0)
    tracker.observe("c", 1, 301.0)
    assert tracker.probability(0, 301.0) == pytest.approx((0 + 1 / 2) / (1 + 1))


def _two_turn_conversations(tracker: Any, count: int, *, gap_s: float = 20.0) -> float:
    """``count`` conversations of two turns ``gap_s`` apart, one starting every 5 s;
    returns the time of the last one's second turn."""
    now = 0.0
    for number in range(count):
        start = 5.0 * number
        tracker.observe(f"c{number}", 0, start)
        tracker.observe(f"c{number}", 1, start + gap_s)
        now = start + gap_s
    return now


def test_a_turn_waiting_longer_than_any_gap_counts_as_not_followed_before_the_lifetime() -> None:
    """Conversations of two turns, all within one five-minute lifetime: no second turn
    has waited 300 s, so counting only resolved turns left the second turn's chance at
    the prior; a second turn that waited past the longest gap seen is presumed ended."""
    from contextpilot_rag.cloud.continuation import MIN_GAPS, ContinuationTracker

    tracker = ContinuationTracker(300.0)
    now = _two_turn_conversations(tracker, 2 * MIN_GAPS)
    assert now + 30.0 < 300.0  # the lifetime of the first turns has not passed
    assert tracker.probability(0, now + 30.0) > 0.9
    assert tracker.probability(1, now + 30.0) < 0.1  # the prior says 2/3
    assert tracker.later_turns(0, now + 30.0) < 1.1
    # too few gaps known: a turn is resolved by the lifetime alone, as before
    early = ContinuationTracker(300.0)
    few = _two_turn_conversations(early, MIN_GAPS - 1)
    assert early.probability(1, few + 30.0) == pytest.approx(2 / 3)


def test_a_presumed_end_is_corrected_when_the_next_turn_still_comes_in_time() -> None:
    from contextpilot_rag.cloud.continuation import MIN_GAPS, ContinuationTracker

    tracker = ContinuationTracker(300.0, prior_weight=1.0)
    now = _two_turn_conversations(tracker, MIN_GAPS)  # gaps of 20 s
    tracker.observe("late", 0, now)
    assert tracker.pending("late", now + 100.0)  # presumed ended, yet it may come back
    ended = tracker.probability(0, now + 100.0)
    assert ended == pytest.approx((MIN_GAPS + 1 / 2) / (MIN_GAPS + 1 + 1))
    tracker.observe("late", 1, now + 100.0)  # within the lifetime: followed after all
    assert tracker.probability(0, now + 100.0) == pytest.approx(
        (MIN_GAPS + 1 + 1 / 2) / (MIN_GAPS + 1 + 1)
    )
    assert tracker.gap_quantile(1.0) == pytest.approx(100.0)  # its gap is learnt
    # a retry of a presumed-ended turn waits again, counted once (the longest gap is
    # 100 s now: presumed ended after that)
    tracker.observe("retry", 0, now + 100.0)
    waiting = tracker.probability(0, now + 150.0)
    assert tracker.probability(0, now + 250.0) < waiting
    tracker.observe("retry", 0, now + 260.0)
    tracker.observe("retry", 1, now + 270.0)
    followed = MIN_GAPS + 2
    assert tracker.probability(0, now + 270.0) == pytest.approx((followed + 1 / 2) / (followed + 1))
    # past the lifetime a presumed end is final
    tracker.observe("gone", 0, now + 300.0)
    tracker.observe("gone", 1, now + 700.0)
    assert tracker.probability(0, now + 700.0) == pytest.approx(
        (followed + 1 / 2) / (followed + 1 + 1)
    )


def test_the_pilot_stops_writing_tails_where_its_conversations_stop(
    tokenizer: Tokenizer,
) -> None:
    now = [0.0]
    config = PilotConfig(system_prompt="Rules. " * 1200, cloud=CloudCacheConfig(enabled=True))
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=lambda: now[0])

    def tail_reads(conversation: str, turns: int) -> float:
        reads = 0.0
        for turn in range(turns):
            docs = _docs(f"{conversation}{turn}")
            prompt = pilot.optimize(docs, "Q?", conversation_id=conversation)
            pilot.record_answer(prompt, "A")
            assert prompt.cache_plan is not None
            tail = [c for c in _candidates(prompt.cache_plan) if c.kind == "tail"]
            reads = tail[0].expected_reads
            now[0] += 20.0
        now[0] += 1000.0
        return reads

    first = tail_reads("c0", 2)
    # nothing learned yet: the rule of succession, (t + 1) / (t + 2) for every later
    # turn t, chained from the second turn (every later turn reads the tail)
    assert first == pytest.approx(sum(2 / (j + 2) for j in range(1, CHAIN_TURNS + 1)))
    for number in range(1, 10):
        tail_reads(f"c{number}", 2)
    assert tail_reads("last", 2) < 0.2


def test_a_turn_after_one_that_wrote_no_tail_reads_an_earlier_turns_prefix(
    tokenizer: Tokenizer,
) -> None:
    """Conversations that stop after two turns: a second turn writes no tail. When a
    conversation goes on anyway, its third turn still reads what its first turn cached
    (within the provider's lookback): its history breakpoint counts that prefix as
    cached (the previous turn's alone was looked for, so it wrote nothing at the
    history's end and read none of it)."""
    now = [0.0]
    config = PilotConfig(system_prompt="Rules. " * 1200, cloud=CloudCacheConfig(enabled=True))
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=lambda: now[0])

    def turn(conversation: str, number: int) -> Prompt:
        prompt = pilot.optimize(
            _docs(f"{conversation}{number}"), "Q?", conversation_id=conversation
        )
        pilot.record_answer(prompt, "A")
        now[0] += 20.0
        return prompt

    def kinds(prompt: Prompt) -> list[str]:
        assert prompt.cache_plan is not None
        return [kept.kind for kept in prompt.cache_plan.breakpoints]

    for number in range(30):
        turn(f"c{number}", 0)
        turn(f"c{number}", 1)
        now[0] += 1000.0
    first, second, third = (turn("long", number) for number in range(3))
    assert "tail" in kinds(first) and "tail" not in kinds(second)
    assert third.cache_plan is not None
    history = next(kept for kept in third.cache_plan.breakpoints if kept.kind == "history")
    assert history.candidate.cached_tokens == first.stats.prompt_tokens
    assert "turn 2 turns back" in history.candidate.basis


def test_chained_turns_sum_the_chances_of_reaching_each_later_turn() -> None:
    assert chained_turns([0.5, 0.5]) == pytest.approx(0.5 + 0.25)
    assert chained_turns([0.9, 0.0, 0.9]) == pytest.approx(0.9)  # the chain breaks
    assert chained_turns(itertools.repeat(1.0)) == CHAIN_TURNS  # bounded
    assert chained_turns([]) == 0.0


def test_later_turns_learn_how_long_conversations_go_on() -> None:
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0)
    now = 0.0
    for number in range(200):  # conversations of exactly three turns
        for turn in range(3):
            tracker.observe(f"c{number}", turn, now)
            now += 10.0
        now += 400.0  # past the lifetime: the third turn resolves as not followed
    assert tracker.later_turns(0, now) == pytest.approx(2.0, abs=0.1)
    assert tracker.later_turns(1, now) == pytest.approx(1.0, abs=0.1)
    assert tracker.later_turns(2, now) < 0.1


def test_a_one_hour_lifetime_still_caches_a_conversation(tokenizer: Tokenizer) -> None:
    """A one-hour write costs twice the input price, which one read (0.1x) does not
    repay; every later turn reads it, though, and a conversation expected to go on
    writes its tail and history (only the next turn's chance was counted before, so a
    one-hour pilot cached no conversation)."""
    cloud = CloudCacheConfig(enabled=True, ttl="1h")
    pilot = ContextPilot(
        PilotConfig(system_prompt="Rules. " * 1200, cloud=cloud), tokenizer=tokenizer
    )
    first = pilot.optimize(_docs("a", "b"), "Q1?", conversation_id="c")
    pilot.record_answer(first, "A1")
    second = pilot.optimize(_docs("c"), "Q2?", conversation_id="c")
    for prompt in (first, second):
        assert prompt.cache_plan is not None and prompt.cache_plan.ttl == "1h"
        tail = next(kept for kept in prompt.cache_plan.breakpoints if kept.kind == "tail")
        assert tail.candidate.expected_reads > 1 / ANTHROPIC_RULES.read_saving
    markers = [
        part.get("cache_control")
        for message in second.to_anthropic()["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
    ]
    assert {"type": "ephemeral", "ttl": "1h"} in markers


def _candidates(plan: CachePlan) -> list[ReuseCandidate]:
    return [b.candidate for b in plan.breakpoints] + [s.candidate for s in plan.skipped]


@pytest.mark.parametrize(
    "arguments",
    [{"ttl_s": 0.0}, {"ttl_s": 300.0, "prior_weight": 0.0}, {"ttl_s": 300.0, "capacity": 0}],
)
def test_continuations_refuse_a_bad_configuration(arguments: dict[str, float]) -> None:
    from contextpilot_rag.cloud.continuation import ContinuationTracker
    from contextpilot_rag.errors import ConfigError

    with pytest.raises(ConfigError, match="ContinuationTracker"):
        ContinuationTracker(**arguments)  # type: ignore[arg-type]


def test_a_bounded_tracker_resolves_its_oldest_pending_turn_as_not_followed() -> None:
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0, prior_weight=1.0, capacity=2)
    for conversation in ("a", "b", "c"):  # "a" is pushed out: resolved, not followed
        tracker.observe(conversation, 0, 0.0)
    assert tracker.probability(0, 1.0) == pytest.approx((0 + 1 / 2) / (1 + 1))
    tracker.observe("b", 1, 2.0)  # "b" followed in time
    assert tracker.probability(0, 2.0) == pytest.approx((1 + 1 / 2) / (2 + 1))


def _two_turns(pilot: ContextPilot) -> tuple[Prompt, Prompt]:
    first = pilot.optimize(_docs("a", "b"), "Q1?", conversation_id="c")
    pilot.record_answer(first, "A1")
    return first, pilot.optimize(_docs("a", "c"), "Q2?", conversation_id="c")


@pytest.mark.parametrize(
    ("model", "next_turn", "kept_whole"),
    [
        ("claude-haiku-4-5", None, True),  # 4,096-token minimum: only the whole turn reaches it
        ("claude-haiku-4-5", 0.0, False),  # no next turn would read it: not worth a write
        ("claude-sonnet-4-6", None, False),  # 1,024: cacheable de-duplicated
    ],
)
def test_a_turn_sends_repeated_blocks_in_full_where_only_that_makes_it_cacheable(
    tokenizer: Tokenizer, model: str, next_turn: float | None, kept_whole: bool
) -> None:
    cloud = CloudCacheConfig(enabled=True, model=model, next_turn_probability=next_turn)
    config = PilotConfig(system_prompt="Rules. " * 250, cloud=cloud)
    pilot = ContextPilot(config, tokenizer=tokenizer)
    first, second = _two_turns(pilot)
    minimum = cloud.rules.min_tokens(model)
    assert second.cache_plan is not None
    if kept_whole:
        assert first.stats.prompt_tokens < minimum  # nothing of the history is cached
        assert second.deduplicated == () and second.stats.prompt_tokens >= minimum
        assert [kept.kind for kept in second.cache_plan.breakpoints] == ["tail"]
    else:
        assert [block.id for block in second.deduplicated] == ["a"]
    # every retrieved block is in the prompt or in the history a note points to
    assert {block.id for block in (*second.blocks, *second.deduplicated)} == {"a", "c"}


@pytest.mark.parametrize(
    ("whole", "deduplicated", "next_turn", "expected"),
    [
        (4200, 3300, 0.8, True),  # cached 4,200 x 1.33 < uncached 3,300 x (1 + 0.8 x 1.25)
        (4200, 3300, 0.3, False),  # rarely read back: 4,200 x 1.28 > 3,300 x 1.375
        (4200, 3300, 0.2, False),  # a write that does not pay: neither is cached
        (6000, 3300, 0.8, False),  # far more to send: 6,000 x 1.33 > 3,300 x 2
        (5000, 4500, 0.8, False),  # cacheable de-duplicated already
        (4000, 3000, 0.8, False),  # under the minimum either way
    ],
)
def test_duplicates_pay_only_where_they_make_the_prompt_cacheable_for_less(
    whole: int, deduplicated: int, next_turn: float, expected: bool
) -> None:
    from contextpilot_rag.cloud.breakpoints import duplicates_pay

    rules = rules_for("anthropic")
    kwargs = {"model": "claude-haiku-4-5", "next_turn": next_turn}
    assert duplicates_pay(whole, deduplicated, rules, **kwargs) is expected  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="next_turn"):
        duplicates_pay(whole, deduplicated, rules, model="claude-haiku-4-5", next_turn=1.5)


def test_a_system_prompt_seen_anew_is_written_while_new_ones_tend_to_come_back(
    tokenizer: Tokenizer,
) -> None:
    """The first request with a long system prompt writes it (its second reads it,
    instead of writing it one request late); once system prompts seen anew are learnt
    never to come back within the lifetime, a new one is not written."""
    now = [0.0]
    pilot = ContextPilot(
        PilotConfig(cloud=CloudCacheConfig(enabled=True)), tokenizer=tokenizer, clock=lambda: now[0]
    )

    def system_plan(system: str) -> list[Breakpoint]:
        prompt = pilot.optimize(_docs("a"), "Q?", system=system)
        assert prompt.cache_plan is not None
        return [kept for kept in prompt.cache_plan.breakpoints if kept.kind == "system"]

    assert len(system_plan("Rules. " * 1200)) == 1
    now[0] += 10.0
    [again] = system_plan("Rules. " * 1200)
    assert again.candidate.cached_tokens > 0  # read back, not written
    for number in range(8):  # each sent once, then never within the lifetime
        now[0] += 400.0
        system_plan(f"Persona {number}. " + "Rules. " * 1200)
    now[0] += 400.0
    assert system_plan("Another persona. " + "Rules. " * 1200) == []


def _short_docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(f"Memory {n}: the user prefers {n}.", id=n) for n in names]


@pytest.mark.parametrize("cloud", [True, False])
def test_a_prompt_under_the_hosted_minimum_keeps_the_retrievers_order(
    tokenizer: Tokenizer, cloud: bool
) -> None:
    """No hosted cache serves any part of a prompt whose system prompt and blocks are
    shorter than the model's minimum cacheable prefix, so reordering it would gain
    nothing and cost an order note on every request; a self-hosted engine caches any
    page, so without planning the blocks an earlier prompt sent still go first."""
    config = PilotConfig(cloud=CloudCacheConfig(enabled=cloud))
    pilot = ContextPilot(config, tokenizer=tokenizer)
    pilot.optimize(_short_docs("a", "b", "c"), "Q1?")
    prompt = pilot.optimize(_short_docs("c", "b", "a"), "Q2?")
    shown = [block.id for block in prompt.blocks]
    if cloud:
        assert shown == ["c", "b", "a"] and prompt.order_note is None
        assert prompt.stats.blocks_matched == 0  # its own order shares no block with a, b, c
    else:
        assert shown == ["a", "b", "c"] and prompt.order_note is not None
        assert prompt.stats.blocks_matched == 3


@pytest.mark.parametrize(
    ("policy", "shared"), [("always", False), ("never", False), ("private", True), ("never", True)]
)
def test_a_tenants_prompt_under_the_hosted_minimum_keeps_the_retrievers_order(
    tokenizer: Tokenizer, policy: str, shared: bool
) -> None:
    """The same rule on a tenant's prompts, salted (the tenant's own index) or not
    (public blocks matched by content in the shared index): the order stays, and what
    of that exact order the namespace already holds is reported as matched."""
    config = PilotConfig(
        tenants=TenantConfig(cache_salt=policy, salt_key="k" * 32),  # type: ignore[arg-type]
        cloud=CloudCacheConfig(enabled=True),
    )
    pilot = ContextPilot(config, tokenizer=tokenizer)

    def docs(*names: str) -> list[ContextBlock]:
        return [replace(block, shared=shared) for block in _short_docs(*names)]

    pilot.optimize(docs("a", "b", "c"), "Q1?", tenant="t1")
    prompt = pilot.optimize(docs("c", "b", "a"), "Q2?", tenant="t1")
    assert [block.id for block in prompt.blocks] == ["c", "b", "a"] and prompt.order_note is None
    assert prompt.stats.blocks_matched == 0
    again = pilot.optimize(docs("c", "b", "d"), "Q3?", tenant="t1")
    assert [block.id for block in again.blocks] == ["c", "b", "d"]
    assert again.stats.blocks_matched == 2  # c, b: the previous prompt's exact start


def test_a_tenants_prompt_over_the_hosted_minimum_is_still_reordered(
    tokenizer: Tokenizer,
) -> None:
    config = PilotConfig(
        tenants=TenantConfig(cache_salt="always", salt_key="k" * 32),
        cloud=CloudCacheConfig(enabled=True),
    )
    pilot = ContextPilot(config, tokenizer=tokenizer)
    pilot.optimize(_docs("a", "b"), "Q1?", tenant="t1")
    prompt = pilot.optimize(_docs("b", "a"), "Q2?", tenant="t1")
    assert [block.id for block in prompt.blocks] == ["a", "b"] and prompt.order_note is not None


def test_a_prompt_over_the_hosted_minimum_is_still_reordered(cloud_pilot: ContextPilot) -> None:
    cloud_pilot.optimize(_docs("a", "b"), "Q1?")
    prompt = cloud_pilot.optimize(_docs("b", "a"), "Q2?")
    assert [block.id for block in prompt.blocks] == ["a", "b"] and prompt.order_note is not None
    assert prompt.stats.blocks_matched == 2


def _ids(prompt: Prompt) -> list[str]:
    return [block.id for block in prompt.blocks]


@pytest.mark.parametrize(
    ("cloud", "index", "idle_s", "follows"),
    [
        (True, IndexConfig(), 299.0, True),  # within the 5-minute lifetime
        (True, IndexConfig(), 301.0, False),  # the provider has dropped the prefix
        (False, IndexConfig(), 301.0, True),  # no hosted cache: no lifetime
        (True, IndexConfig(ttl_s=3600.0), 301.0, True),  # the index's own ttl_s wins
    ],
)
def test_a_path_idle_past_the_cache_lifetime_no_longer_steers_the_order(
    tokenizer: Tokenizer, cloud: bool, index: IndexConfig, idle_s: float, follows: bool
) -> None:
    now = [0.0]
    config = PilotConfig(index=index, cloud=CloudCacheConfig(enabled=cloud))
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=lambda: now[0])
    docs = [ContextBlock(f"Passage {name} on prefix caching. " * 60, id=name) for name in "abcd"]
    first = pilot.optimize(docs, "Q?")
    now[0] += idle_s
    again = pilot.optimize(docs[::-1], "Another question?")
    assert (_ids(again) == _ids(first)) is follows
    assert pilot.config.index_for(config.index).ttl_s == (
        300.0 if cloud and index.ttl_s is None else index.ttl_s
    )


@pytest.mark.parametrize(
    ("ttl", "lifetime_s", "follows"),
    [("5m", 300.0, False), ("in_memory", 300.0, False), ("24h", 3600.0, True)],
)
def test_an_extended_openai_retention_keeps_a_prefix_cached_past_ten_minutes(
    tokenizer: Tokenizer, ttl: str, lifetime_s: float, follows: bool
) -> None:
    """OpenAI's in-memory retention drops a prefix idle 5–10 minutes; extended ("24h")
    retention keeps it for longer (1–2 hours for most usage): planned with it, a path
    idle for ten minutes still orders the next prompt."""
    now = [0.0]
    cloud = CloudCacheConfig(enabled=True, rules=OPENAI_RULES, ttl=ttl)
    config = PilotConfig(cloud=cloud)
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=lambda: now[0])
    docs = [ContextBlock(f"Passage {name} on prefix caching. " * 60, id=name) for name in "abcd"]
    first = pilot.optimize(docs, "Q?")
    now[0] += 600.0
    again = pilot.optimize(docs[::-1], "Another question?")
    assert (_ids(again) == _ids(first)) is follows
    assert (again.stats.blocks_matched == len(docs)) is follows
    assert cloud.ttl_s == lifetime_s == pilot.config.index_for(config.index).ttl_s


def test_openai_lifetimes_plan_with_no_write_premium() -> None:
    for ttl in ("5m", "in_memory", "24h"):
        assert OPENAI_RULES.write_premium(ttl) == 0.0
    assert plan_breakpoints([_candidate(reads=9)], OPENAI_RULES, ttl="24h").breakpoints == ()
    assert rules_for("anthropic").request_retention == {}


def _cache_blocks(prompt: Prompt, tokenizer: Tokenizer) -> list[CacheBlock]:
    """``prompt.to_anthropic()`` as Anthropic caches it: one entry key per content
    block (role and text), a breakpoint where ``cache_control`` is."""
    request = prompt.to_anthropic()
    messages = [("system", request.get("system", ()))]
    messages += [(message["role"], message["content"]) for message in request["messages"]]
    blocks = []
    for role, content in messages:
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for part in parts:
            marked = part.get("cache_control") is not None
            blocks.append(
                CacheBlock(
                    f"{role}\n{part['text']}",
                    len(tokenizer.encode(part["text"])),
                    TTL_5M_S if marked else None,
                )
            )
    return blocks


def test_a_later_turn_keeps_its_first_turns_shared_entries_alive(tokenizer: Tokenizer) -> None:
    """A first turn caches the end of the blocks other users share; its conversation's
    later turn puts a breakpoint there too (it costs nothing: the turn reads its history
    past it), so a user who comes a lifetime after the first turn but within one of the
    later turn still reads the shared blocks. Without it the entry expired with the
    first turn's lifetime, while the conversation went on."""
    now = [0.0]
    config = PilotConfig(system_prompt="Rules.", cloud=CloudCacheConfig(enabled=True))
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=lambda: now[0])
    provider = AnthropicCacheModel()

    def send(prompt: Prompt) -> int:
        return provider.request(_cache_blocks(prompt, tokenizer), now_s=now[0]).cache_read_tokens

    for number in range(3):  # the blocks p and q are popular
        send(pilot.optimize(_docs("p", "q", f"x{number}"), f"Q{number}?"))
        now[0] += 1.0
    first = pilot.optimize(_docs("p", "q", "c0"), "Q?", conversation_id="c")
    send(first)
    pilot.record_answer(first, "A")
    assert first.cache_plan is not None
    shared = {
        kept.position for kept in first.cache_plan.breakpoints if kept.kind == "shared_blocks"
    }
    assert shared and all(message == 1 for message, _ in shared)
    now[0] = 200.0
    second = pilot.optimize(_docs("c1"), "Q2?", conversation_id="c")
    send(second)
    assert second.cache_plan is not None
    kept = {k.position: k for k in second.cache_plan.breakpoints if k.kind == "shared_blocks"}
    assert kept and set(kept) <= shared  # the first turn's entries, in its message
    assert all("first turn cached" in k.candidate.basis for k in kept.values())
    now[0] = 450.0  # past the first turn's lifetime, within the second's
    other = pilot.optimize(_docs("p", "q", "d0"), "Q3?", conversation_id="d")
    assert [block.id for block in other.blocks[:2]] == ["p", "q"]
    assert send(other) >= other.boundaries[1].token_end  # read the shared blocks


def _unseen_lead_reads(pilot: ContextPilot, now: list[float], name: str) -> float | None:
    """The expected reads of the end of a prompt's first block, one no request carried
    before (None: not a candidate)."""
    now[0] += 1.0
    prompt = pilot.optimize(_docs(name), "Q?", conversation_id=name)
    assert prompt.cache_plan is not None and prompt.blocks[0].id == name
    ends = [
        c.expected_reads
        for c in _candidates(prompt.cache_plan)
        if c.kind == "shared_blocks" and c.part == 0
    ]
    return ends[0] if ends else None


@pytest.mark.parametrize("come_back", [True, False])
def test_a_block_seen_anew_is_expected_back_as_often_as_such_blocks_came_back(
    tokenizer: Tokenizer, come_back: bool
) -> None:
    """A first turn's leading block that no request carried before got no breakpoint
    candidate at all (its popularity is zero), though other users may well retrieve it
    next. The pilot learns how often a block seen anew is carried again within the
    lifetime and expects that; until enough blocks seen anew have resolved it expects
    nothing (a stream whose blocks never come back must not start writing)."""
    now = [0.0]
    config = PilotConfig(system_prompt="Rules. " * 1200, cloud=CloudCacheConfig(enabled=True))
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=lambda: now[0])
    assert _unseen_lead_reads(pilot, now, "first-probe") is None  # no evidence yet
    for number in range(40):
        pilot.optimize(_docs(f"n{number}"), f"Q{number}?")
        now[0] += 5.0
        if come_back:
            pilot.optimize(_docs(f"n{number}"), f"Q{number} again?")
            now[0] += 5.0
    now[0] += 400.0  # past the lifetime: the blocks that did not come back are resolved
    reads = _unseen_lead_reads(pilot, now, "second-probe")
    if come_back:
        assert reads is not None and reads > 0.04
    else:
        assert reads is None or reads < 0.01


def test_a_sighting_counts_as_new_or_as_a_return_within_the_lifetime() -> None:
    from contextpilot_rag.cloud.continuation import ContinuationTracker

    tracker = ContinuationTracker(300.0)
    tracker.sighted("back", 0.0)
    tracker.sighted("back", 10.0)  # within the lifetime: turn 0 followed
    tracker.sighted("gone", 20.0)
    assert tracker.resolved(0, 30.0) == 1
    assert tracker.resolved(0, 1000.0) == 2  # "gone" never came back
    assert tracker.probability(0, 1000.0) == pytest.approx((1 + 2 * 0.5) / (2 + 2))
    tracker.sighted("gone", 1000.0)  # a lifetime later: seen anew, not a return
    assert tracker.resolved(0, 1001.0) == 2
