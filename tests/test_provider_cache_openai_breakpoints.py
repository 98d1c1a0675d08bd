"""OpenAI's breakpoint prompt cache (gpt-5.6 and later) against its published rules
(contextpilot_rag/sim/provider_cache.py cites them): writes only where a breakpoint ends
a prefix, the latest four (or three and the implicit one) per request, reads at any
block boundary, the 1,024-token minimum, a 30-minute life that a read does not extend,
and the older models' routing by head and ``prompt_cache_key``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import pytest

from contextpilot_rag.cloud.rules import OPENAI_BREAKPOINT_RULES, OPENAI_RULES
from contextpilot_rag.errors import ConfigError
from contextpilot_rag.sim.provider_cache import (
    CacheBlock,
    OpenAIBreakpointCacheModel,
    OpenAICacheRules,
)
from contextpilot_rag.usage import InputTokens

MARK = OPENAI_BREAKPOINT_RULES.ttl_s["30m"]


def blocks(sizes: list[int], marked: Collection[int] = (), tag: str = "b") -> list[CacheBlock]:
    """Blocks named ``{tag}{i}`` of the given token sizes, explicit breakpoints at
    ``marked``."""
    return [
        CacheBlock(f"{tag}{i}", size, MARK if i in marked else None) for i, size in enumerate(sizes)
    ]


def split(tokens: InputTokens) -> tuple[int, int, int]:
    """(uncached, read, written)."""
    return (tokens.uncached_tokens, tokens.cache_read_tokens, tokens.cache_write_5m_tokens)


def test_an_explicit_breakpoint_is_written_then_read() -> None:
    model = OpenAIBreakpointCacheModel()
    request = blocks([2000, 500, 30], marked={1})
    first = model.request(request, now_s=0)
    second = model.request(request, now_s=10)
    assert split(first.tokens) == (30, 0, 2500)
    assert split(second.tokens) == (30, 2500, 0)
    assert first.machine == second.machine


def test_a_shared_prefix_is_read_at_a_boundary_without_a_breakpoint() -> None:
    model = OpenAIBreakpointCacheModel()
    model.request(blocks([2000, 500, 30], marked={1}), now_s=0)
    follow_up = [*blocks([2000, 500]), CacheBlock("new", 400, MARK)]
    usage = model.request(follow_up, now_s=1)
    assert split(usage.tokens) == (0, 2500, 400)


def test_a_prefix_shared_only_up_to_a_boundary_never_written_reads_nothing() -> None:
    model = OpenAIBreakpointCacheModel()
    model.request(blocks([2000, 500, 30], marked={1}), now_s=0)
    changed = [*blocks([2000]), CacheBlock("other", 500, MARK), CacheBlock("b2", 30)]
    usage = model.request(changed, now_s=1)
    assert split(usage.tokens) == (30, 0, 2500)  # 2,000 tokens shared, but no entry there


def test_implicit_mode_writes_the_whole_prompt_so_a_new_question_reads_nothing() -> None:
    model = OpenAIBreakpointCacheModel()
    first = model.request(
        [CacheBlock("system", 3000), CacheBlock("q1", 200)], now_s=0, implicit_block=1
    )
    second = model.request(
        [CacheBlock("system", 3000), CacheBlock("q2", 200)], now_s=1, implicit_block=1
    )
    assert split(first.tokens) == (0, 0, 3200)
    assert split(second.tokens) == (0, 0, 3200)  # the gpt-5.6 pitfall: 3,000 stable tokens lost


def test_an_explicit_breakpoint_on_the_stable_prefix_makes_a_new_question_read() -> None:
    model = OpenAIBreakpointCacheModel()
    system = CacheBlock("system", 3000, MARK)
    first = model.request([system, CacheBlock("q1", 200)], now_s=0, implicit_block=1)
    second = model.request([system, CacheBlock("q2", 200)], now_s=1, implicit_block=1)
    assert split(first.tokens) == (0, 0, 3200)
    assert split(second.tokens) == (0, 3000, 200)


def test_only_the_latest_four_explicit_breakpoints_are_written() -> None:
    model = OpenAIBreakpointCacheModel()
    request = blocks([1100] * 6, marked=range(6))
    assert split(model.request(request, now_s=0).tokens) == (0, 0, 6600)
    assert [model.lookup(request[:n], now_s=1) for n in range(1, 7)] == [
        0,
        0,
        3300,
        4400,
        5500,
        6600,
    ]
    assert model.cached_prefixes == 4


def test_implicit_mode_writes_the_latest_three_explicit_breakpoints_and_the_implicit_one() -> None:
    model = OpenAIBreakpointCacheModel()
    request = blocks([1100] * 6, marked=range(5))
    assert split(model.request(request, now_s=0, implicit_block=5).tokens) == (0, 0, 6600)
    looked = [model.lookup(request[:n], now_s=1, implicit_block=n - 1) for n in range(1, 7)]
    assert looked == [0, 0, 3300, 4400, 5500, 6600]
    assert model.cached_prefixes == 4


def test_an_explicit_mode_request_without_breakpoints_neither_reads_nor_writes() -> None:
    model = OpenAIBreakpointCacheModel()
    model.request(blocks([2000, 30], marked={0}), now_s=0)
    unmarked = blocks([2000, 30])
    assert model.lookup(unmarked, now_s=1) == 0
    assert split(model.request(unmarked, now_s=1).tokens) == (2030, 0, 0)
    assert split(model.request(unmarked, now_s=2, implicit_block=1).tokens) == (0, 2000, 30)


def test_a_prefix_under_the_minimum_is_not_written() -> None:
    model = OpenAIBreakpointCacheModel()
    short = blocks([1000, 10], marked={0})
    assert split(model.request(short, now_s=0).tokens) == (1010, 0, 0)
    assert split(model.request(short, now_s=1).tokens) == (1010, 0, 0)
    at_minimum = blocks([1024, 10], marked={0}, tag="m")
    assert split(model.request(at_minimum, now_s=2).tokens) == (10, 0, 1024)


def test_the_minimum_is_per_model() -> None:
    rules = replace(OPENAI_BREAKPOINT_RULES, model_min_tokens={"gpt-5.6-luna": 2048})
    model = OpenAIBreakpointCacheModel(rules)
    request = blocks([1500, 10], marked={0})
    luna = model.request(request, now_s=0, model="gpt-5.6-luna-2026-05-01")  # a release
    sol = model.request(request, now_s=0, model="gpt-5.6-sol")
    assert (luna.tokens.cache_write_5m_tokens, sol.tokens.cache_write_5m_tokens) == (0, 1500)


def test_the_cache_is_per_model() -> None:
    model = OpenAIBreakpointCacheModel()
    request = blocks([2000, 10], marked={0})
    model.request(request, now_s=0, model="gpt-5.6-sol")
    assert model.lookup(request, now_s=1, model="gpt-5.6-luna") == 0
    assert model.lookup(request, now_s=1, model="gpt-5.6-sol") == 2000


def test_an_entry_expires_30_minutes_after_its_write() -> None:
    model = OpenAIBreakpointCacheModel()
    request = blocks([2000, 10], marked={0})
    model.request(request, now_s=0)
    assert model.lookup(request, now_s=1799) == 2000
    assert split(model.request(request, now_s=1800).tokens) == (10, 0, 2000)


def test_a_read_does_not_extend_the_life_but_a_rewrite_does() -> None:
    model = OpenAIBreakpointCacheModel()
    model.request(blocks([2000, 10], marked={0}), now_s=0)
    reader = [CacheBlock("b0", 2000), CacheBlock("tail", 10, MARK)]
    assert split(model.request(reader, now_s=1000).tokens) == (0, 2000, 10)
    assert model.lookup(blocks([2000, 10], marked={0}), now_s=1800) == 0
    model.request(blocks([2000, 10], marked={0}, tag="r"), now_s=0)
    model.request(blocks([2000, 10], marked={0}, tag="r"), now_s=1000)
    assert model.lookup(blocks([2000, 10], marked={0}, tag="r"), now_s=2500) == 2000


def test_the_same_key_goes_to_the_same_machine_and_another_key_can_miss() -> None:
    model = OpenAIBreakpointCacheModel(routing=OpenAICacheRules(machines=8))
    request = blocks([2000, 10], marked={0})
    home = model.route(request, "tenant-a")
    other = next(f"tenant-{i}" for i in range(100) if model.route(request, f"tenant-{i}") != home)
    first = model.request(request, now_s=0, prompt_cache_key="tenant-a")
    again = model.request(request, now_s=1, prompt_cache_key="tenant-a")
    elsewhere = model.request(request, now_s=2, prompt_cache_key=other)
    assert first.machine == again.machine == home
    assert elsewhere.machine != home
    assert (again.tokens.cache_read_tokens, elsewhere.tokens.cache_read_tokens) == (2000, 0)


def test_the_route_depends_only_on_the_blocks_opening_the_first_256_tokens() -> None:
    model = OpenAIBreakpointCacheModel(routing=OpenAICacheRules(machines=8))
    machines = {
        model.route([CacheBlock("head", 300), CacheBlock(f"tail{i}", 50)]) for i in range(20)
    }
    assert len(machines) == 1


def test_more_than_15_requests_a_minute_on_one_route_overflow_to_the_next_machine() -> None:
    model = OpenAIBreakpointCacheModel()
    request = blocks([2000, 10], marked={0})
    usages = [model.request(request, now_s=t, prompt_cache_key="k") for t in range(16)]
    home = model.route(request, "k")
    assert {usage.machine for usage in usages[:15]} == {home}
    assert usages[15].machine == (home + 1) % 4
    assert split(usages[15].tokens) == (10, 0, 2000)


def test_usage_adds_up_to_the_prompt() -> None:
    model = OpenAIBreakpointCacheModel()
    model.request(blocks([1500, 700, 40], marked={0}), now_s=0)
    usage = model.request(blocks([1500, 700, 40, 90], marked={1, 2}), now_s=1, implicit_block=2)
    tokens = usage.tokens
    assert split(tokens) == (90, 1500, 740)
    assert tokens.uncached_tokens + tokens.cache_read_tokens + tokens.cache_write_tokens == 2330
    assert tokens.prompt_tokens == 2330


@pytest.mark.parametrize(
    ("now_s", "implicit_block"),
    [(5, -1), (5, 2), (5, True), (5, "1"), (float("nan"), None), ("5", None)],
)
def test_bad_input_is_a_config_error_and_changes_nothing(
    now_s: object, implicit_block: object
) -> None:
    model = OpenAIBreakpointCacheModel(routing=OpenAICacheRules(overflow_requests_per_minute=2))
    request = blocks([2000, 10], marked={0})
    first = model.request(request, now_s=0)
    for _ in range(3):
        with pytest.raises(ConfigError):
            model.request(request, now_s=now_s, implicit_block=implicit_block)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            model.lookup(request, now_s=now_s, implicit_block=implicit_block)  # type: ignore[arg-type]
    after = model.request(request, now_s=2)  # the bad ones did not count towards overflow
    assert (after.machine, after.tokens.cache_read_tokens) == (first.machine, 2000)
    assert model.cached_prefixes == 1


def test_rules_without_explicit_breakpoints_write_only_the_implicit_one() -> None:
    model = OpenAIBreakpointCacheModel(OPENAI_RULES)
    request = blocks([1100, 1100, 10], marked={0, 1})
    assert split(model.request(request, now_s=0).tokens) == (2210, 0, 0)
    assert split(model.request(request, now_s=1, implicit_block=2).tokens) == (0, 0, 2210)
    assert model.cached_prefixes == 1
