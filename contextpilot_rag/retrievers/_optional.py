"""Lazy imports of the optional back-ends, so the core imports without them."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import MissingExtraError


def import_optional(module: str, extra: str) -> Any:
    """The module ``module``, or a :class:`MissingExtraError` (an :class:`ImportError`)
    naming the extra that installs it. Typed ``Any``: rank-bm25 and faiss ship no type
    stubs."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f'{module!r} is not installed; install it with: pip install "contextpilot-rag[{extra}]"'
        ) from exc
