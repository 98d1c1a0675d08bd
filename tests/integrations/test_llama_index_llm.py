"""``ContextPilotLLM`` as LlamaIndex sees it: cumulative streamed responses, completion
and chat on chat and base models, metadata, and a chat engine on top, against real
loopback servers. What both framework models share (routing, streaming, configuration)
is in test_routed_models.py."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest

from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.testing import OpenAICompatibleServer, ScriptedChatServer

pytest.importorskip("llama_index.core")

from llama_index.core import VectorStoreIndex
from llama_index.core.base.llms.types import AudioBlock, ImageBlock, MessageRole, TextBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import ChatMessage, ChatResponse, CompletionResponse
from llama_index.core.schema import TextNode
from llama_index.core.tools import FunctionTool
from llama_index.llms.contextpilot import ContextPilotLLM
from routed_fleet import TOOL_DELTAS, question, reply_of

WORDS = ["answer", " from", " server", " a", " in", " words"]


@pytest.fixture
def llm(server: OpenAICompatibleServer) -> Iterator[ContextPilotLLM]:
    model = ContextPilotLLM(endpoints=[server.base_url], model="m", max_tokens=64)
    yield model
    model.close()


def chat_messages() -> list[ChatMessage]:
    return [ChatMessage(role=m["role"], content=m["content"]) for m in question()]


def test_stream_chat_grows_the_message_by_one_delta_per_response(llm: ContextPilotLLM) -> None:
    responses = list(llm.stream_chat(chat_messages()))
    assert [r.delta for r in responses] == [*WORDS, ""]
    assert [r.message.content for r in responses] == [
        "".join(WORDS[: i + 1]) for i in range(len(WORDS))
    ] + [reply_of("a")]
    assert all(not r.additional_kwargs and r.raw is None for r in responses[:-1])
    facts, usage = responses[-1].additional_kwargs, responses[-1].raw["usage"]
    assert facts["completion_tokens"] == usage["completion_tokens"] == 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6


def test_chat_reports_routing_facts_and_openai_shaped_usage(
    llm: ContextPilotLLM, server: OpenAICompatibleServer
) -> None:
    first = llm.chat(chat_messages())
    again = llm.chat(chat_messages())
    assert first.message.content == reply_of("a")
    assert first.additional_kwargs["endpoint"] == server.base_url
    assert first.additional_kwargs["model"] == "m"
    cached = again.raw["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == again.additional_kwargs["cached_tokens"] > 0
    assert server.requests[-1]["max_tokens"] == 64


def test_complete_on_a_chat_model_sends_the_prompt_as_one_user_message(
    llm: ContextPilotLLM, server: OpenAICompatibleServer
) -> None:
    response = llm.complete("What comes first?")
    assert isinstance(response, CompletionResponse) and response.text == reply_of("a")
    assert server.requests[-1]["messages"] == [{"role": "user", "content": "What comes first?"}]
    streamed = list(llm.stream_complete("What comes first?"))
    assert [r.delta for r in streamed] == [*WORDS, ""] and streamed[-1].text == reply_of("a")


def test_every_async_path_streams_and_answers(
    llm: ContextPilotLLM, server: OpenAICompatibleServer
) -> None:
    async def run() -> tuple[list[str | None], list[str | None], str, str]:
        chat_deltas = [r.delta async for r in await llm.astream_chat(chat_messages())]
        text_deltas = [r.delta async for r in await llm.astream_complete("Which?")]
        chat = await llm.achat(chat_messages())
        completion = await llm.acomplete("Which?")
        await llm.aclose()
        return chat_deltas, text_deltas, chat.message.content or "", completion.text

    chat_deltas, text_deltas, chat_text, completion_text = asyncio.run(run())
    assert chat_deltas == text_deltas == [*WORDS, ""]
    assert chat_text == completion_text == reply_of("a")
    assert len(server.requests) == 4


def test_a_base_model_completes_on_the_completions_endpoint(
    server: OpenAICompatibleServer,
) -> None:
    llm = ContextPilotLLM(
        endpoints=[server.base_url],
        model="m",
        is_chat_model=False,
        completion_to_prompt=lambda prompt: f"Q: {prompt}\nA:",
    )
    assert not llm.metadata.is_chat_model
    assert llm.complete("Which?").text == reply_of("a")
    assert (
        server.requests[-1]["prompt"] == "Q: Which?\nA:" and "messages" not in server.requests[-1]
    )
    llm.complete("raw text", formatted=True)
    assert server.requests[-1]["prompt"] == "raw text"
    deltas = [r.delta for r in llm.stream_complete("Which?")]
    assert deltas == [*WORDS, ""]
    llm.close()


def test_a_base_model_chats_through_messages_to_prompt(server: OpenAICompatibleServer) -> None:
    def render(messages: Any) -> str:
        return "".join(f"{m.role.value}> {m.content}\n" for m in messages)

    llm = ContextPilotLLM(
        endpoints=[server.base_url], model="m", is_chat_model=False, messages_to_prompt=render
    )
    response = llm.chat([ChatMessage(role="user", content="Which?")])
    assert response.message.content == reply_of("a")
    assert server.requests[-1]["prompt"] == "user> Which?\n"
    llm.close()


def test_metadata_describes_the_routed_model(llm: ContextPilotLLM) -> None:
    metadata = llm.metadata
    assert metadata.is_chat_model and metadata.model_name == "m"
    assert metadata.num_output == 64 and metadata.context_window > 0


def test_a_chat_engine_streams_through_the_llm(
    llm: ContextPilotLLM, server: OpenAICompatibleServer
) -> None:
    engine = SimpleChatEngine.from_defaults(llm=llm, system_prompt="Answer briefly.")
    response = engine.stream_chat("Which topic comes first?")
    assert "".join(response.response_gen) == reply_of("a")
    assert server.requests[-1]["messages"][0] == {"role": "system", "content": "Answer briefly."}


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_images_are_sent_as_content_parts_and_other_blocks_are_refused() -> None:
    by_url = ImageBlock(url="https://example.invalid/a.png", detail="low")
    blocks = [
        TextBlock(text="What is in"),
        by_url,
        TextBlock(text=" and in"),
        ImageBlock(image=PNG),
    ]
    with ScriptedChatServer([{"content": "A cat."}]) as engine:  # a vision model's stand-in
        llm = ContextPilotLLM(endpoints=[engine.base_url], model="m")
        answer = llm.chat([ChatMessage(role="user", blocks=blocks)])
        assert answer.message.content == "A cat."
        assert engine.requests[-1]["messages"] == [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.invalid/a.png", "detail": "low"},
                    },
                    {"type": "text", "text": " and in"},
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": "data:image/png;base64," + base64.b64encode(PNG).decode()
                        },
                    },
                ],
            }
        ]
        audio = AudioBlock(audio=b"RIFF0000WAVE", format="wav")
        message = ChatMessage(role="user", blocks=[TextBlock(text="What is this?"), audio])
        with pytest.raises(InvalidInputError, match=r"messages\[0\] holds a AudioBlock"):
            llm.chat([message])
        empty = ChatMessage(
            role="user", blocks=[TextBlock(text="And this?"), ImageBlock(image=b"")]
        )
        with pytest.raises(InvalidInputError, match=r"messages\[0\]: unreadable image"):
            llm.chat([empty])
        assert len(engine.requests) == 1  # both refused before any request
        llm.close()


def test_a_streaming_query_engine_streams_through_the_llm(
    llm: ContextPilotLLM, server: OpenAICompatibleServer
) -> None:
    nodes = [TextNode(text=f"Document {i} is about topic {i}.") for i in range(3)]
    index = VectorStoreIndex(nodes, embed_model=MockEmbedding(embed_dim=8))
    response = index.as_query_engine(llm=llm, streaming=True).query("Which topic?")
    assert [delta for delta in response.response_gen if delta] == WORDS
    sent = server.requests[-1]["messages"][-1]["content"]
    assert "is about topic" in sent and "Which topic?" in sent  # the retrieved context


def lookup(q: str) -> str:
    """Look ``q`` up in the knowledge base."""
    return q


def test_tool_calling_sends_the_tools_and_reads_back_the_engines_calls() -> None:
    tool = FunctionTool.from_defaults(fn=lookup)
    with ScriptedChatServer(TOOL_DELTAS, finish_reason="tool_calls") as engine:
        llm = ContextPilotLLM(endpoints=[engine.base_url], model="m")
        assert llm.metadata.is_function_calling_model
        response = llm.chat_with_tools([tool], user_msg="Find cats.", tool_required=True)
        sent = engine.requests[-1]
        assert sent["tools"][0]["function"]["name"] == "lookup"
        assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
        calls = llm.get_tool_calls_from_response(response)
        assert [(c.tool_id, c.tool_name, c.tool_kwargs) for c in calls] == [
            ("c1", "lookup", {"q": "cats"}),
            ("c2", "lookup", {}),  # arguments that are not JSON
        ]
        assert response.message.additional_kwargs["tool_calls"][0]["id"] == "c1"

        *_, last = llm.stream_chat_with_tools([tool], user_msg="Find cats.")
        assert llm.get_tool_calls_from_response(last) == calls

        # the tool's answer goes back with the call it answers
        answered = ChatMessage(
            role=MessageRole.TOOL, content="cats", additional_kwargs={"tool_call_id": "c1"}
        )
        llm.chat([ChatMessage(role="user", content="Find cats."), response.message, answered])
        messages = engine.requests[-1]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
        assert messages[1]["content"] is None
        assert messages[1]["tool_calls"][0]["function"] == {
            "name": "lookup",
            "arguments": '{"q": "cats"}',
        }
        assert messages[2] == {"role": "tool", "content": "cats", "tool_call_id": "c1"}
        sent_before = len(engine.requests)
        with pytest.raises(InvalidInputError, match="tool_call_id"):
            llm.chat([ChatMessage(role=MessageRole.TOOL, content="cats")])
        assert len(engine.requests) == sent_before  # refused before anything was sent
        plain = ChatResponse(message=ChatMessage(role="assistant", content="no tools"))
        with pytest.raises(ValueError, match="no tool call"):
            llm.get_tool_calls_from_response(plain)
        assert llm.get_tool_calls_from_response(plain, error_on_no_tool_call=False) == []
        llm.close()
