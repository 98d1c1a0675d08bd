"""``ChatContextPilot`` as LangChain sees it: message chunks and their metadata, token
callbacks, engine parameters and LCEL chains, against real loopback servers. What both
framework models share (routing, streaming, configuration) is in test_routed_models.py."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from functools import reduce
from operator import add
from typing import Any

import pytest

from contextpilot_rag.routing import EndpointError
from contextpilot_rag.testing import OpenAICompatibleServer, ScriptedChatServer

pytest.importorskip("langchain_core")

from langchain_contextpilot import ChatContextPilot
from langchain_core._api import LangChainBetaWarning
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from routed_fleet import CONTEXT, TOOL_DELTAS, question, reply_of

WORDS = ["answer", " from", " server", " a", " in", " words"]


class TokenRecorder(BaseCallbackHandler):
    """Records every ``on_llm_new_token``."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


@pytest.fixture
def model(server: OpenAICompatibleServer) -> Iterator[ChatContextPilot]:
    chat = ChatContextPilot(endpoints=[server.base_url], model="m")
    yield chat
    chat.close()


def test_each_delta_is_an_ai_message_chunk_and_the_last_carries_routing_and_usage(
    model: ChatContextPilot, server: OpenAICompatibleServer
) -> None:
    model.invoke(question())  # warm the cache
    chunks = list(model.stream(question()))
    assert all(isinstance(chunk, AIMessageChunk) for chunk in chunks)
    assert [chunk.text for chunk in chunks[:-1]] == WORDS
    assert all(not c.response_metadata and c.usage_metadata is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.text == "" and last.chunk_position == "last"
    assert last.response_metadata["endpoint"] == server.base_url
    assert last.response_metadata["model_name"] == "m"
    usage = last.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] == last.response_metadata["prompt_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_token_details"]["cache_read"] == last.response_metadata["cached_tokens"]
    assert usage["input_token_details"]["cache_read"] > 0
    merged = reduce(add, chunks)
    assert merged.text == reply_of("a") and merged.usage_metadata == usage  # counted once


def test_invoke_puts_routing_facts_and_token_usage_on_the_message(
    model: ChatContextPilot, server: OpenAICompatibleServer
) -> None:
    message = model.invoke(question())
    facts = message.response_metadata
    assert facts["endpoint"] == server.base_url and facts["finish_reason"] == "stop"
    assert facts["attempts"] == 1 and facts["routing_reason"]
    assert 0 < facts["ttft_s"] <= facts["e2e_s"]
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == 6
    assert message.usage_metadata["input_token_details"] == {"cache_read": 0}


def test_token_callbacks_fire_once_per_delta(model: ChatContextPilot) -> None:
    recorder = TokenRecorder()
    model.invoke(question(), config={"callbacks": [recorder]}, stream=True)
    assert [token for token in recorder.tokens if token] == WORDS


def test_the_model_fires_the_token_callbacks_when_langchain_hands_it_the_run(
    model: ChatContextPilot,
) -> None:
    if not hasattr(model, "stream_events"):
        pytest.skip("this langchain-core has no stream_events (newer releases do)")
    recorder = TokenRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangChainBetaWarning)
        stream = model.stream_events(question(), {"callbacks": [recorder]}, version="v3")
        assert stream.output.text == reply_of("a")
    assert recorder.tokens == WORDS  # the run manager passed to _stream: no empty token


def test_stop_max_tokens_temperature_and_bound_keywords_reach_the_engine(
    server: OpenAICompatibleServer,
) -> None:
    model = ChatContextPilot(endpoints=[server.base_url], model="m", max_tokens=2, temperature=0.25)
    message = model.bind(top_p=0.5).invoke(question(), stop=["\n\n"])
    body = server.requests[-1]
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (2, 0.25, 0.5)
    assert body["stop"] == ["\n\n"]
    assert message.text == "answer from" and message.response_metadata["finish_reason"] == "length"
    model.invoke(question(), max_tokens=3)
    assert server.requests[-1]["max_tokens"] == 3  # the call's value wins
    model.close()


def test_a_chain_of_prompt_model_and_parser_invokes_and_streams(
    model: ChatContextPilot, server: OpenAICompatibleServer
) -> None:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the documents."), ("human", "{context}\n\n{question}")]
    )
    chain = prompt | model | StrOutputParser()
    inputs = {"context": CONTEXT, "question": "Which topic comes first?"}
    assert chain.invoke(inputs) == reply_of("a")
    assert server.requests[-1]["messages"] == question()  # the same messages, byte for byte
    pieces = list(chain.stream(inputs))
    assert [piece for piece in pieces if piece] == WORDS


def test_the_model_identifies_its_fleet_and_policy(
    model: ChatContextPilot, server: OpenAICompatibleServer
) -> None:
    # asdict() in newer langchain-core releases, dict() before (both give these params)
    params = model.asdict() if hasattr(model, "asdict") else model.dict()
    assert params["_type"] == "contextpilot-routing"
    assert params["replicas"] == [server.base_url] and params["policy"] == "combined"
    assert params["model"] == "m"


def test_a_message_with_content_parts_reaches_the_engine_as_given(
    model: ChatContextPilot, server: OpenAICompatibleServer
) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}
    message = HumanMessage(content=[{"type": "text", "text": "What is this?"}, image])
    # the test server serves a text-only model: its refusal names the image part, so
    # the part reached the engine as given
    with pytest.raises(EndpointError, match=r"messages\[0\]\.content\[1\].*only text parts"):
        model.invoke([message])


def lookup(q: str) -> str:
    """Look ``q`` up in the knowledge base."""
    return q


def test_bound_tools_reach_the_engine_and_its_tool_calls_come_back_parsed() -> None:
    with ScriptedChatServer(TOOL_DELTAS, finish_reason="tool_calls") as engine:
        chat = ChatContextPilot(endpoints=[engine.base_url], model="m")
        with_tools = chat.bind_tools([lookup], tool_choice="lookup")
        answer = with_tools.invoke("Find cats.")
        sent = engine.requests[-1]
        assert sent["tools"][0]["function"]["name"] == "lookup"
        assert sent["tools"][0]["function"]["parameters"]["required"] == ["q"]
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
        assert answer.tool_calls == [
            {"name": "lookup", "args": {"q": "cats"}, "id": "c1", "type": "tool_call"}
        ]
        assert [(c["name"], c["args"]) for c in answer.invalid_tool_calls] == [
            ("lookup", "not json")
        ]
        assert answer.response_metadata["finish_reason"] == "tool_calls"

        streamed = reduce(add, with_tools.stream("Find cats."))
        assert streamed.tool_calls == answer.tool_calls
        assert [c["args"] for c in streamed.invalid_tool_calls] == ["not json"]

        # the tool's answer goes back with the call it answers, as LangChain sends them
        chat.invoke([HumanMessage("Find cats."), answer, ToolMessage("cats", tool_call_id="c1")])
        messages = engine.requests[-1]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
        assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"q": "cats"}'
        assert messages[2]["tool_call_id"] == "c1"
        assert chat.bind_tools([lookup], tool_choice="any").kwargs["tool_choice"] == "required"
        chat.close()
