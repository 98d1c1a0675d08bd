"""Specification of parse_cache_usage and ContextPilot.observe: the engine's cache truth,
read from every usage shape an answer comes back with."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, InvalidInputError
from contextpilot_rag.usage import CacheUsage, InputTokens, parse_cache_usage, parse_input_tokens

OPENAI_USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 20,
    "total_tokens": 1020,
    "prompt_tokens_details": {"cached_tokens": 640},
}

SHAPES = {
    "openai usage": OPENAI_USAGE,
    "openai response": {"id": "x", "choices": [], "usage": OPENAI_USAGE},
    "llama-server timings": {"cache_n": 640, "prompt_n": 360, "predicted_n": 20},
    "llama-server final chunk": {
        "usage": {"prompt_tokens": 360, "completion_tokens": 20},  # no cache info here
        "timings": {"cache_n": 640, "prompt_n": 360},
    },
    "langchain usage_metadata": {
        "input_tokens": 1000,
        "output_tokens": 20,
        "total_tokens": 1020,
        "input_token_details": {"cache_read": 640},
    },
    "anthropic usage": {
        "input_tokens": 300,
        "cache_read_input_tokens": 640,
        "cache_creation_input_tokens": 60,
        "output_tokens": 20,
    },
    "anthropic message": SimpleNamespace(
        content=[],
        usage=SimpleNamespace(
            input_tokens=300, cache_read_input_tokens=640, cache_creation_input_tokens=60
        ),
    ),
    "gemini usage_metadata": SimpleNamespace(
        prompt_token_count=1000, cached_content_token_count=640, candidates_token_count=20
    ),
    "gemini REST response": {
        "usageMetadata": {"promptTokenCount": 1000, "cachedContentTokenCount": 640}
    },
    "attribute object": SimpleNamespace(
        prompt_tokens=1000, prompt_tokens_details=SimpleNamespace(cached_tokens=640)
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_usage_shape_reads_as_640_of_1000_cached(shape: str) -> None:
    assert parse_cache_usage(SHAPES[shape]) == CacheUsage(cached_tokens=640, prompt_tokens=1000)


def _ai_message(**fields: Any) -> Any:
    """A LangChain ``AIMessage``; the test skips where langchain-core is not installed
    (the core's own lower-bounds run, ``make test-lowest``)."""
    messages = pytest.importorskip("langchain_core.messages")
    return messages.AIMessage(**fields)


def test_a_langchain_ai_message_is_read_through_its_usage_metadata() -> None:
    message = _ai_message(content="x", usage_metadata=SHAPES["langchain usage_metadata"])
    assert parse_cache_usage(message) == CacheUsage(640, 1000)


def test_the_openai_sdk_usage_and_response_objects_are_read() -> None:
    pytest.importorskip("openai")
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion

    usage = CompletionUsage.model_validate(OPENAI_USAGE)
    assert parse_cache_usage(usage) == CacheUsage(640, 1000)
    response = ChatCompletion.model_validate(
        {"id": "r", "choices": [], "created": 0, "model": "m", "object": "chat.completion"}
        | {"usage": OPENAI_USAGE}
    )
    assert parse_cache_usage(response) == CacheUsage(640, 1000)


def test_the_openai_responses_api_usage_and_response_are_read() -> None:
    pytest.importorskip("openai")
    from openai.types.responses import Response, ResponseUsage

    fields = {
        "input_tokens": 1000,
        "input_tokens_details": {"cached_tokens": 640, "cache_write_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1020,
    }
    usage = ResponseUsage.model_validate(fields)
    assert parse_cache_usage(usage) == CacheUsage(640, 1000)
    response = Response.model_construct(id="r", output=[], usage=usage)
    assert parse_cache_usage(response) == CacheUsage(640, 1000)
    assert parse_input_tokens(response) == InputTokens(360, 640, 0, 0, 20)


# -- cache writes of OpenAI's breakpoint models (gpt-5.6 and later) ------------------------

OPENAI_WRITES_USAGE = {
    "prompt_tokens": 3000,
    "completion_tokens": 5,
    "total_tokens": 3005,
    "prompt_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 1500},
}


def test_openai_cache_writes_are_billed_as_writes_beside_the_reads() -> None:
    assert parse_input_tokens(OPENAI_WRITES_USAGE) == InputTokens(476, 1024, 1500, 0, 5)
    assert parse_input_tokens({"usage": OPENAI_WRITES_USAGE}).prompt_tokens == 3000
    assert parse_cache_usage(OPENAI_WRITES_USAGE) == CacheUsage(1024, 3000)


def test_the_openai_sdks_chat_completion_carries_cache_write_tokens() -> None:
    pytest.importorskip("openai")
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion

    usage = CompletionUsage.model_validate(OPENAI_WRITES_USAGE)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cache_write_tokens == 1500  # a field of the SDK
    response = ChatCompletion.model_validate(
        {"id": "r", "choices": [], "created": 0, "model": "gpt-5.6-terra"}
        | {"object": "chat.completion", "usage": OPENAI_WRITES_USAGE}
    )
    assert parse_input_tokens(usage) == InputTokens(476, 1024, 1500, 0, 5)
    assert parse_input_tokens(response) == InputTokens(476, 1024, 1500, 0, 5)


def test_the_openai_responses_api_reports_cache_writes_too() -> None:
    pytest.importorskip("openai")
    from openai.types.responses import Response, ResponseUsage

    usage = ResponseUsage.model_validate(
        {
            "input_tokens": 1000,
            "input_tokens_details": {"cached_tokens": 640, "cache_write_tokens": 300},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 1020,
        }
    )
    response = Response.model_construct(id="r", output=[], usage=usage)
    assert parse_input_tokens(usage) == InputTokens(60, 640, 300, 0, 20)
    assert parse_input_tokens(response) == InputTokens(60, 640, 300, 0, 20)


def test_litellm_writes_mirrored_in_cache_write_tokens_keep_their_1_hour_split() -> None:
    report = {
        "prompt_tokens": 2000,
        "prompt_tokens_details": {
            "cached_tokens": 1000,
            "cache_write_tokens": 800,
            "cache_creation_token_details": {
                "ephemeral_5m_input_tokens": 300,
                "ephemeral_1h_input_tokens": 500,
            },
        },
        "cache_creation_input_tokens": 800,
    }
    assert parse_input_tokens(report) == InputTokens(200, 1000, 300, 500)


@pytest.mark.parametrize(
    "report",
    [
        {
            "prompt_tokens": 1000,
            "prompt_tokens_details": {"cached_tokens": 640, "cache_write_tokens": 361},
        },
        {
            "prompt_tokens": 1000,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": -1},
        },
        {
            "prompt_tokens": 1000,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 9.0},
        },
        {
            "input_tokens": 1000,
            "input_tokens_details": {"cached_tokens": 640, "cache_write_tokens": 361},
        },
    ],
)
def test_openai_writes_that_do_not_fit_the_prompt_are_refused(report: object) -> None:
    with pytest.raises(InvalidInputError, match="cache_write_tokens"):
        parse_input_tokens(report)


@pytest.mark.parametrize(
    "report",
    [
        {"prompt_tokens": 1000, "completion_tokens": 20},
        {"prompt_tokens": 1000, "prompt_tokens_details": None},
        {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": None}},
        {"input_tokens": 1000, "input_token_details": {"audio": 3}},
        {"usage": None},
        lambda: _ai_message(content="x"),  # built in the test: it may skip
        None,
        "640/1000",
    ],
)
def test_a_report_without_cache_information_is_refused_naming_the_fields(report: object) -> None:
    report = report() if callable(report) else report
    with pytest.raises(InvalidInputError, match=r"cached_tokens.*cache_n.*cache_read"):
        parse_cache_usage(report)
    with pytest.raises(InvalidInputError, match=r"cached_tokens.*cache_n.*cache_read"):
        parse_input_tokens(report)  # never "nothing cached"


def test_langchains_empty_input_token_details_is_no_cache_information() -> None:
    """``ChatOpenAI`` against an engine that reports no cached tokens (vLLM without
    ``--enable-prompt-tokens-details``) writes ``input_token_details: {}``: neither
    reader takes that as nothing cached."""
    usage = {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}
    report = {**usage, "input_token_details": {}, "output_token_details": {}}
    for parse in (parse_cache_usage, parse_input_tokens):
        with pytest.raises(InvalidInputError, match="cache_read"):
            parse(report)


@pytest.mark.parametrize(
    "report",
    [
        {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": -1}},
        {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 640.0}},
        {"prompt_tokens": "1000", "prompt_tokens_details": {"cached_tokens": 640}},
        {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": True}},
        {"prompt_tokens": 600, "prompt_tokens_details": {"cached_tokens": 640}},
        {"prompt_tokens_details": {"cached_tokens": 640}},
        {"cache_n": 640},
        {"cache_n": 640, "prompt_n": -5},
        {"cache_read_input_tokens": 640, "input_tokens": 300, "cache_creation_input_tokens": 1.5},
        {"cached_content_token_count": 640},
    ],
)
def test_bad_counts_are_refused(report: object) -> None:
    with pytest.raises(InvalidInputError):
        parse_cache_usage(report)


def _docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(text=f"Document {n}: " + f"{n} facts. " * 40, id=n) for n in names]


def _shared_prefix_pilot(pilot: ContextPilot) -> object:
    pilot.optimize(_docs("a", "b", "c"), "Q1?")
    second = pilot.optimize(_docs("a", "b", "d"), "Q2?")
    pilot.optimize(_docs("x", "y"), "Q3?")
    assert second.stats.blocks_matched == 2 and pilot.index_stats().requests == 3
    return second


@pytest.mark.parametrize(
    "shape", ["openai response", "llama-server timings", "langchain", "anthropic", "gemini"]
)
def test_observe_evicts_like_observe_cache_on_the_same_numbers(
    pilot: ContextPilot, shape: str
) -> None:
    second = _shared_prefix_pilot(pilot)
    reports = {  # 10 of 1000 served: predicted a hit, got none
        "openai response": {
            "usage": {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 10}}
        },
        "llama-server timings": {"cache_n": 10, "prompt_n": 990},
        "anthropic": {"input_tokens": 990, "cache_read_input_tokens": 10},
        "gemini": {"prompt_token_count": 1000, "cached_content_token_count": 10},
    }
    if shape == "langchain":
        reports[shape] = _ai_message(
            content="x",
            usage_metadata={
                "input_tokens": 1000,
                "output_tokens": 1,
                "total_tokens": 1001,
                "input_token_details": {"cache_read": 10},
            },
        )
    twin = ContextPilot(tokenizer=pilot.tokenizer)
    twin_second = _shared_prefix_pilot(twin)
    assert pilot.observe(second, reports[shape]) == twin.observe_cache(twin_second, 10, 1000) == 1
    assert pilot.index_stats() == twin.index_stats()
    assert pilot.index_stats().requests == 2


def test_observe_leaves_the_index_alone_when_served_as_predicted(pilot: ContextPilot) -> None:
    second = _shared_prefix_pilot(pilot)
    assert pilot.observe(second, {"cache_n": 900, "prompt_n": 100}) == 0
    assert pilot.index_stats().requests == 3


def test_observe_refuses_a_report_without_cache_information_and_changes_nothing(
    pilot: ContextPilot,
) -> None:
    second = _shared_prefix_pilot(pilot)
    before = pilot.index_stats()
    with pytest.raises(InvalidInputError, match="looked for"):
        pilot.observe(second, {"prompt_tokens": 1000, "completion_tokens": 5})
    with pytest.raises(InvalidInputError):
        pilot.observe(second, {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}})
    with pytest.raises(InvalidInputError):
        pilot.observe("not a prompt", OPENAI_USAGE)  # type: ignore[arg-type]
    assert pilot.index_stats() == before


def test_gemini_omits_a_zero_cached_count_so_its_absence_is_zero() -> None:
    assert parse_cache_usage({"prompt_token_count": 1000}) == CacheUsage(0, 1000)
    assert parse_cache_usage({"usageMetadata": {"promptTokenCount": 7}}) == CacheUsage(0, 7)


# -- what carries a report: SDK, LangChain and LlamaIndex objects -------------------------

LANGCHAIN_USAGE = {
    "input_tokens": 1000,
    "output_tokens": 20,
    "total_tokens": 1020,
    "input_token_details": {"cache_read": 640},
}


def test_a_langchain_llm_result_is_read_through_its_generation_or_llm_output() -> None:
    message = _ai_message(content="x", usage_metadata=LANGCHAIN_USAGE)
    from langchain_core.outputs import ChatGeneration, LLMResult

    generation = ChatGeneration(message=message)
    assert parse_cache_usage(generation) == CacheUsage(640, 1000)
    assert parse_cache_usage(LLMResult(generations=[[generation]])) == CacheUsage(640, 1000)
    bare = LLMResult(
        generations=[[ChatGeneration(message=_ai_message(content="x"))]],
        llm_output={"token_usage": OPENAI_USAGE, "model_name": "m"},
    )
    assert parse_cache_usage(bare) == CacheUsage(640, 1000)


def test_a_langchain_message_is_read_through_its_response_metadata_token_usage() -> None:
    message = _ai_message(content="x", response_metadata={"token_usage": OPENAI_USAGE})
    assert parse_cache_usage(message) == CacheUsage(640, 1000)


def test_an_llm_result_of_several_prompts_is_not_read_from_one_of_them() -> None:
    message = _ai_message(content="x", usage_metadata=LANGCHAIN_USAGE)
    from langchain_core.outputs import ChatGeneration, LLMResult

    generation = ChatGeneration(message=message)
    with pytest.raises(InvalidInputError, match="looked for"):
        parse_cache_usage(LLMResult(generations=[[generation], [generation]]))


def test_llama_index_responses_are_read_through_raw_or_additional_kwargs() -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse
    from openai.types.chat import ChatCompletion

    completion = ChatCompletion.model_validate(
        {"id": "r", "choices": [], "created": 0, "model": "m", "object": "chat.completion"}
        | {"usage": OPENAI_USAGE}
    )
    message = ChatMessage(role="assistant", content="x")
    routed_facts = {"prompt_tokens": 1000, "cached_tokens": 640, "endpoint": "http://e/v1"}
    for response in (
        ChatResponse(message=message, raw=completion),  # OpenAI / OpenAILike
        ChatResponse(message=message, raw={"usage": OPENAI_USAGE}),  # ContextPilotLLM
        ChatResponse(message=message, additional_kwargs=routed_facts),
        CompletionResponse(text="x", raw=completion),
        CompletionResponse(text="x", additional_kwargs=routed_facts),
    ):
        assert parse_cache_usage(response) == CacheUsage(640, 1000), response
    without = ChatResponse(message=message, additional_kwargs={"prompt_tokens": 1000})
    with pytest.raises(InvalidInputError, match="looked for"):
        parse_cache_usage(without)


def test_a_cache_usage_reads_as_itself() -> None:
    assert parse_cache_usage(CacheUsage(3, 7)) == CacheUsage(3, 7)


def test_a_report_nested_deeper_than_the_carriers_reach_is_not_found() -> None:
    deep = {"raw": {"raw": {"raw": {"usage": OPENAI_USAGE}}}}
    with pytest.raises(InvalidInputError, match="looked for"):
        parse_cache_usage(deep)


def test_a_self_referencing_report_is_read_once() -> None:
    looping: dict[str, object] = {"prompt_tokens": 5}
    looping["raw"] = looping
    with pytest.raises(InvalidInputError, match="looked for"):
        parse_cache_usage(looping)


# -- the plain OpenAI SDK, against the loopback engine -------------------------------------


def test_the_openai_sdk_two_liner_feeds_the_engines_cache_truth_to_the_pilot(
    pilot: ContextPilot,
) -> None:
    openai = pytest.importorskip("openai")
    from contextpilot_rag.testing import OpenAICompatibleServer

    with OpenAICompatibleServer() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        first = pilot.optimize(_docs("a", "b", "c"), "Q1?")
        pilot.observe(first, client.chat.completions.create(model="m", messages=first.to_openai()))
        server.cache.reset()  # the engine drops what it held
        second = pilot.optimize(_docs("a", "b", "d"), "Q2?")
        assert second.stats.blocks_matched == 2  # predicted: a and b are cached
        response = client.chat.completions.create(model="m", messages=second.to_openai())
        assert response.usage.prompt_tokens_details.cached_tokens == 0
        assert pilot.observe(second, response) == 1  # the first request is evicted

        third = pilot.optimize(_docs("c", "b", "a"), "Q3?")
        stream = client.chat.completions.create(
            model="m",
            messages=third.to_openai(),
            stream=True,
            stream_options={"include_usage": True},
        )
        *_, last = stream  # the last chunk carries the usage
        assert pilot.observe(third.request_id, last) == 0
    assert pilot.index_stats().requests == 2
