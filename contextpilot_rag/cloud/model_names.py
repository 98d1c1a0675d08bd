"""Which listed model name a provider's model name is a version of.

A listed name matches itself and its dated or versioned releases:
``claude-sonnet-4-5`` matches ``claude-sonnet-4-5-20250929`` (Anthropic),
``claude-sonnet-4-5@20250929`` (Vertex), ``-latest`` and a Bedrock-style ``-v1:0``
suffix; ``gpt-4o`` matches ``gpt-4o-2024-08-06``. A longer name is another model, not
a release: ``claude-opus-4`` does not match ``claude-opus-4-7``, ``gpt-5.4`` does not
match ``gpt-5.4-pro`` (a plain prefix match priced and sized them as the older model).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["match_model_name"]

_RELEASE = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|@\d{8}|-latest)?(?:-v\d+(?::\d+)?)?")


def match_model_name(model: str, names: Iterable[str]) -> str | None:
    """The longest of ``names`` that ``model`` is (a release of); ``None`` when none."""
    matches = [
        name for name in names if model.startswith(name) and _RELEASE.fullmatch(model[len(name) :])
    ]
    return max(matches, key=len) if matches else None
