"""What counts as a number in a configuration or a report: a bool is not a count
(``True`` is an ``int``), and NaN is no number at all (it passes every range check,
then spoils every sum it enters)."""

from __future__ import annotations

import math

__all__ = ["is_finite_at_least", "is_finite_positive", "is_int", "is_number"]


def is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An ``int`` or ``float`` that is neither a ``bool`` nor NaN (infinities pass)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def is_finite_at_least(value: object, low: float) -> bool:
    """A finite number at least ``low``."""
    return is_number(value) and math.isfinite(value) and value >= low  # type: ignore[arg-type,operator]


def is_finite_positive(value: object) -> bool:
    """A finite number above 0 (a rate, a timeout, a price multiplier)."""
    return is_finite_at_least(value, 0) and value > 0  # type: ignore[operator]
