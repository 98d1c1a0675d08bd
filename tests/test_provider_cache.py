"""The hosted-API cache models against the providers' published rules
(contextpilot_rag/sim/provider_cache.py cites the pages): Anthropic's explicit
breakpoints, minimum, 20-block lookback and TTLs; OpenAI's 1,024-token minimum,
128-token steps, key routing and retention."""

from __future__ import annotations

import pytest

from contextpilot_rag.cloud.rules import ANTHROPIC_RULES, ProviderRules
from contextpilot_rag.errors import CacheControlError, ConfigError
from contextpilot_rag.sim import (
    AnthropicCacheModel,
    CacheBlock,
    ManualClock,
    OpenAICacheModel,
    OpenAICacheRules,
)
from contextpilot_rag.sim.provider_cache import TTL_1H_S, TTL_5M_S


def blocks(sizes: list[int], breakpoints: dict[int, float], tag: str = "b") -> list[CacheBlock]:
    """Blocks named ``{tag}{i}`` of the given token sizes, breakpoints at the given
    indices (with their TTLs)."""
    return [CacheBlock(f"{tag}{i}", size, breakpoints.get(i)) for i, size in enumerate(sizes)]


# Anthropic


def test_a_prefix_under_the_minimum_is_never_cached() -> None:
    model = AnthropicCacheModel()
    request = blocks([1000, 10], {0: TTL_5M_S})
    first = model.request(request, now_s=0)
    second = model.request(request, now_s=1)
    assert (first.cache_write_tokens, first.uncached_tokens) == (0, 1010)
    assert (second.cache_read_tokens, second.uncached_tokens) == (0, 1010)


def test_a_breakpoint_at_the_minimum_is_written_then_read() -> None:
    model = AnthropicCacheModel()
    request = blocks([1024, 10], {0: TTL_5M_S})
    first = model.request(request, now_s=0)
    second = model.request(request, now_s=1)
    assert (first.cache_write_tokens, first.uncached_tokens) == (1024, 10)
    assert (second.cache_read_tokens, second.cache_write_tokens) == (1024, 0)
    assert second.uncached_tokens == 10


def test_the_minimum_is_per_model() -> None:
    rules = ProviderRules("anthropic", model_min_tokens={"claude-haiku-4-5": 4096})
    model = AnthropicCacheModel(rules)
    request = blocks([2048, 10], {0: TTL_5M_S})
    haiku = model.request(request, now_s=0, model="claude-haiku-4-5-20251001")  # a release
    other = model.request(request, now_s=0, model="claude-haiku-4-6")  # another model
    assert (haiku.cache_write_tokens, other.cache_write_tokens) == (0, 2048)


def test_the_cache_is_per_model() -> None:
    model = AnthropicCacheModel()
    request = blocks([2000, 10], {0: TTL_5M_S})
    model.request(request, now_s=0, model="a")
    assert model.request(request, now_s=1, model="b").cache_read_tokens == 0


def test_nothing_is_cached_without_a_breakpoint() -> None:
    model = AnthropicCacheModel()
    request = blocks([5000, 10], {})
    model.request(request, now_s=0)
    usage = model.request(request, now_s=1)
    assert (usage.cache_read_tokens, usage.uncached_tokens) == (0, 5010)


def test_more_than_four_breakpoints_is_an_error_and_changes_nothing() -> None:
    model = AnthropicCacheModel()
    request = blocks([2000] * 5, dict.fromkeys(range(5), TTL_5M_S))
    with pytest.raises(CacheControlError, match="A maximum of 4 blocks with cache_control"):
        model.request(request, now_s=0)
    assert model.cached_prefixes == 0


def test_four_breakpoints_are_allowed_and_each_long_one_writes() -> None:
    model = AnthropicCacheModel()
    request = blocks([600, 600, 600, 600, 5], dict.fromkeys(range(4), TTL_5M_S))
    usage = model.request(request, now_s=0)
    # the first breakpoint (600 tokens) is under the minimum; the other three write
    assert (usage.cache_write_tokens, usage.uncached_tokens) == (2400, 5)
    assert model.cached_prefixes == 3


def test_a_read_finds_a_cached_prefix_up_to_20_blocks_before_a_breakpoint() -> None:
    model = AnthropicCacheModel()
    shared = [2000] + [10] * 18  # blocks 0..18
    model.request(blocks(shared, {0: TTL_5M_S}), now_s=0)
    # block 0 is the 20th block counting back from the breakpoint on block 19
    reach = model.request(blocks([*shared, 10], {19: TTL_5M_S}), now_s=1)
    assert reach.cache_read_tokens == 2000
    # one block further, block 0 is the 21st: out of the window, nothing read
    model.reset()
    model.request(blocks(shared, {0: TTL_5M_S}), now_s=0)
    miss = model.request(blocks([*shared, 10, 10], {20: TTL_5M_S}), now_s=1)
    assert miss.cache_read_tokens == 0
    assert miss.cache_write_tokens == 2000 + 18 * 10 + 20


def test_a_lookback_of_0_reads_a_cached_prefix_however_far_back() -> None:
    """``ProviderRules.lookback_blocks=0`` is documented as no limit (the breakpoint
    planner folds breakpoints on that reading)."""
    model = AnthropicCacheModel(ProviderRules(provider="anthropic", lookback_blocks=0))
    shared = [2000] + [10] * 40
    model.request(blocks(shared, {0: TTL_5M_S}), now_s=0)
    far = model.request(blocks([*shared, 10], {41: TTL_5M_S}), now_s=1)
    assert far.cache_read_tokens == 2000


def test_an_earlier_breakpoint_keeps_a_far_prefix_readable() -> None:
    model = AnthropicCacheModel()
    shared = [2000] + [10] * 18
    model.request(blocks(shared, {0: TTL_5M_S}), now_s=0)
    usage = model.request(blocks([*shared, 10, 10], {0: TTL_5M_S, 20: TTL_5M_S}), now_s=1)
    assert usage.cache_read_tokens == 2000
    assert usage.cache_write_tokens == 18 * 10 + 20


def test_the_longest_cached_prefix_is_read_and_the_rest_written() -> None:
    model = AnthropicCacheModel()
    model.request(blocks([1500, 500, 7], {1: TTL_5M_S}), now_s=0)  # caches 2000
    usage = model.request(blocks([1500, 500, 300, 7], {2: TTL_5M_S}), now_s=1)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (2000, 300)
    assert usage.uncached_tokens == 7
    assert usage.prompt_tokens == 2307


def test_a_changed_block_before_the_breakpoint_misses() -> None:
    model = AnthropicCacheModel()
    model.request(blocks([1500, 500], {1: TTL_5M_S}), now_s=0)
    changed = [CacheBlock("other", 1500), CacheBlock("b1", 500, TTL_5M_S)]
    assert model.request(changed, now_s=1).cache_read_tokens == 0


def test_a_5_minute_entry_expires_after_5_minutes_unused() -> None:
    model = AnthropicCacheModel()
    request = blocks([2000, 10], {0: TTL_5M_S})
    model.request(request, now_s=0)
    assert model.lookup(request, now_s=299.9) == 2000
    assert model.lookup(request, now_s=300) == 0
    assert model.request(request, now_s=300).cache_write_tokens == 2000


def test_a_read_refreshes_the_5_minute_lifetime() -> None:
    model = AnthropicCacheModel()
    request = blocks([2000, 10], {0: TTL_5M_S})
    model.request(request, now_s=0)
    for now_s in (200, 400, 600):  # each read within 5 minutes of the last use
        assert model.request(request, now_s=now_s).cache_read_tokens == 2000
    assert model.lookup(request, now_s=899) == 2000
    assert model.lookup(request, now_s=900) == 0


def test_a_1_hour_entry_outlives_5_minutes_and_is_billed_as_1_hour() -> None:
    model = AnthropicCacheModel()
    request = blocks([2000, 10], {0: TTL_1H_S})
    first = model.request(request, now_s=0)
    assert (first.cache_write_1h_tokens, first.cache_write_5m_tokens) == (2000, 0)
    assert model.lookup(request, now_s=3599) == 2000
    assert model.lookup(request, now_s=3600) == 0


def test_writes_are_split_by_ttl() -> None:
    model = AnthropicCacheModel()
    usage = model.request(blocks([1500, 800, 9], {0: TTL_1H_S, 1: TTL_5M_S}), now_s=0)
    assert (usage.cache_write_1h_tokens, usage.cache_write_5m_tokens) == (1500, 800)
    assert usage.cache_write_tokens == 2300


def test_a_1_hour_breakpoint_after_a_5_minute_one_is_an_error() -> None:
    model = AnthropicCacheModel()
    with pytest.raises(CacheControlError, match="longer ttl"):
        model.request(blocks([1500, 800], {0: TTL_5M_S, 1: TTL_1H_S}), now_s=0)


def test_usage_adds_up_to_the_prompt() -> None:
    model = AnthropicCacheModel()
    model.request(blocks([1100, 300, 50], {1: TTL_5M_S}), now_s=0)
    usage = model.request(blocks([1100, 300, 400, 50], {2: TTL_5M_S}), now_s=5)
    assert usage.prompt_tokens == 1850
    assert usage.cache_write_5m_tokens == 400


@pytest.mark.parametrize(
    "make",
    [
        lambda: CacheBlock("x", -1),
        lambda: CacheBlock("x", 1, 0.0),
        lambda: OpenAICacheRules(step_tokens=0),
        lambda: OpenAICacheRules(in_memory_retention_s=0),
    ],
)
def test_bad_configuration_is_a_config_error(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


# OpenAI


def tokens(count: int, start: int = 0) -> list[int]:
    return list(range(start, start + count))


def test_prompts_under_1024_tokens_are_never_cached() -> None:
    model = OpenAICacheModel()
    prompt = tokens(1023)
    model.request(prompt, now_s=0)
    assert model.request(prompt, now_s=1).cached_tokens == 0


def test_hits_come_in_128_token_steps_from_1024() -> None:
    model = OpenAICacheModel()
    prompt = tokens(1500)
    assert model.request(prompt, now_s=0).cached_tokens == 0
    usage = model.request(prompt, now_s=1)
    assert usage.cached_tokens == 1408  # 1024 + 3 * 128 <= 1500 < 1024 + 4 * 128
    assert (usage.cached_tokens - 1024) % 128 == 0
    longer = model.request([*prompt, *tokens(600, 10_000)], now_s=2)
    assert longer.cached_tokens == 1408


def test_a_shared_prefix_is_read_up_to_the_last_full_step() -> None:
    model = OpenAICacheModel()
    model.request(tokens(1300), now_s=0)
    diverging = [*tokens(1200), *tokens(500, 50_000)]
    assert model.request(diverging, now_s=1).cached_tokens == 1152


def test_the_same_prefix_under_another_key_can_miss() -> None:
    model = OpenAICacheModel(OpenAICacheRules(machines=8))
    prompt = tokens(2048)
    home = model.route(prompt, "tenant-a")
    other = next(f"tenant-{i}" for i in range(100) if model.route(prompt, f"tenant-{i}") != home)
    model.request(prompt, now_s=0, prompt_cache_key="tenant-a")
    assert model.request(prompt, now_s=1, prompt_cache_key="tenant-a").cached_tokens == 2048
    assert model.request(prompt, now_s=2, prompt_cache_key=other).cached_tokens == 0


def test_routing_depends_only_on_the_first_256_tokens_and_the_key() -> None:
    model = OpenAICacheModel(OpenAICacheRules(machines=64))
    head = tokens(256)
    assert model.route([*head, *tokens(900, 1000)], "k") == model.route([*head, 7], "k")


def test_more_than_15_requests_a_minute_overflow_to_another_machine() -> None:
    model = OpenAICacheModel()
    prompt = tokens(2048)
    machines = [model.request(prompt, now_s=i, prompt_cache_key="k").machine for i in range(16)]
    assert set(machines[:15]) == {model.route(prompt, "k")}
    assert machines[15] != machines[0]
    # a minute later the route's rate has dropped: back home, and still cached there
    back = model.request(prompt, now_s=100, prompt_cache_key="k")
    assert (back.machine, back.cached_tokens) == (machines[0], 2048)


def test_in_memory_retention_expires_after_idle_time_and_is_refreshed_by_use() -> None:
    model = OpenAICacheModel(OpenAICacheRules(overflow_requests_per_minute=None))
    prompt = tokens(1024)
    model.request(prompt, now_s=0)
    assert model.request(prompt, now_s=299, prompt_cache_key=None).cached_tokens == 1024
    assert model.lookup(prompt, now_s=598) == 1024  # refreshed at 299
    assert model.lookup(prompt, now_s=599) == 0


def test_in_memory_entries_live_at_most_an_hour() -> None:
    model = OpenAICacheModel(OpenAICacheRules(overflow_requests_per_minute=None))
    prompt = tokens(1024)
    for now_s in range(0, 3600, 240):
        model.request(prompt, now_s=now_s)
    assert model.lookup(prompt, now_s=3599) == 1024
    assert model.lookup(prompt, now_s=3600) == 0


def test_24h_retention_keeps_a_prefix_for_a_day() -> None:
    model = OpenAICacheModel()
    prompt = tokens(1024)
    model.request(prompt, now_s=0, retention="24h")
    assert model.lookup(prompt, now_s=86_399) == 1024
    assert model.lookup(prompt, now_s=86_400) == 0


def test_memory_follows_the_live_entries_not_the_requests() -> None:
    """A prompt refreshed on every request leaves no trail of stale expiry items (a
    24-hour lifetime kept a day of them), and routes idle for a minute are dropped
    from the rate table."""
    model = OpenAICacheModel()
    prompt = tokens(8192)
    for now_s in range(3000):
        model.request(prompt, now_s=float(now_s), retention="24h")
    cache = model._machines.caches[model.route(prompt)]
    assert len(cache) == 8192 // 128 - 7  # the steps from 1,024 tokens on
    assert len(cache._heap) <= 2 * len(cache) + cache._SLACK
    for number in range(3000):  # distinct routes, a minute apart
        model.request([number, *tokens(1024)], now_s=4000.0 + 61 * number)
    assert len(model._machines._recent) <= 2 + 2 * model._machines._SLACK


def test_an_unknown_retention_is_an_error() -> None:
    with pytest.raises(CacheControlError, match="prompt_cache_retention"):
        OpenAICacheModel().request(tokens(10), now_s=0, retention="1w")  # type: ignore[arg-type]


def test_gemini_implicit_rules_have_one_cache_and_no_key_routing() -> None:
    model = OpenAICacheModel(OpenAICacheRules.gemini_implicit())
    prompt = tokens(2000)
    model.request(prompt, now_s=0, prompt_cache_key="a")
    assert model.request(prompt, now_s=1, prompt_cache_key="b").cached_tokens == 1920


def test_the_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(10)
    assert clock.advance(5) == clock() == 15
    with pytest.raises(ConfigError):
        clock.advance(-1)


def test_the_emulator_reads_the_same_rules_as_the_breakpoint_planner() -> None:
    model = AnthropicCacheModel()
    assert model.rules is ANTHROPIC_RULES
    request = blocks([2048, 10], {0: TTL_5M_S})
    assert model.request(request, now_s=0, model="claude-haiku-4-5").uncached_tokens == 2058


def test_openai_usage_is_billed_as_cached_reads_and_uncached_rest() -> None:
    model = OpenAICacheModel()
    model.request(tokens(1300), now_s=0)
    billed = model.request(tokens(1300), now_s=1).input_tokens
    assert (billed.cache_read_tokens, billed.uncached_tokens, billed.cache_write_tokens) == (
        1280,
        20,
        0,
    )
