"""The OpenAI-compatible test server, driven by real clients over loopback: the openai
SDK, httpx, LangChain's ChatOpenAI and LlamaIndex's OpenAILike."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from contextpilot_rag import ConfigError, ContextBlock, Tokenizer, render_block
from contextpilot_rag.sim.replay import EngineTokenizer
from contextpilot_rag.testing import (
    OWNED_BY,
    OpenAICompatibleServer,
    ScriptedChatServer,
    default_reply,
)

SYSTEM = "You answer questions using only the context documents given. " * 4
DOCS = [
    ContextBlock(f"Document {n}: the river {n} flows north through town {n}.") for n in range(3)
]


def user_turn(question: str, blocks: list[ContextBlock] = DOCS) -> str:
    return "".join(render_block(block) for block in blocks) + question


def chat(question: str = "Where does river 1 flow?") -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_turn(question)}]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One httpx client for the module: building one per request costs ~0.1 s (TLS setup)."""
    with httpx.Client() as shared:
        yield shared


def sdk_client(server: OpenAICompatibleServer, http: httpx.Client) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0, http_client=http)


@pytest.fixture
def server(tokenizer: Tokenizer) -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(tokenizer=tokenizer) as running:
        yield running


@pytest.fixture
def client(server: OpenAICompatibleServer, http: httpx.Client) -> openai.OpenAI:
    return sdk_client(server, http)


def cached_tokens(usage: Any) -> int:
    return int(usage.prompt_tokens_details.cached_tokens)


def test_models_and_health(
    server: OpenAICompatibleServer, client: openai.OpenAI, http: httpx.Client
) -> None:
    models = client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [
        ("test-model", "model", OWNED_BY)
    ]
    assert isinstance(models.data[0].created, int)  # required by OpenAI's Model schema
    health = http.get(server.base_url.removesuffix("/v1") + "/health")
    assert health.status_code == 200


def test_chat_completion_counts_context_blocks_and_tokens_like_the_engine(
    server: OpenAICompatibleServer, client: openai.OpenAI, tokenizer: Tokenizer
) -> None:
    messages = chat()
    response = client.chat.completions.create(model="test-model", messages=messages)
    assert response.object == "chat.completion"
    assert response.model == "test-model"
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Answer from 3 context documents."
    assert choice.finish_reason == "stop"
    usage = response.usage
    assert usage is not None
    assert usage.prompt_tokens == len(EngineTokenizer(tokenizer)(messages))
    assert usage.completion_tokens == tokenizer.count("Answer from 3 context documents.")
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert cached_tokens(usage) == 0
    assert server.requests == [{"model": "test-model", "messages": messages}]


def test_reply_function_gets_the_messages(tokenizer: Tokenizer, http: httpx.Client) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return f"echo: {messages[-1]['content']}"

    with (
        OpenAICompatibleServer(reply=reply, tokenizer=tokenizer, model="m") as server,
    ):
        client = sdk_client(server, http)
        response = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "ping"}]
        )
    assert response.choices[0].message.content == "echo: ping"
    assert seen == [[{"role": "user", "content": "ping"}]]


def test_streamed_chat_reassembles_and_ends_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="test-model",
        messages=chat(),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Answer from 3 context documents."
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 5
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert len({chunk.id for chunk in chunks}) == 1


def test_stream_wire_format_is_sse_ending_with_done(
    server: OpenAICompatibleServer, http: httpx.Client
) -> None:
    body = {"model": "test-model", "messages": chat(), "stream": True}
    with http.stream("POST", f"{server.base_url}/chat/completions", json=body) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    assert all("usage" not in payload for payload in payloads)  # no include_usage
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"


def test_text_completions_plain_and_streamed(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    prompt = user_turn("Question: where does river 2 flow?\nAnswer:")
    response = client.completions.create(model="base", prompt=prompt)
    assert response.object == "text_completion"
    assert response.model == "base"
    assert response.choices[0].text == "Answer from 3 context documents."
    assert response.usage is not None
    assert response.usage.prompt_tokens == tokenizer.count(prompt)

    stream = client.completions.create(
        model="base", prompt=[prompt], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == response.choices[0].text
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert cached_tokens(chunks[-1].usage) > 0  # the same prompt again


def test_repeated_prompt_is_served_from_cache_and_another_is_not(
    server: OpenAICompatibleServer, client: openai.OpenAI
) -> None:
    def ask(messages: list[Any]) -> Any:
        return client.chat.completions.create(model="test-model", messages=messages).usage

    first, second = ask(chat()), ask(chat())
    assert cached_tokens(first) == 0
    assert 0 < cached_tokens(second) < second.prompt_tokens
    assert cached_tokens(second) % server.cache.block_size == 0
    assert cached_tokens(second) > second.prompt_tokens - server.cache.block_size - 1
    other: list[Any] = [
        {"role": "user", "content": "A different opening sentence. " + user_turn("Q?")}
    ]
    assert cached_tokens(ask(other)) == 0
    assert server.cache.cached_tokens_total == cached_tokens(second)


def test_extended_conversation_reuses_its_prefix(client: openai.OpenAI) -> None:
    first_turn = chat()
    client.chat.completions.create(model="test-model", messages=first_turn)
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": "Answer from 3 context documents."},
        {"role": "user", "content": "And river 2?"},
    ]
    usage = client.chat.completions.create(model="test-model", messages=second_turn).usage
    assert usage is not None
    first_prompt = client.chat.completions.create(model="test-model", messages=first_turn).usage
    assert first_prompt is not None
    assert cached_tokens(usage) >= first_prompt.prompt_tokens - 16


def test_cache_capacity_bounds_what_is_served(tokenizer: Tokenizer, http: httpx.Client) -> None:
    with (
        OpenAICompatibleServer(tokenizer=tokenizer, cache_capacity_tokens=32) as server,
    ):
        client = sdk_client(server, http)
        for _ in range(3):
            usage = client.chat.completions.create(model="test-model", messages=chat()).usage
            assert usage is not None
            assert cached_tokens(usage) <= 32
            assert server.cache.used_tokens <= 32
        assert cached_tokens(usage) == 32  # the head of the prompt stays cached


def test_text_parts_tokenize_like_a_string(client: openai.OpenAI) -> None:
    plain: list[Any] = [{"role": "user", "content": user_turn("Q?")}]
    parts: list[Any] = [{"role": "user", "content": [{"type": "text", "text": user_turn("Q?")}]}]
    as_plain = client.chat.completions.create(model="test-model", messages=plain)
    as_parts = client.chat.completions.create(model="test-model", messages=parts)
    assert as_parts.choices[0].message.content == "Answer from 3 context documents."
    assert as_plain.usage is not None and as_parts.usage is not None
    assert as_parts.usage.prompt_tokens == as_plain.usage.prompt_tokens
    assert cached_tokens(as_parts.usage) > 0


def test_max_tokens_cuts_the_reply_at_a_word(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="test-model", messages=chat(), max_tokens=2)
    assert response.choices[0].message.content == "Answer from"
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens <= 2


def test_a_first_word_longer_than_max_tokens_still_gives_a_token(
    tokenizer: Tokenizer, http: httpx.Client
) -> None:
    """An engine decodes at least one token: the head of the word, not nothing."""
    with OpenAICompatibleServer(
        tokenizer=tokenizer, reply=lambda m: "Supercalifragilistic!"
    ) as server:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        answer = http.post(server.base_url + "/chat/completions", json=body).json()
    text = answer["choices"][0]["message"]["content"]
    assert text and "Supercalifragilistic!".startswith(text)
    assert answer["usage"]["completion_tokens"] == tokenizer.count(text) == 1
    assert answer["choices"][0]["finish_reason"] == "length"


def test_token_delay_paces_the_stream(tokenizer: Tokenizer, http: httpx.Client) -> None:
    with (
        OpenAICompatibleServer(tokenizer=tokenizer, token_delay_s=0.02) as server,
    ):
        client = sdk_client(server, http)
        started = time.perf_counter()
        stream = client.chat.completions.create(model="test-model", messages=chat(), stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert time.perf_counter() - started >= 5 * 0.02  # five words


def test_concurrent_requests_all_succeed(
    server: OpenAICompatibleServer, client: openai.OpenAI
) -> None:
    def ask(number: int) -> str | None:
        messages: list[Any] = [
            {"role": "user", "content": user_turn(f"Question {number}?", DOCS[:2])}
        ]
        stream = number % 2 == 1
        if stream:
            chunks = client.chat.completions.create(
                model="test-model",
                messages=messages,
                stream=True,
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        response = client.chat.completions.create(model="test-model", messages=messages)
        return response.choices[0].message.content

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, range(40)))
    assert answers == ["Answer from 2 context documents."] * 40
    recorded = server.requests
    assert len(recorded) == 40
    assert sorted(r["messages"][0]["content"] for r in recorded) == sorted(
        user_turn(f"Question {n}?", DOCS[:2]) for n in range(40)
    )
    assert server.cache.prompt_tokens_total > 0


@pytest.mark.parametrize(
    ("path", "body", "message_part"),
    [
        ("/chat/completions", b"{not json", "not valid JSON"),
        ("/chat/completions", b"[1, 2]", "JSON object"),
        ("/chat/completions", b'{"model": "test-model"}', "'messages'"),
        ("/chat/completions", b'{"messages": []}', "'messages'"),
        ("/chat/completions", b'{"messages": ["hi"]}', "messages[0]"),
        ("/chat/completions", b'{"messages": [{"role": "user", "content": 3}]}', "content"),
        (
            "/chat/completions",
            b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            "text parts",
        ),
        ("/chat/completions", b'{"messages": [{"role": "user"}], "stream": "yes"}', "'stream'"),
        ("/chat/completions", b'{"messages": [{"role": "user"}], "max_tokens": 0}', "max_tokens"),
        ("/completions", b'{"model": "base"}', "'prompt'"),
        ("/completions", b'{"prompt": ["a", "b"]}', "'prompt'"),
        ("/completions", b'{"prompt": "a", "stream_options": 1}', "stream_options"),
        ("/completions", b'{"prompt": ""}', "'prompt'"),
        (
            "/completions",
            b'{"prompt": "a", "stream_options": {"include_usage": true}}',
            "only allowed when 'stream' is true",
        ),
        ("/chat/completions", b'{"messages": [{"role": "user"}], "n": 2}', "n=1"),
    ],
)
def test_bad_requests_get_an_openai_style_400(
    server: OpenAICompatibleServer, path: str, body: bytes, message_part: str, http: httpx.Client
) -> None:
    response = http.post(
        server.base_url + path, content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert message_part in error["message"]
    assert server.requests == []


def test_the_sdk_raises_bad_request_for_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="test-model", messages=[])


def test_unknown_paths_are_404_and_wrong_methods_405(
    server: OpenAICompatibleServer, http: httpx.Client
) -> None:
    missing = http.post(server.base_url + "/embeddings", json={"input": "x"})
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "invalid_request_error"
    assert http.get(server.base_url + "/nothing").status_code == 404
    assert http.get(server.base_url + "/chat/completions").status_code == 405
    wrong = http.put(server.base_url + "/chat/completions", json={"messages": []})
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


def test_a_failing_reply_function_is_a_500_and_the_server_survives(
    tokenizer: Tokenizer, http: httpx.Client
) -> None:
    calls: list[int] = []

    def reply(messages: list[dict[str, Any]]) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("boom")
        return "fine"

    with OpenAICompatibleServer(reply=reply, tokenizer=tokenizer) as server:
        url = server.base_url + "/chat/completions"
        body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
        failed = http.post(url, json=body)
        assert failed.status_code == 500
        assert failed.json()["error"]["type"] == "server_error"
        assert http.post(url, json=body).json()["choices"][0]["message"]["content"] == "fine"
        assert len(server.requests) == 1


def test_garbage_on_the_socket_does_not_stop_the_server(
    server: OpenAICompatibleServer, http: httpx.Client
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"\x00\x01 not http at all\r\n\r\n")
        reply = raw.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 400")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "invalid_request_error"
    assert http.request("DELETE", server.base_url + "/models").status_code == 405
    assert http.request("BREW", server.base_url + "/models").status_code == 501
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        raw.shutdown(socket.SHUT_WR)  # the body ends short of its length
        assert raw.makefile("rb").read().startswith(b"HTTP/1.1 400")
    assert http.get(server.base_url + "/models").status_code == 200


def test_reset_clears_requests_and_cache(
    server: OpenAICompatibleServer, client: openai.OpenAI
) -> None:
    client.chat.completions.create(model="test-model", messages=chat())
    server.reset()
    assert server.requests == []
    assert server.cache.used_tokens == 0
    usage = client.chat.completions.create(model="test-model", messages=chat()).usage
    assert usage is not None and cached_tokens(usage) == 0


def test_start_and_stop_twice(tokenizer: Tokenizer, http: httpx.Client) -> None:
    server = OpenAICompatibleServer(tokenizer=tokenizer)
    with pytest.raises(RuntimeError):
        _ = server.base_url
    for _ in range(2):
        assert server.start() is server
        assert server.start() is server  # already running: no-op
        assert http.get(server.base_url + "/models").status_code == 200
        url = server.base_url
        server.stop()
        server.stop()
        assert not server.running
        with pytest.raises(httpx.ConnectError):
            http.get(url + "/models")


def test_stop_closes_idle_keep_alive_connections(tokenizer: Tokenizer, http: httpx.Client) -> None:
    server = OpenAICompatibleServer(tokenizer=tokenizer).start()
    assert http.get(server.base_url + "/models").status_code == 200  # stays open in the pool
    before = threading.active_count()
    started = time.perf_counter()
    server.stop()
    assert time.perf_counter() - started < 2
    deadline = time.monotonic() + 2
    while threading.active_count() >= before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() < before


def test_context_manager_frees_the_port(tokenizer: Tokenizer, http: httpx.Client) -> None:
    with OpenAICompatibleServer(tokenizer=tokenizer) as first:
        port = first.port
        assert http.post(first.base_url + "/completions", json={"prompt": "hello"}).is_success
    with OpenAICompatibleServer(tokenizer=tokenizer, port=port) as second:
        assert second.base_url == f"http://127.0.0.1:{port}/v1"
        assert http.get(second.base_url + "/models").status_code == 200


@pytest.mark.parametrize(
    "options",
    [
        {"model": ""},
        {"port": -1},
        {"port": 70000},
        {"block_size": 0},
        {"cache_capacity_tokens": -16},
        {"token_delay_s": -0.1},
        {"reply": "not callable"},
        {"tokenizer": object()},
    ],
)
def test_invalid_configuration_is_rejected(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        OpenAICompatibleServer(**options)


def test_default_reply_counts_block_headers_in_the_last_user_message() -> None:
    assert default_reply(chat()) == "Answer from 3 context documents."
    history = [
        {"role": "user", "content": user_turn("Q1?")},
        {"role": "assistant", "content": "[not-a-header] x"},
        {"role": "user", "content": "No documents, and [inline] labels do not count."},
    ]
    assert default_reply(history) == "Answer from 0 context documents."
    assert default_reply([]) == "Answer from 0 context documents."


def test_langchain_chat_openai_invokes_and_streams(server: OpenAICompatibleServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=server.base_url, api_key="test", model="test-model", max_retries=0
    )
    message = llm.invoke("hi")
    assert message.content == "Answer from 0 context documents."
    assert message.usage_metadata["input_tokens"] > 0
    streamed = "".join(str(chunk.content) for chunk in llm.stream("hi"))
    assert streamed == "Answer from 0 context documents."
    assert [r["messages"] for r in server.requests] == [[{"role": "user", "content": "hi"}]] * 2


def test_llama_index_openai_like_chats_and_streams(server: OpenAICompatibleServer) -> None:
    openai_like = pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage

    llm = openai_like.OpenAILike(
        api_base=server.base_url, api_key="test", model="test-model", is_chat_model=True
    )
    context = user_turn("Where does river 0 flow?")
    response = llm.chat([ChatMessage(role="user", content=context)])
    assert response.message.content == "Answer from 3 context documents."
    deltas = [r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content="hi")])]
    assert "".join(deltas) == "Answer from 0 context documents."
    assert len(server.requests) == 2


def test_disconnect_next_rejects_a_bad_count_and_keeps_answering() -> None:
    with OpenAICompatibleServer() as server:
        for bad in (-1, 1.5, True):
            with pytest.raises(ConfigError, match="count"):
                server.disconnect_next(bad)  # type: ignore[arg-type]
        reply = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply.status_code == 200  # nothing was scheduled to be dropped
        server.disconnect_next(1)
        assert httpx.post(f"{server.base_url}/embeddings", json={}).status_code == 404
        with pytest.raises(httpx.RemoteProtocolError):  # the completion is the one dropped
            httpx.post(f"{server.base_url}/chat/completions", json={"messages": []})


def test_the_scripted_server_answers_a_body_that_is_no_json_with_a_400() -> None:
    with ScriptedChatServer([{"content": "ok"}]) as server:
        url = server.base_url + "/chat/completions"
        refused = httpx.post(url, content=b"{not json")
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert httpx.post(url, json={"messages": []}).status_code == 200
        assert server.requests == [{"messages": []}]
