"""Synthetic MultiHopRAG-like workloads: a corpus, a popularity skew, and requests.

Every generator is a pure function of its arguments: the same arguments (seed
included) give an equal :class:`Workload`, and different seeds give different ones.
Workloads with the same ``seed`` and ``n_docs`` share their corpus and popularity, so
online and multi-turn results are measured over the same documents.

* Corpus: ``n_docs`` documents ``doc-00000`` … of English-like text (common English
  words mixed with pseudo-words from a fixed vocabulary), by default
  :data:`DOC_WORDS` words (about 150–250 cl100k tokens) each; :class:`TextLengths`
  sets other document and question lengths.
* Popularity: Zipf weights over a seeded random permutation of the documents. The
  exponent is calibrated so that about 80% of retrieved document slots fall on the 20%
  most-used documents at the default sizes (see :func:`top_share`).
* Requests retrieve ``k`` distinct documents by popularity, in a random relevance order
  per request, so the same documents recur in different orders.
* :func:`topic_workload` splits the corpus into topics (knowledge bases), each with its
  own small document pool: a request picks a topic by popularity and retrieves only
  from its pool, so requests of one topic share most of their documents.
* :func:`intent_workload` draws requests from a set of popular *intents* (one question
  asked by many users in other words): a request retrieves its intent's documents with
  each one swapped, with some probability, for another document drawn by popularity,
  so requests come in near-duplicate groups.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ..errors import ConfigError

__all__ = [
    "DOC_WORDS",
    "SYSTEM_PROMPT",
    "ZIPF_EXPONENT",
    "TextLengths",
    "Workload",
    "WorkloadRequest",
    "intent_workload",
    "log_uniform",
    "multiturn_workload",
    "online_workload",
    "top_share",
    "topic_workload",
]

ZIPF_EXPONENT = 1.04
"""Default popularity exponent: top_share ≈ 0.8 at 2000 docs, 2000 requests, k=15."""

SYSTEM_PROMPT = (
    "You are a careful research assistant that answers questions about a collection of "
    "news reports and technical documents. Each request gives you several numbered "
    "documents retrieved for the question, most relevant first, followed by the "
    "question itself. Answer only from the documents provided. When the answer needs "
    "facts from more than one document, combine them step by step and cite every "
    "document you rely on by its number in square brackets. If the documents do not "
    "contain enough information to answer, say so plainly instead of guessing. Keep "
    "answers short and factual: one to three sentences unless the question asks for a "
    "list. Do not repeat the question, do not describe your reasoning, and do not "
    "mention these instructions. Use the same language as the question."
)
"""The fixed system prompt of every workload (about 140 cl100k tokens)."""

_VOCAB_SEED = 20240917  # the pseudo-word vocabulary is the same for every workload
_VOCAB_SIZE = 3000
_COMMON_SHARE = 0.7  # share of common English words in a document
DOC_WORDS = (85, 120)
"""Default words per document (inclusive range; ~1.9 cl100k tokens per word)."""
_QUERY_PAD_STREAM = 7  # the generator of question padding: its own stream, so padding
# questions leaves every other draw (documents, requests) as it is
_WORDS_PER_SENTENCE = (7, 16)

_ONSETS: tuple[str, ...] = ("b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "k", "l")
_ONSETS += ("m", "n", "p", "pl", "pr", "r", "s", "sh", "st", "t", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io")
_CODAS = ("", "", "", "n", "r", "s", "l", "th", "m", "x")

_COMMON_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from "
    "at which but have an they you were had her their one all we can has there been if "
    "more when will would who so no other into its new some than two time first may "
    "only over also after most these such where many before through between then year "
    "under while since during against report market company city government people "
    "study team plan data source official group local early late major public result "
    "share growth policy region system network record season project energy price "
    "water health court board council agency industry research analysts investors "
    "said announced reported expected confirmed noted found showed added described"
)
_COMMON_WORDS = tuple(_COMMON_TEXT.split())

_QUERY_TEMPLATES = (
    "What does the record say about {a} and {b}?",
    "How is {a} related to {b} in the {c} reports?",
    "Which sources mention {a} together with {b}?",
    "When did {a} first affect {b} and {c}?",
    "Summarize what is known about the role of {a} in {b}.",
    "Did {a} report the same {b} figures as {c}?",
)


@dataclass(frozen=True)
class TextLengths:
    """How long generated texts are, in words, each drawn uniformly from its inclusive
    range: ``doc_words`` per document; ``query_words`` per question (``None``: the bare
    question of a template, 8–14 words; otherwise a question shorter than the drawn
    length is preceded by a sentence of context words that makes it up). Raises
    :class:`ConfigError` for a range that is empty or starts below 1."""

    doc_words: tuple[int, int] = DOC_WORDS
    query_words: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        ranges = [("doc_words", self.doc_words), ("query_words", self.query_words)]
        for name, bounds in ranges:
            if bounds is None and name == "query_words":
                continue
            if (
                not isinstance(bounds, tuple)
                or len(bounds) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                or not 1 <= bounds[0] <= bounds[1]
            ):
                raise ConfigError(
                    f"{name} must be a (low, high) pair with 1 <= low <= high, got {bounds!r}"
                )


DEFAULT_LENGTHS = TextLengths()


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: ``k`` distinct documents in retrieval order (most relevant first)."""

    doc_ids: tuple[str, ...]
    query: str
    session: str | None  # conversation id in multi-turn workloads; None when online
    turn: int  # 0-based turn within the session; 0 when online


@dataclass(frozen=True)
class Workload:
    """A corpus, a fixed system prompt and a sequence of requests over the corpus."""

    name: str
    corpus: Mapping[str, str] = field(repr=False)  # doc id -> text; read-only
    requests: tuple[WorkloadRequest, ...] = field(repr=False)
    system_prompt: str = SYSTEM_PROMPT


@dataclass(frozen=True)
class _Language:
    """The words documents and queries are made of."""

    common: tuple[str, ...]
    pseudo: tuple[str, ...]


@dataclass
class _Session:
    """A multi-turn conversation being generated: the documents it has retrieved."""

    session_id: str
    turns_done: int = 0
    history: list[int] = field(default_factory=list)  # doc indices, first retrieval order


def _pseudo_words(rng: np.random.Generator, count: int) -> list[str]:
    """``count`` random words of two or three syllables (onset, vowel, coda)."""
    parts = (_ONSETS, _VOWELS, _CODAS)
    picks = [rng.integers(len(part), size=(count, 3)).tolist() for part in parts]
    syllables = rng.integers(2, 4, size=count).tolist()
    return [
        "".join(
            _ONSETS[picks[0][w][s]] + _VOWELS[picks[1][w][s]] + _CODAS[picks[2][w][s]]
            for s in range(syllables[w])
        )
        for w in range(count)
    ]


def _language() -> _Language:
    """The fixed vocabulary: common English words and ``_VOCAB_SIZE`` pseudo-words."""
    rng = np.random.default_rng(_VOCAB_SEED)
    pseudo: dict[str, None] = {}  # insertion-ordered set
    while len(pseudo) < _VOCAB_SIZE:
        for word in _pseudo_words(rng, _VOCAB_SIZE):
            if word not in _COMMON_WORDS and len(pseudo) < _VOCAB_SIZE:
                pseudo[word] = None
    return _Language(common=_COMMON_WORDS, pseudo=tuple(pseudo))


def _words(rng: np.random.Generator, language: _Language, count: int) -> list[str]:
    """``count`` words, a ``_COMMON_SHARE`` of them common English on average."""
    is_common = rng.random(count) < _COMMON_SHARE
    common = rng.integers(len(language.common), size=count)
    pseudo = rng.integers(len(language.pseudo), size=count)
    return [
        language.common[c] if use_common else language.pseudo[p]
        for use_common, c, p in zip(
            is_common.tolist(), common.tolist(), pseudo.tolist(), strict=True
        )
    ]


def _sentence_starts(rng: np.random.Generator, total: int) -> list[int]:
    """Start offsets of sentences covering ``total`` words; the last may be short."""
    low, high = _WORDS_PER_SENTENCE
    lengths = rng.integers(low, high + 1, size=total // low + 1)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    return [int(start) for start in starts[starts < total]]


def _document(rng: np.random.Generator, language: _Language, words: tuple[int, int]) -> str:
    """One document: sentences of common words and pseudo-words, ``words`` long."""
    low, high = words
    return _prose(rng, _words(rng, language, int(rng.integers(low, high + 1))))


def _prose(rng: np.random.Generator, words: Sequence[str]) -> str:
    """``words`` as sentences (capitalised, full stops) of drawn lengths."""
    starts = _sentence_starts(rng, len(words))
    sentences = (
        " ".join(words[a:b]) for a, b in zip(starts, [*starts[1:], len(words)], strict=True)
    )
    return " ".join(sentence[0].upper() + sentence[1:] + "." for sentence in sentences)


def _doc_ids(n_docs: int) -> tuple[str, ...]:
    width = max(5, len(str(n_docs - 1)))
    return tuple(f"doc-{i:0{width}d}" for i in range(n_docs))


def _corpus(
    rng: np.random.Generator, doc_ids: Sequence[str], language: _Language, words: tuple[int, int]
) -> Mapping[str, str]:
    return MappingProxyType({doc_id: _document(rng, language, words) for doc_id in doc_ids})


def log_uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    """A value drawn log-uniformly between ``bounds`` (for sizes and gaps that span
    orders of magnitude)."""
    low, high = bounds
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


def _log_popularity(rng: np.random.Generator, n_docs: int, exponent: float) -> np.ndarray:
    """Log retrieval weights: Zipf weights ``1 / rank**exponent`` over a random
    permutation of the documents (unnormalized; only ratios matter)."""
    ranks = rng.permutation(n_docs) + 1
    return np.asarray(-exponent * np.log(ranks.astype(np.float64)))


def _draw_docs(
    rng: np.random.Generator, log_popularity: np.ndarray, count: int, exclude: Sequence[int] = ()
) -> list[int]:
    """``count`` distinct documents drawn one after another by popularity, none of them
    in ``exclude``. Gumbel-top-k: the ``count`` largest perturbed log-weights are
    distributed as successive draws without replacement."""
    keys = log_popularity + rng.gumbel(size=len(log_popularity))
    if exclude:
        keys[list(exclude)] = -np.inf
    top = np.argpartition(-keys, count - 1)[:count]
    return [int(i) for i in top]


def _query(rng: np.random.Generator, language: _Language, seen: set[str]) -> str:
    """A question not in ``seen``; records it there."""
    while True:
        template = _QUERY_TEMPLATES[rng.integers(len(_QUERY_TEMPLATES))]
        a, b, c = (language.pseudo[i] for i in rng.integers(len(language.pseudo), size=3))
        query = template.format(a=a.capitalize(), b=b, c=c)
        if query not in seen:
            seen.add(query)
            return query


class _Questions:
    """A workload's questions, each new, padded to :attr:`TextLengths.query_words`."""

    def __init__(self, seed: int, language: _Language, lengths: TextLengths) -> None:
        self._language, self._words = language, lengths.query_words
        self._seen: set[str] = set()
        self._pad = np.random.default_rng([seed, _QUERY_PAD_STREAM])

    def next(self, rng: np.random.Generator) -> str:
        """The next question (its template and names drawn from ``rng``)."""
        question = _query(rng, self._language, self._seen)
        if self._words is None:
            return question
        low, high = self._words
        missing = int(self._pad.integers(low, high + 1)) - len(question.split())
        if missing <= 0:
            return question
        return f"{_prose(self._pad, _words(self._pad, self._language, missing))} {question}"


def _relevance_order(
    rng: np.random.Generator, docs: Sequence[int], doc_ids: Sequence[str]
) -> tuple[str, ...]:
    """The ids of ``docs`` in a random order, independent of how they were drawn."""
    return tuple(doc_ids[docs[i]] for i in rng.permutation(len(docs)))


def _generators(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """Independent streams for the corpus, the popularity and the requests, so that
    workloads with one seed share a corpus and a popularity whatever their requests."""
    corpus, popularity, requests = np.random.SeedSequence(seed).spawn(3)
    return (
        np.random.default_rng(corpus),
        np.random.default_rng(popularity),
        np.random.default_rng(requests),
    )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _validate_common(
    n_docs: int, k: int, seed: int, zipf_exponent: float, lengths: TextLengths
) -> None:
    _require(n_docs >= 1, f"n_docs must be >= 1, got {n_docs}")
    _require(1 <= k <= n_docs, f"k must be between 1 and n_docs ({n_docs}), got {k}")
    _require(seed >= 0, f"seed must be >= 0, got {seed}")
    _require(zipf_exponent >= 0, f"zipf_exponent must be >= 0, got {zipf_exponent}")
    _require(isinstance(lengths, TextLengths), f"lengths must be a TextLengths, got {lengths!r}")


def online_workload(
    *,
    n_docs: int = 2000,
    n_requests: int = 2000,
    k: int = 15,
    seed: int = 0,
    zipf_exponent: float = ZIPF_EXPONENT,
    lengths: TextLengths = DEFAULT_LENGTHS,
) -> Workload:
    """Independent single-turn requests, each retrieving ``k`` distinct documents.

    ``lengths``: document and question lengths (default: documents of
    :data:`DOC_WORDS` words, bare questions). Deterministic in its arguments. Raises
    :class:`ConfigError` for sizes out of range.
    """
    _validate_common(n_docs, k, seed, zipf_exponent, lengths)
    _require(n_requests >= 0, f"n_requests must be >= 0, got {n_requests}")
    corpus_rng, popularity_rng, rng = _generators(seed)
    language = _language()
    doc_ids = _doc_ids(n_docs)
    corpus = _corpus(corpus_rng, doc_ids, language, lengths.doc_words)
    popularity = _log_popularity(popularity_rng, n_docs, zipf_exponent)
    questions = _Questions(seed, language, lengths)
    requests = tuple(
        WorkloadRequest(
            doc_ids=_relevance_order(rng, _draw_docs(rng, popularity, k), doc_ids),
            query=questions.next(rng),
            session=None,
            turn=0,
        )
        for _ in range(n_requests)
    )
    return Workload(name="online", corpus=corpus, requests=requests)


def topic_workload(
    *,
    n_topics: int = 12,
    docs_per_topic: int = 8,
    n_requests: int = 200,
    k: int = 5,
    seed: int = 0,
    zipf_exponent: float = ZIPF_EXPONENT,
    lengths: TextLengths = DEFAULT_LENGTHS,
) -> Workload:
    """Independent single-turn requests over ``n_topics`` knowledge bases: the corpus of
    ``n_topics * docs_per_topic`` documents is split at random into disjoint pools of
    ``docs_per_topic``; each request picks a topic by Zipf popularity over the topics
    and retrieves ``k`` distinct documents of that topic's pool by Zipf popularity
    within it (both with ``zipf_exponent``), in a random relevance order.

    ``lengths``: document and question lengths (default: documents of
    :data:`DOC_WORDS` words, bare questions). Deterministic in its arguments. Raises
    :class:`ConfigError` for sizes out of range.
    """
    _require(n_topics >= 1, f"n_topics must be >= 1, got {n_topics}")
    _require(docs_per_topic >= 1, f"docs_per_topic must be >= 1, got {docs_per_topic}")
    _validate_common(n_topics * docs_per_topic, k, seed, zipf_exponent, lengths)
    _require(k <= docs_per_topic, f"k must be <= docs_per_topic ({docs_per_topic}), got {k}")
    _require(n_requests >= 0, f"n_requests must be >= 0, got {n_requests}")
    corpus_rng, popularity_rng, rng = _generators(seed)
    language = _language()
    doc_ids = _doc_ids(n_topics * docs_per_topic)
    corpus = _corpus(corpus_rng, doc_ids, language, lengths.doc_words)
    pools = popularity_rng.permutation(len(doc_ids)).reshape(n_topics, docs_per_topic).tolist()
    topic_popularity = _log_popularity(popularity_rng, n_topics, zipf_exponent)
    pool_popularity = _log_popularity(popularity_rng, docs_per_topic, zipf_exponent)
    questions = _Questions(seed, language, lengths)
    requests = []
    for _ in range(n_requests):
        pool = pools[_draw_docs(rng, topic_popularity, 1)[0]]
        docs = [pool[i] for i in _draw_docs(rng, pool_popularity, k)]
        requests.append(
            WorkloadRequest(
                doc_ids=_relevance_order(rng, docs, doc_ids),
                query=questions.next(rng),
                session=None,
                turn=0,
            )
        )
    return Workload(name="topics", corpus=corpus, requests=tuple(requests))


def intent_workload(
    *,
    n_docs: int = 2000,
    n_requests: int = 2000,
    k: int = 15,
    n_intents: int = 300,
    swap: float = 0.3,
    seed: int = 0,
    zipf_exponent: float = ZIPF_EXPONENT,
    lengths: TextLengths = DEFAULT_LENGTHS,
) -> Workload:
    """Independent single-turn requests that paraphrase ``n_intents`` underlying
    questions: each intent has ``k`` documents drawn by document popularity; a request
    picks an intent by Zipf popularity over the intents (``zipf_exponent``), keeps each
    of its documents with probability ``1 - swap`` and replaces the others by distinct
    documents drawn by popularity, in a random relevance order.

    ``lengths``: document and question lengths (default: documents of
    :data:`DOC_WORDS` words, bare questions). Deterministic in its arguments. Raises
    :class:`ConfigError` for sizes out of range.
    """
    _validate_common(n_docs, k, seed, zipf_exponent, lengths)
    _require(n_requests >= 0, f"n_requests must be >= 0, got {n_requests}")
    _require(n_intents >= 1, f"n_intents must be >= 1, got {n_intents}")
    _require(0.0 <= swap <= 1.0, f"swap must be between 0 and 1, got {swap}")
    corpus_rng, popularity_rng, rng = _generators(seed)
    language = _language()
    doc_ids = _doc_ids(n_docs)
    corpus = _corpus(corpus_rng, doc_ids, language, lengths.doc_words)
    popularity = _log_popularity(popularity_rng, n_docs, zipf_exponent)
    intent_popularity = _log_popularity(popularity_rng, n_intents, zipf_exponent)
    intents = [_draw_docs(popularity_rng, popularity, k) for _ in range(n_intents)]
    questions = _Questions(seed, language, lengths)
    requests = []
    for _ in range(n_requests):
        intent = intents[_draw_docs(rng, intent_popularity, 1)[0]]
        swapped = rng.random(k) < swap
        kept = [doc for doc, gone in zip(intent, swapped.tolist(), strict=True) if not gone]
        if len(kept) < k:
            kept += _draw_docs(rng, popularity, k - len(kept), exclude=kept)
        requests.append(
            WorkloadRequest(
                doc_ids=_relevance_order(rng, kept, doc_ids),
                query=questions.next(rng),
                session=None,
                turn=0,
            )
        )
    return Workload(name="intents", corpus=corpus, requests=tuple(requests))


def _session_docs(
    rng: np.random.Generator, session: _Session, popularity: np.ndarray, k: int, reretrieve: int
) -> list[int]:
    """The documents of the session's next turn, recorded in its history. On turns after
    the first, ``reretrieve`` of them come from the history and the rest are new to it."""
    if not session.history:
        docs = _draw_docs(rng, popularity, k)
    else:
        again = rng.choice(len(session.history), size=reretrieve, replace=False)
        docs = [session.history[int(i)] for i in again]
        docs += _draw_docs(rng, popularity, k - reretrieve, exclude=session.history)
    session.history += [d for d in docs if d not in session.history]
    return docs


def _session_order(n_sessions: int, turns: int, interleave: int) -> Iterator[tuple[_Session, int]]:
    """(session, turn) in emission order: ``interleave`` sessions are served
    round-robin, and a finished session's slot goes to the next waiting one."""
    waiting = deque(_Session(f"s-{i + 1:04d}") for i in range(n_sessions))
    active = deque(waiting.popleft() for _ in range(min(interleave, n_sessions)))
    while active:
        session = active.popleft()
        yield session, session.turns_done
        session.turns_done += 1
        if session.turns_done < turns:
            active.append(session)
        elif waiting:
            active.append(waiting.popleft())


def multiturn_workload(
    *,
    n_sessions: int = 200,
    turns: int = 5,
    interleave: int = 16,
    k: int = 15,
    reretrieve_fraction: float = 0.4,
    n_docs: int = 2000,
    seed: int = 0,
    zipf_exponent: float = ZIPF_EXPONENT,
    lengths: TextLengths = DEFAULT_LENGTHS,
) -> Workload:
    """``n_sessions`` conversations of ``turns`` turns, ``interleave`` of them active at
    once and served round-robin. Turn 0 retrieves ``k`` documents by popularity; each
    later turn re-retrieves ``round(reretrieve_fraction * k)`` documents from the
    session's earlier turns and retrieves the rest new to the session. ``lengths``:
    document and question lengths (default: documents of :data:`DOC_WORDS` words, bare
    questions).

    Deterministic in its arguments. Raises :class:`ConfigError` for sizes out of range,
    including a corpus too small to give every session enough new documents.
    """
    _validate_common(n_docs, k, seed, zipf_exponent, lengths)
    _require(n_sessions >= 0, f"n_sessions must be >= 0, got {n_sessions}")
    _require(turns >= 1, f"turns must be >= 1, got {turns}")
    _require(interleave >= 1, f"interleave must be >= 1, got {interleave}")
    _require(
        0.0 <= reretrieve_fraction <= 1.0,
        f"reretrieve_fraction must be in [0, 1], got {reretrieve_fraction}",
    )
    reretrieve = round(reretrieve_fraction * k)
    needed = k + (turns - 1) * (k - reretrieve)
    _require(needed <= n_docs, f"each session needs {needed} distinct docs; n_docs is {n_docs}")
    corpus_rng, popularity_rng, rng = _generators(seed)
    language = _language()
    doc_ids = _doc_ids(n_docs)
    corpus = _corpus(corpus_rng, doc_ids, language, lengths.doc_words)
    popularity = _log_popularity(popularity_rng, n_docs, zipf_exponent)
    questions = _Questions(seed, language, lengths)
    requests = tuple(
        WorkloadRequest(
            doc_ids=_relevance_order(
                rng, _session_docs(rng, session, popularity, k, reretrieve), doc_ids
            ),
            query=questions.next(rng),
            session=session.session_id,
            turn=turn,
        )
        for session, turn in _session_order(n_sessions, turns, interleave)
    )
    return Workload(name="multiturn", corpus=corpus, requests=requests)


def top_share(workload: Workload, fraction: float = 0.2) -> float:
    """Share of all retrieved document slots that fall on the ``fraction`` most-used
    documents of the corpus (at least one document). 0.0 when there are no requests."""
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"fraction must be in (0, 1], got {fraction}")
    counts = dict.fromkeys(workload.corpus, 0)
    for request in workload.requests:
        for doc_id in request.doc_ids:
            counts[doc_id] = counts.get(doc_id, 0) + 1
    total = sum(counts.values())
    if total == 0:
        return 0.0
    top = max(1, math.ceil(fraction * len(counts)))
    return sum(sorted(counts.values(), reverse=True)[:top]) / total
