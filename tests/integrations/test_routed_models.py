"""One conformance suite for both framework models over ``RoutingClient``
(LangChain's ``ChatContextPilot``, LlamaIndex's ``ContextPilotLLM``), run through each
framework's public API against a fleet of real loopback servers: how they are built,
where their requests go, how they stream, and who closes the client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from contextpilot_rag.errors import ConfigError, RoutingError
from contextpilot_rag.routing import RoutingClient, make_policy
from contextpilot_rag.testing import OpenAICompatibleServer

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_contextpilot import ChatContextPilot
from llama_index.core.llms import ChatMessage
from llama_index.llms.contextpilot import ContextPilotLLM
from routed_fleet import idle, question, reply_of, served_by

Messages = list[dict[str, str]]
Facts = dict[str, Any]
"""The routing facts a framework puts on an answer (both name ``endpoint`` and
``cached_tokens``)."""


@dataclass(frozen=True)
class Framework:
    """How one framework's model is built, asked and streamed: each stream piece is
    ``(delta, facts)``, the facts empty on all but the piece that carries them."""

    build: Callable[..., Any]
    answer: Callable[[Any, Messages], tuple[str, Facts]]
    stream: Callable[[Any, Messages], Iterator[tuple[str, Facts]]]
    aanswer: Callable[[Any, Messages], Awaitable[tuple[str, Facts]]]
    astream: Callable[[Any, Messages], AsyncIterator[tuple[str, Facts]]]


def _lc_answer(model: ChatContextPilot, messages: Messages) -> tuple[str, Facts]:
    message = model.invoke(messages)
    return message.text, message.response_metadata


def _lc_stream(model: ChatContextPilot, messages: Messages) -> Iterator[tuple[str, Facts]]:
    for chunk in model.stream(messages):
        yield chunk.text, chunk.response_metadata


async def _lc_aanswer(model: ChatContextPilot, messages: Messages) -> tuple[str, Facts]:
    message = await model.ainvoke(messages)
    return message.text, message.response_metadata


async def _lc_astream(
    model: ChatContextPilot, messages: Messages
) -> AsyncIterator[tuple[str, Facts]]:
    async for chunk in model.astream(messages):
        yield chunk.text, chunk.response_metadata


def _chat_messages(messages: Messages) -> list[ChatMessage]:
    return [ChatMessage(role=m["role"], content=m["content"]) for m in messages]


def _li_answer(llm: ContextPilotLLM, messages: Messages) -> tuple[str, Facts]:
    response = llm.chat(_chat_messages(messages))
    return response.message.content or "", response.additional_kwargs


def _li_stream(llm: ContextPilotLLM, messages: Messages) -> Iterator[tuple[str, Facts]]:
    for response in llm.stream_chat(_chat_messages(messages)):
        yield response.delta or "", response.additional_kwargs


async def _li_aanswer(llm: ContextPilotLLM, messages: Messages) -> tuple[str, Facts]:
    response = await llm.achat(_chat_messages(messages))
    return response.message.content or "", response.additional_kwargs


async def _li_astream(llm: ContextPilotLLM, messages: Messages) -> AsyncIterator[tuple[str, Facts]]:
    async for response in await llm.astream_chat(_chat_messages(messages)):
        yield response.delta or "", response.additional_kwargs


FRAMEWORKS = {
    "langchain": Framework(ChatContextPilot, _lc_answer, _lc_stream, _lc_aanswer, _lc_astream),
    "llama-index": Framework(ContextPilotLLM, _li_answer, _li_stream, _li_aanswer, _li_astream),
}


@pytest.fixture(params=list(FRAMEWORKS))
def framework(request: pytest.FixtureRequest) -> Iterator[Framework]:
    """The framework, its models closed after the test."""
    built: list[Any] = []

    def build(**options: Any) -> Any:
        built.append(FRAMEWORKS[request.param].build(**options))
        return built[-1]

    yield replace(FRAMEWORKS[request.param], build=build)
    for model in built:
        model.close()


def _server_named(fleet: list[OpenAICompatibleServer], endpoint: str) -> str:
    names = {server.base_url: name for server, name in zip(fleet, "abc", strict=True)}
    return names[endpoint]


def test_an_answer_names_the_fleet_endpoint_that_served_it(
    framework: Framework, fleet: list[OpenAICompatibleServer], fleet_urls: list[str]
) -> None:
    model = framework.build(endpoints=fleet_urls, model="m")
    text, facts = framework.answer(model, question())
    assert facts["endpoint"] in fleet_urls
    assert text == reply_of(_server_named(fleet, facts["endpoint"]))
    assert served_by(fleet) == {url: int(url == facts["endpoint"]) for url in fleet_urls}
    assert facts["ttft_s"] > 0 and facts["finish_reason"] == "stop"


def test_a_repeated_prompt_returns_to_its_endpoint_and_is_served_from_its_cache(
    framework: Framework, fleet_urls: list[str]
) -> None:
    model = framework.build(endpoints=fleet_urls, model="m")
    _, first = framework.answer(model, question())
    _, again = framework.answer(model, question())
    assert again["endpoint"] == first["endpoint"]
    assert first["cached_tokens"] == 0  # a fresh fleet
    assert again["cached_tokens"] > 0.8 * again["prompt_tokens"]


@pytest.mark.parametrize("by_name", [True, False], ids=["policy-name", "policy-object"])
def test_the_model_routes_with_the_policy_it_was_given(
    framework: Framework, fleet_urls: list[str], by_name: bool
) -> None:
    policy = "round-robin" if by_name else make_policy("round-robin")
    model = framework.build(endpoints=fleet_urls, model="m", policy=policy)
    endpoints = [framework.answer(model, question())[1]["endpoint"] for _ in fleet_urls]
    assert sorted(endpoints) == sorted(fleet_urls)  # round-robin ignores the cache


def test_a_stream_yields_each_engine_delta_and_the_deltas_join_to_the_answer(
    framework: Framework, fleet: list[OpenAICompatibleServer], fleet_urls: list[str]
) -> None:
    model = framework.build(endpoints=fleet_urls, model="m")
    pieces = list(framework.stream(model, question()))
    deltas = [delta for delta, _ in pieces if delta]
    facts = [facts for _, facts in pieces if facts]
    assert len(facts) == 1 and pieces[-1][1] == facts[0]  # the facts ride on the last piece
    answer = reply_of(_server_named(fleet, facts[0]["endpoint"]))
    assert deltas == [answer.split(" ")[0]] + [f" {word}" for word in answer.split(" ")[1:]]
    assert "".join(deltas) == answer


def test_deltas_are_yielded_as_the_engine_sends_them_not_buffered(
    framework: Framework, slow_server: OpenAICompatibleServer
) -> None:
    model = framework.build(endpoints=[slow_server.base_url], model="m")
    arrivals = [time.monotonic() for delta, _ in framework.stream(model, question()) if delta]
    assert len(arrivals) == 6
    assert arrivals[-1] - arrivals[0] > 0.15  # 5 gaps of 50 ms; buffered would be ~0


def test_the_async_paths_route_and_stream_like_the_sync_ones(
    framework: Framework, fleet_urls: list[str]
) -> None:
    async def run() -> tuple[tuple[str, Facts], list[tuple[str, Facts]]]:
        model = framework.build(endpoints=fleet_urls, model="m")
        answered = await framework.aanswer(model, question())
        streamed = [piece async for piece in framework.astream(model, question())]
        await model.aclose()
        return answered, streamed

    (text, facts), pieces = asyncio.run(run())
    assert facts["endpoint"] in fleet_urls
    assert pieces[-1][1]["endpoint"] == facts["endpoint"]  # the repeat follows the cache
    assert pieces[-1][1]["cached_tokens"] > 0
    assert len([delta for delta, _ in pieces if delta]) > 1
    assert "".join(delta for delta, _ in pieces) == text


def test_closing_a_stream_early_cancels_the_request_and_frees_the_endpoint(
    framework: Framework, slow_server: OpenAICompatibleServer
) -> None:
    with RoutingClient([slow_server.base_url], model="m") as client:
        model = framework.build(client=client)
        pieces = framework.stream(model, question())
        assert next(pieces)[0] == "answer"
        assert not idle(client)  # the rest of the answer is still coming
        pieces.close()  # type: ignore[attr-defined]
        assert idle(client)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of client= .* or endpoints="),
        ({"client": "CLIENT", "endpoints": ["http://127.0.0.1:9/v1"]}, "exactly one of"),
        ({"client": "CLIENT", "model": "m"}, "model= and policy= go with endpoints="),
        ({"client": "CLIENT", "policy": "random"}, "model= and policy= go with endpoints="),
        ({"client": object()}, "client must be a RoutingClient"),
        ({"endpoints": "http://127.0.0.1:9/v1", "model": "m"}, "a list of base URLs"),
        ({"endpoints": [], "model": "m"}, "at least one endpoint"),
        ({"endpoints": ["127.0.0.1:9/v1"], "model": "m"}, "must start with http"),
        ({"endpoints": ["http://127.0.0.1:9/v1"]}, "no model"),
        ({"endpoints": ["http://127.0.0.1:9/v1"], "model": "m", "policy": "x"}, "unknown routing"),
    ],
)
def test_bad_configuration_is_a_config_error_and_leaves_a_given_client_alone(
    framework: Framework,
    fleet_urls: list[str],
    options: dict[str, Any],
    message: str,
) -> None:
    with RoutingClient(fleet_urls, model="m") as client:
        given = {key: client if value == "CLIENT" else value for key, value in options.items()}
        with pytest.raises(ConfigError, match=message):
            framework.build(**given)
        assert client.chat(question()).text.startswith("answer from server")
        assert idle(client)


@pytest.mark.parametrize("closing", ["close", "aclose"])
def test_a_model_built_from_endpoints_closes_the_client_it_created(
    framework: Framework, fleet_urls: list[str], closing: str
) -> None:
    model = framework.build(endpoints=fleet_urls, model="m")
    framework.answer(model, question())
    if closing == "close":
        model.close()
    else:
        asyncio.run(model.aclose())
    with pytest.raises(RoutingError, match="closed"):
        framework.answer(model, question())


def test_a_model_given_a_client_leaves_it_open(framework: Framework, fleet_urls: list[str]) -> None:
    with RoutingClient(fleet_urls, model="m") as client:
        model = framework.build(client=client)
        model.close()
        assert client.chat(question()).text.startswith("answer from server")
