"""One JSON Lines line as an object, for every reader of JSON Lines in the package
(``contextpilot-rag optimize``, ``eval`` task files, trace files)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_object"]


def json_object(line: str, error: type[Exception]) -> dict[str, Any]:
    """``line`` parsed as a JSON object; anything else raises ``error`` with the reason
    (the caller adds where the line is). Every line the parser refuses is the line's
    error: bad syntax, an integer past Python's digit limit, nesting too deep to parse."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer literal over sys.get_int_max_str_digits()
        raise error(f"not valid JSON ({exc})") from None
    except RecursionError:
        raise error("not valid JSON (nested too deeply)") from None
    if not isinstance(item, dict):
        raise error(f"expected a JSON object, got {type(item).__name__}")
    return item
