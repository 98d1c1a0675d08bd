"""Dense retrieval over an exact FAISS flat index (the ``faiss-cpu`` package, extra
``[faiss]``), with an offline hashing embedder by default."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from ..blocks import ContextBlock
from ..errors import ConfigError
from ._corpus import Corpus, check_query
from ._optional import import_optional
from .hashing import HashingEmbedder

__all__ = ["EmbedFn", "FaissRetriever", "Metric"]

EmbedFn = Callable[[Sequence[str]], np.ndarray]
Metric = Literal["cosine", "ip", "l2"]
_METRICS = ("cosine", "ip", "l2")


class FaissRetriever:
    """Nearest documents by embedding, searched exhaustively (``IndexFlatIP`` /
    ``IndexFlatL2``), so results are exact and deterministic.

    ``documents`` are :class:`ContextBlock` s or strings (a string becomes a block
    whose id is the hash of its text); an empty list is allowed. ``embed`` maps a
    list of texts to an array of shape ``(len(texts), dim)`` of real numbers; it
    defaults to :class:`HashingEmbedder` ``()`` (lexical, offline). The dimension is
    fixed by the first call; any later output of another shape, a non-numeric dtype
    or a non-finite value raises :class:`ConfigError` and stores nothing.

    ``metric`` sets what ``score`` means, higher always better:

    * ``"cosine"`` (default): cosine similarity (inner product of L2-normalised
      vectors; a zero vector scores 0 against everything);
    * ``"ip"``: raw inner product;
    * ``"l2"``: minus the squared Euclidean distance.

    :meth:`retrieve` returns ``min(k, len(self))`` documents — dense search has no
    notion of "no match" — ties in insertion order. Thread-safe: :meth:`add` and
    :meth:`retrieve` hold one lock.
    """

    def __init__(
        self,
        documents: Sequence[ContextBlock | str],
        *,
        embed: EmbedFn | None = None,
        metric: Metric = "cosine",
    ) -> None:
        self._faiss = import_optional("faiss", "faiss")
        if metric not in _METRICS:
            raise ConfigError(f"metric must be one of {_METRICS}, got {metric!r}")
        if embed is not None and not callable(embed):
            raise ConfigError("embed must be a callable list[str] -> array (n, dim), or None")
        self.metric: Metric = metric
        self._embed: EmbedFn = embed if embed is not None else HashingEmbedder()
        self._lock = threading.Lock()
        self._corpus = Corpus()
        self._index: Any = None  # faiss flat index; row i is document i; None until dim known
        self.add(documents)

    def __len__(self) -> int:
        return len(self._corpus)

    @property
    def dim(self) -> int | None:
        """The embedding dimension, ``None`` until something was embedded."""
        return None if self._index is None else int(self._index.d)

    @property
    def documents(self) -> tuple[ContextBlock, ...]:
        """Every document, in insertion order."""
        with self._lock:
            return self._corpus.blocks

    def add(self, documents: Sequence[ContextBlock | str]) -> None:
        """Embed and add documents; one already present (same id, same text) is
        skipped. Raises :class:`InvalidInputError`, :class:`BlockConflictError` or
        :class:`ConfigError` (bad embedder output) before adding any of them."""
        with self._lock:
            blocks = self._corpus.new_blocks(documents)
            if not blocks:
                return
            vectors = self._vectors([block.text for block in blocks])
            if self._index is None:
                self._index = self._new_index(vectors.shape[1])
            self._index.add(vectors)
            self._corpus.extend(blocks)

    def retrieve(self, query: str, k: int = 10) -> list[ContextBlock]:
        """The ``min(k, len(self))`` nearest documents, best first, each a copy of the
        stored block with ``score`` set. An empty retriever returns ``[]`` without
        calling the embedder."""
        check_query(query, k)
        with self._lock:
            if not self._corpus:
                return []
            vector = self._vectors([query])
            found, rows = self._index.search(vector, min(k, len(self._corpus)))
            scores = -found[0] if self.metric == "l2" else found[0]
            order = np.lexsort((rows[0], -scores))
            return [self._corpus.scored(int(rows[0][i]), scores[i]) for i in order.tolist()]

    def _new_index(self, dim: int) -> Any:
        if self.metric == "l2":
            return self._faiss.IndexFlatL2(dim)
        return self._faiss.IndexFlatIP(dim)

    def _vectors(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` as faiss wants them (C-contiguous float32),
        normalised for cosine."""
        vectors = _checked_embeddings(self._embed(texts), len(texts), self.dim)
        if self.metric == "cosine":
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors


def _checked_embeddings(output: object, n_texts: int, dim: int | None) -> np.ndarray:
    """``output`` as a fresh float32 array of shape ``(n_texts, dim)``, or a
    :class:`ConfigError` saying what the embedding function got wrong."""
    try:
        array = np.asarray(output)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"embed returned {type(output).__name__}, not an array") from exc
    if array.dtype.kind not in "iuf":
        raise ConfigError(
            f"embed returned an array of dtype {array.dtype}; it must return real numbers"
        )
    expected = f"({n_texts}, {'dim' if dim is None else dim})"
    if array.ndim != 2 or array.shape[0] != n_texts or array.shape[1] < 1:
        raise ConfigError(
            f"embed returned shape {array.shape} for {n_texts} texts; expected {expected}"
        )
    if dim is not None and array.shape[1] != dim:
        raise ConfigError(
            f"embed returned dimension {array.shape[1]}, but the index has dimension {dim}"
        )
    vectors = np.array(array, dtype=np.float32, order="C")  # always a copy
    if not np.isfinite(vectors).all():
        raise ConfigError("embed returned NaN or infinite values")
    return vectors
