"""One JSON Lines line as an object, for every reader of JSON Lines in the package
(``contextpilot-rag optimize``, ``eval`` task files, trace files)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_object"]


def json_object(line: str, error: type[Exception]) -> dict[str, Any]:
    """``line`` parsed as a JSON object; anything else raises ``error`` with the reason
    (the caller adds where the line is)."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise error(f"expected a JSON object, got {type(item).__name__}")
    return item
