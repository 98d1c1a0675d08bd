"""The framework paths to hosted prompt caches (docs/cloud.md, "Framework paths"), with
the real clients against the loopback cloud emulator: LangChain's ``ChatAnthropic`` and
``ChatOpenAI`` fed by ``ContextPilotPromptBuilder``, LlamaIndex's ``Anthropic`` LLM fed
by ``prompt_to_chat_messages``, and ``litellm`` fed by ``Prompt.to_openai_request``. The
markers arrive where the pilot's cache plan put them, a conversation's next turn reads
from cache, and the provider's usage reaches the pilot. Offline: loopback only,
simulated time."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # read by litellm at import

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt
from contextpilot_rag.cloud import CloudCacheConfig, rules_for
from contextpilot_rag.testing.cloud_server import CloudCacheServer
from contextpilot_rag.usage import parse_input_tokens

if TYPE_CHECKING:
    from conftest import FakeClock, MarkedParts

CLAUDE = "claude-test"
GPT = "gpt-test"
SYSTEM = "Answer from the context documents and cite their labels. " * 120  # > 1,024 tokens
PASSAGE = "Passage {} about prefix caching, context reuse and what a cache breakpoint pays. "


def _need(module: str) -> Any:
    return pytest.importorskip(
        module, reason=f"{module} is not installed (pip install -e '.[dev]')"
    )


@pytest.fixture
def server(clock: FakeClock) -> Iterator[CloudCacheServer]:
    with CloudCacheServer(clock=clock) as emulator:
        yield emulator


@pytest.fixture
def pilot() -> ContextPilot:
    return ContextPilot(PilotConfig(cloud=CloudCacheConfig(enabled=True)))


def _blocks(*numbers: int) -> list[ContextBlock]:
    return [ContextBlock(PASSAGE.format(n) * 60, id=f"doc-{n}") for n in numbers]


def _documents(*numbers: int) -> list[Any]:
    documents = _need("langchain_core.documents")
    return [
        documents.Document(block.text, id=block.id, metadata={"source": "kb"})
        for block in _blocks(*numbers)
    ]


def _designed_paths(prompt: Prompt) -> list[str]:
    """Where the cache plan's breakpoints are, as the emulator names a marker's place."""
    assert prompt.cache_plan is not None
    offset = 1 if prompt.messages[0]["role"] == "system" else 0
    paths = []
    for message_index, part in sorted(
        (m, p % len(prompt.content_parts(m))) for m, p in prompt.cache_plan.positions
    ):
        if prompt.messages[message_index]["role"] == "system":
            paths.append(f"system[{part}]")
        else:
            paths.append(f"messages[{message_index - offset}].content[{part}]")
    return paths


# LangChain: ChatAnthropic


@pytest.fixture
def claude(server: CloudCacheServer) -> Any:
    chat_models = _need("langchain_anthropic")
    return chat_models.ChatAnthropic(
        model=CLAUDE, base_url=server.anthropic_base_url, api_key="test", max_retries=0
    )


def test_chat_anthropic_sends_the_markers_where_the_cache_plan_put_them(
    pilot: ContextPilot, claude: Any, server: CloudCacheServer
) -> None:
    from langchain_contextpilot import build_cached_messages

    pilot.optimize(_blocks(0, 1, 2), "What is A?", system=SYSTEM)  # doc-0..2 now shared
    prompt = pilot.optimize(_blocks(2, 1, 0, 5), "What is B?", system=SYSTEM)
    claude.invoke(build_cached_messages(prompt))
    sent = server.requests[-1]
    assert len(sent.cache_control_paths) >= 2
    assert sent.cache_control_paths == _designed_paths(prompt)
    assert "contextpilot" not in repr(sent.body)  # the annotation is not sent
    texts = [block["text"] for block in sent.body["messages"][0]["content"]]
    assert texts == list(prompt.content_parts(1))  # each context block its own block


def _claude_chain(pilot: ContextPilot, claude: Any) -> Any:
    from langchain_contextpilot import ContextPilotPromptBuilder
    from langchain_core.runnables import RunnableLambda

    retriever = RunnableLambda(lambda question: _documents(*RETRIEVED[question]))
    builder = ContextPilotPromptBuilder(pilot=pilot, system=SYSTEM)
    return {"documents": retriever, "question": lambda question: question} | builder | claude


RETRIEVED = {"What is A?": (0, 1, 2), "And B?": (2, 3, 4), "What is C?": (1, 0, 5)}


def test_builder_conversation_next_turn_reads_from_cache_and_usage_reaches_the_pilot(
    pilot: ContextPilot, claude: Any, server: CloudCacheServer
) -> None:
    from langchain_contextpilot import ContextPilotCallbackHandler

    handler = ContextPilotCallbackHandler(pilot)
    config: Any = {"configurable": {"conversation_id": "user-42"}, "callbacks": [handler]}
    chain = _claude_chain(pilot, claude)
    first = chain.invoke("What is A?", config=config)
    pilot.record_answer("user-42", first.text)
    second = chain.invoke("And B?", config=config)
    written = first.usage_metadata["input_token_details"]["ephemeral_5m_input_tokens"]
    assert written >= 1024
    assert parse_input_tokens(first).cache_write_5m_tokens == written  # billed as a write
    assert second.usage_metadata["input_token_details"]["cache_read"] == written
    turn_1, turn_2 = (request.cache_control_paths for request in server.requests)
    assert turn_1[-1] == "messages[0].content[3]"  # the end of the turn: 3 documents, question
    assert "messages[1].content[0]" in turn_2  # the end of the history: the answer
    assert handler.counts.observed == 2 and handler.counts.unmatched == 0
    assert len(pilot.conversation("user-42").turns) == 2


def test_builder_provider_prefix_not_served_stops_steering(
    pilot: ContextPilot, claude: Any
) -> None:
    from langchain_contextpilot import ContextPilotCallbackHandler

    handler = ContextPilotCallbackHandler(pilot)
    chain = _claude_chain(pilot, claude)
    chain.invoke("What is A?", config={"callbacks": [handler]})
    requests_before = pilot.index_stats().requests
    # "What is C?" shares doc-0 and doc-1 with A, so the pilot puts them first: a
    # prefix Anthropic never cached (A's breakpoint ends after its question).
    answer = chain.invoke("What is C?", config={"callbacks": [handler]})
    assert answer.usage_metadata["input_token_details"]["cache_read"] < 1024 * 2
    assert handler.counts.observed == 2 and handler.counts.evicted >= 1
    assert pilot.index_stats().requests <= requests_before  # A is gone, C stays


def test_handler_pairs_the_model_call_with_the_prompt_its_messages_name(
    pilot: ContextPilot, claude: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langchain_contextpilot import (
        ContextPilotCallbackHandler,
        ContextPilotPromptBuilder,
        ContextPilotRetriever,
    )
    from langchain_core.runnables import RunnableLambda

    # a ContextPilotRetriever in the same run leaves a second prompt waiting: no guess
    retriever = ContextPilotRetriever(
        base_retriever=RunnableLambda(lambda question: _documents(*RETRIEVED[question])),
        pilot=pilot,
    )
    builder = ContextPilotPromptBuilder(pilot=pilot, system=SYSTEM)
    chain = {"documents": retriever, "question": lambda question: question} | builder | claude
    handler = ContextPilotCallbackHandler(pilot)
    prompts: list[Prompt] = []
    observed: list[str] = []
    optimize, observe_cache = pilot.optimize, pilot.observe_cache

    def optimize_and_keep(*args: Any, **kwargs: Any) -> Prompt:
        prompts.append(optimize(*args, **kwargs))
        return prompts[-1]

    def observe_and_keep(request_id: Any, *args: Any, **kwargs: Any) -> int:
        observed.append(request_id)
        return observe_cache(request_id, *args, **kwargs)

    monkeypatch.setattr(pilot, "optimize", optimize_and_keep)
    monkeypatch.setattr(pilot, "observe_cache", observe_and_keep)
    chain.invoke("What is A?", config={"callbacks": [handler]})
    assert len(prompts) == 2  # the retriever's prompt, then the builder's
    assert observed == [prompts[1].request_id]
    assert handler.counts.unmatched == 0


def test_builder_streams_and_awaits_like_any_runnable(pilot: ContextPilot, claude: Any) -> None:
    import asyncio

    chain = _claude_chain(pilot, claude)
    config: Any = {"configurable": {"conversation_id": "user-5"}}
    streamed = None
    for chunk in chain.stream("What is A?", config=config):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert streamed.usage_metadata["input_token_details"]["ephemeral_5m_input_tokens"] >= 1024
    pilot.record_answer("user-5", streamed.text)
    answer = asyncio.run(chain.ainvoke("And B?", config=config))
    assert answer.usage_metadata["input_token_details"]["cache_read"] >= 1024


def test_builder_refuses_input_without_a_question(pilot: ContextPilot) -> None:
    _need("langchain_core")
    from langchain_contextpilot import ContextPilotPromptBuilder

    from contextpilot_rag.errors import InvalidInputError

    builder = ContextPilotPromptBuilder(pilot=pilot)
    with pytest.raises(InvalidInputError):
        builder.invoke({"documents": _documents(0)})
    with pytest.raises(InvalidInputError):
        builder.invoke("What is A?")  # type: ignore[arg-type]


def test_the_builder_awaits_the_pilot_off_the_event_loop(
    pilot: ContextPilot, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import threading

    _need("langchain_core")
    from langchain_contextpilot import ContextPilotPromptBuilder

    builder = ContextPilotPromptBuilder(pilot=pilot, system=SYSTEM)
    optimize = pilot.optimize

    async def scenario() -> Any:
        loop, gate = asyncio.get_running_loop(), threading.Event()

        def gated(*args: Any, **kwargs: Any) -> Prompt:
            loop.call_soon_threadsafe(gate.set)  # opens only while the loop is free
            assert gate.wait(5), "the pilot ran on the event loop (tokenizing, a store's I/O)"
            return optimize(*args, **kwargs)

        monkeypatch.setattr(pilot, "optimize", gated)
        return await builder.ainvoke({"documents": _documents(0, 1), "question": "A?"})

    messages = asyncio.run(scenario())
    assert messages[-1].additional_kwargs["contextpilot"]["request_id"]


# LangChain: ChatOpenAI


def _chat_openai_conversation(
    pilot: ContextPilot, server: CloudCacheServer, model: str
) -> tuple[Any, Any, Any]:
    """Two turns of one conversation through ``ContextPilotPromptBuilder`` and
    ``ChatOpenAI`` (``model``) on the emulator: the answers and the callback handler."""
    chat_models = _need("langchain_openai")
    from langchain_contextpilot import (
        ContextPilotCallbackHandler,
        ContextPilotPromptBuilder,
        with_prompt_cache_key,
    )
    from langchain_core.runnables import RunnableLambda

    gpt = chat_models.ChatOpenAI(
        model=model, base_url=server.openai_base_url, api_key="test", max_retries=0
    )
    builder = ContextPilotPromptBuilder(pilot=pilot, provider="openai", system=SYSTEM)
    retriever = RunnableLambda(lambda question: _documents(*RETRIEVED[question]))
    chain = (
        {"documents": retriever, "question": lambda question: question}
        | builder
        | with_prompt_cache_key(gpt)
    )
    handler = ContextPilotCallbackHandler(pilot)
    config: Any = {"configurable": {"conversation_id": "user-7"}, "callbacks": [handler]}
    first = chain.invoke("What is A?", config=config)
    pilot.record_answer("user-7", first.text)
    second = chain.invoke("And B?", config=config)
    return first, second, handler


def test_chat_openai_gets_plain_text_and_the_prompt_cache_key(
    pilot: ContextPilot, server: CloudCacheServer
) -> None:
    _, second, handler = _chat_openai_conversation(pilot, server, GPT)
    bodies = [request.body for request in server.requests]
    assert bodies[0]["prompt_cache_key"] == bodies[1]["prompt_cache_key"]  # one conversation
    assert bodies[0]["prompt_cache_key"].startswith("cpk-")
    assert all(isinstance(m["content"], str) for body in bodies for m in body["messages"])
    assert "contextpilot" not in repr(bodies)
    assert second.usage_metadata["input_token_details"]["cache_read"] >= 1024
    assert handler.counts.observed == 2 and handler.counts.unmatched == 0


def _openai_pilot(ttl: str) -> ContextPilot:
    from contextpilot_rag.cloud import OPENAI_RULES

    cloud = CloudCacheConfig(enabled=True, rules=OPENAI_RULES, model=GPT, ttl=ttl)
    return ContextPilot(PilotConfig(cloud=cloud))


def test_chat_openai_sends_the_retention_the_pilot_planned_with(server: CloudCacheServer) -> None:
    chat_models = _need("langchain_openai")
    from langchain_contextpilot import ContextPilotPromptBuilder, with_prompt_cache_key

    gpt = chat_models.ChatOpenAI(
        model=GPT, base_url=server.openai_base_url, api_key="test", max_retries=0
    )
    for ttl, sent in (("24h", "24h"), ("5m", None)):
        builder = ContextPilotPromptBuilder(
            pilot=_openai_pilot(ttl), provider="openai", system=SYSTEM
        )
        chain = builder | with_prompt_cache_key(gpt)
        chain.invoke({"documents": _documents(0, 1), "question": "What is A?"})
        body = server.requests[-1].body
        assert body.get("prompt_cache_retention") == sent
        assert body["prompt_cache_key"].startswith("cpk-")


GPT_56 = "gpt-5.6-terra"


def test_chat_openai_sends_gpt_56_breakpoints_and_the_next_turn_reads_them(
    server: CloudCacheServer, marked_parts: MarkedParts
) -> None:
    """On ``gpt-5.6``, ``ChatOpenAI`` carries the plan's ``prompt_cache_breakpoint``
    markers and ``prompt_cache_options`` (explicit: no write of OpenAI's own), the
    emulator writes at the markers, the next turn reads them, and the usage (writes in
    ``cache_write_tokens``) reaches the pilot."""
    cloud = CloudCacheConfig(enabled=True, rules=rules_for("openai", GPT_56), model=GPT_56)
    pilot = ContextPilot(PilotConfig(cloud=cloud))
    first, second, handler = _chat_openai_conversation(pilot, server, GPT_56)
    bodies = [request.body for request in server.requests]
    for body in bodies:
        assert body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
        assert body["prompt_cache_key"].startswith("cpk-")
        marked = marked_parts(body)
        assert 1 <= len(marked) <= 4
        assert all(role != "assistant" for role, _ in marked)
        assert all(part["prompt_cache_breakpoint"] == {"mode": "explicit"} for _, part in marked)
    first_details = first.usage_metadata["input_token_details"]
    assert first_details.get("cache_read", 0) == 0
    assert second.usage_metadata["input_token_details"]["cache_read"] >= 1024
    assert handler.counts.observed == 2 and handler.counts.unmatched == 0


# LiteLLM


def test_litellm_forwards_the_prompts_key_and_retention_to_openai(
    server: CloudCacheServer,
) -> None:
    litellm = _need("litellm")
    prompt = _openai_pilot("24h").optimize(_blocks(0, 1), "What is A?", system=SYSTEM)
    # a LiteLLM that does not name the fields (1.84, the lowest the plug-in allows) drops
    # them at the top level: extra_body carries them through any version
    named = "prompt_cache_retention" in inspect.signature(litellm.completion).parameters
    kwargs = prompt.to_openai_request(extra_body=not named)
    litellm.completion(
        model=f"openai/{GPT}", api_base=server.openai_base_url, api_key="test", **kwargs
    )
    (request,) = server.requests
    assert request.api == "openai"
    assert request.body["prompt_cache_retention"] == "24h"
    assert request.body["prompt_cache_key"] == prompt.prompt_cache_key


def test_litellm_forwards_gpt_56_breakpoints_and_options_to_openai(
    server: CloudCacheServer,
) -> None:
    litellm = _need("litellm")
    cloud = CloudCacheConfig(enabled=True, rules=rules_for("openai", GPT_56), model=GPT_56)
    pilot = ContextPilot(PilotConfig(cloud=cloud))
    usages = []
    for question in ("What is A?", "What is C?"):
        prompt = pilot.optimize(_blocks(0, 1), question, system=SYSTEM)
        response = litellm.completion(
            model=f"openai/{GPT_56}",
            api_base=server.openai_base_url,
            api_key="test",
            **prompt.to_openai_request(extra_body=True),
        )
        usages.append(parse_input_tokens(response.usage))
        pilot.observe(prompt, response.usage)
    sent = server.requests[-1].body
    assert sent["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
    assert sent["prompt_cache_key"] == prompt.prompt_cache_key
    assert sent["messages"] == prompt.to_openai_request()["messages"]  # markers kept
    assert usages[0].cache_write_tokens > 0 and usages[0].cache_read_tokens == 0
    assert usages[1].cache_read_tokens >= 1024


def test_litellm_forwards_the_prompts_markers_to_anthropic_and_reports_cache_usage(
    pilot: ContextPilot, server: CloudCacheServer
) -> None:
    litellm = _need("litellm")
    kwargs = {"api_base": server.anthropic_base_url, "api_key": "test", "max_tokens": 32}
    responses = []
    for question in ("What is A?", "And B?"):
        blocks = _blocks(*RETRIEVED[question])
        prompt = pilot.optimize(blocks, question, conversation_id="user-9", system=SYSTEM)
        messages = prompt.to_openai_request(cache_control=True)["messages"]
        response = litellm.completion(model=f"anthropic/{CLAUDE}", messages=messages, **kwargs)
        assert server.requests[-1].api == "anthropic"
        assert server.requests[-1].cache_control_paths == _designed_paths(prompt)
        pilot.observe(prompt, response.usage)
        pilot.record_answer(prompt, response.choices[0].message.content)
        responses.append(response)
    first, second = (response.usage for response in responses)
    assert first.cache_creation_input_tokens >= 1024
    assert second.prompt_tokens_details.cached_tokens >= first.cache_creation_input_tokens


# LlamaIndex


def _without_ttl_5m(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LlamaIndex's ``CacheControl`` always names its lifetime; ``"5m"`` is the default."""
    out = []
    for block in blocks:
        marker = block.get("cache_control")
        if marker is not None and marker.get("ttl") == "5m":
            block = {**block, "cache_control": {"type": marker["type"]}}
        out.append(dict(block))
    return out


def _conversation_prompt(pilot: ContextPilot) -> Prompt:
    first = pilot.optimize(_blocks(0, 1, 2), "What is A?", conversation_id="user-3", system=SYSTEM)
    pilot.record_answer(first, "A is the first passage.")
    return pilot.optimize(_blocks(2, 3, 4), "And B?", conversation_id="user-3", system=SYSTEM)


def test_llama_index_anthropic_turns_the_cache_points_into_the_plans_markers(
    pilot: ContextPilot,
) -> None:
    utils = _need("llama_index.llms.anthropic.utils")
    from llama_index.core.llms import MessageRole
    from llama_index.llms.contextpilot import prompt_to_chat_messages

    prompt = _conversation_prompt(pilot)
    messages = prompt_to_chat_messages(prompt)
    designed = prompt.to_anthropic()
    assert messages[0].role == MessageRole.SYSTEM and messages[0].content == SYSTEM
    sent = [utils.blocks_to_anthropic_blocks(m.blocks, m.additional_kwargs) for m in messages[1:]]
    assert [_without_ttl_5m(blocks) for blocks in sent] == [
        message["content"] for message in designed["messages"]
    ]


def test_llama_index_anthropic_chat_sends_the_markers_and_reports_cache_usage(
    pilot: ContextPilot, server: CloudCacheServer
) -> None:
    import typing

    llms = _need("llama_index.llms.anthropic")
    from llama_index.llms.anthropic import utils
    from llama_index.llms.contextpilot import prompt_to_chat_messages

    if typing.get_origin(utils.MessageParam) is typing.Union:
        pytest.skip(
            "llama-index-llms-anthropic (0.12.3) does not run on the anthropic 2 SDK: it "
            "calls anthropic.types.MessageParam(...), now a Union, and passes "
            "temperature=, which messages.create() no longer takes"
        )

    llm = llms.Anthropic(
        model="claude-sonnet-4-0",
        base_url=server.anthropic_base_url,
        api_key="test",
        max_retries=0,
        max_tokens=32,
    )
    for question in ("What is A?", "And B?"):
        blocks = _blocks(*RETRIEVED[question])
        prompt = pilot.optimize(blocks, question, conversation_id="user-3", system=SYSTEM)
        response = llm.chat(prompt_to_chat_messages(prompt))
        # the system prompt's marker arrives where the release sends the system prompt as
        # content blocks (0.10); releases that send it as one string carry none there
        designed = _designed_paths(prompt)
        if isinstance(server.requests[-1].body["system"], str):
            designed = [path for path in designed if not path.startswith("system")]
        assert server.requests[-1].cache_control_paths == designed
        pilot.observe(prompt, response)
        pilot.record_answer(prompt, response.message.content or "")
    assert parse_input_tokens(server.requests[-1].usage).cache_read_tokens >= 1024


def test_the_builder_refuses_a_pilot_that_plans_no_breakpoints() -> None:
    from langchain_contextpilot import ContextPilotPromptBuilder

    from contextpilot_rag.errors import ConfigError

    with pytest.raises(ConfigError, match="enabled=True"):
        ContextPilotPromptBuilder(pilot=ContextPilot())
    assert ContextPilotPromptBuilder().pilot.config.cloud.enabled
