"""The retriever contract: one method, a query in, ranked context blocks out."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..blocks import ContextBlock

__all__ = ["Retriever"]


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns the ``k`` blocks most relevant to ``query``, best first,
    each with its ``score`` set (higher is more relevant)."""

    def retrieve(self, query: str, k: int = ...) -> list[ContextBlock]:
        """At most ``k`` blocks, most relevant first."""
        ...
