"""Specification of parse_cache_usage and ContextPilot.observe: the engine's cache truth,
read from every usage shape an answer comes back with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage

from contextpilot_rag import ContextBlock, ContextPilot, InvalidInputError
from contextpilot_rag.usage import CacheUsage, parse_cache_usage

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


def test_a_langchain_ai_message_is_read_through_its_usage_metadata() -> None:
    message = AIMessage(content="x", usage_metadata=SHAPES["langchain usage_metadata"])  # type: ignore[arg-type]
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


@pytest.mark.parametrize(
    "report",
    [
        {"prompt_tokens": 1000, "completion_tokens": 20},
        {"prompt_tokens": 1000, "prompt_tokens_details": None},
        {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": None}},
        {"input_tokens": 1000, "input_token_details": {"audio": 3}},
        {"usage": None},
        AIMessage(content="x"),
        None,
        "640/1000",
    ],
)
def test_a_report_without_cache_information_is_refused_naming_the_fields(report: object) -> None:
    with pytest.raises(InvalidInputError, match=r"cached_tokens.*cache_n.*cache_read"):
        parse_cache_usage(report)


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
        "langchain": AIMessage(
            content="x",
            usage_metadata={
                "input_tokens": 1000,
                "output_tokens": 1,
                "total_tokens": 1001,
                "input_token_details": {"cache_read": 10},
            },
        ),
        "anthropic": {"input_tokens": 990, "cache_read_input_tokens": 10},
        "gemini": {"prompt_token_count": 1000, "cached_content_token_count": 10},
    }
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
