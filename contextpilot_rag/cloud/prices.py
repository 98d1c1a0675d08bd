"""Prices of hosted models' input, cache and output tokens, and the money a request's
input cost.

:data:`DEFAULT_PRICES` is a dated snapshot of published list prices (USD per million
tokens), each row with the page it was read from and the date it was read. Prices
change: pass your own rows (:meth:`PriceTable.with_overrides`, or a new
:class:`PriceTable`) for current, negotiated or regional prices. A row prices its model
and the model's dated releases (``"claude-sonnet-4-5"`` prices
``"claude-sonnet-4-5-20250929"``), never another model whose name it starts
(``"claude-opus-4"`` does not price ``"claude-opus-4-7"``: an unlisted model is refused,
not priced as an older one; :func:`~.model_names.match_model_name`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from .._numbers import is_finite_at_least
from ..errors import ConfigError, InvalidInputError
from ..usage import InputTokens, parse_input_tokens
from .model_names import match_model_name

__all__ = [
    "DEFAULT_PRICES",
    "PRICES_READ_ON",
    "InputCost",
    "ModelPrice",
    "PriceTable",
    "input_cost",
]

PRICES_READ_ON = "2026-11-25"
"""The date the rows of :data:`DEFAULT_PRICES` were read from their sources."""

_PER_MILLION = 1_000_000


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens of one model. ``cache_write_5m`` / ``cache_write_1h``:
    the price of a write for the shorter and the longer lifetime (Anthropic's 5 minutes
    and 1 hour; OpenAI's 30-minute write on ``gpt-5.6`` and later is the shorter),
    ``None`` where the provider charges no write premium (OpenAI before ``gpt-5.6``,
    Gemini's implicit cache: a write costs ``input``). ``output``: ``None`` when not listed here.
    ``source``: the page the row was read from; ``read_on``: when (ISO date)."""

    provider: str
    model: str
    input: float
    cache_read: float
    cache_write_5m: float | None = None
    cache_write_1h: float | None = None
    output: float | None = None
    source: str = ""
    read_on: str = PRICES_READ_ON

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("ModelPrice.model must be a non-empty str")
        for name in ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output"):
            value = getattr(self, name)
            if value is None and name in ("input", "cache_read"):
                raise ConfigError(f"ModelPrice.{name} is required")
            if value is not None and not is_finite_at_least(value, 0):
                raise ConfigError(
                    f"ModelPrice.{name} must be a finite number >= 0 (USD per million "
                    f"tokens), got {value!r}"
                )


@dataclass(frozen=True)
class InputCost:
    """The input side of one request's bill, in USD: ``uncached``, ``cache_read`` and
    ``cache_write`` parts and their ``total``; ``uncached_baseline`` is what the same
    input would cost with no cache at all (every token at the base input price)."""

    tokens: InputTokens
    price: ModelPrice
    uncached: float
    cache_read: float
    cache_write: float

    @property
    def total(self) -> float:
        return self.uncached + self.cache_read + self.cache_write

    @property
    def uncached_baseline(self) -> float:
        return self.tokens.prompt_tokens * self.price.input / _PER_MILLION

    @property
    def saving(self) -> float:
        """``uncached_baseline - total`` (negative when writes cost more than reads saved)."""
        return self.uncached_baseline - self.total


class PriceTable:
    """Model prices by model name; immutable (:meth:`with_overrides` returns a new
    table)."""

    def __init__(self, rows: Iterable[ModelPrice] = ()) -> None:
        by_model: dict[str, ModelPrice] = {}
        for row in rows:
            if not isinstance(row, ModelPrice):
                raise ConfigError(f"PriceTable rows must be ModelPrice, got {type(row).__name__}")
            by_model[row.model] = row
        self._by_model = by_model

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._by_model.values())

    def __len__(self) -> int:
        return len(self._by_model)

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self._match(model) is not None

    def price(self, model: str) -> ModelPrice:
        """The row of ``model`` or of the model it is a dated release of;
        :class:`InvalidInputError` when none is listed."""
        if not isinstance(model, str):
            raise InvalidInputError(f"model must be a str, got {type(model).__name__}")
        row = self._match(model)
        if row is None:
            raise InvalidInputError(
                f"no price for model {model!r}; add one with "
                "PriceTable.with_overrides(ModelPrice(...))"
            )
        return row

    def with_overrides(self, *rows: ModelPrice, **changes: dict[str, float]) -> PriceTable:
        """A table with ``rows`` added or replacing the rows of their models, and
        ``changes`` applied: ``model_name={"input": 2.5, ...}`` replaces fields of an
        existing row (its ``source`` becomes ``"user override"``)."""
        table = PriceTable([*self._by_model.values(), *rows])
        for model, fields in changes.items():
            row = table._by_model.get(model)
            if row is None:
                raise ConfigError(f"no row for model {model!r} to override; pass a ModelPrice")
            try:
                table._by_model[model] = replace(row, **fields, source="user override")  # type: ignore[arg-type]
            except TypeError as exc:
                raise ConfigError(f"bad price override for {model!r}: {exc}") from exc
        return table

    def _match(self, model: str) -> ModelPrice | None:
        row = self._by_model.get(model)
        if row is not None:
            return row
        name = match_model_name(model, self._by_model)
        return None if name is None else self._by_model[name]


def input_cost(
    usage: object, model: str | ModelPrice, table: PriceTable | None = None
) -> InputCost:
    """The input cost of a request from its usage report (any shape
    :func:`~contextpilot_rag.usage.parse_input_tokens` reads: OpenAI, Anthropic,
    Gemini, LangChain, a response carrying one) or an :class:`InputTokens`, at
    ``model``'s price in ``table`` (:data:`DEFAULT_PRICES`) or at a given
    :class:`ModelPrice`."""
    price = model if isinstance(model, ModelPrice) else (table or DEFAULT_PRICES).price(model)
    tokens = usage if isinstance(usage, InputTokens) else parse_input_tokens(usage)
    write_5m = price.input if price.cache_write_5m is None else price.cache_write_5m
    write_1h = price.input if price.cache_write_1h is None else price.cache_write_1h
    return InputCost(
        tokens,
        price,
        uncached=tokens.uncached_tokens * price.input / _PER_MILLION,
        cache_read=tokens.cache_read_tokens * price.cache_read / _PER_MILLION,
        cache_write=(
            tokens.cache_write_5m_tokens * write_5m + tokens.cache_write_1h_tokens * write_1h
        )
        / _PER_MILLION,
    )


# Anthropic's own pricing page ("Model pricing" table: base input, 5 m / 1 h cache
# writes, cache hits, output); every Anthropic row below matches it
_ANTHROPIC_PRICING = "https://platform.claude.com/docs/en/about-claude/pricing"
_OPENAI_54 = "https://benchlm.ai/blog/posts/openai-api-pricing"  # quotes OpenAI's pricing page
_OPENAI_4O = "https://chatgptpricing-akr.pages.dev/api-pricing"  # quotes OpenAI's pricing page
# quotes OpenAI's gpt-5.6 preview: input / output, writes 1.25x input, reads 0.1x
_OPENAI_56 = "https://www.calcaas.com/blog/gpt-5-6-pricing-sol-terra-luna-cost-breakdown"


def _multiplied(
    provider: str, model: str, base: float, output: float, source: str, read_on: str, hour: bool
) -> ModelPrice:
    """A row by the provider's multipliers: reads 0.1×, writes 1.25× (and 2× for the
    hour's when ``hour``)."""
    return ModelPrice(
        provider,
        model,
        input=base,
        cache_read=round(base * 0.1, 6),
        cache_write_5m=round(base * 1.25, 6),
        cache_write_1h=round(base * 2.0, 6) if hour else None,
        output=output,
        source=source,
        read_on=read_on,
    )


def _anthropic(
    model: str, base: float, output: float, source: str, read_on: str = PRICES_READ_ON
) -> ModelPrice:
    """Anthropic's rows follow its multipliers: writes 1.25× / 2×, reads 0.1×."""
    return _multiplied("anthropic", model, base, output, source, read_on, hour=True)


def _openai_breakpoints(model: str, base: float, output: float) -> ModelPrice:
    """OpenAI's ``gpt-5.6`` rows follow its multipliers: writes 1.25× (30 minutes),
    reads 0.1×."""
    return _multiplied("openai", model, base, output, _OPENAI_56, "2026-11-30", hour=False)


DEFAULT_PRICES = PriceTable(
    [
        _anthropic("claude-opus-5", 5.0, 25.0, _ANTHROPIC_PRICING, "2026-11-30"),
        _anthropic("claude-opus-4-8", 5.0, 25.0, _ANTHROPIC_PRICING, "2026-11-30"),
        _anthropic("claude-opus-4-7", 5.0, 25.0, _ANTHROPIC_PRICING, "2026-11-30"),
        _anthropic("claude-opus-4-6", 5.0, 25.0, _ANTHROPIC_PRICING),
        _anthropic("claude-sonnet-4-6", 3.0, 15.0, _ANTHROPIC_PRICING),
        _anthropic("claude-opus-4-5", 5.0, 25.0, _ANTHROPIC_PRICING),
        _anthropic("claude-opus-4-1", 15.0, 75.0, _ANTHROPIC_PRICING),
        _anthropic("claude-opus-4", 15.0, 75.0, _ANTHROPIC_PRICING),
        _anthropic("claude-sonnet-4-5", 3.0, 15.0, _ANTHROPIC_PRICING),
        _anthropic("claude-sonnet-4", 3.0, 15.0, _ANTHROPIC_PRICING),
        _anthropic("claude-3-7-sonnet", 3.0, 15.0, _ANTHROPIC_PRICING),
        _anthropic("claude-haiku-4-5", 1.0, 5.0, _ANTHROPIC_PRICING),
        _anthropic("claude-3-5-haiku", 0.8, 4.0, _ANTHROPIC_PRICING),
        ModelPrice("anthropic", "claude-3-haiku", 0.25, 0.03, 0.30, 0.50, 1.25, _ANTHROPIC_PRICING),
        _openai_breakpoints("gpt-5.6-sol", 5.0, 30.0),
        _openai_breakpoints("gpt-5.6-terra", 2.5, 15.0),
        _openai_breakpoints("gpt-5.6-luna", 1.0, 6.0),
        ModelPrice("openai", "gpt-5.4", 2.50, 0.25, output=15.0, source=_OPENAI_54),
        ModelPrice("openai", "gpt-5.4-mini", 0.75, 0.075, output=4.50, source=_OPENAI_54),
        ModelPrice("openai", "gpt-5.4-nano", 0.20, 0.02, output=1.25, source=_OPENAI_54),
        ModelPrice("openai", "gpt-5.1", 1.25, 0.125, output=10.0, source=_OPENAI_54),
        ModelPrice("openai", "gpt-4o", 2.50, 1.25, output=10.0, source=_OPENAI_4O),
        ModelPrice("openai", "gpt-4o-mini", 0.15, 0.075, output=0.60, source=_OPENAI_4O),
    ]
)
"""List prices (USD per million tokens), each row read on its ``read_on``
(:data:`PRICES_READ_ON` unless it says a later date). Anthropic's
from its own pricing page; OpenAI's from pages that reproduce OpenAI's table (the
``source`` of each row): check those against OpenAI's pricing page before relying on
them, and override any row with :meth:`PriceTable.with_overrides`."""
