"""RoutingClient against real OpenAI-compatible HTTP servers on loopback (several
instances of the test server, each with its own prefix cache, as a fleet)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from contextpilot_rag import ContextBlock, ContextPilot, Prompt
from contextpilot_rag.errors import ConfigError, InvalidInputError
from contextpilot_rag.routing import (
    ChatResult,
    CombinedPolicy,
    Endpoint,
    EndpointError,
    RanvierPolicy,
    RouteRequest,
    RoutingClient,
    RoutingError,
)
from contextpilot_rag.routing.client.endpoints import replicas_of
from contextpilot_rag.routing.gorgo import PrefixLocations
from contextpilot_rag.routing.metrics import DECISION_LOGGER
from contextpilot_rag.routing.prompt_keys import CHAT_TEMPLATES, PromptKeys, serialise
from contextpilot_rag.testing import OpenAICompatibleServer, ScriptedChatServer

DOCS = [f"[doc{i}]\n" + f"Document {i} talks about topic {i}. " * 60 for i in range(8)]


def messages(question: str, docs: list[str] = DOCS[:4]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Answer from the documents. " * 20},
        {"role": "user", "content": "\n\n".join(docs)},
        {"role": "user", "content": question},
    ]


def named_reply(name: str):  # type: ignore[no-untyped-def]
    return lambda _messages: f"answer from {name} with several words in it"


@pytest.fixture
def fleet() -> Iterator[list[OpenAICompatibleServer]]:
    with ExitStack() as stack:
        servers = [
            stack.enter_context(OpenAICompatibleServer(reply=named_reply(name)))
            for name in ("a", "b", "c")
        ]
        yield servers


def idle(client: RoutingClient) -> bool:
    return all(r.in_flight == 0 and r.queued_tokens == 0 for r in client.replicas)


def test_requests_sharing_a_prefix_follow_the_cache_and_feed_back_cached_tokens(
    fleet: list[OpenAICompatibleServer],
) -> None:
    with RoutingClient([s.base_url for s in fleet], model="m") as client:
        first = client.chat(messages("Question one?"))
        later = [client.chat(messages(f"Question {i}?")) for i in range(2, 6)]
    assert first.text.startswith("answer from") and first.ttft_s > 0
    assert {r.endpoint for r in later} == {first.endpoint}
    assert all((r.cached_tokens or 0) > 0.5 * (r.prompt_tokens or 1) for r in later)
    assert all(r.decision.predicted_cached_tokens > 0 for r in later)
    assert idle(client)


def test_an_endpoint_killed_mid_stream_fails_over_and_no_request_is_lost() -> None:
    with (
        OpenAICompatibleServer(reply=named_reply("a"), token_delay_s=0.05) as slow,
        OpenAICompatibleServer(reply=named_reply("b")) as healthy,
    ):
        client = RoutingClient(
            [Endpoint(slow.base_url, rtt_s=0.0), Endpoint(healthy.base_url, rtt_s=0.5)],
            model="m",
            policy="round-robin",
        )
        slow_url = slow.base_url
        stream = client.stream(messages("Which?"))
        first = next(stream)  # round-robin sends the first request to the slow server
        assert first == "answer"
        threading.Thread(target=slow.stop).start()
        rest = "".join(stream)
        result = stream.result
        assert result.endpoint == healthy.base_url and result.attempts == 2
        # the retry reproduced the delivered word, so the stream resumed after it
        assert first + rest == result.text == "answer from b with several words in it"
        assert idle(client)
        states = {r.replica_id: r for r in client.replicas}
        assert not states[slow_url].healthy  # its breaker is open


def test_a_keep_alive_connection_the_server_closed_is_retried_on_the_same_endpoint(
    fleet: list[OpenAICompatibleServer],
) -> None:
    # prefix affinity alone sends the second question (same documents) where the first
    # went; the default policy also weighs observed latencies, which a loaded machine
    # can tip towards another replica
    urls = [s.base_url for s in fleet]
    with RoutingClient(urls, model="m", metrics=True, policy="prefix") as client:
        first = client.chat(messages("Question one?"))
        server = next(s for s in fleet if s.base_url == first.endpoint)
        server.disconnect_next()  # closes the connection without answering
        second = client.chat(messages("Question two?"))
    assert second.endpoint == first.endpoint and second.attempts == 2
    assert (second.cached_tokens or 0) > 0  # the cache was not given up
    assert all(r.healthy for r in client.replicas) and idle(client)
    assert sample(client, "attempts_total", endpoint=first.endpoint, model="m", result="stale") == 1


def test_the_stale_retry_stays_on_its_endpoint_whatever_the_policy_would_pick_next(
    fleet: list[OpenAICompatibleServer],
) -> None:
    # round-robin would send the retry to the next server: the retry is not a new route
    with RoutingClient([s.base_url for s in fleet], model="m", policy="round-robin") as client:
        sent = [client.chat(messages(f"Question {n}?")).endpoint for n in range(len(fleet))]
        server = next(s for s in fleet if s.base_url == sent[0])
        server.disconnect_next()
        again = client.chat(messages("Question again?"))
    assert again.endpoint == sent[0] and again.attempts == 2
    assert all(r.healthy for r in client.replicas) and idle(client)


def test_a_resumed_stream_that_diverges_is_a_clear_error() -> None:
    with (
        OpenAICompatibleServer(reply=named_reply("a"), token_delay_s=0.05) as slow,
        OpenAICompatibleServer(reply=named_reply("b")) as other,
    ):
        client = RoutingClient([slow.base_url, other.base_url], model="m", policy="round-robin")
        stream = client.stream(messages("Which?"))
        assert [next(stream) for _ in range(3)] == ["answer", " from", " a"]
        threading.Thread(target=slow.stop).start()
        with pytest.raises(RoutingError, match="diverged"):
            list(stream)
        assert idle(client)


def test_solve_retries_with_the_failed_endpoint_excluded(
    fleet: list[OpenAICompatibleServer],
) -> None:
    client = RoutingClient([s.base_url for s in fleet], model="m", policy="round-robin")
    solved = client.solve(messages("Q?"), verify=lambda text: "from c" in text, max_attempts=5)
    assert solved.correct and solved.answer is not None
    assert solved.answer.endpoint == fleet[2].base_url
    tried = [a.endpoint for a in solved.attempts]
    assert len(tried) == len(set(tried)) >= 2  # no endpoint tried twice
    assert [a.correct for a in solved.attempts] == [False] * (len(tried) - 1) + [True]
    assert solved.ttca_s >= sum(a.latency_s for a in solved.attempts) * 0.5
    unsolvable = client.solve(messages("Q?"), verify=lambda text: False, max_attempts=4)
    assert not unsolvable.correct and len(unsolvable.attempts) == 4
    assert idle(client)


def test_counters_return_to_zero_after_cancellations() -> None:
    with OpenAICompatibleServer(token_delay_s=0.05) as server:
        client = RoutingClient([server.base_url], model="m")
        with client.stream(messages("Q?")) as stream:
            next(stream)
            assert client.replicas[0].in_flight == 1
        assert idle(client)

        async def cancel_mid_request() -> None:
            task = asyncio.create_task(client.achat(messages("Q?")))
            await asyncio.sleep(0.08)
            assert client.replicas[0].in_flight == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.aclose()

        asyncio.run(cancel_mid_request())
        assert idle(client)
        assert client.replicas[0].healthy  # a cancellation is not a failure


def test_a_request_held_while_the_fleet_is_backlogged_is_sent_once_it_drains() -> None:
    # 100 tokens/s: the first request's prompt is seconds of predicted queue until its
    # first token (0.3 s: the server's delay), so the second is held at the client,
    # touching no counter, and sent when the first one's first token shows its prompt
    # prefilled: one hold decision each, no timer or polling in between.
    policy = CombinedPolicy(hold_wait_s=0.1)
    with OpenAICompatibleServer(token_delay_s=0.3) as server:
        endpoint = Endpoint(server.base_url, prefill_tokens_per_s=100.0)
        client = RoutingClient(
            [endpoint], model="m", policy=policy, metrics=True, learn_rates=False
        )

        def second_while_first_is_queued(send: Callable[[], ChatResult]) -> ChatResult:
            first = threading.Thread(target=client.chat, args=(messages("First?"),))
            first.start()
            while client.replicas[0].queued_tokens == 0:
                time.sleep(0.005)
            assert client.replicas[0].in_flight == 1
            result = send()
            first.join()
            return result

        second = second_while_first_is_queued(lambda: client.chat(messages("Second?")))
        async_second = second_while_first_is_queued(
            lambda: asyncio.run(client.achat(messages("Third?")))
        )
        assert [r["messages"][-1]["content"] for r in server.requests] == [
            "First?",
            "Second?",
            "First?",
            "Third?",
        ]
        for result in (second, async_second):
            assert result.ttft_s > 0.2  # the wait at the client counts
        assert sample(client, "decisions_total", policy="combined", reason="hold") == 2
        assert sample(client, "held_seconds_count") == 4  # every answered attempt
        assert 0.05 < sample(client, "held_seconds_sum") < 2 * 0.3  # until a first token
        assert idle(client)


def _first_queued(server: OpenAICompatibleServer) -> tuple[RoutingClient, threading.Thread]:
    """A client over ``server`` priced at 100 tokens/s (learning nothing), holding
    requests predicted to wait more than 0.1 s, with "First?" sent and queued."""
    endpoint = Endpoint(server.base_url, prefill_tokens_per_s=100.0)
    policy = CombinedPolicy(hold_wait_s=0.1)
    client = RoutingClient([endpoint], model="m", policy=policy, learn_rates=False)
    first = threading.Thread(target=client.chat, args=(messages("First?"),))
    first.start()
    while client.replicas[0].queued_tokens == 0:
        time.sleep(0.005)
    return client, first


def _held_count(client: RoutingClient, count: int) -> None:
    while len(client._held) < count:
        time.sleep(0.005)


def test_a_prefill_end_releases_the_held_request_with_the_smallest_predicted_ttft() -> None:
    # At 100 tokens/s the first prompt is ~20 s of predicted queue, so "Long?" (its
    # own ~20 s prefill) and then "Short?" (~0.5 s) are held. When the first token of
    # the first one arrives, the held requests are offered again smallest predicted
    # TTFT first: the short one goes, and its 0.5 s of queue keeps the long one held
    # until the short one's first token. Offered in arrival order, the long one would
    # have gone first and the short one would have waited behind its 20 s.
    short = [{"role": "user", "content": "Short? " + "Tell me more. " * 12}]
    with OpenAICompatibleServer(token_delay_s=0.3) as server:
        client, first = _first_queued(server)
        long = threading.Thread(target=client.chat, args=(messages("Long?", DOCS[4:]),))
        long.start()
        _held_count(client, 1)
        result: list[ChatResult] = []
        client_short = threading.Thread(target=lambda: result.append(client.chat(short)))
        client_short.start()
        _held_count(client, 2)
        for thread in (first, long, client_short):
            thread.join()
        asked = [r["messages"][-1]["content"].split()[0] for r in server.requests]
        assert asked == ["First?", "Short?", "Long?"]
        assert result[0].ttft_s < 1.0  # it waited for the first prompt only
        assert idle(client) and client._held == {}


def test_a_policy_failing_on_a_held_request_does_not_fail_the_request_that_released_it() -> None:
    """The policy raises (a bug of its own) when the held request is offered again at
    the first request's first token: the first request still gets its answer, and the
    held one's caller gets the policy's error from its own offer."""
    policy = CombinedPolicy(hold_wait_s=0.1)
    with OpenAICompatibleServer(token_delay_s=0.3) as server:
        endpoint = Endpoint(server.base_url, prefill_tokens_per_s=100.0)
        client = RoutingClient([endpoint], model="m", policy=policy, learn_rates=False)
        outcomes: dict[str, BaseException | ChatResult] = {}

        def ask(question: str, docs: list[str]) -> None:
            try:
                outcomes[question] = client.chat(messages(question, docs))
            except Exception as error:  # the test reads it
                outcomes[question] = error

        threads = {q: threading.Thread(target=ask, args=(q, d)) for q, d in (
            ("First?", DOCS[:4]), ("Second?", DOCS[4:]))}  # fmt: skip
        threads["First?"].start()
        while client.replicas[0].queued_tokens == 0:
            time.sleep(0.005)
        threads["Second?"].start()
        _held_count(client, 1)

        def broken(request: RouteRequest, fleet: Any) -> Any:
            raise ValueError("policy bug")

        policy.choose = broken  # type: ignore[method-assign]
        for thread in threads.values():
            thread.join(timeout=10)
        assert isinstance(outcomes["First?"], ChatResult)
        assert isinstance(outcomes["Second?"], ValueError)
        assert [r["messages"][-1]["content"] for r in server.requests] == ["First?"]


def test_a_cancelled_held_request_leaves_nothing_held_or_booked() -> None:
    with OpenAICompatibleServer(token_delay_s=0.3) as server:
        client, first = _first_queued(server)

        async def cancel_while_held() -> None:
            task = asyncio.create_task(client.achat(messages("Second?", DOCS[4:])))
            while not client._held:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client._held == {}
            await asyncio.to_thread(first.join)
            await client.aclose()

        asyncio.run(cancel_while_held())
        assert [r["messages"][-1]["content"] for r in server.requests] == ["First?"]
        assert idle(client)


def test_a_held_request_is_sent_after_max_hold_s_even_if_the_backlog_stays() -> None:
    # The first request's prompt stays queued for 1.5 s (the server's delay before its
    # first token); the second may be held at most 0.2 s, so it reaches the server
    # while the first is still queued instead of waiting for it to drain.
    policy = CombinedPolicy(hold_wait_s=0.0, max_hold_s=0.2)
    with OpenAICompatibleServer(token_delay_s=1.5) as server:
        endpoint = Endpoint(server.base_url, prefill_tokens_per_s=100.0)
        client = RoutingClient([endpoint], model="m", policy=policy, metrics=True)
        threads = [
            threading.Thread(target=client.chat, args=(messages(q),), kwargs={"max_tokens": 2})
            for q in ("First?", "Second?")
        ]
        threads[0].start()
        while client.replicas[0].queued_tokens == 0:
            time.sleep(0.005)
        first_queued = client.replicas[0].queued_tokens
        threads[1].start()
        while len(server.requests) < 2:
            time.sleep(0.005)
        replica = client.replicas[0]
        assert replica.in_flight == 2 and replica.queued_tokens > first_queued
        for thread in threads:
            thread.join()
        assert sample(client, "decisions_total", policy="combined", reason="hold") >= 1
        assert idle(client)


def test_async_chat_complete_and_stream(fleet: list[OpenAICompatibleServer]) -> None:
    async def run() -> tuple[str, str, str]:
        async with RoutingClient([s.base_url for s in fleet], model="m") as client:
            chat = await client.achat(messages("Q?"))
            completion = await client.acomplete("Complete this text please. " * 30)
            stream = client.astream(messages("Q?"))
            pieces = [piece async for piece in stream]
            assert stream.result.text == "".join(pieces)
            assert idle(client)
            return chat.text, completion.text, "".join(pieces)

    chat, completion, streamed = asyncio.run(run())
    assert chat.startswith("answer from") and completion.startswith("answer from")
    assert streamed.startswith("answer from")


def test_a_string_chat_runs_on_several_event_loops_and_keys_stay_out_of_reprs(
    fleet: list[OpenAICompatibleServer],
) -> None:
    client = RoutingClient([Endpoint(fleet[0].base_url, api_key="sk-secret")], model="m")
    assert client.chat("Just a question?").text.startswith("answer from")
    assert fleet[0].requests[-1]["messages"] == [{"role": "user", "content": "Just a question?"}]
    for _ in range(2):  # each asyncio.run is a new loop; the client follows it
        assert asyncio.run(client.achat("Async question?")).text.startswith("answer from")
    asyncio.run(client.aclose())
    assert "sk-secret" not in repr(client.replicas) + repr(Endpoint("http://h/v1", api_key="sk-1"))


def test_all_endpoints_down_fails_after_max_attempts_without_leaking_counters() -> None:
    server = OpenAICompatibleServer().start()
    url = server.base_url
    server.stop()
    client = RoutingClient([url, url.replace("/v1", "/x/v1")], model="m", max_attempts=3)
    with pytest.raises(RoutingError) as caught:
        client.chat(messages("Q?"))
    assert len(caught.value.attempts) == 3
    assert idle(client)


def test_a_client_error_is_not_retried(fleet: list[OpenAICompatibleServer]) -> None:
    client = RoutingClient([s.base_url for s in fleet], model="m")
    with pytest.raises(EndpointError) as caught:
        client.chat(messages("Q?"), max_tokens=0)  # the server rejects it with a 400
    assert caught.value.status == 400
    assert idle(client) and all(r.healthy for r in client.replicas)


def test_the_route_table_stays_bounded(fleet: list[OpenAICompatibleServer]) -> None:
    locations = PrefixLocations(capacity=12)
    client = RoutingClient(
        [s.base_url for s in fleet], model="m", policy=CombinedPolicy(locations=locations)
    )
    for i in range(10):
        client.chat(messages(f"Q{i}: " + "details " * 20, docs=[DOCS[i % 8], DOCS[(i + 3) % 8]]))
        assert len(locations) <= 12
    assert len(locations) == 12


def test_bad_configuration_and_input_are_rejected() -> None:
    with pytest.raises(ConfigError):
        RoutingClient([], model="m")
    with pytest.raises(ConfigError):
        RoutingClient(["ftp://x"], model="m")
    with pytest.raises(ConfigError):
        RoutingClient(["http://127.0.0.1:1/v1"])  # no model anywhere
    with pytest.raises(ConfigError):
        RoutingClient([Endpoint("http://127.0.0.1:1/v1", models=("x",))], model="y")
    for number in ("prefill_tokens_per_s", "decode_tokens_per_s", "rtt_s"):
        for bad in (float("nan"), float("inf")):  # refused here, not in every request
            with pytest.raises(ConfigError, match=number):
                Endpoint("http://127.0.0.1:1/v1", **{number: bad})
    client = RoutingClient(["http://127.0.0.1:1/v1"], model="m")
    with pytest.raises(InvalidInputError):
        client.chat(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="max_tokens"):
        client.chat(messages("Q?"), max_tokens="lots")
    for limit in ("max_tokens", "max_completion_tokens"):  # not the route request's error
        with pytest.raises(InvalidInputError, match="max_tokens"):
            client.chat(messages("Q?"), **{limit: -1})
    with pytest.raises(ConfigError):
        client.solve(messages("Q?"), verify=bool, max_attempts=0)
    assert idle(client)


TOOL_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You look things up."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 40_000}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
]


TEXT_PART = {"type": "text", "text": "Look it up."}


def test_tool_calls_and_content_parts_are_sent_as_given() -> None:
    received: list[list[dict[str, object]]] = []

    def record(messages: list[dict[str, object]]) -> str:
        received.append(messages)
        return "a cat"

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    with (
        OpenAICompatibleServer(reply=record) as server,
        RoutingClient([server.base_url], model="test-model") as client,
    ):
        # the test server serves a text-only model: an image part is answered HTTP 400
        chat: list[dict[str, Any]] = [
            *TOOL_CHAT[:1],
            {"role": "user", "content": [TEXT_PART, TEXT_PART]},
            *TOOL_CHAT[2:],
        ]
        answer = client.chat(chat, tools=tools, max_tokens=8)
        assert answer.text == "a cat"
        assert received == [chat]
        with pytest.raises(EndpointError, match="only text parts"):
            client.chat(TOOL_CHAT, max_tokens=8)  # the image reached the server as given
        assert idle(client)


TOOL_STREAM: list[dict[str, Any]] = [
    {"role": "assistant", "content": None},
    {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "look"}}]},
    {"tool_calls": [{"index": 0, "function": {"name": "up", "arguments": '{"q": '}}]},
    {"tool_calls": [{"index": 1, "id": "c2", "type": "function", "function": {"name": "now"}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"cats"}'}}]},
]


def test_hits_on_an_engine_that_reports_no_cached_tokens_do_not_inflate_its_prefill_rate() -> None:
    """vLLM and SGLang leave ``prompt_tokens_details`` out by default. A repeated
    prompt's short first token is a cache hit, not a fast prefill of the whole prompt:
    the uncached part is what the policy predicted (about none here), so the rate the
    client learns stays near the first, cold answer's instead of climbing toward the
    whole prompt over the hit's TTFT (80,000 tokens/s)."""
    prompt = [{"role": "user", "content": "A long shared document. " * 700}]
    usage = {"prompt_tokens": 4000, "completion_tokens": 1}
    with ScriptedChatServer([{"content": "ok"}], usage=usage, first_chunk_delay_s=0.05) as server:
        endpoint = Endpoint(server.base_url, prefill_tokens_per_s=10_000.0)
        with RoutingClient([endpoint], model="m", policy=CombinedPolicy()) as client:
            client.chat(prompt, max_tokens=1)
            after_cold = client.replicas[0].prefill_tokens_per_s
            for _ in range(5):
                decision = client.chat(prompt, max_tokens=1)
            assert decision.text == "ok"
            assert client.replicas[0].prefill_tokens_per_s <= after_cold * 1.01


def test_streamed_tool_calls_are_joined_into_the_answer() -> None:
    with (
        ScriptedChatServer(TOOL_STREAM, finish_reason="tool_calls") as server,
        RoutingClient([server.base_url], model="m") as client,
    ):
        answer = client.chat(messages("Q?"), tools=[{"type": "function"}], max_tokens=8)
        assert answer.text == ""
        assert answer.finish_reason == "tool_calls"
        assert answer.tool_calls == (
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "cats"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "now", "arguments": ""}},
        )
        assert answer.ttft_s > 0  # the first fragment is the first token
        assert idle(client)


def test_route_keys_of_content_parts_and_tool_calls() -> None:
    keys = PromptKeys()
    text = serialise(TOOL_CHAT)
    # the image counts as a short digest, not 40k characters of base64
    assert len(text.text) < 400
    assert keys.request(text, request_id="a").prompt_tokens < 100
    other = [dict(m) for m in TOOL_CHAT]
    other[1] = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert serialise(TOOL_CHAT).text == text.text  # equal parts, equal key
    assert serialise(other).text != text.text
    # the system prompt stays a shared boundary of both
    assert text.boundaries[0] == serialise(other).boundaries[0]


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": 42},
        {"role": "assistant", "content": None},  # None only with tool calls
        {"role": "user", "content": [{"text": "no type"}]},
        {"role": 3, "content": "x"},
    ],
)
def test_malformed_messages_are_rejected_before_sending(message: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError):
        serialise([message])


def test_route_keys_match_exactly_on_shared_prefixes() -> None:
    keys = PromptKeys()
    first, other = "first question? " * 10, "another one? " * 10
    a = keys.request(serialise(messages(first)), request_id="a")
    b = keys.request(serialise(messages(other)), request_id="b")
    c = keys.request(serialise(messages(first, docs=DOCS[4:8])), request_id="c")
    shared = set(a.boundaries[:-1]) & set(b.boundaries[:-1])  # all but the question ends
    assert len(shared) >= 2  # the system prompt and the documents message
    assert all(a.block_hashes[x - 1] == b.block_hashes[x - 1] for x in shared)
    assert a.block_hashes[a.boundaries[-1] - 1] != b.block_hashes[b.boundaries[-1] - 1]
    docs_end = sorted(shared)[-1]
    assert a.block_hashes[docs_end - 1] != c.block_hashes[docs_end - 1]
    assert a.block_hashes[0] == b.block_hashes[0] == c.block_hashes[0]
    fillers = set(a.block_hashes[1:]) - {a.block_hashes[x - 1] for x in a.boundaries}
    assert not fillers & set(b.block_hashes)  # only boundaries can match


def test_route_keys_stay_the_same_while_the_token_estimate_is_refined() -> None:
    keys = PromptKeys()
    text = serialise(messages("Question one?"))
    before = keys.request(text, request_id="a")
    for _ in range(20):  # an engine whose tokens are longer than the first estimate
        keys.observe_tokens(len(text.text), len(text.text) // 5)
    after = keys.request(text, request_id="b")
    assert keys.chars_per_token > 4.5
    assert after.block_hashes[0] == before.block_hashes[0]  # the hash fallbacks' key

    def boundary_keys(request: RouteRequest) -> set[int]:
        return {request.block_hashes[b - 1] for b in request.boundaries}

    # the system prompt's and the documents' ends keep their keys (a key holds the
    # boundary's character position above its CRC), now at other block counts
    kept = boundary_keys(before) & boundary_keys(after)
    assert {key >> 32 for key in kept} >= set(text.boundaries[:2])


@pytest.mark.parametrize("chars_per_token", [3.5, 4.2, 4.6, 5.0, 6.0])
def test_block_zero_keeps_its_key_when_a_boundary_moves_into_the_second_block(
    chars_per_token: float,
) -> None:
    """A short system prompt ends inside block 0 or block 1 depending on the refined
    estimate: block 0's key (the hash fallbacks' and session affinity's) is the first
    block's text either way."""
    keys = PromptKeys()
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    text = serialise([system, {"role": "user", "content": "Q1 " + "x" * 400}])
    before = keys.request(text, request_id="a")
    keys.chars_per_token = chars_per_token  # as observe_tokens leaves it
    after = keys.request(text, request_id="b")
    assert after.block_hashes[0] == before.block_hashes[0]
    assert 1 not in after.boundaries


def test_known_chat_templates_render_as_the_engine_does() -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    chatml = serialise(chat, CHAT_TEMPLATES["chatml"])
    assert chatml.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n"
    )
    assert [chatml.text[:b].endswith("<|im_end|>\n") for b in chatml.boundaries] == [True] * 3
    llama = serialise(chat[1:], CHAT_TEMPLATES["llama3"])
    assert llama.text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
    )
    gemma = serialise(chat, CHAT_TEMPLATES["gemma"])  # no system turn; assistant is "model"
    assert gemma.text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello<end_of_turn>\n"
    )
    assert [gemma.text[:b] for b in gemma.boundaries[:1]] == [
        "<bos><start_of_turn>user\nBe brief.\n\n"
    ]
    assert len(gemma.boundaries) == 3
    with pytest.raises(ConfigError, match="unknown chat template"):
        RoutingClient(["http://127.0.0.1:1/v1"], model="m", chat_template="vicuna")


def test_the_marker_scan_finds_turn_ends_in_rendered_completion_prompts(
    fleet: list[OpenAICompatibleServer],
) -> None:
    template = CHAT_TEMPLATES["chatml"]

    def rendered(question: str) -> str:
        return serialise(messages(question), template).text + "<|im_start|>assistant\n"

    keys = PromptKeys()
    a = keys.request(serialise(rendered("one?"), template), request_id="a")
    b = keys.request(serialise(rendered("two?"), template), request_id="b")
    unscanned = keys.request(serialise(rendered("one?")), request_id="u")
    assert len(a.boundaries) == 3  # system, documents, question (the end shares its block)
    assert len(unscanned.boundaries) == 2  # a fixed prefix and the end
    shared = a.boundaries[:2]  # the system prompt and the documents turn
    assert shared == b.boundaries[:2]
    assert [a.block_hashes[x - 1] for x in shared] == [b.block_hashes[x - 1] for x in shared]
    assert a.block_hashes[a.boundaries[2] - 1] != b.block_hashes[b.boundaries[2] - 1]
    with RoutingClient([s.base_url for s in fleet], model="m", chat_template="chatml") as client:
        first = client.complete(rendered("one?"))
        second = client.complete(rendered("two?"))
    assert second.endpoint == first.endpoint
    assert second.decision.predicted_cached_tokens > 0 and (second.cached_tokens or 0) > 0


def test_a_prompt_sent_as_a_completion_keeps_its_block_boundaries(
    pilot: ContextPilot, fleet: list[OpenAICompatibleServer]
) -> None:
    blocks = [ContextBlock(text=DOCS[i], id=f"doc{i}") for i in range(4)]
    prompt = pilot.optimize(blocks, "What is topic 2?")
    text = serialise(prompt, completion=True)
    assert text.text == prompt.text
    block_ends = [text.text[:b] for b in text.boundaries]
    assert sum(end.rstrip().endswith(DOCS[i].strip()) for end in block_ends for i in range(4)) == 4
    with RoutingClient([s.base_url for s in fleet], model="m") as client:
        first = client.complete(prompt)
        again = client.complete(pilot.optimize(blocks, "And topic 3?"))
    sent = [r["prompt"] for s in fleet for r in s.requests]
    assert prompt.text in sent
    assert again.endpoint == first.endpoint and again.decision.predicted_cached_tokens > 0


def sample(client: RoutingClient, name: str, **labels: str) -> float:
    assert client.metrics is not None
    value = client.metrics.registry.get_sample_value(f"contextpilot_routing_{name}", labels)
    return 0.0 if value is None else value


def test_metrics_count_decisions_cache_predictions_and_latencies(
    fleet: list[OpenAICompatibleServer],
) -> None:
    with RoutingClient([s.base_url for s in fleet], model="m", metrics=True) as client:
        first = client.chat(messages("Question one?"))
        second = client.chat(messages("Question two?"))
        with pytest.raises(EndpointError):
            client.chat(messages("Q?"), max_tokens=0)  # the server answers 400
    url = first.endpoint
    assert second.endpoint == url and (second.cached_tokens or 0) > 0
    assert sample(client, "decisions_total", policy="combined", reason="min-expected-ttca") == 3
    assert sample(client, "attempts_total", endpoint=url, model="m", result="ok") == 2
    rejected = sum(
        sample(client, "attempts_total", endpoint=s.base_url, model="m", result="rejected")
        for s in fleet
    )
    assert rejected == 1
    # the first request was cold everywhere, the second a predicted and served hit
    assert sample(client, "cache_predictions_total", endpoint=url, verdict="cold") == 1
    assert sample(client, "cache_predictions_total", endpoint=url, verdict="hit") == 1
    observed = sample(client, "observed_cached_tokens_total", endpoint=url)
    assert observed == second.cached_tokens
    assert sample(client, "prompt_tokens_total", endpoint=url) == (first.prompt_tokens or 0) + (
        second.prompt_tokens or 0
    )
    assert sample(client, "ttft_seconds_count", endpoint=url) == 2
    assert sample(client, "ttft_seconds_sum", endpoint=url) == pytest.approx(
        first.ttft_s + second.ttft_s, abs=1e-5
    )
    assert sample(client, "route_table_entries") > 0
    assert sample(client, "in_flight", endpoint=url, model="m") == 0
    assert sample(client, "healthy", endpoint=url, model="m") == 1
    assert client.metrics is not None
    text = client.metrics.exposition().decode()
    assert "contextpilot_routing_decisions_total" in text and "route_table_entries" in text


def test_gauges_name_each_slot_target(fleet: list[OpenAICompatibleServer]) -> None:
    url = fleet[0].base_url
    slots = [Endpoint(url, slot=i) for i in range(2)]
    with RoutingClient(slots, model="m", policy="round-robin", metrics=True) as client:
        client.complete("Question? " + "words " * 40)
        first = client._dispatcher.replicas[f"{url}#slot0"]
        first.queued_tokens = 700  # as if a prompt were waiting for its first token
        try:
            assert client.metrics is not None
            lines = client.metrics.exposition().decode().splitlines()
            own = sample(client, "queued_tokens", endpoint=f"{url}#slot0", model="m")
            other = sample(client, "queued_tokens", endpoint=f"{url}#slot1", model="m")
        finally:
            first.queued_tokens = 0
    gauges = [line for line in lines if line.startswith("contextpilot_routing_healthy{")]
    assert len(gauges) == 2 and len(set(gauges)) == 2  # one sample per slot, none merged
    assert (own, other) == (700, 0)


def test_metrics_of_solve_and_the_http_endpoint(fleet: list[OpenAICompatibleServer]) -> None:
    client = RoutingClient([s.base_url for s in fleet], model="m", policy="round-robin")
    assert client.metrics is None  # opt-in
    with RoutingClient(
        [s.base_url for s in fleet], model="m", policy="round-robin", metrics=True
    ) as client:
        solved = client.solve(messages("Q?"), verify=lambda text: "from b" in text)
        assert client.metrics is not None
        server, thread = client.metrics.serve(0)
        try:
            port = server.server_address[1]
            scraped = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        finally:
            server.shutdown()
            thread.join()
    assert solved.correct
    assert sample(client, "solves_total", correct="true") == 1
    assert sample(client, "ttca_seconds_sum") == pytest.approx(solved.ttca_s, abs=1e-5)
    assert 'contextpilot_routing_solves_total{correct="true"} 1.0' in scraped
    assert sample(client, "route_table_entries") == 0  # round-robin remembers no routes
    with pytest.raises(ConfigError, match="already bound"):
        RoutingClient([fleet[0].base_url], model="m", metrics=client.metrics)


def test_every_finished_attempt_is_logged_as_json_with_its_reason(
    fleet: list[OpenAICompatibleServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=DECISION_LOGGER)
    with RoutingClient([s.base_url for s in fleet], model="m", policy="ranvier") as client:
        answers = [client.chat(messages(f"Q{i}?")) for i in range(3)]
    records = [r for r in caplog.records if r.name == DECISION_LOGGER]
    assert len(records) == 3
    logged = [json.loads(r.getMessage()) for r in records]
    assert [entry["endpoint"] for entry in logged] == [a.endpoint for a in answers]
    for entry, record, answer in zip(logged, records, answers, strict=True):
        assert entry == record.routing  # type: ignore[attr-defined]
        assert entry["policy"] == "ranvier" and entry["result"] == "ok"
        assert entry["reason"] == answer.decision.reason
        assert entry["observed_cached_tokens"] == answer.cached_tokens
        assert entry["predicted_cached_tokens"] == answer.decision.predicted_cached_tokens


def test_a_cache_miss_the_pilot_predicted_as_a_hit_trims_its_index(
    pilot: ContextPilot, fleet: list[OpenAICompatibleServer]
) -> None:
    blocks = [ContextBlock(text=DOCS[i], id=f"doc{i}") for i in range(4)]
    with RoutingClient([fleet[0].base_url], model="m", pilot=pilot) as client:
        client.chat(pilot.optimize(blocks, "First question?"))
        hit = client.chat(pilot.optimize(blocks[:3], "Second question?"))
        assert (hit.cached_tokens or 0) > 0 and pilot.index_stats().requests == 2
        fleet[0].reset()  # the engine loses its cache
        predicted = pilot.optimize(blocks[:3] + blocks[3:], "Third question?")
        assert predicted.stats.blocks_matched > 0
        missed = client.chat(predicted)
    assert missed.cached_tokens == 0
    assert pilot.index_stats().requests == 1  # only the request the engine just cached


class FeedbackThreads:
    """The pilot's cache feedback, noting whether each call ran on an event loop."""

    def __init__(self, pilot: ContextPilot) -> None:
        self.pilot = pilot
        self.on_event_loop: list[bool] = []

    def observe_cache(self, prompt: Prompt, cached_tokens: int, prompt_tokens: int) -> int:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.on_event_loop.append(False)
        else:
            self.on_event_loop.append(True)
        return self.pilot.observe_cache(prompt, cached_tokens, prompt_tokens)


def test_an_async_call_gives_the_pilot_its_feedback_off_the_event_loop(
    pilot: ContextPilot, fleet: list[OpenAICompatibleServer]
) -> None:
    feedback = FeedbackThreads(pilot)  # the pilot's lock or store may block
    blocks = [ContextBlock(text=DOCS[i], id=f"doc{i}") for i in range(2)]

    async def main() -> None:
        async with RoutingClient([fleet[0].base_url], model="m", pilot=feedback) as client:
            await client.achat(pilot.optimize(blocks, "First question?"))

    asyncio.run(main())
    assert feedback.on_event_loop == [False]


def test_slot_endpoints_are_targets_of_their_own_and_send_their_slot_id(
    fleet: list[OpenAICompatibleServer],
) -> None:
    server = fleet[0]
    slots = [Endpoint(server.base_url, slot=i) for i in range(2)]
    with RoutingClient(slots, model="m", policy="round-robin") as client:
        answers = [client.complete(f"Question {i}? " + "words " * 40) for i in range(4)]
        states = client.replicas
    assert [s.replica_id for s in states] == [
        f"{server.base_url}#slot0",
        f"{server.base_url}#slot1",
    ]
    assert [a.decision.replica_id for a in answers] == [s.replica_id for s in states] * 2
    assert {a.endpoint for a in answers} == {server.base_url}
    assert [body["id_slot"] for body in server.requests] == [0, 1, 0, 1]
    assert idle(client)


def test_a_slot_id_reaches_the_chat_endpoint_too(fleet: list[OpenAICompatibleServer]) -> None:
    with RoutingClient([Endpoint(fleet[0].base_url, slot=3)], model="m") as client:
        client.chat(messages("Q?"))
    assert fleet[0].requests[-1]["id_slot"] == 3


def test_endpoints_without_a_slot_send_no_slot_id(fleet: list[OpenAICompatibleServer]) -> None:
    with RoutingClient([fleet[0].base_url], model="m") as client:
        client.complete("Question?")
    assert "id_slot" not in fleet[0].requests[-1]


def test_max_cached_prompts_bounds_the_route_table_of_each_slot(
    fleet: list[OpenAICompatibleServer],
) -> None:
    server = fleet[0]
    slot = Endpoint(server.base_url, slot=0, max_cached_prompts=1)
    with RoutingClient([slot], model="m") as client:
        assert isinstance(client.policy, CombinedPolicy)
        for i in range(6):
            client.chat(messages(f"Q{i}?", docs=[DOCS[i], DOCS[(i + 1) % 8]]))
        routes = len(client.policy.locations)
        again = client.chat(messages("Q0?", docs=[DOCS[0], DOCS[1]]))
    last = 8 + 1  # at most the last prompt's recorded boundaries (and the one relied on)
    assert routes <= last
    assert again.decision.predicted_cached_tokens < 0.5 * (again.prompt_tokens or 0)


def test_max_cached_prompts_bounds_ranvier_routes_too(fleet: list[OpenAICompatibleServer]) -> None:
    slot = Endpoint(fleet[0].base_url, slot=0, max_cached_prompts=1)
    with RoutingClient([slot], model="m", policy="ranvier") as client:
        for i in range(6):
            client.chat(messages(f"Q{i}?", docs=[DOCS[i], DOCS[(i + 1) % 8]]))
        again = client.chat(messages("Q0?", docs=[DOCS[0], DOCS[1]]))
        assert isinstance(client.policy, RanvierPolicy)
        routes = len(client.policy.table)
    # the last prompt's message-boundary routes (and the prefix it shares), not six prompts'
    assert routes <= 2 * 4
    assert again.decision.reason != "route"  # Q0's prompt was overwritten five times since


def test_bad_slot_settings_are_rejected_before_any_client_exists() -> None:
    url = "http://127.0.0.1:1/v1"
    for bad in (-1, 1.0, True, "0"):
        with pytest.raises(ConfigError, match="slot"):
            Endpoint(url, slot=bad)  # type: ignore[arg-type]
    for bad in (0, -2, 2.5, False):
        with pytest.raises(ConfigError, match="max_cached_prompts"):
            Endpoint(url, max_cached_prompts=bad)  # type: ignore[arg-type]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_batch"):
            Endpoint(url, max_batch=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="distinct"):
        RoutingClient([Endpoint(url, slot=1), Endpoint(url, slot=1)], model="m")
    assert Endpoint(url, slot=0).target == f"{url}#slot0"
    assert Endpoint(url).target == url


def test_an_endpoints_batch_limit_reaches_the_policy() -> None:
    url = "http://127.0.0.1:1/v1"
    (limited,) = replicas_of([Endpoint(url, models=("m",), max_batch=2)], None)
    (unknown,) = replicas_of([Endpoint(url, models=("m",))], None)
    assert limited.state(0.0).max_batch == 2
    assert unknown.state(0.0).max_batch is None
