"""``ContextPilotPromptBuilder`` on what a chain hands it: a retrieval with no hit, and
LangGraph's thread ids. Real langchain-core runnables, offline (the chat model is
LangChain's ``GenericFakeChatModel``)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest

from contextpilot_rag import (
    ContextBlock,
    ContextPilot,
    PilotConfig,
    Tokenizer,
)
from contextpilot_rag.cloud import CloudCacheConfig

pytest.importorskip("langchain_core")

from langchain_contextpilot import (
    MESSAGE_KEY,
    ContextPilotCallbackHandler,
    ContextPilotPromptBuilder,
)
from langchain_core.documents import Document
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

SYSTEM = "Answer from the context documents."
PASSAGE = "Passage about rivers, bridges and what a cache breakpoint pays. " * 20


@pytest.fixture
def pilot(tokenizer: Tokenizer) -> ContextPilot:
    return ContextPilot(PilotConfig(cloud=CloudCacheConfig(enabled=True)), tokenizer=tokenizer)


def text_of(message: BaseMessage) -> str:
    """A message's text, whether its content is a string or text blocks."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(block["text"] for block in content if isinstance(block, dict))


@pytest.mark.parametrize(("provider", "content_type"), [("anthropic", list), ("openai", str)])
def test_no_documents_give_the_system_prompt_and_the_pilots_question_line(
    pilot: ContextPilot, tokenizer: Tokenizer, provider: Any, content_type: type
) -> None:
    question = "Question: which rivers?"  # a line the pilot escapes
    builder = ContextPilotPromptBuilder(pilot=pilot, provider=provider, system=SYSTEM)
    before = pilot.index_stats()
    messages = builder.invoke({"documents": [], "question": question})
    assert pilot.index_stats() == before  # no pilot prompt: nothing recorded
    assert [type(message) for message in messages] == [SystemMessage, HumanMessage]
    assert all(isinstance(message.content, content_type) for message in messages)
    assert MESSAGE_KEY not in messages[-1].additional_kwargs
    assert text_of(messages[0]) == SYSTEM
    other = ContextPilot(PilotConfig(cloud=CloudCacheConfig(enabled=True)), tokenizer=tokenizer)
    with_context = other.optimize([ContextBlock(PASSAGE, id="doc-0")], question, system=SYSTEM)
    assert text_of(messages[1]) == "Question: \\Question: which rivers?"
    assert with_context.messages[-1]["content"].endswith(text_of(messages[1]))


def test_a_retrieval_without_hits_runs_through_the_chain(pilot: ContextPilot) -> None:
    handler = ContextPilotCallbackHandler(pilot)
    model = GenericFakeChatModel(messages=iter([AIMessage("Nothing found.")] * 2))
    chain = (
        {"documents": RunnableLambda(lambda _: []), "question": RunnablePassthrough()}
        | ContextPilotPromptBuilder(pilot=pilot, system=SYSTEM)
        | model
    )
    config: Any = {"callbacks": [handler]}
    assert chain.invoke("Which rivers?", config=config).text == "Nothing found."
    assert asyncio.run(chain.ainvoke("Which rivers?", config=config)).text == "Nothing found."
    assert handler.counts.unmatched == 2 and handler.counts.failed == 0  # no prompt to pair


def test_a_turn_without_documents_enters_the_conversation_through_the_chain(
    pilot: ContextPilot,
) -> None:
    """A conversation's turn whose retrieval found nothing: the builder gives the
    pilot's prompt (history and question), its answer is recorded as any other's, and
    the next turn carries both byte for byte."""
    handler = ContextPilotCallbackHandler(pilot)
    answers = iter([AIMessage("Rivers: two."), AIMessage("You are welcome."), AIMessage("Ok.")])
    found = iter([[Document(PASSAGE, id="doc-0")], [], [Document(PASSAGE, id="doc-0")]])
    chain = (
        {"documents": RunnableLambda(lambda _: next(found)), "question": RunnablePassthrough()}
        | ContextPilotPromptBuilder(pilot=pilot, system=SYSTEM)
        | GenericFakeChatModel(messages=answers)
    )
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "thread-1"}}
    for question in ("Which rivers?", "Thanks!"):
        pilot.record_answer("thread-1", chain.invoke(question, config=config).text)
    assert handler.counts.failed == 0 and handler.counts.unmatched == 0
    turns = pilot.conversation("thread-1").turns
    assert [turn.answer for turn in turns] == ["Rivers: two.", "You are welcome."]
    assert turns[1].block_ids == ()
    builder = ContextPilotPromptBuilder(pilot=pilot, system=SYSTEM)
    messages = builder.invoke(
        {"documents": [Document(PASSAGE, id="doc-0")], "question": "More?"}, config=config
    )
    assert [text_of(message) for message in messages[3:5]] == [
        "Context documents:\n\nQuestion: Thanks!",
        "You are welcome.",
    ]


@pytest.mark.parametrize("thread_id", [7, UUID("5f0c8a3e-2b1d-4c6e-9a7f-0d3b2e1c4a58")])
def test_an_int_or_uuid_thread_id_names_the_conversation_by_its_str(
    pilot: ContextPilot, thread_id: object
) -> None:
    builder = ContextPilotPromptBuilder(pilot=pilot)
    config: Any = {"configurable": {"thread_id": thread_id}}
    documents = [Document(PASSAGE, id="doc-0")]
    messages = builder.invoke({"documents": documents, "question": "Which?"}, config=config)
    assert messages[-1].additional_kwargs[MESSAGE_KEY]["conversation_id"] == str(thread_id)
    assert len(pilot.conversation(str(thread_id)).turns) == 1
