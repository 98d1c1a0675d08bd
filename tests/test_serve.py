"""``contextpilot-rag serve``: the OpenAI-compatible proxy, served by a real uvicorn on a
free loopback port in front of two loopback engines with a simulated prefix cache,
driven by the official ``openai`` SDK (``extra_body``) and by raw HTTP."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import os
import runpy
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from contextpilot_rag import PilotConfig
from contextpilot_rag.cli import _parser, main
from contextpilot_rag.errors import (
    ConfigError,
    ContextPilotError,
    ConversationConflictError,
    InvalidRouteRequestError,
    StoreUnavailableError,
    UnknownConversationError,
)
from contextpilot_rag.routing.client import RoutingClient
from contextpilot_rag.serve import API_KEY_ENV, BackgroundServer, ServeConfig
from contextpilot_rag.serve.api_errors import ApiError, pilot_error_of, routing_error_of
from contextpilot_rag.serve.cli import config_from_args
from contextpilot_rag.serve.request_body import MAX_NESTING, parse_json, parse_request
from contextpilot_rag.testing import OpenAICompatibleServer, ScriptedChatServer

MODEL = "test-model"
PARIS = ("Paris is the capital of France and sits on the Seine. " * 12).strip()
BERLIN = ("Berlin is the capital of Germany and sits on the Spree. " * 12).strip()
ROME = ("Rome is the capital of Italy and sits on the Tiber. " * 12).strip()
DOCUMENTS = [{"id": "paris", "text": PARIS, "score": 0.9}, {"id": "berlin", "text": BERLIN}]
KEY = "s3cret-test-key"


@pytest.fixture
def engines() -> Iterator[list[OpenAICompatibleServer]]:
    with ExitStack() as stack:
        yield [stack.enter_context(OpenAICompatibleServer(model=MODEL)) for _ in range(2)]


def start_proxy(urls: list[str], **options: Any) -> BackgroundServer:
    config = ServeConfig(endpoints=tuple(urls), model=MODEL, policy="round-robin", **options)
    return BackgroundServer(config).start()


@pytest.fixture
def proxy(engines: list[OpenAICompatibleServer]) -> Iterator[BackgroundServer]:
    server = start_proxy([engine.base_url for engine in engines])
    yield server
    server.stop()


@pytest.fixture
def sdk(proxy: BackgroundServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)
    yield client
    client.close()


def received(engines: list[OpenAICompatibleServer]) -> list[dict[str, Any]]:
    return [body for engine in engines for body in engine.requests]


def root(proxy: BackgroundServer) -> str:
    return proxy.base_url.removesuffix("/v1")


def pilot_field(**fields: Any) -> dict[str, Any]:
    return {"contextpilot": {"documents": DOCUMENTS, **fields}}


def ask(sdk: openai.OpenAI, question: str, **fields: Any) -> Any:
    return sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        extra_body=pilot_field(**fields),
    )


# -- requests without the field ------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_without_the_field_reaches_the_engine_untouched(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer], stream: bool
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello there"}]},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    params = {"temperature": 0.2, "max_tokens": 50, "stop": ["\n\n"], "user": "u1", "seed": 7}
    response = sdk.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=stream,
        **params,  # type: ignore[call-overload]
    )
    if stream:
        text = "".join(chunk.choices[0].delta.content or "" for chunk in response if chunk.choices)
    else:
        text = response.choices[0].message.content
        assert response.usage.prompt_tokens > 0
        assert "contextpilot" not in (response.model_extra or {})
    assert text == "Answer from 0 context documents."
    (body,) = received(engines)
    assert body["messages"] == messages
    assert {key: body[key] for key in params} == params
    assert body["model"] == MODEL and "contextpilot" not in body


def test_a_completion_without_the_field_sends_the_prompt_as_given(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    response = sdk.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
    assert response.choices[0].text and response.usage is not None
    (body,) = received(engines)
    assert body["prompt"] == "Once upon a time" and body["max_tokens"] == 3


# -- requests with the field ---------------------------------------------------------


def test_documents_in_extra_body_become_the_prompt_the_engine_sees(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    response = ask(sdk, "Where is Paris?")
    assert response.choices[0].message.content == "Answer from 2 context documents."
    (body,) = received(engines)
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    assert PARIS in user["content"] and BERLIN in user["content"]
    assert user["content"].endswith("Question: Where is Paris?")
    extension = response.model_extra["contextpilot"]
    assert extension["request_id"] and extension["blocks_total"] == 2
    assert extension["blocks_sent"] == 2 and extension["blocks_deduplicated"] == 0
    assert set(extension["labels"]) == {"paris", "berlin"}
    assert response.usage.prompt_tokens > 0
    assert response.usage.prompt_tokens_details.cached_tokens == 0


def test_a_repeated_prefix_is_reported_cached_by_the_engine(sdk: openai.OpenAI) -> None:
    ask(sdk, "Where is Paris?")
    ask(sdk, "Where is Paris?")  # round-robin: the other engine
    third = ask(sdk, "Where is Berlin?")
    assert third.usage.prompt_tokens_details.cached_tokens > 0


def test_the_clients_system_message_is_kept(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    sdk.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Where is Paris?"},
        ],
        extra_body=pilot_field(),
    )
    (body,) = received(engines)
    assert body["messages"][0] == {"role": "system", "content": "Answer in French."}


def test_a_stream_with_documents_carries_the_extension_first_and_the_usage_last(
    sdk: openai.OpenAI, proxy: BackgroundServer
) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Where is Paris?"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body=pilot_field(conversation_id="s1"),
        )
    )
    assert chunks[0].model_extra["contextpilot"]["conversation_id"] == "s1"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Answer from 2 context documents."
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    (turn,) = proxy.proxy.pilot.conversation("s1").turns
    assert turn.answer == text  # recorded before the stream ended


def test_the_second_turn_sends_a_location_note_instead_of_the_repeated_document(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    first = ask(sdk, "Where is Paris?", conversation_id="c1")
    second = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "And Rome?"}],
        stream=True,
        extra_body={
            "contextpilot": {
                "documents": [{"id": "rome", "text": ROME}, {"id": "paris", "text": PARIS}],
                "conversation_id": "c1",
            }
        },
    )
    chunks = list(second)
    extension = chunks[0].model_extra["contextpilot"]
    assert extension["blocks_deduplicated"] == 1 and extension["blocks_sent"] == 1
    last = received(engines)[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user"]
    assert last[2]["content"] == first.choices[0].message.content
    question = last[-1]["content"]
    assert PARIS not in question and ROME in question
    assert "earlier turns: paris" in question  # the location note


def test_tenants_never_share_a_conversation(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    ask(sdk, "Where is Paris?", conversation_id="1", tenant="acme")
    response = ask(sdk, "Where is Paris?", conversation_id="1", tenant="globex")
    assert response.model_extra["contextpilot"]["blocks_deduplicated"] == 0
    assert len(received(engines)[-1]["messages"]) == 2  # no history of acme's turn


def test_max_history_turns_bounds_the_turns_sent_and_stored(
    engines: list[OpenAICompatibleServer],
) -> None:
    server = start_proxy([engine.base_url for engine in engines], max_history_turns=2)
    sdk = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0)
    try:
        for turn in range(6):
            ask(sdk, f"Question {turn}?", conversation_id="long")
        last = received(engines)[-1]["messages"]
        assert [m["role"] for m in last] == ["system", *["user", "assistant"] * 2, "user"]
        assert "Question 3?" in last[1]["content"] and "Question 4?" in last[3]["content"]
        stored = server.proxy.pilot.conversation("long")
        assert len(stored.turns) == 2 and stored.dropped_turns == 4
    finally:
        sdk.close()
        server.stop()


def test_system_into_user_sends_the_system_prompt_in_the_first_user_message(
    engines: list[OpenAICompatibleServer],
) -> None:
    server = start_proxy([engine.base_url for engine in engines], system_into_user=True)
    sdk = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0)
    try:
        for turn in range(2):
            ask(sdk, f"Question {turn}?", conversation_id="folded")
        first, second = (request["messages"] for request in received(engines)[-2:])
        assert [m["role"] for m in second] == ["user", "assistant", "user"]
        assert second[0] == first[0]  # the turn the engine cached, byte for byte
        system = PilotConfig().system_prompt
        assert system is not None and second[0]["content"].startswith(system + "\n\n")
    finally:
        sdk.close()
        server.stop()


def test_a_conversation_turn_without_documents_carries_the_history(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    """A retrieval with no hit in a conversation: the engine gets the history and the
    question, and the turn is the next one's history (without a conversation, an empty
    list stays a 400: see BAD_FIELDS)."""
    ask(sdk, "Where is Paris?", conversation_id="empty-turn")
    sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Thanks! And Rome?"}],
        extra_body={"contextpilot": {"documents": [], "conversation_id": "empty-turn"}},
    )
    sent = received(engines)[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[-1]["content"].endswith("Question: Thanks! And Rome?")
    ask(sdk, "And Berlin?", conversation_id="empty-turn")
    assert received(engines)[-1]["messages"][3]["content"] == sent[-1]["content"]


def test_a_completion_with_documents_sends_the_prompt_text(
    sdk: openai.OpenAI, engines: list[OpenAICompatibleServer]
) -> None:
    response = sdk.completions.create(
        model=MODEL, prompt="Where is Paris?", extra_body=pilot_field(system="Be brief.")
    )
    assert response.model_extra["contextpilot"]["blocks_sent"] == 2
    (body,) = received(engines)
    assert body["prompt"].startswith("Be brief.") and PARIS in body["prompt"]
    assert body["prompt"].endswith("Question: Where is Paris?")


def test_tool_calls_pass_through_streamed_and_whole() -> None:
    call = {"index": 0, "id": "call_1", "type": "function"}
    deltas = [
        {"role": "assistant", "tool_calls": [{**call, "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]},
    ]
    with ScriptedChatServer(deltas, finish_reason="tool_calls") as engine:
        server = start_proxy([engine.base_url])
        try:
            sdk = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0)
            tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
            whole = sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], tools=tools
            )
            (tool_call,) = whole.choices[0].message.tool_calls
            assert tool_call.function.arguments == '{"x": 1}'
            assert whole.choices[0].finish_reason == "tool_calls"
            streamed = sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], tools=tools, stream=True
            )
            fragments = [c.choices[0].delta.tool_calls for c in streamed if c.choices]
            assert any(f and f[0].function.name == "f" for f in fragments)
            assert engine.requests[0]["tools"] == tools
        finally:
            server.stop()


# -- malformed requests --------------------------------------------------------------


BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"contextpilot": {}}, "contextpilot.documents"),
    ({"contextpilot": []}, "contextpilot"),
    ({"contextpilot": {"documents": []}}, "contextpilot.documents"),
    ({"contextpilot": {"documents": [{"id": "a"}]}}, "contextpilot.documents[0].text"),
    ({"contextpilot": {"documents": ["  "]}}, "contextpilot.documents[0].text"),
    ({"contextpilot": {"documents": [3]}}, "contextpilot.documents[0]"),
    ({"contextpilot": {"documents": [{"text": "t", "url": "x"}]}}, "contextpilot.documents[0]"),
    (
        {"contextpilot": {"documents": [{"text": "t", "score": "high"}]}},
        "contextpilot.documents[0].score",
    ),
    (
        {"contextpilot": {"documents": [{"text": "t", "metadata": []}]}},
        "contextpilot.documents[0].metadata",
    ),
    ({"contextpilot": {"documents": ["t"], "conversation": "c"}}, "contextpilot"),
    ({"contextpilot": {"documents": ["t"], "conversation_id": 7}}, "contextpilot.conversation_id"),
    ({"contextpilot": {"documents": ["t"], "tenant": ""}}, "contextpilot.tenant"),
    ({"contextpilot": {"documents": ["t"], "system": 1}}, "contextpilot.system"),
    (
        {"contextpilot": {"documents": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}},
        "contextpilot",
    ),
]


def post(proxy: BackgroundServer, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(f"{proxy.base_url}{path}", json=body, headers=headers, timeout=30)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Where?"}], **extra}


@pytest.mark.parametrize(("extra", "param"), BAD_FIELDS)
def test_a_malformed_field_is_a_400_naming_it_and_changes_nothing(
    proxy: BackgroundServer,
    engines: list[OpenAICompatibleServer],
    extra: dict[str, Any],
    param: str,
) -> None:
    pilot = proxy.proxy.pilot
    before = pilot.index_stats()
    response = post(proxy, "/chat/completions", chat_body(**extra, stream=True))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["code"] == "invalid_contextpilot_field"
    assert received(engines) == []
    assert pilot.index_stats() == before


def test_earlier_turns_need_a_conversation_id(
    proxy: BackgroundServer, engines: list[OpenAICompatibleServer]
) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Where?"},
    ]
    body = {"model": MODEL, "messages": messages, **pilot_field()}
    response = post(proxy, "/chat/completions", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    body["contextpilot"]["conversation_id"] = "c"  # type: ignore[index]
    assert post(proxy, "/chat/completions", body).status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            chat_body(
                **pilot_field(system="S"),
                messages=[{"role": "system", "content": "T"}, {"role": "user", "content": "q"}],
            ),
            "contextpilot.system",
        ),
        (
            chat_body(**pilot_field(), messages=[{"role": "assistant", "content": "q"}]),
            "messages[0]",
        ),
        (
            chat_body(
                **pilot_field(),
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}
                ],
            ),
            "messages[0].content",
        ),
        (chat_body(n=2), "n"),
        (chat_body(logprobs=True), "logprobs"),
        (chat_body(stream="yes"), "stream"),
        (chat_body(messages=[]), "messages"),
    ],
)
def test_a_request_the_proxy_cannot_serve_is_a_400(
    proxy: BackgroundServer, engines: list[OpenAICompatibleServer], body: Any, param: str
) -> None:
    response = post(proxy, "/chat/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert received(engines) == []


def test_the_sdk_raises_bad_request_for_a_malformed_field(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Where?"}],
            extra_body={"contextpilot": {"documents": "not a list"}},
        )
    assert caught.value.body["param"] == "contextpilot.documents"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": -5}, "max_completion_tokens"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": 5}, "cache_salt"),
        ({"kind": "x"}, "kind"),  # the routing client's own arguments
        ({"kind": "x", "stream": True}, "kind"),
        ({"self": 1}, "self"),
        ({"self": 1, "stream": True}, "self"),
    ],
)
def test_an_engine_parameter_the_fleet_cannot_take_is_a_400_naming_it_and_records_nothing(
    proxy: BackgroundServer,
    engines: list[OpenAICompatibleServer],
    extra: dict[str, Any],
    param: str,
) -> None:
    first = post(proxy, "/chat/completions", chat_body(**pilot_field(conversation_id="c")))
    assert first.status_code == 200, first.text
    pilot, sent = proxy.proxy.pilot, len(received(engines))
    before = pilot.index_stats()
    body = chat_body(**pilot_field(conversation_id="c"), **extra)
    body["messages"] = [{"role": "user", "content": "REJECTED-TURN"}]
    response = post(proxy, "/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert len(pilot.conversation("c").turns) == 1  # the rejected turn was not recorded
    assert pilot.index_stats() == before and len(received(engines)) == sent


def test_no_parameter_reaches_the_engine_under_a_routing_client_argument_name() -> None:
    calls = (RoutingClient.achat, RoutingClient.acomplete, RoutingClient.astream)
    names = {
        parameter.name
        for call in calls
        for parameter in inspect.signature(call).parameters.values()
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD
    }
    bodies = {"chat": chat_body(), "completion": {"model": MODEL, "prompt": "Where?"}}
    for kind, body in bodies.items():
        for name in names:
            try:
                request = parse_request(kind, {**body, name: 1})  # type: ignore[arg-type]
            except ApiError as exc:
                assert (exc.status, exc.param) == (400, name)
            else:
                assert name not in request.params


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [MAX_NESTING, 970])  # the body's object is one more
def test_a_body_nested_deeper_than_the_limit_is_a_400_and_nothing_is_sent(
    proxy: BackgroundServer, engines: list[OpenAICompatibleServer], depth: int
) -> None:
    raw = json.dumps(chat_body(**pilot_field())).removesuffix("}") + f', "extra": {nested(depth)}}}'
    response = httpx.post(f"{proxy.base_url}/chat/completions", content=raw.encode(), timeout=30)
    assert response.status_code == 400, response.text
    assert f"deeper than {MAX_NESTING} levels" in response.json()["error"]["message"]
    assert received(engines) == [] and proxy.proxy.pilot.index_stats().requests == 0


def test_a_body_nested_as_deep_as_the_limit_is_json() -> None:
    assert parse_json(nested(MAX_NESTING).encode()) == parse_json(nested(MAX_NESTING).encode())
    with pytest.raises(ApiError):
        parse_json(nested(MAX_NESTING + 1).encode())


def test_invalid_json_an_unknown_path_and_an_oversize_body_are_openai_errors(
    engines: list[OpenAICompatibleServer],
) -> None:
    server = start_proxy([e.base_url for e in engines], max_body_bytes=4096)
    try:
        raw = httpx.post(f"{server.base_url}/chat/completions", content=b"{nope")
        assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
        nan = httpx.post(f"{server.base_url}/chat/completions", content=b'{"temperature": NaN}')
        assert nan.status_code == 400
        missing = httpx.get(f"{server.base_url}/embeddings")
        assert missing.status_code == 404 and missing.json()["error"]["type"]
        wrong_method = httpx.get(f"{server.base_url}/chat/completions")
        assert wrong_method.status_code == 405
        big = post(server, "/chat/completions", chat_body(**pilot_field(), pad="x" * 8000))
        assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    finally:
        server.stop()
    assert received(engines) == []


def test_another_model_is_a_404_like_openai(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


# -- authentication ------------------------------------------------------------------


def test_the_api_key_is_required_where_set(engines: list[OpenAICompatibleServer]) -> None:
    server = start_proxy([e.base_url for e in engines], api_key=KEY)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY}):
            response = post(server, "/chat/completions", chat_body(), **headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert response.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{server.base_url}/models").status_code == 401
        assert httpx.get(f"{root(server)}/metrics").status_code == 401
        assert httpx.get(f"{root(server)}/health").status_code == 200
        assert received(engines) == []
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0).models.list()
        sdk = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
        assert ask(sdk, "Where is Paris?").choices[0].message.content
    finally:
        server.stop()


# -- models, metrics, health ---------------------------------------------------------


def test_models_lists_the_fleets_model(sdk: openai.OpenAI) -> None:
    assert [model.id for model in sdk.models.list()] == [MODEL]


def test_metrics_show_routing_and_proxy_counters(
    sdk: openai.OpenAI, proxy: BackgroundServer
) -> None:
    ask(sdk, "Where is Paris?", conversation_id="m")
    sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    text = httpx.get(f"{root(proxy)}/metrics").text
    assert 'contextpilot_proxy_requests_total{mode="pilot",route="chat",status="200"} 1.0' in text
    assert (
        'contextpilot_proxy_requests_total{mode="passthrough",route="chat",status="200"} 1.0'
        in text
    )
    assert 'contextpilot_proxy_blocks_total{outcome="sent"} 2.0' in text
    assert 'contextpilot_proxy_answers_recorded_total{result="ok"} 1.0' in text
    assert "contextpilot_routing_attempts_total" in text


def test_health_reports_the_fleet(proxy: BackgroundServer) -> None:
    health = httpx.get(f"{root(proxy)}/health").json()
    assert health["status"] == "ok" and health["healthy_replicas"] == 2


# -- failures ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_fleet_that_is_down_answers_503_quickly_and_keeps_the_index_clean(
    engines: list[OpenAICompatibleServer], stream: bool
) -> None:
    server = start_proxy([e.base_url for e in engines])
    try:
        for engine in engines:
            engine.stop()
        started = time.monotonic()
        response = post(server, "/chat/completions", chat_body(**pilot_field(), stream=stream))
        assert time.monotonic() - started < 5.0
        assert response.status_code in (502, 503), response.text
        assert response.json()["error"]["type"] == "server_error"
        assert server.proxy.pilot.index_stats().requests == 0  # evicted: never cached
        again = post(server, "/chat/completions", chat_body())
        assert again.status_code == 503 and again.headers["retry-after"] == "1"
        assert httpx.get(f"{root(server)}/health").json()["status"] == "degraded"
    finally:
        server.stop()


class _CutStream(BaseHTTPRequestHandler):
    """An engine whose every stream breaks off after two deltas."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("Half", " an answer"):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_a_stream_broken_after_its_first_text_ends_with_an_error_event_and_no_answer() -> None:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _CutStream)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    server = start_proxy([f"http://127.0.0.1:{engine.server_address[1]}/v1"])
    try:
        sdk = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0)
        stream = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "q"}],
            stream=True,
            extra_body=pilot_field(conversation_id="cut"),
        )
        with pytest.raises(openai.APIError):
            for _ in stream:
                pass
        (turn,) = server.proxy.pilot.conversation("cut").turns
        assert turn.answer is None
    finally:
        server.stop()
        engine.shutdown()
        engine.server_close()


class _WrongKey(BaseHTTPRequestHandler):
    """An engine configured with another API key: it refuses every request (401, or its
    server's ``status``), quoting the ``Authorization`` header it got, as some do."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        quoted = f"invalid API key {self.headers.get('Authorization')} for org internal-7"
        body = json.dumps({"error": {"message": quoted, "code": "invalid_api_key"}})
        self.send_response(getattr(self.server, "status", 401))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def test_a_replica_that_refuses_every_request_is_routed_around(
    engines: list[OpenAICompatibleServer],
) -> None:
    wrong_key = ThreadingHTTPServer(("127.0.0.1", 0), _WrongKey)
    threading.Thread(target=wrong_key.serve_forever, daemon=True).start()
    server = start_proxy(
        [f"http://127.0.0.1:{wrong_key.server_address[1]}/v1", engines[0].base_url]
    )
    try:
        statuses = [post(server, "/chat/completions", chat_body()).status_code for _ in range(4)]
        assert statuses == [200] * 4
        assert httpx.get(f"{root(server)}/health").json()["healthy_replicas"] == 1
    finally:
        server.stop()
        wrong_key.shutdown()
        wrong_key.server_close()


@pytest.mark.parametrize(("status", "answered"), [(401, (502, 503)), (400, (400,))])
def test_a_client_never_sees_the_engines_credentials_or_urls(
    status: int, answered: tuple[int, ...], caplog: pytest.LogCaptureFixture
) -> None:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _WrongKey)
    engine.status = status  # type: ignore[attr-defined]
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    port = engine.server_address[1]
    server = start_proxy([f"http://fleet:Upstr3amPw@127.0.0.1:{port}/v1"])
    token = base64.b64encode(b"fleet:Upstr3amPw").decode()
    try:
        with caplog.at_level(logging.DEBUG):
            for stream in (False, True):
                response = post(server, "/chat/completions", chat_body(stream=stream))
                assert response.status_code in answered, response.text
                shown = response.text + caplog.text
                assert "Upstr3amPw" not in shown and token not in shown
                assert f":{port}" not in response.text  # nor where the engine is
        if status == 400:  # the engine's refusal of the request itself is passed on
            assert "org internal-7" in response.text and "HTTP 400" in response.text
        else:  # an engine's fault is the proxy operator's: told in the log only
            assert "org internal-7" not in response.text and "org internal-7" in caplog.text
    finally:
        server.stop()
        engine.shutdown()
        engine.server_close()


def test_documents_questions_and_answers_are_in_no_log_record_or_metric(
    proxy: BackgroundServer, sdk: openai.OpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        for turn in range(2):
            ask(sdk, f"Which river, PRIVATE-QUESTION {turn}?", conversation_id="c")
    metrics = httpx.get(f"{root(proxy)}/metrics").text
    ours = [r for r in caplog.records if not r.name.startswith("openai")]  # not the client's
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in ours)
    assert ours and "answer" in metrics  # something was logged and counted
    for text in ("PRIVATE-QUESTION", PARIS[:40], BERLIN[:40]):
        assert text not in logged and text not in metrics


def test_a_serve_config_shows_no_key_or_credentials() -> None:
    config = ServeConfig(
        endpoints=("http://fleet:Upstr3amPw@10.0.0.1:8000/v1",),
        model=MODEL,
        api_key=KEY,
        store="redis://:St0rePw@10.0.0.5:6379/0",
        salt_key="salt-" + KEY,
    )
    shown = repr(config) + str(config)
    assert "10.0.0.1:8000" in shown and "10.0.0.5:6379" in shown
    assert not [secret for secret in ("Upstr3amPw", "St0rePw", KEY) if secret in shown]
    with pytest.raises(ConfigError) as bad:
        ServeConfig(endpoints=("ftp://fleet:Upstr3amPw@host/v1",), model=MODEL)
    assert "Upstr3amPw" not in str(bad.value)


def test_a_malformed_store_url_is_refused_without_its_password(
    engines: list[OpenAICompatibleServer],
) -> None:
    url = "redis://:St0rePw@127.0.0.1:0/0"  # port 0
    with pytest.raises(ConfigError) as caught:
        start_proxy([engines[0].base_url], store=url)
    assert "port 0" in str(caught.value) and "St0rePw" not in str(caught.value)


def test_a_failed_request_leaves_the_index_off_the_event_loop(
    engines: list[OpenAICompatibleServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = start_proxy([e.base_url for e in engines])
    pilot, on_event_loop = server.proxy.pilot, []
    evict = pilot.evict

    def noting_evict(request_ids: list[str]) -> int:  # a shared index log may block
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            on_event_loop.append(False)
        else:
            on_event_loop.append(True)
        return evict(request_ids)

    monkeypatch.setattr(pilot, "evict", noting_evict)
    try:
        for engine in engines:
            engine.stop()
        response = post(server, "/chat/completions", chat_body(**pilot_field()))
        assert response.status_code in (502, 503), response.text
    finally:
        server.stop()
    assert on_event_loop == [False] and pilot.index_stats().requests == 0


# -- configuration and the command ---------------------------------------------------


def test_an_unusable_store_is_a_config_error(engines: list[OpenAICompatibleServer]) -> None:
    with pytest.raises(ConfigError):
        start_proxy([engines[0].base_url], store="nosuch://store")


def test_a_store_that_does_not_answer_is_a_config_error_that_hides_its_password(
    engines: list[OpenAICompatibleServer],
) -> None:
    pytest.importorskip("redis", reason='the redis client: pip install "contextpilot-rag[redis]"')
    url = f"redis://:s3cretpw@127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(ConfigError) as caught:
        start_proxy([engines[0].base_url], store=url)
    assert "127.0.0.1" in str(caught.value) and "s3cretpw" not in str(caught.value)
    command = [sys.executable, "-m", "contextpilot_rag.cli", "serve", "--model", MODEL]
    command += ["--endpoint", engines[0].base_url, "--store", url]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and "s3cretpw" not in output


@pytest.mark.parametrize(
    "options",
    [
        {"endpoints": ()},
        {"endpoints": ("ftp://x",)},
        {"model": ""},
        {"policy": "nope"},
        {"workers": 0},
        {"api_key": "short"},
        {"timeout_s": float("nan")},
        {"max_history_turns": 0},
        {"max_history_turns": True},
        {"max_history_turns": 2.0},
        {"system_into_user": "yes"},
    ],
)
def test_a_bad_configuration_is_refused(options: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"endpoints": ("http://127.0.0.1:1/v1",), "model": MODEL, **options}
    with pytest.raises(ConfigError):
        ServeConfig(**fields)


def test_the_request_contract_needs_no_http_framework() -> None:
    request = parse_request("chat", chat_body(**pilot_field(tenant="t")))
    assert request.pilot is not None and request.pilot.query == "Where?"
    assert [block.id for block in request.pilot.fields.documents] == ["paris", "berlin"]
    assert request.params == {}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_the_serve_command_runs_workers_on_one_store_behind_the_key_from_the_environment(
    engines: list[OpenAICompatibleServer], tmp_path: Path
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "contextpilot_rag.cli", "serve", "--model", MODEL]
    for engine in engines:
        command += ["--endpoint", engine.base_url]
    command += ["--port", str(port), "--workers", "2", "--store", f"sqlite:///{tmp_path}/s.db"]
    env = {**os.environ, API_KEY_ENV: KEY}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        workers: set[int] = set()

        def both_workers_answer() -> bool:
            workers.add(httpx.get(f"{base}/health", timeout=5).json()["worker"])
            return len(workers) == 2

        wait_for(both_workers_answer, timeout_s=120)
        assert httpx.get(f"{base}/v1/models").status_code == 401
        for turn in range(4):  # whichever worker answers, each knows the conversation
            sdk = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
            extension = ask(sdk, f"Question {turn}?", conversation_id="w").model_extra
            assert extension["contextpilot"]["blocks_deduplicated"] == (2 if turn else 0)
            sdk.close()
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode(errors="replace")
    assert "Traceback" not in output, output


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_two_proxies_on_one_store_continue_each_others_conversations(
    engines: list[OpenAICompatibleServer],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    backend: str,
) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
    first = start_proxy([e.base_url for e in engines], store=url)
    second = start_proxy([e.base_url for e in engines], store=url)
    try:
        sdks = [
            openai.OpenAI(base_url=p.base_url, api_key="-", max_retries=0) for p in (first, second)
        ]
        answer = ask(sdks[0], "Where is Paris?", conversation_id="shared")
        again = ask(sdks[1], "And Berlin?", conversation_id="shared")
        assert again.model_extra["contextpilot"]["blocks_deduplicated"] == 2
        history = received(engines)[-1]["messages"]
        assert history[2] == {"role": "assistant", "content": answer.choices[0].message.content}
        assert PARIS not in history[-1]["content"]
    finally:
        first.stop()
        second.stop()


def test_the_serve_command_reports_a_bad_configuration() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "contextpilot_rag.cli", "serve", "--endpoint", "x", "--model", "m"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "http://" in result.stdout + result.stderr


def test_the_serve_command_takes_a_history_window_and_refuses_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ["serve", "--endpoint", "http://127.0.0.1:1/v1", "--model", MODEL]
    config = config_from_args(_parser().parse_args([*command, "--max-history-turns", "3"]))
    assert config.max_history_turns == 3 and not config.system_into_user
    assert config_from_args(_parser().parse_args([*command, "--system-into-user"])).system_into_user
    assert ServeConfig.from_json(config.to_json()) == config  # as the workers get it
    assert config_from_args(_parser().parse_args(command)).max_history_turns is None
    assert main([*command, "--max-history-turns", "0"]) == 2  # before anything starts
    assert "max_history_turns" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        _parser().parse_args([*command, "--max-history-turns", "many"])


def test_unknown_conversations_stay_unknown_after_a_passthrough(
    sdk: openai.OpenAI, proxy: BackgroundServer
) -> None:
    sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(UnknownConversationError):
        proxy.proxy.pilot.conversation("hi")


def test_a_client_that_leaves_mid_stream_frees_the_replica_and_records_no_answer() -> None:
    with OpenAICompatibleServer(model=MODEL, token_delay_s=0.3) as slow:
        server = start_proxy([slow.base_url])
        try:
            body = chat_body(**pilot_field(conversation_id="gone"), stream=True)
            url = f"{server.base_url}/chat/completions"
            with httpx.stream("POST", url, json=body, timeout=30) as response:
                events = response.iter_lines()
                assert "contextpilot" in next(line for line in events if line)
                # while the stream is open the replica counts it (the engine is slow)
                assert server.proxy.client.replicas[0].in_flight == 1
            wait_for(lambda: server.proxy.client.replicas[0].in_flight == 0, timeout_s=10)
            (turn,) = server.proxy.pilot.conversation("gone").turns
            assert turn.answer is None
        finally:
            server.stop()


def test_concurrent_streams_are_answered_and_release_every_counter(
    proxy: BackgroundServer,
) -> None:
    results: list[str] = []

    def one(number: int) -> None:
        sdk = openai.OpenAI(base_url=proxy.base_url, api_key="-", max_retries=0)
        stream = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Question {number}?"}],
            stream=True,
            extra_body=pilot_field(conversation_id=f"conc-{number % 3}"),
        )
        results.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 8 and all(text.startswith("Answer from") for text in results)
    assert all(r.in_flight == 0 and r.queued_tokens == 0 for r in proxy.proxy.client.replicas)
    turns = [len(proxy.proxy.pilot.conversation(f"conc-{i}").turns) for i in range(3)]
    assert sorted(turns) == [2, 3, 3]


def test_the_serve_client_example_runs_offline(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "serve_client.py"
    first, second = runpy.run_path(str(example))["main"]([])
    assert first["blocks_sent"] == 3 and second["blocks_deduplicated"] == 2
    assert "cached" in capsys.readouterr().out


def test_without_starlette_the_package_imports_and_building_the_app_names_the_extra() -> None:
    code = """
import sys
from importlib.abc import MetaPathFinder

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("starlette", "uvicorn"):
            raise ImportError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from contextpilot_rag.cli import main
from contextpilot_rag.errors import ConfigError
from contextpilot_rag.serve import ServeConfig, build_app
try:
    build_app(ServeConfig(endpoints=("http://127.0.0.1:1/v1",), model="m"))
except ConfigError as exc:
    print(exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'pip install "contextpilot-rag[serve]"' in result.stdout


def test_a_malformed_route_request_is_a_400_not_500() -> None:
    answer = routing_error_of(InvalidRouteRequestError("max_tokens < 0"), fleet_down=False)
    assert answer.status == 400 and answer.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (ConversationConflictError("c1 kept changing"), 409, "conversation_conflict"),
        (StoreUnavailableError("redis://10.0.0.5:6379 timed out"), 503, "store_unavailable"),
    ],
)
def test_store_errors_are_answered_with_their_status_not_500(
    error: ContextPilotError, status: int, code: str
) -> None:
    for answer in (pilot_error_of(error), routing_error_of(error, fleet_down=False)):
        assert (answer.status, answer.body()["error"]["code"]) == (status, code)
        assert answer.headers.get("Retry-After") == "1"
        assert "10.0.0.5" not in str(answer.body())  # the store's address is not shown


def test_a_port_in_use_ends_serve_with_the_documented_status_1(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """uvicorn exits 3 when it cannot bind; the command's documented status is 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = ["serve", "--endpoint", "http://127.0.0.1:1/v1", "--model", MODEL]
        assert main([*command, "--port", str(port)]) == 1
    assert "address already in use" in capfd.readouterr().err.lower()
