"""Specification of the llama-server slot and prompt-cache model (sim.slot_cache)."""

from __future__ import annotations

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.sim.slot_cache import LlamaServerCacheModel


def tokens(*runs: tuple[int, int]) -> list[int]:
    """Concatenated ranges: ``tokens((0, 5), (100, 103))`` = 0..4, 100..102."""
    return [t for start, stop in runs for t in range(start, stop)]


A = tokens((0, 100))
B = tokens((1000, 1100))


def test_the_slot_serves_the_common_prefix_and_the_last_token_is_computed() -> None:
    cache = LlamaServerCacheModel()
    assert cache.admit(A).cached_tokens == 0
    assert cache.admit(tokens((0, 100), (500, 520))).cached_tokens == 100  # extends the slot
    # a prompt the slot holds entirely: its last token is still evaluated
    assert cache.admit(tokens((0, 100), (500, 520))).cached_tokens == 119


def test_generated_tokens_stay_in_the_slot_but_the_last() -> None:
    cache = LlamaServerCacheModel()
    cache.admit(A, generated=[7, 8, 9])
    # the next turn carries the answer: everything but the last answer token is reused
    assert cache.admit([*A, 7, 8, 9, 42]).cached_tokens == 102


def test_a_slot_kept_by_more_than_half_is_not_saved() -> None:
    cache = LlamaServerCacheModel()
    cache.admit(A)
    cache.admit(tokens((0, 60), (200, 240)))  # keeps 60% of the slot: taken, not saved
    assert cache.saved_prompts == 0
    # so A's last 40 tokens are gone: going back reads only the 60 in common
    assert cache.admit(A).cached_tokens == 60


def test_a_slot_kept_by_less_than_half_is_saved_and_restored_later() -> None:
    cache = LlamaServerCacheModel()
    cache.admit(A)
    other = tokens((0, 20), (300, 400))  # keeps 20% of A (> 10% of itself): saved
    assert cache.admit(other).cached_tokens == 20
    assert cache.saved_prompts == 1
    # A's continuation keeps all of the saved A (and more of it than of the slot): restored
    assert cache.admit(tokens((0, 100), (600, 610))).cached_tokens == 100
    assert cache.saved_prompts == 1  # the slot (other) saved, A taken out


def test_an_unrelated_prompt_takes_the_slot_as_least_recently_used_and_saves_it() -> None:
    cache = LlamaServerCacheModel()
    cache.admit(A)
    assert cache.admit(B).cached_tokens == 0  # shares nothing: LRU path, A saved
    assert cache.admit(A).cached_tokens == 99  # restored whole, its last token computed
    assert cache.saved_prompts == 1  # B saved when A came back


def test_an_entry_kept_by_less_than_a_quarter_is_not_restored() -> None:
    cache = LlamaServerCacheModel()
    long_a = tokens((0, 400))
    cache.admit(long_a)
    cache.admit(B)  # long_a saved
    # shares 80 tokens with long_a: 20% of it (< 25%), so it is not restored
    assert cache.admit(tokens((0, 80), (900, 910))).cached_tokens == 0


def test_a_slot_contained_in_a_saved_prompt_is_not_saved_again() -> None:
    cache = LlamaServerCacheModel()
    long_a = tokens((0, 400))
    cache.admit(long_a)
    cache.admit(B)  # long_a saved
    # its first 80 tokens: 20% of long_a, too little to restore it; the slot (B) saved
    assert cache.admit(tokens((0, 80))).cached_tokens == 0
    assert cache.saved_prompts == 2
    cache.admit(tokens((3000, 3100)))  # the slot (long_a's first 80) is in long_a: not saved
    assert cache.saved_prompts == 2


def test_without_the_prompt_cache_only_the_slot_is_reused() -> None:
    cache = LlamaServerCacheModel(prompt_cache=False)
    cache.admit(A)
    cache.admit(B)
    assert cache.admit(A).cached_tokens == 0
    assert cache.saved_prompts == 0


def test_capacity_drops_the_oldest_saved_prompts() -> None:
    c, d = tokens((2000, 2100)), tokens((3000, 3100))
    cache = LlamaServerCacheModel(capacity_tokens=250)
    for prompt in (A, B, c, d):  # each saves the one before: A, B, then c drops A
        cache.admit(prompt)
    assert (cache.saved_prompts, cache.evicted_tokens) == (2, 100)
    # saving d drops B before c is looked for: c is restored whole
    assert cache.admit(c).cached_tokens == 99
    assert cache.evicted_tokens == 200
    assert cache.admit(A).cached_tokens == 0  # long gone


def test_reset_empties_slot_and_cache() -> None:
    cache = LlamaServerCacheModel(capacity_tokens=150)
    cache.admit(A)
    cache.admit(B)
    cache.admit(tokens((2000, 2100)))
    cache.reset()
    assert (cache.saved_prompts, cache.evicted_tokens) == (0, 0)
    assert cache.admit(A).cached_tokens == 0


@pytest.mark.parametrize(
    "arguments", [{"capacity_tokens": -1}, {"capacity_tokens": 1.5}, {"similarity": 1.0}]
)
def test_bad_settings_are_config_errors(arguments: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        LlamaServerCacheModel(**arguments)  # type: ignore[arg-type]
