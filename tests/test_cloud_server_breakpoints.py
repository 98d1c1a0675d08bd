"""The cloud emulator's gpt-5.6 models, driven by the official ``openai`` SDK (the new
fields through ``extra_body`` and ``getattr``, so that the oldest SDK the ``cloud``
extra allows runs them too, as the lowest-bounds run does): explicit
``prompt_cache_breakpoint`` markers and ``prompt_cache_options`` reach the breakpoint
cache, the usage reports ``cache_write_tokens`` beside ``cached_tokens`` (streamed or
not) and reads back through ``parse_input_tokens``; the requests OpenAI refuses are
400s that change nothing; other models behave as before. Offline: loopback only,
simulated time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from contextpilot_rag.testing.cloud_server import DEFAULT_ANSWER, CloudCacheServer
from contextpilot_rag.tokenizers import Tokenizer
from contextpilot_rag.usage import InputTokens, parse_input_tokens

if TYPE_CHECKING:
    from conftest import FakeClock

openai = pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[dev]')")

TERRA = "gpt-5.6-terra"
LONG = "Retrieved passage about prefix caching and context reuse. " * 200  # > 1,024 tokens
EXPLICIT = {"mode": "explicit"}


@pytest.fixture
def server(clock: FakeClock) -> Iterator[CloudCacheServer]:
    """The emulator on simulated time: ``clock`` (tests/conftest.py) moves only when told."""
    with CloudCacheServer(clock=clock) as emulator:
        yield emulator


@pytest.fixture
def gpt(server: CloudCacheServer) -> Any:
    return openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)


def system(marker: dict[str, Any] | None) -> dict[str, Any]:
    """The long system prompt as one text part, carrying ``marker`` if given."""
    part: dict[str, Any] = {"type": "text", "text": LONG}
    if marker is not None:
        part["prompt_cache_breakpoint"] = marker
    return {"role": "system", "content": [part]}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def split(response: Any) -> tuple[int, int, int]:
    """(prompt_tokens, cached_tokens, cache_write_tokens) as the SDK reads them."""
    usage = response.usage
    details = usage.prompt_tokens_details
    return usage.prompt_tokens, details.cached_tokens, getattr(details, "cache_write_tokens", None)


def test_an_explicit_breakpoint_is_written_then_read_by_the_next_turn(
    gpt: Any, server: CloudCacheServer, tokenizer: Tokenizer
) -> None:
    long, first_q, answer, second_q = (
        tokenizer.count(text) for text in (LONG, "What is A?", "It is a.", "And B?")
    )
    turn_1 = [system(EXPLICIT), user("What is A?")]
    first = gpt.chat.completions.create(
        model=TERRA,
        messages=turn_1,
        extra_body={"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}},
    )
    turn_2 = [*turn_1, {"role": "assistant", "content": "It is a."}, user("And B?")]
    second = gpt.chat.completions.create(
        model=TERRA, messages=turn_2, extra_body={"prompt_cache_options": {"mode": "explicit"}}
    )
    assert long >= 1024
    assert split(first) == (long + first_q, 0, long)
    assert split(second) == (long + first_q + answer + second_q, long, 0)
    rest = first_q + answer + second_q
    answered = tokenizer.count(DEFAULT_ANSWER)
    assert parse_input_tokens(second) == InputTokens(rest, long, 0, 0, answered)
    assert server.requests[0].body["messages"][0]["content"][0]["prompt_cache_breakpoint"] == {
        "mode": "explicit"
    }
    assert server.requests[1].usage["prompt_tokens_details"]["cache_write_tokens"] == 0


def test_implicit_mode_without_markers_writes_the_whole_prompt_each_turn(
    gpt: Any, tokenizer: Tokenizer
) -> None:
    long, question = tokenizer.count(LONG), tokenizer.count("What is A?")
    first = gpt.chat.completions.create(model=TERRA, messages=[system(None), user("What is A?")])
    second = gpt.chat.completions.create(model=TERRA, messages=[system(None), user("What is C?")])
    assert split(first) == (long + question, 0, long + question)
    assert split(second) == (long + question, 0, long + question)  # the gpt-5.6 pitfall
    answered = tokenizer.count(DEFAULT_ANSWER)
    assert parse_input_tokens(second) == InputTokens(0, 0, long + question, 0, answered)


def test_a_marked_system_prompt_in_implicit_mode_is_read_under_a_new_question(
    gpt: Any, tokenizer: Tokenizer
) -> None:
    long, question = tokenizer.count(LONG), tokenizer.count("What is A?")
    gpt.chat.completions.create(model=TERRA, messages=[system(EXPLICIT), user("What is A?")])
    second = gpt.chat.completions.create(
        model=TERRA, messages=[system(EXPLICIT), user("What is C?")]
    )
    assert split(second) == (long + question, long, question)


def test_a_streamed_answer_reports_the_writes_in_its_usage_chunk(
    gpt: Any, tokenizer: Tokenizer
) -> None:
    stream = gpt.chat.completions.create(
        model=TERRA,
        messages=[system(EXPLICIT), user("What is A?")],
        extra_body={"prompt_cache_options": {"mode": "explicit"}},
        stream=True,
        stream_options={"include_usage": True},
    )
    *_, last = stream
    long = tokenizer.count(LONG)
    assert split(last) == (long + tokenizer.count("What is A?"), 0, long)
    assert parse_input_tokens(last).cache_write_5m_tokens == long


def test_a_dated_release_uses_the_breakpoint_cache_and_an_older_model_does_not(
    gpt: Any, server: CloudCacheServer, tokenizer: Tokenizer
) -> None:
    messages = [system(None), user("What is A?")]
    dated = gpt.chat.completions.create(model="gpt-5.6-luna-2026-05-13", messages=messages)
    older = gpt.chat.completions.create(model="gpt-4o", messages=messages)
    assert (
        getattr(dated.usage.prompt_tokens_details, "cache_write_tokens", None)
        == dated.usage.prompt_tokens
    )
    assert getattr(older.usage.prompt_tokens_details, "cache_write_tokens", None) is None
    assert "cache_write_tokens" not in server.requests[1].usage["prompt_tokens_details"]
    assert server.openai_breakpoint_cache.cached_prefixes == 1


def test_reset_empties_the_breakpoint_cache(gpt: Any, server: CloudCacheServer) -> None:
    messages = [system(EXPLICIT), user("What is A?")]
    gpt.chat.completions.create(model=TERRA, messages=messages)
    server.reset()
    again = gpt.chat.completions.create(model=TERRA, messages=messages)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert len(server.requests) == 1


MARKED_ASSISTANT = [
    user("Hi"),
    {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello", "prompt_cache_breakpoint": EXPLICIT}],
    },
    user("What is A?"),
]


@pytest.mark.parametrize(
    ("model", "messages", "options", "says"),
    [
        (TERRA, [system(None), user("Q")], {"ttl": "24h"}, "prompt_cache_options.ttl"),
        (TERRA, [system(None), user("Q")], {"ttl": ["30m"]}, "prompt_cache_options.ttl"),
        (TERRA, [system(None), user("Q")], {"mode": "auto"}, "prompt_cache_options.mode"),
        (TERRA, [system(None), user("Q")], {"retention": "1h"}, "prompt_cache_options"),
        (
            TERRA,
            [system({"mode": "implicit"}), user("Q")],
            None,
            "messages[0].content[0].prompt_cache_breakpoint",
        ),
        (TERRA, MARKED_ASSISTANT, None, "assistant messages"),
        ("gpt-4o", [system(None), user("Q")], {"mode": "explicit"}, "'gpt-4o'"),
        ("gpt-5.6", [system(EXPLICIT), user("Q")], None, "not supported with the model"),
    ],
)
def test_requests_openai_refuses_are_400s_that_change_nothing(
    gpt: Any,
    server: CloudCacheServer,
    model: str,
    messages: list[dict[str, Any]],
    options: dict[str, Any] | None,
    says: str,
) -> None:
    explicit = {"mode": "explicit"}
    gpt.chat.completions.create(
        model=TERRA,
        messages=[system(EXPLICIT), user("Q")],
        extra_body={"prompt_cache_options": explicit},
    )
    extra = {} if options is None else {"extra_body": {"prompt_cache_options": options}}
    with pytest.raises(openai.BadRequestError, match=re.escape(says)) as caught:
        gpt.chat.completions.create(model=model, messages=messages, **extra)
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "invalid_request_error"
    assert len(server.requests) == 1
    assert server.openai_breakpoint_cache.cached_prefixes == 1
