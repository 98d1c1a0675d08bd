"""An offline, deterministic text embedder by feature hashing.

Each text becomes a bag of features — lowercase word n-grams and, optionally,
character n-grams of each word — and each feature adds ±1 to one of ``dim`` slots
chosen by a keyed BLAKE2b hash (the "hashing trick" with a signed hash, so colliding
features tend to cancel instead of piling up). Rows are L2-normalised, so the inner
product of two embeddings is their cosine similarity.

The result is **lexical, not semantic**: texts are similar when they share words (or
word pieces), never because they mean the same thing. "car" and "automobile" are
unrelated to it. It exists so that examples, tests and benchmarks run with no model
download; plug a real embedding model into :class:`FaissRetriever` for semantic search.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from ..blocks import is_list_like
from ..errors import ConfigError, InvalidInputError
from ._text import word_tokens

__all__ = ["HashingEmbedder"]

_SLOT_CACHE_SIZE = 1 << 18  # features whose (slot, sign) is remembered
_SIGN_BIT = 63


class HashingEmbedder:
    """``HashingEmbedder(dim)(texts)`` → float32 array of shape ``(len(texts), dim)``,
    each row of unit L2 norm (all zeros for a text without a letter or digit).

    ``ngram_range=(min_n, max_n)``: word n-gram sizes (default unigrams and bigrams).
    ``char_ngram_range``: character n-gram sizes taken inside each word padded with
    spaces (as scikit-learn's ``char_wb``), or ``None`` (default) for none; they make
    the embedding robust to inflections ("battery" / "batteries") at some cost.
    ``seed`` keys the hash: the same arguments give the same vectors in every process
    and on every platform, a different seed gives an independent hashing.
    A feature occurring ``c`` times in a text weighs ``1 + ln(c)`` (sublinear term
    frequency, so repeated stop words do not swamp the rest); there is no IDF.
    """

    def __init__(
        self,
        dim: int = 384,
        *,
        ngram_range: tuple[int, int] = (1, 2),
        char_ngram_range: tuple[int, int] | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"dim must be an int >= 1, got {dim!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ConfigError(f"seed must be an int in [0, 2**64), got {seed!r}")
        self.dim = dim
        self.ngram_range = _checked_range("ngram_range", ngram_range)
        self.char_ngram_range = (
            None
            if char_ngram_range is None
            else _checked_range("char_ngram_range", char_ngram_range)
        )
        self.seed = seed
        self._key = seed.to_bytes(8, "little")
        self._slots: dict[str, tuple[int, float]] = {}

    def __repr__(self) -> str:
        return (
            f"HashingEmbedder(dim={self.dim}, ngram_range={self.ngram_range}, "
            f"char_ngram_range={self.char_ngram_range}, seed={self.seed})"
        )

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` (a sequence of strings; a bare string is rejected)."""
        texts = _checked_texts(texts)
        flat_slots: list[int] = []
        weights: list[float] = []
        for row, text in enumerate(texts):
            for feature, count in Counter(self._features(text)).items():
                slot, sign = self._slot(feature)
                flat_slots.append(row * self.dim + slot)
                weights.append(sign * (1.0 + math.log(count)))
        sums = np.bincount(
            np.asarray(flat_slots, dtype=np.int64),
            weights=np.asarray(weights, dtype=np.float64),
            minlength=len(texts) * self.dim,
        )
        vectors = sums.astype(np.float64).reshape(len(texts), self.dim)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors.astype(np.float32)

    def _features(self, text: str) -> Iterator[str]:
        """Word n-grams (prefixed ``w:``) and character n-grams (prefixed ``c:``), so
        the two kinds never share a hash input."""
        words = word_tokens(text)
        low, high = self.ngram_range
        for n in range(low, high + 1):
            for start in range(len(words) - n + 1):
                yield "w:" + " ".join(words[start : start + n])
        if self.char_ngram_range is not None:
            low, high = self.char_ngram_range
            for word in words:
                padded = f" {word} "
                for n in range(low, min(high, len(padded)) + 1):
                    for start in range(len(padded) - n + 1):
                        yield "c:" + padded[start : start + n]

    def _slot(self, feature: str) -> tuple[int, float]:
        """The slot and sign of ``feature``: low 32 bits of a keyed 64-bit BLAKE2b
        pick the slot, the top bit the sign. Memoised (the cache only ever holds
        values the hash would recompute, so a racing clear is harmless)."""
        cached = self._slots.get(feature)
        if cached is not None:
            return cached
        digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8, key=self._key).digest()
        value = int.from_bytes(digest, "little")
        slot = ((value & 0xFFFFFFFF) % self.dim, 1.0 if value >> _SIGN_BIT else -1.0)
        if len(self._slots) >= _SLOT_CACHE_SIZE:
            self._slots.clear()
        self._slots[feature] = slot
        return slot


def _checked_range(name: str, value: object) -> tuple[int, int]:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in value)
        or not 1 <= value[0] <= value[1]
    ):
        raise ConfigError(f"{name} must be a tuple (min_n, max_n) with 1 <= min_n <= max_n")
    return (value[0], value[1])


def _checked_texts(texts: object) -> list[str]:
    if not is_list_like(texts):
        raise InvalidInputError(
            f"texts must be a sequence of str, got {type(texts).__name__} "
            "(wrap a single text in a list)"
        )
    checked: list[str] = []
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"texts[{position}] is {type(text).__name__}, expected str")
        checked.append(text)
    return checked
