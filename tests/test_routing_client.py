"""RoutingClient against real OpenAI-compatible HTTP servers on loopback (several
instances of the test server, each with its own prefix cache, as a fleet)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from contextpilot_rag.errors import ConfigError, InvalidInputError
from contextpilot_rag.routing import (
    CombinedPolicy,
    Endpoint,
    EndpointError,
    RoutingClient,
    RoutingError,
)
from contextpilot_rag.routing.gorgo import PrefixLocations
from contextpilot_rag.routing.prompt_keys import PromptKeys, serialise
from contextpilot_rag.testing import OpenAICompatibleServer

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
    client = RoutingClient(["http://127.0.0.1:1/v1"], model="m")
    with pytest.raises(InvalidInputError):
        client.chat(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="max_tokens"):
        client.chat(messages("Q?"), max_tokens="lots")
    with pytest.raises(ConfigError):
        client.solve(messages("Q?"), verify=bool, max_attempts=0)
    assert idle(client)


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
