"""What ``ContextPilotRetriever`` takes from a call's config and keywords: one
conversation-key vocabulary (``conversation_id``, its alias ``session_id``, LangGraph's
``thread_id``) and the caller's callbacks, tags and metadata on the base retriever's
run. Real langchain-core retrievers and callback handlers, offline."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from pydantic import Field

from contextpilot_rag import ConfigError, ContextPilot, InvalidInputError, UnknownConversationError

pytest.importorskip("langchain_core")

from langchain_contextpilot import ANNOTATION_KEY, ContextPilotCompressor, ContextPilotRetriever
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    BaseCallbackHandler,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableLambda

TEXTS = {
    f"doc-{n}": f"Document {n} is about {topic}. " + f"It records facts on {topic}. " * 5
    for n, topic in enumerate(["rivers", "bridges", "museums", "railways"])
}


class FixedRetriever(BaseRetriever):
    """Returns the same documents for every query; records the keywords of each call."""

    doc_ids: list[str]
    keywords: list[dict[str, Any]] = Field(default_factory=list)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        self.keywords.append(kwargs)
        return [Document(page_content=TEXTS[i], id=i) for i in self.doc_ids]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return self._get_relevant_documents(query, run_manager=run_manager.get_sync(), **kwargs)


class RetrieverStarts(BaseCallbackHandler):
    """Records the tags and metadata of every retriever run, by run name."""

    def __init__(self) -> None:
        self.tags: dict[str, list[str]] = {}
        self.metadata: dict[str, dict[str, Any]] = {}

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or ""
        self.tags[name] = list(tags or [])
        self.metadata[name] = dict(metadata or {})


def conversation_of(retriever: ContextPilotRetriever, *args: Any, **kwargs: Any) -> str | None:
    """The conversation the pilot de-duplicated one call against."""
    value: str | None = retriever.invoke("q", *args, **kwargs)[0].metadata[ANNOTATION_KEY][
        "conversation_id"
    ]
    return value


def retriever_over(pilot: ContextPilot, *doc_ids: str, **options: Any) -> ContextPilotRetriever:
    base = FixedRetriever(doc_ids=list(doc_ids) or ["doc-0", "doc-1"])
    return ContextPilotRetriever(base_retriever=base, pilot=pilot, dedup=True, **options)


# -- one vocabulary --------------------------------------------------------------------------


def test_session_id_is_an_alias_of_the_conversation_id_field(pilot: ContextPilot) -> None:
    for keyword in ("conversation_id", "session_id"):
        retriever = retriever_over(pilot, **{keyword: "chat-1"})
        assert retriever.conversation_id == retriever.session_id == "chat-1"
        assert conversation_of(retriever) == "chat-1"
    compressor = ContextPilotCompressor(pilot=pilot, session_id="chat-2")
    assert compressor.conversation_id == "chat-2"


def test_the_same_value_under_both_names_is_accepted(pilot: ContextPilot) -> None:
    retriever = retriever_over(pilot, conversation_id="c", session_id="c")
    assert conversation_of(retriever, session_id="k", conversation_id="k") == "k"


def test_two_names_with_different_values_in_the_constructor_are_a_config_error(
    pilot: ContextPilot,
) -> None:
    with pytest.raises(ConfigError, match="session_id"):
        retriever_over(pilot, conversation_id="a", session_id="b")


@pytest.mark.parametrize(
    ("keywords", "configurable", "expected"),
    [
        ({"conversation_id": "kw"}, {"conversation_id": "cfg", "thread_id": "t"}, "kw"),
        ({"session_id": "kw"}, {"conversation_id": "cfg"}, "kw"),
        ({}, {"conversation_id": "cfg", "session_id": "cfg", "thread_id": "t"}, "cfg"),
        ({}, {"session_id": "session", "thread_id": "t"}, "session"),
        ({}, {"thread_id": "thread"}, "thread"),
        ({}, {}, "field"),
    ],
)
def test_precedence_keyword_then_configurable_names_then_thread_then_field(
    pilot: ContextPilot, keywords: dict[str, str], configurable: dict[str, str], expected: str
) -> None:
    retriever = retriever_over(pilot, conversation_id="field")
    config: RunnableConfig = {"configurable": configurable}
    assert conversation_of(retriever, config, **keywords) == expected
    assert (
        asyncio.run(retriever.ainvoke("q", config, **keywords))[0].metadata[ANNOTATION_KEY][
            "conversation_id"
        ]
        == expected
    )


@pytest.mark.parametrize(
    ("keywords", "configurable"),
    [
        ({"conversation_id": "a", "session_id": "b"}, {}),
        ({}, {"conversation_id": "a", "session_id": "b"}),
    ],
)
def test_two_different_values_in_one_place_fail_before_the_pilot_changes(
    pilot: ContextPilot, keywords: dict[str, str], configurable: dict[str, str]
) -> None:
    retriever = retriever_over(pilot)
    before = pilot.index_stats()
    with pytest.raises(ConfigError):
        retriever.invoke("q", {"configurable": configurable}, **keywords)
    assert pilot.index_stats() == before
    for name in ("a", "b"):
        with pytest.raises(UnknownConversationError):
            pilot.conversation(name)


def test_a_thread_id_that_is_not_a_str_int_or_uuid_is_rejected(pilot: ContextPilot) -> None:
    with pytest.raises(InvalidInputError, match="thread_id"):
        retriever_over(pilot).invoke("q", {"configurable": {"thread_id": 7.5}})


@pytest.mark.parametrize("thread_id", [7, UUID("5f0c8a3e-2b1d-4c6e-9a7f-0d3b2e1c4a58")])
def test_an_int_or_uuid_thread_id_names_the_conversation_by_its_str(
    pilot: ContextPilot, thread_id: object
) -> None:
    """LangGraph takes any of these as a thread id."""
    retriever = retriever_over(pilot)
    thread: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    assert conversation_of(retriever, thread) == str(thread_id)
    second = asyncio.run(retriever.ainvoke("q", thread))
    assert all(doc.metadata[ANNOTATION_KEY]["deduplicated"] for doc in second)
    assert len(pilot.conversation(str(thread_id)).turns) == 2


def test_without_dedup_the_configs_conversation_is_not_read(pilot: ContextPilot) -> None:
    """A chain's ``configurable`` may hold anything: without dedup no conversation is
    used, so none is read (nor refused)."""
    retriever = ContextPilotRetriever(base_retriever=FixedRetriever(doc_ids=["doc-0"]), pilot=pilot)
    config: RunnableConfig = {"configurable": {"session_id": 42, "thread_id": 7.5}}
    for out in (retriever.invoke("q", config), asyncio.run(retriever.ainvoke("q", config))):
        assert out[0].metadata[ANNOTATION_KEY]["conversation_id"] is None


def test_a_langgraph_thread_de_duplicates_across_its_turns(pilot: ContextPilot) -> None:
    retriever = retriever_over(pilot)
    thread: RunnableConfig = {"configurable": {"thread_id": "thread-1"}}
    retriever.invoke("first", thread)
    second = retriever.invoke("second", thread)
    assert all(doc.metadata[ANNOTATION_KEY]["deduplicated"] for doc in second)
    assert len(pilot.conversation("thread-1").turns) == 2


def test_the_annotation_names_the_conversation_under_both_keys(pilot: ContextPilot) -> None:
    out = retriever_over(pilot).invoke("q", conversation_id="c")
    assert {doc.metadata[ANNOTATION_KEY]["session_id"] for doc in out} == {"c"}


# -- the base retriever's run ------------------------------------------------------------------


def test_the_base_retriever_run_carries_the_callers_tags_and_metadata(
    pilot: ContextPilot,
) -> None:
    retriever = retriever_over(pilot)
    for path in ("sync", "async"):
        handler = RetrieverStarts()
        config: RunnableConfig = {
            "callbacks": [handler],
            "tags": ["caller-tag"],
            "metadata": {"user": "u-1"},
        }
        if path == "sync":
            retriever.invoke("q", config)
        else:
            asyncio.run(retriever.ainvoke("q", config))
        assert "caller-tag" in handler.tags["FixedRetriever"]
        assert handler.metadata["FixedRetriever"]["user"] == "u-1"
        assert handler.metadata["FixedRetriever"]["ls_retriever_name"] == "fixed"


def test_the_wrappers_own_tags_stay_on_its_own_run(pilot: ContextPilot) -> None:
    retriever = retriever_over(pilot).with_config(tags=["caller-tag"])
    handler = RetrieverStarts()
    retriever.invoke("q", {"callbacks": [handler]})
    assert "caller-tag" in handler.tags["ContextPilotRetriever"]
    assert "caller-tag" in handler.tags["FixedRetriever"]


def test_other_invoke_keywords_go_to_the_base_retriever(pilot: ContextPilot) -> None:
    retriever = retriever_over(pilot)
    retriever.invoke("q", k=1, session_id="s")
    asyncio.run(retriever.ainvoke("q", filter={"lang": "en"}))
    assert retriever.base_retriever.keywords == [{"k": 1}, {"filter": {"lang": "en"}}]  # type: ignore[attr-defined]


def test_the_base_retriever_sees_the_callers_config(pilot: ContextPilot) -> None:
    seen: list[RunnableConfig] = []

    def base(query: str, config: RunnableConfig) -> list[Document]:
        seen.append(config)
        return [Document(page_content=TEXTS["doc-0"], id="doc-0")]

    retriever = ContextPilotRetriever(base_retriever=RunnableLambda(base), pilot=pilot)
    config: RunnableConfig = {
        "configurable": {"thread_id": "t", "index": "news"},
        "recursion_limit": 7,
        "run_name": "outer",
    }
    retriever.invoke("q", config)
    (child,) = seen
    assert child["configurable"]["index"] == "news"
    assert child["recursion_limit"] == 7
    assert child.get("run_name") is None  # the caller named its own run, not this one


def test_a_retrieval_without_hits_is_still_a_turn_of_the_conversation(pilot: ContextPilot) -> None:
    """With dedup, a retrieval that finds nothing is recorded as a turn without
    documents: the pilot's history window then counts turns as the application's chat
    history does, and never points at a turn the application's window dropped."""
    found = ContextPilotRetriever(
        base_retriever=FixedRetriever(doc_ids=["doc-0"]), pilot=pilot, dedup=True,
        conversation_id="chat-1",
    )  # fmt: skip
    nothing = ContextPilotRetriever(
        base_retriever=FixedRetriever(doc_ids=[]), pilot=pilot, dedup=True,
        conversation_id="chat-1",
    )  # fmt: skip
    found.invoke("Which rivers?")
    pilot.record_answer("chat-1", "Two.")
    assert nothing.invoke("Thanks!") == []
    turns = pilot.conversation("chat-1").turns
    assert len(turns) == 2 and turns[1].block_ids == () and turns[1].question == "Thanks!"
