"""The official SDKs and frameworks, unchanged, against the loopback cloud emulator
(contextpilot_rag.testing.cloud_server): ``anthropic``, ``openai``, LangChain's
``ChatAnthropic`` and ``ChatOpenAI``, and ``litellm``. The markers arrive where they were
sent, the cache usage comes back and is read, a repeated request reads from cache, a
breakpoint under the minimum caches nothing. Offline: loopback only, simulated time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # read by litellm at import

import pytest

from contextpilot_rag.testing.cloud_server import CloudCacheServer
from contextpilot_rag.usage import parse_cache_usage

if TYPE_CHECKING:
    from conftest import FakeClock

CLAUDE = "claude-test"
GPT = "gpt-test"
LONG = "Retrieved passage about prefix caching and context reuse. " * 200  # > 1,024 tokens
SHORT = "A short system prompt, well under the minimum cacheable length."
QUESTION = "What does the passage say?"
EPHEMERAL = {"type": "ephemeral"}


def _need(module: str) -> Any:
    return pytest.importorskip(
        module, reason=f"{module} is not installed (pip install -e '.[dev]')"
    )


@pytest.fixture
def server(clock: FakeClock) -> Iterator[CloudCacheServer]:
    """The emulator on simulated time: ``clock`` (tests/conftest.py) moves only when told."""
    with CloudCacheServer(clock=clock) as emulator:
        yield emulator


def _system(text: str, *, marked: bool = True) -> list[dict[str, Any]]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if marked:
        block["cache_control"] = EPHEMERAL
    return [block]


# anthropic


@pytest.fixture
def claude(server: CloudCacheServer) -> Any:
    anthropic = _need("anthropic")
    return anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="test", max_retries=0)


def _ask_claude(client: Any, system: list[dict[str, Any]], **extra: Any) -> Any:
    messages = [{"role": "user", "content": QUESTION}]
    return client.messages.create(
        model=CLAUDE, max_tokens=64, system=system, messages=messages, **extra
    )


def test_anthropic_sdk_repeated_request_reads_what_the_first_wrote(
    claude: Any, server: CloudCacheServer
) -> None:
    first = _ask_claude(claude, _system(LONG))
    second = _ask_claude(claude, _system(LONG))
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens >= 1024
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens == first.usage.input_tokens  # the uncached question
    assert first.content[0].text and first.stop_reason == "end_turn"
    assert [r.cache_control_paths for r in server.requests] == [["system[0]"], ["system[0]"]]
    assert server.requests[0].anthropic_version  # the SDK sends its API version
    read = parse_cache_usage(second)
    assert read.cached_tokens == second.usage.cache_read_input_tokens


def test_anthropic_sdk_breakpoint_under_the_minimum_caches_nothing(claude: Any) -> None:
    _ask_claude(claude, _system(SHORT))
    usage = _ask_claude(claude, _system(SHORT)).usage
    assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


def test_anthropic_sdk_markers_on_message_blocks_arrive_where_sent(
    claude: Any, server: CloudCacheServer
) -> None:
    content = [
        {"type": "text", "text": LONG, "cache_control": EPHEMERAL},
        {"type": "text", "text": QUESTION},
    ]
    claude.messages.create(
        model=CLAUDE,
        max_tokens=16,
        system=_system(SHORT, marked=False),
        messages=[{"role": "user", "content": content}],
    )
    assert server.requests[0].cache_control_paths == ["messages[0].content[0]"]


def test_anthropic_sdk_streaming_carries_cache_usage(claude: Any) -> None:
    _ask_claude(claude, _system(LONG))
    with claude.messages.stream(
        model=CLAUDE,
        max_tokens=64,
        system=_system(LONG),
        messages=[{"role": "user", "content": QUESTION}],
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.usage.cache_read_input_tokens >= 1024
    assert final.content[0].text


def test_anthropic_sdk_entry_expires_after_5_minutes(claude: Any, clock: FakeClock) -> None:
    _ask_claude(claude, _system(LONG))
    clock.advance(301)
    usage = _ask_claude(claude, _system(LONG)).usage
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens >= 1024


def test_anthropic_sdk_five_breakpoints_is_an_invalid_request(
    claude: Any, server: CloudCacheServer
) -> None:
    anthropic = _need("anthropic")
    system = [{"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as raised:
        _ask_claude(claude, system)
    assert raised.value.status_code == 400
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert "A maximum of 4 blocks with cache_control" in raised.value.body["error"]["message"]
    assert server.requests == []


# openai


@pytest.fixture
def gpt(server: CloudCacheServer) -> Any:
    openai = _need("openai")
    return openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)


def _ask_gpt(client: Any, system: str, **extra: Any) -> Any:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
    return client.chat.completions.create(model=GPT, messages=messages, **extra)


def test_openai_sdk_repeated_request_is_cached_in_128_token_steps(
    gpt: Any, server: CloudCacheServer
) -> None:
    first = _ask_gpt(gpt, LONG, prompt_cache_key="conversation-1")
    second = _ask_gpt(gpt, LONG, prompt_cache_key="conversation-1")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 1024 and (cached - 1024) % 128 == 0
    assert second.usage.prompt_tokens - cached < 128
    assert server.requests[1].body["prompt_cache_key"] == "conversation-1"
    assert parse_cache_usage(second).cached_tokens == cached


def test_openai_sdk_streamed_usage_reports_cached_tokens(gpt: Any) -> None:
    _ask_gpt(gpt, LONG)
    stream = _ask_gpt(gpt, LONG, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.prompt_tokens_details.cached_tokens >= 1024


def test_openai_sdk_short_prompt_is_never_cached(gpt: Any) -> None:
    _ask_gpt(gpt, SHORT)
    assert _ask_gpt(gpt, SHORT).usage.prompt_tokens_details.cached_tokens == 0


# LangChain


def test_chat_anthropic_reads_cache_usage_and_sends_markers(server: CloudCacheServer) -> None:
    chat_models = _need("langchain_anthropic")
    messages_module = _need("langchain_core.messages")
    model = chat_models.ChatAnthropic(
        model=CLAUDE, base_url=server.anthropic_base_url, api_key="test", max_retries=0
    )
    messages = [
        messages_module.SystemMessage(content=_system(LONG)),
        messages_module.HumanMessage(content=QUESTION),
    ]
    first = model.invoke(messages)
    second = model.invoke(messages)
    written = first.usage_metadata["input_token_details"]["ephemeral_5m_input_tokens"]
    assert written >= 1024
    assert second.usage_metadata["input_token_details"]["cache_read"] == written
    assert second.usage_metadata["input_tokens"] == first.usage_metadata["input_tokens"]
    assert server.requests[0].cache_control_paths == ["system[0]"]
    streamed = None
    for chunk in model.stream(messages):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert streamed.usage_metadata["input_token_details"]["cache_read"] == written


def test_chat_openai_reads_cached_tokens(server: CloudCacheServer) -> None:
    chat_models = _need("langchain_openai")
    model = chat_models.ChatOpenAI(
        model=GPT, base_url=server.openai_base_url, api_key="test", max_retries=0
    )
    messages = [("system", LONG), ("human", QUESTION)]
    model.invoke(messages)
    second = model.invoke(messages)
    assert second.usage_metadata["input_token_details"]["cache_read"] >= 1024
    streamed = None
    for chunk in model.stream(messages, stream_usage=True):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert streamed.usage_metadata["input_token_details"]["cache_read"] >= 1024


def test_chat_openai_on_the_responses_api_reads_cached_tokens_streamed_or_not(
    server: CloudCacheServer,
) -> None:
    chat_models = _need("langchain_openai")
    model = chat_models.ChatOpenAI(
        model=GPT,
        base_url=server.openai_base_url,
        api_key="test",
        max_retries=0,
        use_responses_api=True,
    )
    messages = [("system", LONG), ("human", QUESTION)]
    first = model.invoke(messages)
    second = model.invoke(messages)
    assert first.usage_metadata["input_token_details"].get("cache_read", 0) == 0
    cached = second.usage_metadata["input_token_details"]["cache_read"]
    assert cached >= 1024
    streamed = None
    for chunk in model.stream(messages):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.text == second.text
    assert streamed.usage_metadata["input_token_details"]["cache_read"] == cached
    assert [request.api for request in server.requests] == ["openai-responses"] * 3
    assert server.requests[-1].body["stream"] is True


# LiteLLM


def test_litellm_forwards_markers_to_anthropic_and_reports_cache_reads(
    server: CloudCacheServer,
) -> None:
    litellm = _need("litellm")
    messages = [
        {"role": "system", "content": _system(LONG)},
        {"role": "user", "content": QUESTION},
    ]
    kwargs = {"api_base": server.anthropic_base_url, "api_key": "test", "max_tokens": 32}
    litellm.completion(model=f"anthropic/{CLAUDE}", messages=messages, **kwargs)
    second = litellm.completion(model=f"anthropic/{CLAUDE}", messages=messages, **kwargs)
    assert [r.api for r in server.requests] == ["anthropic", "anthropic"]
    assert server.requests[0].cache_control_paths == ["system[0]"]
    assert second.usage.prompt_tokens_details.cached_tokens >= 1024
    assert parse_cache_usage(second).cached_tokens >= 1024


def test_openai_sdk_conversations_over_shared_documents_share_the_servers_cache(
    gpt: Any, server: CloudCacheServer, clock: FakeClock
) -> None:
    """The pilot keys a conversation by the prefix its first turn starts with, so users
    who open over the same documents reach the server that holds them (the emulator
    spreads keys over 4 servers): every later user's first turn reads the shared
    prefix, and each user's second turn keeps its first turn's key."""
    from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
    from contextpilot_rag.cloud import OPENAI_RULES, CloudCacheConfig

    cloud = CloudCacheConfig(enabled=True, rules=OPENAI_RULES, model=GPT)
    pilot = ContextPilot(PilotConfig(cloud=cloud), clock=clock)
    docs = [ContextBlock(f"Passage {n}. " + LONG[:2400], id=f"d{n}") for n in range(4)]
    cached, keys = [], []
    for user in range(6):
        clock.now += 20.0  # a user every 20 s: 6 requests a minute, under the key's share
        conversation = f"user-{user}"
        order = docs[user % 4 :] + docs[: user % 4]  # each retriever ranks them its way
        for turn in range(2):
            prompt = pilot.optimize(
                order, f"Question {turn} of {conversation}?", conversation_id=conversation
            )
            response = gpt.chat.completions.create(model=GPT, **prompt.to_openai_request())
            pilot.observe(prompt, response)
            pilot.record_answer(prompt, response.choices[0].message.content)
            keys.append((conversation, prompt.prompt_cache_key))
            if turn == 0:
                cached.append(response.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0 and all(tokens >= 1024 for tokens in cached[1:])
    by_user: dict[str, set[str | None]] = {}
    for conversation, key in keys:
        by_user.setdefault(conversation, set()).add(key)
    assert all(len(found) == 1 for found in by_user.values())


@pytest.mark.parametrize(
    ("ttl", "sent"), [("5m", None), ("in_memory", "in_memory"), ("24h", "24h")]
)
def test_openai_sdk_carries_the_planned_retention_and_a_24h_prefix_outlives_ten_minutes(
    gpt: Any, server: CloudCacheServer, clock: FakeClock, ttl: str, sent: str | None
) -> None:
    """The pilot planned with OpenAI's extended retention sends
    ``prompt_cache_retention="24h"``, and both it and the emulator still hold the prefix
    ten minutes later; planned with ``"5m"`` (no retention sent: the emulator's default,
    in memory) or ``"in_memory"``, both have dropped it."""
    from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
    from contextpilot_rag.cloud import OPENAI_RULES, CloudCacheConfig

    cloud = CloudCacheConfig(enabled=True, rules=OPENAI_RULES, model=GPT, ttl=ttl)
    pilot = ContextPilot(PilotConfig(cloud=cloud), clock=clock)
    docs = [ContextBlock(f"Passage {n}. " + LONG[:2400], id=f"d{n}") for n in range(3)]
    first = pilot.optimize(docs, "First question?")
    gpt.chat.completions.create(model=GPT, **first.to_openai_request())
    clock.advance(600.0)
    again = pilot.optimize(docs[::-1], "Second question?")
    response = gpt.chat.completions.create(model=GPT, **again.to_openai_request())
    assert [request.body.get("prompt_cache_retention") for request in server.requests] == [
        sent,
        sent,
    ]
    kept = ttl == "24h"
    assert ([b.id for b in again.blocks] == [b.id for b in first.blocks]) is kept
    assert (response.usage.prompt_tokens_details.cached_tokens >= 1024) is kept
