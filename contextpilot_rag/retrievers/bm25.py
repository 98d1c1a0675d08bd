"""Lexical retrieval with Okapi BM25 (the ``rank-bm25`` package, extra ``[bm25]``)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..blocks import ContextBlock
from ..errors import ConfigError
from ._corpus import Corpus, check_query
from ._optional import import_optional
from ._text import word_tokens

__all__ = ["BM25Retriever"]

TokenizeFn = Callable[[str], Sequence[str]]


class BM25Retriever:
    """Okapi BM25 over a growing list of documents, scored by ``rank_bm25.BM25Okapi``
    with Lucene's IDF, ``log(1 + (N - n + 0.5) / (n + 0.5))``: positive for every term,
    where BM25Okapi's own IDF is zero or floored for a term in half or more of the
    documents, which makes small corpora rank oddly.

    ``documents`` are :class:`ContextBlock` s or strings (a string becomes a block
    whose id is the hash of its text); an empty list is allowed. ``tokenizer`` maps a
    text to its terms; the default lowercases and keeps runs of letters and digits.

    :meth:`retrieve` returns only documents with a positive score, that is, those
    containing at least one query term: fewer than ``k`` blocks (or none) may come
    back. Higher score first, ties in insertion order. Scores are comparable within
    one call only (IDF and average length change as documents are added).

    Thread-safe: :meth:`add` and :meth:`retrieve` hold one lock.
    """

    def __init__(
        self,
        documents: Sequence[ContextBlock | str],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        tokenizer: TokenizeFn | None = None,
    ) -> None:
        self._rank_bm25 = import_optional("rank_bm25", "bm25")
        if isinstance(k1, bool) or not isinstance(k1, (int, float)) or not k1 >= 0:
            raise ConfigError(f"k1 must be a number >= 0, got {k1!r}")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b <= 1:
            raise ConfigError(f"b must be a number in [0, 1], got {b!r}")
        if tokenizer is not None and not callable(tokenizer):
            raise ConfigError("tokenizer must be a callable str -> sequence of str, or None")
        self.k1 = float(k1)
        self.b = float(b)
        self._tokenize: TokenizeFn = tokenizer or word_tokens
        self._lock = threading.Lock()
        self._corpus = Corpus()
        self._terms: list[list[str]] = []  # row i: the terms of document i
        self._postings: dict[str, list[int]] = {}  # term -> rows containing it, ascending
        self._scorer: Any = None  # BM25Okapi over self._terms; None when stale
        self.add(documents)

    def __len__(self) -> int:
        return len(self._corpus)

    @property
    def documents(self) -> tuple[ContextBlock, ...]:
        """Every document, in insertion order."""
        with self._lock:
            return self._corpus.blocks

    def add(self, documents: Sequence[ContextBlock | str]) -> None:
        """Add documents; one already present (same id, same text) is skipped.
        Raises :class:`InvalidInputError` or :class:`BlockConflictError` before
        adding any of them."""
        with self._lock:
            blocks = self._corpus.new_blocks(documents)
            terms = [self._terms_of(block.text) for block in blocks]
            for row, doc_terms in enumerate(terms, start=len(self._corpus)):
                for term in dict.fromkeys(doc_terms):
                    self._postings.setdefault(term, []).append(row)
            self._corpus.extend(blocks)
            self._terms.extend(terms)
            if blocks:
                self._scorer = None

    def retrieve(self, query: str, k: int = 10) -> list[ContextBlock]:
        """At most ``k`` documents containing a query term, best BM25 score first,
        each a copy of the stored block with ``score`` set."""
        check_query(query, k)
        query_terms = self._terms_of(query)
        with self._lock:
            rows = sorted({row for term in query_terms for row in self._postings.get(term, ())})
            if not rows:
                return []
            scores = np.asarray(self._bm25().get_batch_scores(query_terms, rows))
            best = np.lexsort((np.asarray(rows), -scores))[:k]
            return [self._corpus.scored(rows[i], scores[i]) for i in best.tolist()]

    def _bm25(self) -> Any:
        """The rank-bm25 scorer, rebuilt after documents were added (rank-bm25
        computes IDF and average length once, at construction); its IDF replaced by
        Lucene's (``BM25Okapi.get_batch_scores`` reads the public ``idf`` dict)."""
        if self._scorer is None:
            scorer = self._rank_bm25.BM25Okapi(self._terms, k1=self.k1, b=self.b)
            scorer.idf = self._lucene_idf()
            self._scorer = scorer
        return self._scorer

    def _lucene_idf(self) -> dict[str, float]:
        n_docs = len(self._terms)
        return {
            term: math.log(1.0 + (n_docs - len(rows) + 0.5) / (len(rows) + 0.5))
            for term, rows in self._postings.items()
        }

    def _terms_of(self, text: str) -> list[str]:
        terms = self._tokenize(text)
        if isinstance(terms, str) or not isinstance(terms, Iterable):
            raise ConfigError("the BM25 tokenizer must return a sequence of str")
        listed = list(terms)  # a generator (jieba.cut) is read once, here
        if not all(isinstance(term, str) for term in listed):
            raise ConfigError("the BM25 tokenizer must return a sequence of str")
        return listed
