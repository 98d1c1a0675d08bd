"""The one error this package adds to :mod:`contextpilot_rag.errors`."""

from __future__ import annotations

from contextpilot_rag.errors import InvalidInputError

__all__ = ["Mem0ResponseError"]


class Mem0ResponseError(InvalidInputError):
    """The wrapped memory's ``search`` returned something this package cannot read:
    not a mapping with a ``"results"`` list (mem0 2.x), or a result without a string
    ``"memory"`` or a string/int ``"id"``. Raised before the pilot stores anything."""
