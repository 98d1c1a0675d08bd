"""Specification of the vLLM-style prefix-cache model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.sim import CacheResult, PrefixCacheModel, distinct_block_tokens
from contextpilot_rag.sim.block_hashes import chained_block_hashes

BLOCK = 4


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_computed_tokens_are_the_uncached_part_of_the_prompt() -> None:
    assert CacheResult(prompt_tokens=50, cached_tokens=32).computed_tokens == 18


def test_first_prompt_hits_nothing() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    assert cache.admit(tokens(0, 10)).cached_tokens == 0


def test_repeated_prompt_is_cached_except_its_partial_tail_block() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 10))
    result = cache.admit(tokens(0, 10))
    assert result == CacheResult(prompt_tokens=10, cached_tokens=8)
    assert result.computed_tokens == 2


def test_decoded_tokens_are_cached_for_the_next_turn_but_not_counted() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    first = cache.admit(tokens(0, 10), generated=tokens(10, 7))
    assert first == CacheResult(prompt_tokens=10, cached_tokens=0)
    assert cache.prompt_tokens_total == 10
    assert cache.used_tokens == 16  # four full blocks of prompt + answer; 1 token left over
    # The next turn's prompt repeats prompt + answer and goes on.
    assert cache.admit(tokens(0, 25)).cached_tokens == 16


def test_without_decoded_tokens_the_next_turn_stops_at_the_prompt() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 10))
    assert cache.admit(tokens(0, 25)).cached_tokens == 8


def test_block_aligned_repeat_recomputes_its_last_block_like_vllm() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 12))
    assert cache.admit(tokens(0, 12)).cached_tokens == 8


def test_prompt_differing_in_its_first_token_hits_nothing() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 40))
    assert cache.admit([999, *tokens(1, 39)]).cached_tokens == 0


def test_hits_stop_at_the_first_differing_block() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 40))
    changed = tokens(0, 40)
    changed[9] = -1  # inside the third block
    assert cache.admit(changed).cached_tokens == 8


def test_equal_blocks_after_different_prefixes_do_not_hit() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit([1, 1, 1, 1, 7, 7, 7, 7, 0])
    assert cache.admit([2, 2, 2, 2, 7, 7, 7, 7, 0]).cached_tokens == 0


def test_lookup_reports_hits_without_changing_state() -> None:
    cache = PrefixCacheModel(block_size=BLOCK, capacity_tokens=16)
    cache.admit(tokens(0, 17))
    before = (cache.used_tokens, cache.prompt_tokens_total, cache.cached_tokens_total)
    assert cache.lookup(tokens(0, 17)) == 16
    assert cache.lookup(tokens(100, 17)) == 0
    assert (cache.used_tokens, cache.prompt_tokens_total, cache.cached_tokens_total) == before
    assert cache.admit(tokens(0, 17)).cached_tokens == 16


def test_lookup_does_not_refresh_recency() -> None:
    cache = PrefixCacheModel(block_size=BLOCK, capacity_tokens=8)
    cache.admit(tokens(0, 4))
    cache.admit(tokens(100, 4))
    cache.lookup(tokens(0, 5))
    cache.admit(tokens(200, 4))  # evicts the least recently admitted: tokens(0, 4)
    assert cache.lookup(tokens(0, 5)) == 0
    assert cache.lookup(tokens(100, 5)) == 4


def test_full_cache_evicts_a_prompts_tail_before_its_head() -> None:
    cache = PrefixCacheModel(block_size=BLOCK, capacity_tokens=16)
    cache.admit(tokens(0, 16))  # four blocks, exactly at capacity
    cache.admit(tokens(100, 8))  # two new blocks push out two old ones
    assert cache.lookup(tokens(0, 17)) == 8


def test_least_recently_admitted_prompt_is_evicted_first() -> None:
    cache = PrefixCacheModel(block_size=BLOCK, capacity_tokens=16)
    cache.admit(tokens(0, 8))
    cache.admit(tokens(100, 8))
    cache.admit(tokens(0, 8))  # refreshes the first prompt
    cache.admit(tokens(200, 8))
    assert cache.lookup(tokens(0, 9)) == 8
    assert cache.lookup(tokens(100, 9)) == 0


def test_prompt_longer_than_capacity_keeps_its_head() -> None:
    cache = PrefixCacheModel(block_size=BLOCK, capacity_tokens=8)
    cache.admit(tokens(0, 40))
    assert cache.used_tokens == 8
    assert cache.lookup(tokens(0, 41)) == 8


def test_zero_capacity_never_hits() -> None:
    cache = PrefixCacheModel(block_size=BLOCK, capacity_tokens=0)
    cache.admit(tokens(0, 20))
    assert cache.admit(tokens(0, 20)).cached_tokens == 0
    assert cache.used_tokens == 0


def test_unbounded_cache_holds_every_full_block() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 10))
    cache.admit(tokens(100, 7))
    assert cache.used_tokens == 12
    assert cache.capacity_tokens is None


def test_totals_and_hit_ratio_accumulate_over_admits() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    assert cache.hit_ratio == 0.0
    cache.admit(tokens(0, 10))
    cache.admit(tokens(0, 10))
    assert (cache.prompt_tokens_total, cache.cached_tokens_total) == (20, 8)
    assert cache.hit_ratio == pytest.approx(0.4)


def test_reset_empties_the_cache_and_the_totals() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    cache.admit(tokens(0, 10))
    cache.reset()
    assert (cache.used_tokens, cache.prompt_tokens_total, cache.cached_tokens_total) == (0, 0, 0)
    assert cache.admit(tokens(0, 10)).cached_tokens == 0


def test_empty_prompt_costs_nothing() -> None:
    cache = PrefixCacheModel(block_size=BLOCK)
    assert cache.admit([]) == CacheResult(prompt_tokens=0, cached_tokens=0)


@pytest.mark.parametrize(
    ("block_size", "capacity_tokens"),
    [(0, None), (-1, None), (16, -1), (True, None), (16, 1.5)],
)
def test_bad_configuration_raises_config_error(block_size: object, capacity_tokens: object) -> None:
    with pytest.raises(ConfigError):
        PrefixCacheModel(block_size=block_size, capacity_tokens=capacity_tokens)  # type: ignore[arg-type]


def test_a_chained_block_hash_names_the_whole_prefix_up_to_its_block() -> None:
    first = chained_block_hashes(tokens(0, 10), BLOCK)
    same_head = chained_block_hashes([*tokens(0, 4), *tokens(100, 4)], BLOCK)
    same_tail = chained_block_hashes([*tokens(100, 4), *tokens(4, 4)], BLOCK)
    assert len(first) == 2  # the partial last block has no hash
    assert first[0] == same_head[0] and first[1] != same_head[1]
    assert first[1] != same_tail[1]  # equal tokens after a different prefix


def test_distinct_block_tokens_counts_shared_prefixes_once() -> None:
    prompts = [tokens(0, 10), tokens(0, 10), tokens(0, 6), tokens(100, 8)]
    assert distinct_block_tokens(prompts, block_size=BLOCK) == 16


def test_distinct_block_tokens_is_what_an_unbounded_cache_holds() -> None:
    prompts = [tokens(0, 30), [5, *tokens(1, 20)], tokens(0, 13)]
    cache = PrefixCacheModel(block_size=BLOCK)
    for prompt in prompts:
        cache.admit(prompt)
    assert distinct_block_tokens(prompts, block_size=BLOCK) == cache.used_tokens


prompts_strategy = st.lists(
    st.lists(st.integers(min_value=0, max_value=3), max_size=40), min_size=1, max_size=30
)


def reference_cached_tokens(history: list[list[int]], prompt: list[int], block: int) -> int:
    """Unbounded reference: the longest block-aligned prefix shared with any earlier
    prompt's full blocks, leaving the last token to compute."""
    best = 0
    for earlier in history:
        shared = 0
        while shared < min(len(earlier), len(prompt)) and earlier[shared] == prompt[shared]:
            shared += 1
        best = max(best, shared // block * block)
    return min(best, max(len(prompt) - 1, 0) // block * block)


@settings(max_examples=200, deadline=None)
@given(
    prompts=prompts_strategy,
    block_size=st.integers(min_value=1, max_value=5),
    capacity_tokens=st.one_of(st.none(), st.integers(min_value=0, max_value=60)),
)
def test_every_admit_respects_block_and_capacity_bounds(
    prompts: list[list[int]], block_size: int, capacity_tokens: int | None
) -> None:
    cache = PrefixCacheModel(block_size=block_size, capacity_tokens=capacity_tokens)
    for prompt in prompts:
        predicted = cache.lookup(prompt)
        result = cache.admit(prompt)
        assert result.cached_tokens == predicted
        assert 0 <= result.cached_tokens < max(len(prompt), 1)
        assert result.cached_tokens % block_size == 0
        if capacity_tokens is not None:
            assert cache.used_tokens <= capacity_tokens
    assert cache.cached_tokens_total <= cache.prompt_tokens_total


@settings(max_examples=200, deadline=None)
@given(prompts=prompts_strategy, block_size=st.integers(min_value=1, max_value=5))
def test_unbounded_cache_hits_the_longest_shared_block_prefix(
    prompts: list[list[int]], block_size: int
) -> None:
    cache = PrefixCacheModel(block_size=block_size)
    for i, prompt in enumerate(prompts):
        expected = reference_cached_tokens(prompts[:i], prompt, block_size)
        assert cache.admit(prompt).cached_tokens == expected


@settings(max_examples=100, deadline=None)
@given(
    prompts=prompts_strategy,
    block_size=st.integers(min_value=1, max_value=5),
    capacity_tokens=st.integers(min_value=0, max_value=60),
)
def test_bounded_cache_never_hits_more_than_unbounded(
    prompts: list[list[int]], block_size: int, capacity_tokens: int
) -> None:
    bounded = PrefixCacheModel(block_size=block_size, capacity_tokens=capacity_tokens)
    unbounded = PrefixCacheModel(block_size=block_size)
    for prompt in prompts:
        assert bounded.admit(prompt).cached_tokens <= unbounded.admit(prompt).cached_tokens
