"""Specification of the synthetic benchmark workloads."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from contextpilot_rag.bench import (
    DOC_WORDS,
    SYSTEM_PROMPT,
    TextLengths,
    Workload,
    WorkloadRequest,
    intent_workload,
    multiturn_workload,
    online_workload,
    top_share,
    topic_workload,
)
from contextpilot_rag.errors import ConfigError


@pytest.fixture(scope="module")
def online() -> Workload:
    return online_workload()


@pytest.fixture(scope="module")
def multiturn() -> Workload:
    return multiturn_workload()


def small_multiturn(**overrides: object) -> Workload:
    arguments: dict[str, object] = {"n_sessions": 10, "turns": 4, "interleave": 3, "n_docs": 300}
    arguments.update(overrides)
    return multiturn_workload(**arguments)  # type: ignore[arg-type]


def test_online_workload_has_the_requested_sizes(online: Workload) -> None:
    assert online.name == "online"
    assert len(online.corpus) == 2000
    assert len(online.requests) == 2000
    assert all(len(request.doc_ids) == 15 for request in online.requests)


def test_doc_ids_are_zero_padded_and_name_corpus_documents(online: Workload) -> None:
    assert next(iter(online.corpus)) == "doc-00000"
    assert "doc-01999" in online.corpus
    assert all(doc_id in online.corpus for r in online.requests for doc_id in r.doc_ids)


def test_every_request_retrieves_distinct_documents(online: Workload) -> None:
    assert all(len(set(r.doc_ids)) == len(r.doc_ids) for r in online.requests)


def test_online_requests_belong_to_no_session(online: Workload) -> None:
    assert all(r.session is None and r.turn == 0 for r in online.requests)


def test_queries_are_unique_questions(online: Workload) -> None:
    queries = [r.query for r in online.requests]
    assert len(set(queries)) == len(queries)
    assert all(query[-1] in "?." for query in queries)


def test_documents_are_nonempty_sentences_of_varied_length(online: Workload) -> None:
    texts = list(online.corpus.values())
    assert all(text.endswith(".") and text[0].isupper() for text in texts)
    word_counts = {len(text.split()) for text in texts}
    assert min(word_counts) >= 50
    assert len(word_counts) > 10


def test_corpus_is_read_only(online: Workload) -> None:
    with pytest.raises(TypeError):
        online.corpus["doc-00000"] = "changed"  # type: ignore[index]


def test_system_prompt_is_fixed(online: Workload, multiturn: Workload) -> None:
    assert online.system_prompt == multiturn.system_prompt == SYSTEM_PROMPT


def test_about_80_percent_of_doc_slots_hit_the_top_20_percent_of_docs(online: Workload) -> None:
    assert 0.75 <= top_share(online) <= 0.85


def test_same_documents_recur_in_different_orders(online: Workload) -> None:
    orders: defaultdict[frozenset[str], set[tuple[str, ...]]] = defaultdict(set)
    first_docs = Counter(r.doc_ids[0] for r in online.requests)
    for request in online.requests:
        orders[frozenset(request.doc_ids[:2])].add(request.doc_ids[:2])
    assert any(len(seen) == 2 for seen in orders.values())
    assert first_docs.most_common(1)[0][1] < len(online.requests) / 10


def test_online_workload_is_deterministic_for_a_seed() -> None:
    assert online_workload(n_requests=50, seed=3) == online_workload(n_requests=50, seed=3)


def test_different_seeds_give_different_workloads() -> None:
    first, second = online_workload(n_requests=50, seed=1), online_workload(n_requests=50, seed=2)
    assert first.requests != second.requests
    assert first.corpus != second.corpus


def test_workloads_with_one_seed_share_their_corpus(online: Workload, multiturn: Workload) -> None:
    assert online.corpus == multiturn.corpus


def test_top_share_is_zero_without_requests() -> None:
    assert top_share(online_workload(n_docs=20, n_requests=0)) == 0.0


def test_top_share_of_the_whole_corpus_is_one(online: Workload) -> None:
    assert top_share(online, fraction=1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_top_share_rejects_fractions_outside_zero_to_one(online: Workload, fraction: float) -> None:
    with pytest.raises(ConfigError):
        top_share(online, fraction)


@pytest.mark.parametrize(
    "arguments",
    [{"n_docs": 0}, {"k": 0}, {"n_docs": 10, "k": 11}, {"n_requests": -1}, {"seed": -1}],
)
def test_online_workload_rejects_bad_sizes(arguments: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        online_workload(**arguments)


def test_multiturn_workload_has_every_turn_of_every_session(multiturn: Workload) -> None:
    assert multiturn.name == "multiturn"
    assert len(multiturn.requests) == 200 * 5
    turns = Counter(r.session for r in multiturn.requests)
    assert set(turns) == {f"s-{i:04d}" for i in range(1, 201)}
    assert set(turns.values()) == {5}


def test_session_turns_are_emitted_in_order(multiturn: Workload) -> None:
    turns_seen: defaultdict[str | None, list[int]] = defaultdict(list)
    for request in multiturn.requests:
        turns_seen[request.session].append(request.turn)
    assert all(turns == [0, 1, 2, 3, 4] for turns in turns_seen.values())


def test_multiturn_requests_retrieve_k_distinct_documents(multiturn: Workload) -> None:
    assert all(len(set(r.doc_ids)) == len(r.doc_ids) == 15 for r in multiturn.requests)


def re_retrieved(requests: tuple[WorkloadRequest, ...]) -> list[float]:
    """Per later turn, the share of its documents the session retrieved before."""
    history: defaultdict[str | None, set[str]] = defaultdict(set)
    shares = []
    for request in requests:
        seen = history[request.session]
        if request.turn > 0:
            shares.append(sum(d in seen for d in request.doc_ids) / len(request.doc_ids))
        seen.update(request.doc_ids)
    return shares


def test_later_turns_re_retrieve_forty_percent_of_their_documents(multiturn: Workload) -> None:
    shares = re_retrieved(multiturn.requests)
    assert len(shares) == 200 * 4
    assert set(shares) == {6 / 15}


def test_reretrieve_fraction_controls_the_overlap() -> None:
    assert set(re_retrieved(small_multiturn(reretrieve_fraction=0.0).requests)) == {0.0}
    assert set(re_retrieved(small_multiturn(reretrieve_fraction=1.0).requests)) == {1.0}


def test_interleaved_sessions_are_served_round_robin() -> None:
    sessions = [r.session for r in small_multiturn(n_sessions=5, turns=2, interleave=2).requests]
    assert sessions == [
        "s-0001", "s-0002", "s-0001", "s-0002",
        "s-0003", "s-0004", "s-0003", "s-0004",
        "s-0005", "s-0005",
    ]  # fmt: skip


def test_at_most_interleave_sessions_are_active_at_once(multiturn: Workload) -> None:
    remaining = Counter(r.session for r in multiturn.requests)
    active: set[str | None] = set()
    for request in multiturn.requests:
        active.add(request.session)
        assert len(active) <= 16
        remaining[request.session] -= 1
        if remaining[request.session] == 0:
            active.discard(request.session)


def test_multiturn_workload_is_deterministic_for_a_seed() -> None:
    assert small_multiturn(seed=5) == small_multiturn(seed=5)
    assert small_multiturn(seed=5).requests != small_multiturn(seed=6).requests


@pytest.mark.parametrize(
    "arguments",
    [
        {"turns": 0},
        {"interleave": 0},
        {"n_sessions": -1},
        {"reretrieve_fraction": 1.5},
        {"n_docs": 40, "turns": 4, "k": 15},  # 15 + 3 * 9 = 42 distinct docs needed
    ],
)
def test_multiturn_workload_rejects_bad_sizes(arguments: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        small_multiturn(**arguments)


@pytest.fixture(scope="module")
def topics() -> Workload:
    return topic_workload(n_topics=6, docs_per_topic=8, n_requests=300, k=5)


def topic_pools(workload: Workload) -> list[set[str]]:
    """The document sets of connected requests: two requests are connected when they
    share a document."""
    pools: list[set[str]] = []
    for request in workload.requests:
        docs = set(request.doc_ids)
        touching = [pool for pool in pools if pool & docs]
        for pool in touching:
            pools.remove(pool)
            docs |= pool
        pools.append(docs)
    return pools


def test_topic_workload_has_the_requested_sizes(topics: Workload) -> None:
    assert topics.name == "topics"
    assert len(topics.corpus) == 6 * 8
    assert len(topics.requests) == 300
    assert all(len(set(r.doc_ids)) == len(r.doc_ids) == 5 for r in topics.requests)
    assert all(r.session is None and r.turn == 0 for r in topics.requests)


def test_topic_requests_retrieve_only_from_their_topics_pool(topics: Workload) -> None:
    pools = topic_pools(topics)
    assert len(pools) == 6  # every topic drawn, no request mixing two pools
    assert sorted(len(pool) for pool in pools) == [8] * 6


def test_topics_are_skewed_and_requests_of_a_topic_share_documents(topics: Workload) -> None:
    pools = topic_pools(topics)
    per_topic = Counter(
        next(i for i, pool in enumerate(pools) if r.doc_ids[0] in pool) for r in topics.requests
    )
    assert per_topic.most_common()[0][1] >= 3 * per_topic.most_common()[-1][1]
    top_doc = Counter(d for r in topics.requests for d in r.doc_ids).most_common(1)[0]
    topic_of_top = next(i for i, pool in enumerate(pools) if top_doc[0] in pool)
    assert top_doc[1] >= 0.85 * per_topic[topic_of_top]  # a topic's favourite is in most


def test_topic_workload_is_deterministic_for_a_seed() -> None:
    assert topic_workload(n_requests=40, seed=4) == topic_workload(n_requests=40, seed=4)
    assert topic_workload(n_requests=40, seed=4) != topic_workload(n_requests=40, seed=5)


def test_topic_queries_are_unique(topics: Workload) -> None:
    assert len({r.query for r in topics.requests}) == len(topics.requests)


@pytest.mark.parametrize(
    "arguments",
    [{"n_topics": 0}, {"docs_per_topic": 0}, {"docs_per_topic": 4, "k": 5}, {"n_requests": -1}],
)
def test_topic_workload_rejects_bad_sizes(arguments: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        topic_workload(**arguments)


@pytest.fixture(scope="module")
def intents() -> Workload:
    return intent_workload(n_docs=400, n_requests=300, k=6, n_intents=20, swap=0.2)


def test_intent_workload_has_the_requested_sizes(intents: Workload) -> None:
    assert intents.name == "intents"
    assert len(intents.corpus) == 400
    assert len(intents.requests) == 300
    assert all(len(set(r.doc_ids)) == len(r.doc_ids) == 6 for r in intents.requests)
    assert all(r.session is None and r.turn == 0 for r in intents.requests)
    assert len({r.query for r in intents.requests}) == 300


def test_intent_requests_come_in_near_duplicate_groups(intents: Workload) -> None:
    # with 20% of documents swapped, most requests share >= 5 of 6 documents with
    # another request; independent draws from the same corpus rarely do
    def near_duplicates(workload: Workload) -> int:
        sets = [set(r.doc_ids) for r in workload.requests]
        return sum(
            any(len(a & b) >= 5 for j, b in enumerate(sets) if j != i) for i, a in enumerate(sets)
        )

    independent = online_workload(n_docs=400, n_requests=300, k=6)
    assert near_duplicates(intents) >= 0.7 * len(intents.requests)
    assert near_duplicates(independent) <= 0.05 * len(independent.requests)


def test_intent_swap_bounds_the_sharing() -> None:
    def distinct(swap: float) -> int:
        workload = intent_workload(n_docs=400, n_requests=200, k=6, n_intents=10, swap=swap)
        return len({d for r in workload.requests for d in r.doc_ids})

    assert distinct(0.0) <= 10 * 6  # only the intents' own documents
    assert distinct(0.0) < distinct(0.5)


def test_intent_workload_is_deterministic_for_a_seed() -> None:
    assert intent_workload(n_requests=30, seed=2) == intent_workload(n_requests=30, seed=2)
    assert intent_workload(n_requests=30, seed=2) != intent_workload(n_requests=30, seed=3)


@pytest.mark.parametrize(
    "arguments",
    [{"n_intents": 0}, {"swap": -0.1}, {"swap": 1.5}, {"n_requests": -1}, {"k": 0}],
)
def test_intent_workload_rejects_bad_arguments(arguments: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        intent_workload(**arguments)  # type: ignore[arg-type]


# -- text lengths ---------------------------------------------------------------------


def words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("generator", [online_workload, topic_workload, intent_workload])
def test_text_lengths_set_the_words_of_documents_and_questions(generator: object) -> None:
    lengths = TextLengths(doc_words=(300, 400), query_words=(40, 50))
    sizes = {"n_requests": 60, "k": 5, "seed": 3}
    if generator is topic_workload:
        sizes |= {"n_topics": 4, "docs_per_topic": 10}
    workload = generator(**sizes, lengths=lengths)  # type: ignore[operator]
    document_words = [words(text) for text in workload.corpus.values()]
    assert min(document_words) >= 300 and max(document_words) <= 400
    assert len(set(document_words)) > 1  # drawn per document
    question_words = [words(request.query) for request in workload.requests]
    assert min(question_words) >= 40 and max(question_words) <= 50
    assert len({request.query for request in workload.requests}) == len(workload.requests)


def test_default_lengths_are_the_bench_texts() -> None:
    workload = online_workload(n_docs=200, n_requests=50, k=5, seed=1)
    low, high = DOC_WORDS
    assert all(low <= words(text) <= high for text in workload.corpus.values())
    assert all(words(request.query) <= 14 for request in workload.requests)


def test_text_lengths_change_no_document_a_request_retrieves() -> None:
    """Lengths come from streams of their own: the same seed retrieves the same
    documents, and a padded question ends with the bare one."""
    arguments = {"n_sessions": 12, "turns": 3, "interleave": 4, "n_docs": 300, "seed": 5}
    bare = multiturn_workload(**arguments)  # type: ignore[arg-type]
    long = multiturn_workload(
        **arguments,  # type: ignore[arg-type]
        lengths=TextLengths(doc_words=(20, 30), query_words=(30, 60)),
    )
    assert [r.doc_ids for r in long.requests] == [r.doc_ids for r in bare.requests]
    assert all(
        padded.query.endswith(" " + plain.query) and words(padded.query) >= 30
        for padded, plain in zip(long.requests, bare.requests, strict=True)
    )
    assert all(20 <= words(text) <= 30 for text in long.corpus.values())


@pytest.mark.parametrize(
    "arguments",
    [
        {"doc_words": (0, 10)},
        {"doc_words": (20, 10)},
        {"doc_words": (10,)},
        {"doc_words": (1.5, 10)},
        {"query_words": (True, 10)},
        {"query_words": (5, 4)},
    ],
)
def test_text_lengths_reject_empty_or_non_positive_ranges(arguments: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="low <= high"):
        TextLengths(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("generator", [online_workload, topic_workload, intent_workload])
def test_lengths_that_are_not_text_lengths_are_refused(generator: object) -> None:
    with pytest.raises(ConfigError, match="lengths must be a TextLengths"):
        generator(n_requests=3, k=2, lengths=(100, 200))  # type: ignore[operator]


def test_multiturn_lengths_that_are_not_text_lengths_are_refused() -> None:
    with pytest.raises(ConfigError, match="lengths must be a TextLengths"):
        small_multiturn(lengths={"doc_words": (1, 2)})
