"""Prices and money (docs/cloud.md): a dated price table with a source per row,
overridable, and the input cost of a request from any provider's usage report;
Anthropic usage feeds the pilot's index as OpenAI's does."""

from __future__ import annotations

import pytest

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.cloud import DEFAULT_PRICES, ModelPrice, PriceTable, input_cost
from contextpilot_rag.errors import ConfigError, InvalidInputError
from contextpilot_rag.usage import InputTokens, parse_input_tokens

SONNET = "claude-sonnet-4-5-20250929"


def test_every_row_is_dated_and_sourced() -> None:
    assert len(DEFAULT_PRICES) >= 10
    for row in DEFAULT_PRICES:
        assert row.source.startswith("https://") and len(row.read_on) == 10
        assert row.cache_read <= row.input


def test_anthropic_rows_follow_the_published_multipliers() -> None:
    row = DEFAULT_PRICES.price(SONNET)
    assert (row.input, row.cache_write_5m, row.cache_write_1h, row.cache_read) == (
        3.0,
        3.75,
        6.0,
        0.3,
    )


def test_anthropic_usage_costs_writes_and_reads_apart() -> None:
    usage = {
        "input_tokens": 100,
        "cache_creation_input_tokens": 1000,
        "cache_read_input_tokens": 4000,
        "cache_creation": {"ephemeral_5m_input_tokens": 600, "ephemeral_1h_input_tokens": 400},
        "output_tokens": 50,
    }
    cost = input_cost(usage, SONNET)
    assert cost.tokens == InputTokens(100, 4000, 600, 400, 50)
    expected = (100 * 3.0 + 4000 * 0.3 + 600 * 3.75 + 400 * 6.0) / 1e6
    assert cost.total == pytest.approx(expected)
    assert cost.uncached_baseline == pytest.approx(5100 * 3.0 / 1e6)
    assert cost.saving == pytest.approx(cost.uncached_baseline - expected)


@pytest.mark.parametrize(
    ("report", "tokens"),
    [
        (
            {"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1536}},
            InputTokens(464, 1536),
        ),
        (  # LiteLLM in front of Anthropic: prompt_tokens counts the writes
            {
                "prompt_tokens": 2000,
                "prompt_tokens_details": {"cached_tokens": 1000},
                "cache_creation_input_tokens": 800,
                "completion_tokens": 7,
            },
            InputTokens(200, 1000, 800, 0, 7),
        ),
        (  # the same with 1-hour writes: LiteLLM's split of them
            {
                "prompt_tokens": 2000,
                "prompt_tokens_details": {
                    "cached_tokens": 1000,
                    "cache_creation_token_details": {
                        "ephemeral_5m_input_tokens": 300,
                        "ephemeral_1h_input_tokens": 500,
                    },
                },
                "cache_creation_input_tokens": 800,
            },
            InputTokens(200, 1000, 300, 500),
        ),
        (
            {"prompt_token_count": 3000, "cached_content_token_count": 2048},
            InputTokens(952, 2048),
        ),
        (
            {
                "usage_metadata": {
                    "input_tokens": 3000,
                    "output_tokens": 3,
                    "input_token_details": {"cache_read": 2000, "cache_creation": 500},
                }
            },
            InputTokens(500, 2000, 500, 0, 3),
        ),
        (
            {
                "cache_read_input_tokens": None,
                "cache_creation_input_tokens": 900,
                "input_tokens": 5,
            },
            InputTokens(5, 0, 900),
        ),
    ],
)
def test_usage_shapes_are_read_into_billed_tokens(report: object, tokens: InputTokens) -> None:
    assert parse_input_tokens(report) == tokens


def test_openai_cached_input_is_billed_at_the_cached_price() -> None:
    usage = {"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1024}}
    cost = input_cost(usage, "gpt-4o-mini-2024-07-18")
    assert cost.total == pytest.approx((976 * 0.15 + 1024 * 0.075) / 1e6)
    assert cost.cache_write == 0


def test_prices_are_user_overridable() -> None:
    table = DEFAULT_PRICES.with_overrides(
        ModelPrice("acme", "acme-1", input=1.0, cache_read=0.2, source="contract"),
        **{SONNET[:17]: {"input": 2.0}},
    )
    assert table.price("acme-1-20260101").cache_read == 0.2
    assert table.price(SONNET).input == 2.0 and table.price(SONNET).source == "user override"
    assert DEFAULT_PRICES.price(SONNET).input == 3.0  # the default is unchanged
    with pytest.raises(ConfigError):
        DEFAULT_PRICES.with_overrides(**{"no-such-model": {"input": 1.0}})
    with pytest.raises(ConfigError):
        ModelPrice("p", "m", input=-1.0, cache_read=0.1)
    with pytest.raises(ConfigError):
        PriceTable(["not a row"])  # type: ignore[list-item]


@pytest.mark.parametrize("price", ["2.5", "abc", True, float("nan"), float("inf"), -0.5, [1]])
def test_a_price_that_is_not_a_finite_number_is_refused_where_it_is_given(price: object) -> None:
    with pytest.raises(ConfigError, match="finite number"):
        ModelPrice("p", "m", input=price, cache_read=0.1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite number"):
        ModelPrice("p", "m", input=1.0, cache_read=0.1, cache_write_5m=price)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite number"):
        DEFAULT_PRICES.with_overrides(**{SONNET[:17]: {"input": price}})  # type: ignore[dict-item]
    assert DEFAULT_PRICES.price(SONNET).input == 3.0


@pytest.mark.parametrize(
    ("model", "row"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-20250514", "claude-opus-4"),
        ("claude-opus-4-7", "claude-opus-4-7"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
    ],
)
def test_a_row_prices_its_model_and_its_dated_releases(model: str, row: str) -> None:
    assert DEFAULT_PRICES.price(model).model == row


@pytest.mark.parametrize("model", ["claude-opus-4-9", "gpt-5.4-pro", "claude-sonnet-4-6-fast"])
def test_a_newer_model_is_not_priced_as_the_one_its_name_starts_with(model: str) -> None:
    assert model not in DEFAULT_PRICES
    with pytest.raises(InvalidInputError, match="with_overrides"):
        DEFAULT_PRICES.price(model)


def test_an_unknown_model_or_report_is_refused() -> None:
    with pytest.raises(InvalidInputError):
        input_cost({"input_tokens": 5, "cache_read_input_tokens": 0}, "unknown-model")
    with pytest.raises(InvalidInputError):
        input_cost({"tokens": 5}, SONNET)


def _docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(text=f"Document {n}: " + f"{n} facts. " * 40, id=n) for n in names]


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": 990, "cache_read_input_tokens": 10, "cache_creation_input_tokens": 0},
        {"input_tokens": 10, "cache_read_input_tokens": None, "cache_creation_input_tokens": 990},
    ],
)
def test_anthropic_usage_corrects_the_index_like_openai_usage(
    pilot: ContextPilot, usage: dict[str, object]
) -> None:
    pilot.optimize(_docs("a", "b", "c"), "Q1?")
    second = pilot.optimize(_docs("a", "b", "d"), "Q2?")
    assert second.stats.blocks_matched == 2
    assert pilot.observe(second, usage) == 1  # predicted a hit, the provider served none
    assert pilot.index_stats().requests == 1


def test_the_anthropic_sdks_usage_object_is_read() -> None:
    anthropic_types = pytest.importorskip("anthropic.types")
    usage = anthropic_types.Usage(
        input_tokens=12,
        output_tokens=3,
        cache_creation_input_tokens=2048,
        cache_read_input_tokens=4096,
    )
    assert parse_input_tokens(usage) == InputTokens(12, 4096, 2048, 0, 3)
