"""``ContextPilotDocumentTransformer``: the pilot as a LangChain
``BaseDocumentTransformer`` (beside ``LongContextReorder``), with real langchain-core
documents and a real pilot, offline."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from off_the_loop import refuse_the_pilot_on_the_loop

from contextpilot_rag import (
    ConfigError,
    ContextBlock,
    ContextPilot,
    InvalidInputError,
    Tokenizer,
    UnknownConversationError,
)

pytest.importorskip("langchain_core")

from langchain_contextpilot import ANNOTATION_KEY, ContextPilotDocumentTransformer
from langchain_core.documents import BaseDocumentTransformer, Document

TEXTS = {
    f"doc-{n}": f"Document {n} is about {topic}. " + f"It records facts on {topic}. " * 5
    for n, topic in enumerate(["rivers", "bridges", "museums", "railways", "harbours"])
}


def docs(*ids: str) -> list[Document]:
    return [Document(page_content=TEXTS[i], id=i, metadata={"src": i}) for i in ids]


def ids(documents: Any) -> list[str]:
    return [str(doc.id) for doc in documents]


def annotation(doc: Document) -> dict[str, Any]:
    value: dict[str, Any] = doc.metadata[ANNOTATION_KEY]
    return value


def pilot_order(pilot: ContextPilot, documents: list[Document], query: str) -> list[str]:
    """The order the pilot itself gives the documents' blocks."""
    blocks = [ContextBlock(doc.page_content, id=doc.id) for doc in documents]
    return [block.id for block in pilot.optimize(blocks, query).placed_blocks]


def test_it_is_a_langchain_document_transformer(pilot: ContextPilot) -> None:
    assert isinstance(ContextPilotDocumentTransformer(pilot=pilot), BaseDocumentTransformer)


def test_order_is_the_pilots_order(tokenizer: Tokenizer) -> None:
    transformer = ContextPilotDocumentTransformer(pilot=ContextPilot(tokenizer=tokenizer))
    twin = ContextPilot(tokenizer=tokenizer)
    for documents, query in (
        (docs("doc-0", "doc-1", "doc-2"), "a"),
        (docs("doc-2", "doc-3", "doc-0"), "b"),
    ):
        out = transformer.transform_documents(documents, query=query)
        assert ids(out) == pilot_order(twin, documents, query)
    assert ids(out)[:2] == ["doc-0", "doc-2"]  # the prefix the first call cached comes first
    assert [annotation(doc)["rank"] for doc in out] == [2, 0, 1]


def test_the_callers_documents_are_never_mutated(pilot: ContextPilot) -> None:
    given = docs("doc-1", "doc-0")
    snapshot = copy.deepcopy(given)
    out = ContextPilotDocumentTransformer(pilot=pilot).transform_documents(given, query="q")
    assert given == snapshot
    assert all(ANNOTATION_KEY not in doc.metadata for doc in given)
    assert not any(o is g for o in out for g in given)
    assert all(doc.metadata["src"] == doc.id for doc in out)


@pytest.mark.parametrize(
    ("documents", "options"),
    [
        (docs("doc-0"), {}),  # no query
        (docs("doc-0"), {"query": {"question": "q"}}),  # a dict piped in by mistake
        ("doc-0", {"query": "q"}),  # a string, not documents
        ([*docs("doc-0"), "doc-1"], {"query": "q"}),
        (docs("doc-0"), {"query": "q", "k": 3}),  # an option it does not have
    ],
)
def test_bad_input_is_a_typed_error_before_the_pilot_changes(
    pilot: ContextPilot, documents: Any, options: dict[str, Any]
) -> None:
    transformer = ContextPilotDocumentTransformer(pilot=pilot, conversation_id="c", dedup=True)
    before = pilot.index_stats()
    with pytest.raises(InvalidInputError):
        transformer.transform_documents(documents, **options)
    assert pilot.index_stats() == before
    with pytest.raises(UnknownConversationError):
        pilot.conversation("c")


def test_options_match_the_retriever(pilot: ContextPilot) -> None:
    transformer = ContextPilotDocumentTransformer(pilot=pilot, dedup=True, annotate=False)
    transformer.transform_documents(docs("doc-0", "doc-1"), query="a", conversation_id="c")
    out = transformer.transform_documents(docs("doc-1", "doc-2"), query="b", session_id="c")
    assert ids(out) == ["doc-2", "doc-1"]
    assert annotation(out[1])["deduplicated"] is True
    assert {annotation(doc)["conversation_id"] for doc in out} == {"c"}
    assert {annotation(doc)["order_note"] for doc in out} == {None}
    # kept with annotate=False: it is what names the de-duplicated document
    assert {annotation(doc)["location_note"] for doc in out} == {
        "Also relevant, shown in earlier turns: doc-1"
    }


def test_id_key_names_the_blocks(pilot: ContextPilot) -> None:
    documents = [Document(page_content=TEXTS["doc-0"], metadata={"path": "rivers.md"})]
    transformer = ContextPilotDocumentTransformer(pilot=pilot, id_key="path")
    (out,) = transformer.transform_documents(documents, query="q")
    assert annotation(out)["block_id"] == "rivers.md"


def test_two_names_for_one_call_must_agree(pilot: ContextPilot) -> None:
    transformer = ContextPilotDocumentTransformer(pilot=pilot, dedup=True)
    before = pilot.index_stats()
    with pytest.raises(ConfigError):
        transformer.transform_documents(
            docs("doc-0"), query="q", conversation_id="a", session_id="b"
        )
    assert pilot.index_stats() == before


def test_async_transform_gives_the_sync_result(tokenizer: Tokenizer) -> None:
    sync = ContextPilotDocumentTransformer(pilot=ContextPilot(tokenizer=tokenizer))
    concurrent = ContextPilotDocumentTransformer(pilot=ContextPilot(tokenizer=tokenizer))
    calls = [(docs("doc-0", "doc-1"), "a"), (docs("doc-1", "doc-3", "doc-0"), "b")]
    for documents, query in calls:
        expected = sync.transform_documents(documents, query=query)
        got = asyncio.run(concurrent.atransform_documents(documents, query=query))
        assert ids(got) == ids(expected)
    assert asyncio.run(concurrent.atransform_documents([], query="c")) == []


def test_async_transform_runs_the_pilot_off_the_event_loop(
    pilot: ContextPilot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenizing new documents, and a shared store's round trips, must not hold the
    loop (as the retriever's ainvoke): the pilot's optimize here opens only while the
    loop is free to open it."""

    async def scenario() -> list[Document]:
        refuse_the_pilot_on_the_loop(pilot, monkeypatch)
        transformer = ContextPilotDocumentTransformer(pilot=pilot)
        return await transformer.atransform_documents(docs("doc-0", "doc-1"), query="a")

    assert ids(asyncio.run(scenario())) == ["doc-0", "doc-1"]
