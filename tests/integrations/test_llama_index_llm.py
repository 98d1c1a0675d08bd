"""``ContextPilotLLM`` as LlamaIndex sees it: cumulative streamed responses, completion
and chat on chat and base models, metadata, and a chat engine on top, against real
loopback servers. What both framework models share (routing, streaming, configuration)
is in test_routed_models.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contextpilot_rag.errors import ConfigError, InvalidInputError, RoutingError
from contextpilot_rag.routing import Endpoint, RoutingClient, make_policy
from contextpilot_rag.testing import OpenAICompatibleServer, ScriptedChatServer

pytest.importorskip("llama_index.core")

from llama_index.core import VectorStoreIndex
from llama_index.core.base.llms.types import (
    AudioBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
)
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import ChatMessage, ChatResponse, CompletionResponse
from llama_index.core.prompts import PromptTemplate
from llama_index.core.schema import TextNode
from llama_index.core.tools import FunctionTool
from llama_index.llms.contextpilot import ContextPilotLLM
from llama_index.llms.contextpilot.base import MODEL_LIST_TIMEOUT_S
from routed_fleet import SERVER_NAMES, TOOL_DELTAS, question, reply_of

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


def test_a_history_from_openais_llms_is_sent_as_openai_expects() -> None:
    """LlamaIndex's OpenAI LLMs keep an assistant's tool calls in
    ``additional_kwargs["tool_calls"]`` only, and a reasoning parser's thoughts as a
    ``ThinkingBlock``: the calls are sent, the thoughts left out."""
    call = {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}
    history = [
        ChatMessage(role="user", content="Find cats."),
        ChatMessage(
            role="assistant",
            blocks=[ThinkingBlock(content="Use g."), TextBlock(text="")],
            additional_kwargs={"tool_calls": [call]},
        ),
        ChatMessage(
            role=MessageRole.TOOL, content="cats", additional_kwargs={"tool_call_id": "c2"}
        ),
    ]
    with ScriptedChatServer([{"content": "Found."}]) as engine:
        llm = ContextPilotLLM(endpoints=[engine.base_url], model="m")
        llm.chat(history)
        messages = engine.requests[-1]["messages"]
        assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [call]}
        assert "Use g." not in json.dumps(messages)
        broken = ChatMessage(role="assistant", additional_kwargs={"tool_calls": [{"id": "c3"}]})
        with pytest.raises(InvalidInputError, match="tool_calls"):
            llm.chat([history[0], broken])
        llm.close()


def lookup(q: str) -> str:
    """Look ``q`` up in the knowledge base."""
    return q


def test_tool_calling_sends_the_tools_and_reads_back_the_engines_calls() -> None:
    tool = FunctionTool.from_defaults(fn=lookup)
    with ScriptedChatServer(TOOL_DELTAS, finish_reason="tool_calls") as engine:
        llm = ContextPilotLLM(
            endpoints=[engine.base_url], model="m", is_function_calling_model=True
        )
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


# -- settings: serialization, credentials and time bounds, the engine's context ----------


class ListingServer:
    """A loopback engine that lists model ``m`` in ``GET /v1/models`` with the fields of
    ``listed`` (vLLM adds ``max_model_len``) after ``list_stall_s``, answers every chat
    request with ``"ok"`` after ``stall_s``, and records ``(method, path, Authorization
    header)`` of each request in ``seen``."""

    def __init__(
        self,
        listed: dict[str, Any] | None = None,
        *,
        stall_s: float = 0.0,
        list_stall_s: float = 0.0,
    ) -> None:
        self.listed = {"id": "m", "object": "model", **(listed or {})}
        self.stall_s = stall_s
        self.list_stall_s = list_stall_s
        self.seen: list[tuple[str, str, str | None]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def requests_to(self, method: str, path: str) -> list[str | None]:
        """The Authorization headers of the requests ``method path``."""
        return [auth for m, p, auth in self.seen if (m, p) == (method, path)]

    def __enter__(self) -> ListingServer:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.seen.append(("GET", self.path, self.headers.get("Authorization")))
                time.sleep(engine.list_stall_s)
                with contextlib.suppress(OSError):  # the client may have given up
                    self._send("application/json", json.dumps({"data": [engine.listed]}))

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                engine.seen.append(("POST", self.path, self.headers.get("Authorization")))
                time.sleep(engine.stall_s)
                chunks = [{"choices": [{"index": 0, "delta": {"content": "ok"}}]}]
                chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
                with contextlib.suppress(OSError):  # the client may have given up
                    self._send("text/event-stream", events + "data: [DONE]\n\n")

            def _send(self, content_type: str, body: str) -> None:
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads, self._server.block_on_close = True, False
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def closed_port_url() -> str:
    """A loopback base URL nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_to_json_and_back_is_the_same_llm_endpoints_included(
    fleet: list[OpenAICompatibleServer],
) -> None:
    endpoints: list[str | Endpoint] = [
        fleet[0].base_url,
        Endpoint(fleet[1].base_url, models=("m",), region="eu", api_key="own-key", rtt_s=0.01),
    ]
    llm = ContextPilotLLM(
        endpoints=endpoints,
        model="m",
        policy="least-load",
        api_key="sk-fleet",
        timeout=30.0,
        max_retries=1,
        max_tokens=64,
        temperature=0.2,
        additional_kwargs={"top_p": 0.9},
        context_window=8192,
        is_function_calling_model=True,
        system_prompt="Answer briefly.",
    )
    restored = ContextPilotLLM.from_json(llm.to_json())
    again = ContextPilotLLM.from_dict(llm.to_dict())
    assert restored.to_dict() == again.to_dict() == llm.to_dict()
    assert restored.endpoints == again.endpoints == endpoints
    assert (restored.api_key, restored.timeout, restored.max_retries) == ("sk-fleet", 30.0, 1)
    assert restored.metadata == llm.metadata
    assert restored.client is not llm.client and restored.client is not None
    assert restored.client.config.timeout_s == 30.0 and restored.client.config.max_attempts == 2
    assert restored.complete("Which?").text in {reply_of(name) for name in SERVER_NAMES}
    for model in (llm, restored, again):
        model.close()


def test_the_api_key_is_serialized_as_openailike_does_and_can_be_left_out(
    server: OpenAICompatibleServer,
) -> None:
    llm = ContextPilotLLM(endpoints=[server.base_url], model="m", api_key="sk-secret")
    assert llm.to_dict()["api_key"] == "sk-secret"  # as OpenAILike.to_dict() writes it
    assert "sk-secret" not in repr(llm)
    if hasattr(llm, "to_payload"):  # LlamaIndex's observability payload (newer cores only)
        assert "sk-secret" not in json.dumps(llm.to_payload())
    data = llm.to_dict(exclude={"api_key"})
    assert "api_key" not in data
    assert ContextPilotLLM.from_dict(data, api_key="sk-secret").to_dict() == llm.to_dict()
    llm.close()


def test_an_llm_over_a_given_client_round_trips_with_that_client(
    server: OpenAICompatibleServer,
) -> None:
    client = RoutingClient([server.base_url], model="m", timeout_s=30.0, max_attempts=2)
    llm = ContextPilotLLM(client=client, max_tokens=8)
    assert (llm.timeout, llm.max_retries) == (30.0, 1)  # the client's
    restored = ContextPilotLLM.from_dict(llm.to_dict(), client=client)
    assert restored.to_dict() == llm.to_dict() and restored.client is client
    with pytest.raises(ConfigError, match="api_key"):
        ContextPilotLLM(client=client, api_key="sk")
    with pytest.raises(ConfigError, match="timeout"):
        ContextPilotLLM(client=client, timeout=5.0)
    client.close()


def test_a_policy_object_is_given_back_to_from_dict(server: OpenAICompatibleServer) -> None:
    policy = make_policy("least-load")
    llm = ContextPilotLLM(endpoints=[server.base_url], model="m", policy=policy)
    data = llm.to_dict()
    assert data["policy"] is None  # a policy object does not serialize
    with pytest.raises(ConfigError, match="pass policy="):
        ContextPilotLLM.from_dict(data)
    restored = ContextPilotLLM.from_dict(data, policy=policy)
    assert restored.client is not None and restored.client.policy is policy
    llm.close()
    restored.close()


def test_api_key_goes_to_every_request_as_a_bearer_token() -> None:
    with ListingServer() as by_url, ListingServer() as keyed:
        own = Endpoint(keyed.base_url, api_key="own-key")
        llm = ContextPilotLLM(endpoints=[by_url.base_url, own], model="m", api_key="sk-fleet")
        assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW  # no length listed
        for _ in range(4):
            llm.complete("Which?")
        assert set(by_url.requests_to("GET", "/v1/models")) == {"Bearer sk-fleet"}
        assert set(keyed.requests_to("GET", "/v1/models")) == {"Bearer own-key"}
        sent = by_url.requests_to("POST", "/v1/chat/completions")
        sent_keyed = keyed.requests_to("POST", "/v1/chat/completions")
        assert set(sent) <= {"Bearer sk-fleet"} and set(sent_keyed) <= {"Bearer own-key"}
        assert len(sent) + len(sent_keyed) == 4
        llm.close()


@pytest.mark.parametrize("max_retries", [0, 1])
def test_timeout_cuts_a_stalled_attempt_and_max_retries_bounds_the_retries(
    max_retries: int,
) -> None:
    with ListingServer(stall_s=2.0) as first, ListingServer(stall_s=2.0) as second:
        llm = ContextPilotLLM(
            endpoints=[first.base_url, second.base_url],
            model="m",
            timeout=0.2,
            max_retries=max_retries,
            context_window=4096,
        )
        started = time.monotonic()
        with pytest.raises(RoutingError):
            llm.complete("Which?")
        assert time.monotonic() - started < 1.5  # no stall was waited out
        posts = [*first.requests_to("POST", "/v1/chat/completions")]
        posts += second.requests_to("POST", "/v1/chat/completions")
        assert len(posts) == max_retries + 1
        llm.close()


def test_context_window_is_the_smallest_max_model_len_the_endpoints_report() -> None:
    with (
        ListingServer({"max_model_len": 32768}) as large,
        ListingServer({"max_model_len": 8192}) as small,
    ):
        llm = ContextPilotLLM(endpoints=[large.base_url, small.base_url], model="m")
        assert llm.context_window is None
        assert llm.metadata.context_window == 8192
        llm.complete("Which?")
        assert llm.metadata.context_window == 8192
        assert len(large.requests_to("GET", "/v1/models")) == 1  # read once, then cached
        assert len(small.requests_to("GET", "/v1/models")) == 1
        llm.close()


def test_the_endpoints_are_asked_at_once_so_hung_ones_hold_the_loop_one_deadline() -> None:
    """LlamaIndex reads ``metadata`` inside ``apredict``, on the event loop: the model
    lists are read there, so four hung endpoints must cost one deadline, not four."""
    with contextlib.ExitStack() as stack:
        hung = [
            stack.enter_context(ListingServer({"max_model_len": 4096}, list_stall_s=10.0))
            for _ in range(4)
        ]
        answering = stack.enter_context(ListingServer({"max_model_len": 8192}))
        endpoints = [answering.base_url, *(server.base_url for server in hung)]
        llm = ContextPilotLLM(endpoints=endpoints, model="m", timeout=0.5, max_retries=0)

        async def scenario() -> tuple[str, float]:
            gaps: list[float] = []

            async def tick() -> None:
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            await asyncio.sleep(0.05)
            answer = await llm.apredict(PromptTemplate("Which {thing}?"), thing="one")
            ticker.cancel()
            return answer, max(gaps)

        answer, longest_stall_s = asyncio.run(scenario())
        assert answer == "ok"
        assert longest_stall_s < 1.5  # one after another: 4 x 0.5 s
        assert llm.metadata.context_window == 8192  # the hung ones count for nothing
        llm.close()


def test_a_context_window_set_by_the_user_wins_and_reads_nothing() -> None:
    with ListingServer({"max_model_len": 32768}) as engine:
        llm = ContextPilotLLM(endpoints=[engine.base_url], model="m", context_window=2048)
        assert llm.metadata.context_window == 2048
        assert engine.requests_to("GET", "/v1/models") == []
        llm.close()


def test_without_max_model_len_the_context_window_is_the_default(
    server: OpenAICompatibleServer,
) -> None:
    llm = ContextPilotLLM(endpoints=[server.base_url], model="m")
    assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW
    llm.close()


def test_an_endpoint_down_never_fails_construction_and_gives_the_default() -> None:
    llm = ContextPilotLLM(endpoints=[closed_port_url()], model="m")
    started = time.monotonic()
    assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW
    assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW  # not read again
    assert time.monotonic() - started < MODEL_LIST_TIMEOUT_S + 1
    llm.close()


def test_is_function_calling_model_only_when_set(server: OpenAICompatibleServer) -> None:
    plain = ContextPilotLLM(endpoints=[server.base_url], model="m")
    tools = ContextPilotLLM(endpoints=[server.base_url], model="m", is_function_calling_model=True)
    assert not plain.metadata.is_function_calling_model
    assert tools.metadata.is_function_calling_model
    with pytest.raises(ConfigError, match="is_chat_model"):
        ContextPilotLLM(
            endpoints=[server.base_url],
            model="m",
            is_chat_model=False,
            is_function_calling_model=True,
        )
    plain.close()
    tools.close()
