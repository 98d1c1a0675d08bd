"""Built-in retrievers: ranking, scores, validation, the pluggable embedder, and the
hand-off to ContextPilot."""

from __future__ import annotations

import math
import subprocess
import sys
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from contextpilot_rag import (
    BlockConflictError,
    ConfigError,
    ContextBlock,
    ContextPilot,
    InvalidBlockError,
    InvalidInputError,
    content_id,
)
from contextpilot_rag.bench.workloads import online_workload
from contextpilot_rag.errors import MissingExtraError
from contextpilot_rag.retrievers import (
    BM25Retriever,
    FaissRetriever,
    HashingEmbedder,
    Retriever,
)
from contextpilot_rag.retrievers._text import word_tokens

CORPUS = {
    "solar": "Solar panels convert sunlight into electricity with photovoltaic cells.",
    "battery": "Lithium batteries store electricity and release it when grid demand peaks.",
    "wind": "Wind turbines turn the kinetic energy of moving air into electrical power.",
    "coffee": "Coffee beans are roasted, ground and brewed with hot water into espresso.",
    "tea": "Green tea leaves are steamed and dried, then steeped in hot water.",
    "python": "Python is a programming language with dynamic typing and garbage collection.",
    "rust": "Rust is a systems programming language with memory safety and no garbage collector.",
    "paris": "Paris is the capital of France and sits on the river Seine.",
}
BLOCKS = [
    ContextBlock(text, id=doc_id, metadata={"topic": doc_id}) for doc_id, text in CORPUS.items()
]
QUERIES = [
    ("how do photovoltaic solar panels work", "solar"),
    ("espresso from roasted coffee beans", "coffee"),
    ("memory safety in a systems programming language", "rust"),
    ("what is the capital of France", "paris"),
    ("steeped green tea leaves", "tea"),
]

RetrieverFactory = Callable[[Sequence[ContextBlock | str]], BM25Retriever | FaissRetriever]
FACTORIES: dict[str, RetrieverFactory] = {"bm25": BM25Retriever, "faiss": FaissRetriever}


@pytest.fixture(params=sorted(FACTORIES))
def make(request: pytest.FixtureRequest) -> RetrieverFactory:
    return FACTORIES[request.param]


def two_dim_embed(vectors: dict[str, list[float]]) -> Callable[[Sequence[str]], np.ndarray]:
    """An embedding function that looks texts up in a table."""
    return lambda texts: np.array([vectors[text] for text in texts], dtype=np.float64)


# ranking


@pytest.mark.parametrize(("query", "expected"), QUERIES)
def test_relevant_document_ranks_first(make: RetrieverFactory, query: str, expected: str) -> None:
    assert make(BLOCKS).retrieve(query, k=3)[0].id == expected


def test_scores_are_set_and_descending(make: RetrieverFactory) -> None:
    results = make(BLOCKS).retrieve("hot water for tea and coffee", k=8)
    scores = [block.score for block in results]
    assert all(score is not None for score in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert {block.id for block in results[:2]} == {"tea", "coffee"}


def test_k_limits_the_number_of_results(make: RetrieverFactory) -> None:
    retriever = make(BLOCKS)
    assert len(retriever.retrieve("programming language garbage collection", k=1)) == 1
    assert len(retriever.retrieve("programming language garbage collection", k=2)) == 2


def test_results_keep_id_text_and_metadata(make: RetrieverFactory) -> None:
    top = make(BLOCKS).retrieve("capital of France", k=1)[0]
    assert (top.id, top.text, dict(top.metadata)) == ("paris", CORPUS["paris"], {"topic": "paris"})
    assert top == BLOCKS[-1]  # same identity as the stored block; only the score added


def test_string_documents_get_content_hash_ids(make: RetrieverFactory) -> None:
    top = make(list(CORPUS.values())).retrieve("capital of France", k=1)[0]
    assert top.id == content_id(CORPUS["paris"])


def test_results_are_deterministic_across_instances(make: RetrieverFactory) -> None:
    first = make(BLOCKS).retrieve("electricity from the grid", k=5)
    second = make(BLOCKS).retrieve("electricity from the grid", k=5)
    assert [(b.id, b.score) for b in first] == [(b.id, b.score) for b in second]


def test_ties_keep_insertion_order(make: RetrieverFactory) -> None:
    twins = [ContextBlock("alpha beta", id="late"), ContextBlock("alpha beta", id="early")]
    results = make([*twins, ContextBlock("gamma delta", id="other")]).retrieve("alpha", k=2)
    assert [block.id for block in results] == ["late", "early"]
    assert results[0].score == results[1].score


def test_retrievers_satisfy_the_protocol(make: RetrieverFactory) -> None:
    assert isinstance(make([]), Retriever)


# BM25 specifics


def reference_bm25(corpus: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Okapi BM25 with Lucene's IDF, written out."""
    docs = [word_tokens(text) for text in corpus]
    avgdl = sum(map(len, docs)) / len(docs)
    scores = []
    for doc in docs:
        score = 0.0
        for term in word_tokens(query):
            n = sum(term in other for other in docs)
            idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
            tf = doc.count(term)
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        scores.append(score)
    return scores


def test_bm25_scores_match_the_formula() -> None:
    texts = list(CORPUS.values())
    query = "hot water electricity language is"
    expected = reference_bm25(texts, query, k1=1.2, b=0.6)
    results = BM25Retriever(texts, k1=1.2, b=0.6).retrieve(query, k=len(texts))
    got = {block.text: block.score for block in results}
    for text, score in zip(texts, expected, strict=True):
        if score > 0:
            assert got[text] == pytest.approx(score)
        else:
            assert text not in got


def test_bm25_returns_only_documents_sharing_a_term() -> None:
    retriever = BM25Retriever(BLOCKS)
    assert [block.id for block in retriever.retrieve("espresso", k=10)] == ["coffee"]
    assert retriever.retrieve("quantum chromodynamics", k=10) == []
    assert all(block.score > 0 for block in retriever.retrieve("is the", k=10))  # type: ignore[operator]


def test_bm25_custom_tokenizer_is_used() -> None:
    retriever = BM25Retriever(["a-b c", "d"], tokenizer=str.split)
    assert [block.text for block in retriever.retrieve("a-b", k=5)] == ["a-b c"]
    assert retriever.retrieve("a", k=5) == []


def test_bm25_reads_a_tokenizer_that_yields_its_terms() -> None:
    """A generator tokenizer (as ``jieba.cut`` returns) is read once, not lost in
    checking it: CJK text the default tokenizer keeps in one run is found by its words."""
    retriever = BM25Retriever(
        ["巴黎 在 法国", "柏林 在 德国"], tokenizer=lambda text: (w for w in text.split())
    )
    assert [block.text for block in retriever.retrieve("巴黎", k=5)] == ["巴黎 在 法国"]


@pytest.mark.parametrize("make", FACTORIES.values(), ids=FACTORIES.keys())
def test_a_decomposed_accent_matches_the_composed_one(make: RetrieverFactory) -> None:
    """NFD text (macOS files, some PDFs) is found by the NFC query a user types."""
    nfd = unicodedata.normalize("NFD", "le café noir")
    retriever = make([nfd, "un thé vert", "une bière"])
    assert retriever.retrieve("café", k=1)[0].text == nfd


def test_bm25_rejects_bad_configuration() -> None:
    bad: list[dict[str, Any]] = [{"k1": -1.0}, {"b": 1.5}, {"b": "0.5"}, {"tokenizer": "words"}]
    for kwargs in bad:
        with pytest.raises(ConfigError):
            BM25Retriever(BLOCKS, **kwargs)


def test_bm25_tokenizer_returning_a_string_is_rejected() -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        BM25Retriever(["some text"], tokenizer=str.lower)


# FAISS specifics


def test_faiss_returns_k_documents_even_without_overlap() -> None:
    results = FaissRetriever(BLOCKS).retrieve("quantum chromodynamics", k=3)
    assert len(results) == 3
    assert len(FaissRetriever(BLOCKS).retrieve("tea", k=100)) == len(BLOCKS)


def test_faiss_uses_the_custom_embedding_function() -> None:
    table = {"doc x": [1.0, 0.0], "doc y": [0.0, 1.0], "query": [0.1, 0.9]}
    calls: list[list[str]] = []

    def embed(texts: Sequence[str]) -> np.ndarray:
        calls.append(list(texts))
        return two_dim_embed(table)(texts)

    retriever = FaissRetriever(["doc x", "doc y"], embed=embed)
    assert [block.text for block in retriever.retrieve("query", k=2)] == ["doc y", "doc x"]
    assert calls == [["doc x", "doc y"], ["query"]]
    assert retriever.dim == 2


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("ip", [("b", 2.0), ("a", 1.0)]),
        ("cosine", [("a", math.sqrt(0.5)), ("b", math.sqrt(0.5))]),
        ("l2", [("a", -1.0), ("b", -2.0)]),
    ],
)
def test_faiss_metric_defines_the_score(metric: str, expected: list[tuple[str, float]]) -> None:
    embed = two_dim_embed({"a": [1.0, 0.0], "b": [0.0, 2.0], "q": [1.0, 1.0]})
    results = FaissRetriever(["a", "b"], embed=embed, metric=metric).retrieve("q", k=2)  # type: ignore[arg-type]
    assert [block.text for block in results] == [text for text, _ in expected]
    assert [block.score for block in results] == pytest.approx(
        [score for _, score in expected], rel=1e-6
    )


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (lambda n: np.ones(n), "shape"),
        (lambda n: np.ones((n + 1, 4)), "shape"),
        (lambda n: np.ones((n, 0)), "shape"),
        (lambda n: np.full((n, 4), "x"), "dtype"),
        (lambda n: np.full((n, 4), np.nan), "NaN"),
        (lambda n: np.ones((n, 4), dtype=complex), "dtype"),
    ],
)
def test_faiss_rejects_a_bad_embedding_function(
    output: Callable[[int], np.ndarray], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        FaissRetriever(["a", "b"], embed=lambda texts: output(len(texts)))


def test_faiss_rejects_an_embedding_dimension_change_and_keeps_its_state() -> None:
    dims = iter([3, 5])
    retriever = FaissRetriever(["a"], embed=lambda texts: np.ones((len(texts), next(dims))))
    with pytest.raises(ConfigError, match="dimension"):
        retriever.add(["b"])
    assert len(retriever) == 1
    assert [block.text for block in retriever.documents] == ["a"]


def test_faiss_on_an_empty_corpus_does_not_embed() -> None:
    def never(texts: Sequence[str]) -> np.ndarray:
        raise AssertionError("embedder called")

    retriever = FaissRetriever([], embed=never)
    assert retriever.retrieve("anything", k=3) == []
    assert retriever.dim is None


def test_faiss_rejects_bad_configuration() -> None:
    with pytest.raises(ConfigError, match="metric"):
        FaissRetriever(BLOCKS, metric="dot")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="embed"):
        FaissRetriever(BLOCKS, embed="hashing")  # type: ignore[arg-type]


# corpus management and input validation (both)


def test_empty_corpus_retrieves_nothing(make: RetrieverFactory) -> None:
    retriever = make([])
    assert len(retriever) == 0
    assert retriever.retrieve("solar panels", k=5) == []


def test_add_makes_new_documents_retrievable(make: RetrieverFactory) -> None:
    retriever = make(BLOCKS[:4])
    assert "paris" not in [block.id for block in retriever.retrieve("capital of France", k=4)]
    retriever.add(BLOCKS[4:])
    assert len(retriever) == len(BLOCKS)
    assert retriever.retrieve("capital of France", k=1)[0].id == "paris"


def test_adding_a_known_document_again_is_a_no_op(make: RetrieverFactory) -> None:
    retriever = make(BLOCKS)
    retriever.add([BLOCKS[0], CORPUS["tea"], BLOCKS[0]])
    assert len(retriever) == len(BLOCKS) + 1  # the tea text as a string has a new id
    assert [block.id for block in retriever.documents[: len(BLOCKS)]] == list(CORPUS)


def test_one_id_with_two_texts_is_a_conflict(make: RetrieverFactory) -> None:
    with pytest.raises(BlockConflictError):
        make([ContextBlock("one text", id="x"), ContextBlock("other text", id="x")])
    retriever = make(BLOCKS)
    with pytest.raises(BlockConflictError):
        retriever.add([ContextBlock("new", id="fresh"), ContextBlock("changed", id="solar")])
    assert len(retriever) == len(BLOCKS)  # nothing of the failed call was added
    assert "fresh" not in [block.id for block in retriever.documents]


def test_a_bad_document_fails_the_whole_add(make: RetrieverFactory) -> None:
    retriever = make(BLOCKS)
    with pytest.raises(InvalidInputError, match=r"documents\[1\]"):
        retriever.add(["Berlin is the capital of Germany.", 42])  # type: ignore[list-item]
    assert len(retriever) == len(BLOCKS)
    with pytest.raises(InvalidBlockError):
        retriever.add(["   "])
    with pytest.raises(InvalidInputError, match="list"):
        retriever.add("a bare string")


@pytest.mark.parametrize(
    ("query", "k"),
    [(b"bytes", 3), (None, 3), ("   ", 3), ("ok", 0), ("ok", -1), ("ok", 1.5), ("ok", True)],
)
def test_bad_query_or_k_is_rejected(make: RetrieverFactory, query: object, k: object) -> None:
    with pytest.raises(InvalidInputError):
        make(BLOCKS).retrieve(query, k=k)  # type: ignore[arg-type]


@pytest.mark.parametrize(("module", "extra"), [("rank_bm25", "bm25"), ("faiss", "faiss")])
def test_missing_backend_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    factory = BM25Retriever if extra == "bm25" else FaissRetriever
    with pytest.raises(ImportError, match=rf"contextpilot-rag\[{extra}\]") as missing:
        factory(BLOCKS)
    assert isinstance(missing.value, MissingExtraError)  # a ConfigError: the CLI's exit 2


def test_package_imports_without_the_backends() -> None:
    code = (
        "import sys; sys.modules['rank_bm25'] = None; sys.modules['faiss'] = None\n"
        "import contextpilot_rag, contextpilot_rag.retrievers as r\n"
        "print(r.HashingEmbedder(8)(['ok']).shape)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "(1, 8)"


# HashingEmbedder


def test_embeddings_are_unit_float32_rows() -> None:
    vectors = HashingEmbedder(64)(["solar panels", "tea leaves and hot water", "!!!"])
    assert vectors.shape == (3, 64)
    assert vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0, 0.0], abs=1e-6)
    assert HashingEmbedder(64)([]).shape == (0, 64)


def test_same_seed_same_vectors_other_seed_other_vectors() -> None:
    texts = ["Solar panels convert sunlight", "green tea"]
    first, second = HashingEmbedder(seed=7)(texts), HashingEmbedder(seed=7)(texts)
    assert np.array_equal(first, second)
    assert not np.array_equal(first, HashingEmbedder(seed=8)(texts))


def test_embedding_is_lexical() -> None:
    embed = HashingEmbedder()
    same = embed(["Solar, PANELS!", "solar panels"])
    assert np.array_equal(same[0], same[1])
    forms = embed([unicodedata.normalize(form, "Straße café") for form in ("NFC", "NFD")])
    assert np.array_equal(forms[0], forms[1])
    car, automobile = embed(["car", "automobile"])
    assert abs(float(car @ automobile)) < 0.2  # synonyms are unrelated to it


def test_char_ngrams_relate_inflections() -> None:
    def similarity(embedder: HashingEmbedder) -> float:
        a, b = embedder(["battery", "batteries"])
        return float(a @ b)

    assert similarity(HashingEmbedder(char_ngram_range=(3, 4))) > 0.3
    assert (
        similarity(HashingEmbedder(char_ngram_range=(3, 4))) > similarity(HashingEmbedder()) + 0.3
    )


def test_embedder_rejects_bad_arguments() -> None:
    bad: list[dict[str, Any]] = [
        {"dim": 0},
        {"dim": 2.5},
        {"ngram_range": (2, 1)},
        {"ngram_range": (0, 1)},
        {"char_ngram_range": [3, 5]},
        {"seed": -1},
    ]
    for kwargs in bad:
        with pytest.raises(ConfigError):
            HashingEmbedder(**kwargs)
    with pytest.raises(InvalidInputError, match="list"):
        HashingEmbedder()("a bare string")
    with pytest.raises(InvalidInputError, match=r"texts\[1\]"):
        HashingEmbedder()(["ok", 3])  # type: ignore[list-item]


# hand-off to ContextPilot


def test_overlapping_queries_share_a_prefix_after_optimize(make: RetrieverFactory) -> None:
    corpus = online_workload(n_docs=200, n_requests=0, seed=3).corpus
    retriever = make([ContextBlock(text, id=doc_id) for doc_id, text in corpus.items()])
    texts = list(corpus.values())

    def excerpt(doc: int) -> str:
        return " ".join(texts[doc].split()[10:25])

    first_query = " ".join(excerpt(doc) for doc in (0, 1, 2, 3))
    second_query = " ".join(excerpt(doc) for doc in (3, 1, 5, 0, 2))
    first, second = retriever.retrieve(first_query, k=4), retriever.retrieve(second_query, k=6)
    assert {block.id for block in first} & {block.id for block in second}

    pilot = ContextPilot(tokenizer="chars")
    first_prompt = pilot.optimize(first, first_query)
    second_prompt = pilot.optimize(second, second_query)
    matched = second_prompt.stats.blocks_matched
    assert matched > 0
    assert second_prompt.blocks[:matched] == first_prompt.blocks[:matched]
