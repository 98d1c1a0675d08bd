"""The default word tokenizer shared by the BM25 retriever and the hashing embedder."""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits


def word_tokens(text: str) -> list[str]:
    """Case-folded runs of letters and digits: ``"Solar-Panels, 2024!"`` →
    ``["solar", "panels", "2024"]``. Punctuation, underscores and whitespace split.
    Text is NFKC-normalized first, so a decomposed ``"café"`` (macOS file names, some
    PDFs) and full-width letters match what a user types."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
