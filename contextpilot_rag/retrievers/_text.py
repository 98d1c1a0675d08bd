"""The default word tokenizer shared by the BM25 retriever and the hashing embedder."""

from __future__ import annotations

import re

_WORD = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits


def word_tokens(text: str) -> list[str]:
    """Lowercase runs of letters and digits: ``"Solar-Panels, 2024!"`` →
    ``["solar", "panels", "2024"]``. Punctuation, underscores and whitespace split."""
    return _WORD.findall(text.lower())
