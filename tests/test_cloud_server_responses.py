"""The cloud emulator's OpenAI Responses endpoint (``POST /v1/responses``), driven by the
official ``openai`` SDK's ``responses.create`` (``prompt_cache_options`` through
``extra_body`` and ``cache_write_tokens`` through ``getattr``, so that the oldest SDK
the ``cloud`` extra allows runs them too, as the lowest-bounds run does): a request is
cached exactly as the same conversation sent to Chat Completions, the ``gpt-5.6``
models at their breakpoints and the older ones automatically; the answer is a Response
object whose usage reads back through ``parse_input_tokens``; the requests the endpoint
refuses are 400s that record nothing. Offline: loopback only, simulated time."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from contextpilot_rag.testing.cloud_server import DEFAULT_ANSWER, CloudCacheServer
from contextpilot_rag.tokenizers import Tokenizer
from contextpilot_rag.usage import InputTokens, parse_input_tokens

if TYPE_CHECKING:
    from conftest import FakeClock, MarkedParts

openai = pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[dev]')")
if not hasattr(openai.OpenAI, "responses"):
    pytest.skip(
        f"openai {openai.__version__} has no Responses API (client.responses)",
        allow_module_level=True,
    )

TERRA = "gpt-5.6-terra"
OLDER = "gpt-5.4"
LONG = "Retrieved passage about prefix caching and context reuse. " * 200  # > 1,024 tokens
EXPLICIT = {"mode": "explicit"}
EXPLICIT_MODE = {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}
IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}


@pytest.fixture
def server(clock: FakeClock) -> Iterator[CloudCacheServer]:
    """The emulator on simulated time (``clock``: tests/conftest.py)."""
    with CloudCacheServer(clock=clock) as emulator:
        yield emulator


def message(role: str, text: str, marker: dict[str, Any] | None = None) -> dict[str, Any]:
    """A message item of one text part (``output_text`` for the assistant, else
    ``input_text``), carrying ``marker`` if given."""
    kind = "output_text" if role == "assistant" else "input_text"
    part: dict[str, Any] = {"type": kind, "text": text}
    if marker is not None:
        part["prompt_cache_breakpoint"] = marker
    return {"type": "message", "role": role, "content": [part]}


def system(marker: dict[str, Any] | None) -> dict[str, Any]:
    return message("system", LONG, marker)


def user(text: str) -> dict[str, Any]:
    return message("user", text)


def assistant(text: str, marker: dict[str, Any] | None = None) -> dict[str, Any]:
    return message("assistant", text, marker)


@pytest.fixture
def gpt(server: CloudCacheServer) -> Any:
    """The official client, without retries (a 400 is seen once)."""
    return openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)


def split(response: Any) -> tuple[int, int, int | None]:
    """(input_tokens, cached_tokens, cache_write_tokens) as the SDK reads them."""
    return split_of(response.usage.input_tokens, response.usage.input_tokens_details)


def split_of(prompt_tokens: int, details: Any) -> tuple[int, int, int | None]:
    return prompt_tokens, details.cached_tokens, getattr(details, "cache_write_tokens", None)


def test_an_explicit_breakpoint_is_written_then_read_by_the_next_request(
    gpt: Any, server: CloudCacheServer, tokenizer: Tokenizer
) -> None:
    turn_1 = [system(EXPLICIT), user("What is A?")]
    first = gpt.responses.create(model=TERRA, input=turn_1, extra_body=EXPLICIT_MODE)
    turn_2 = [*turn_1, assistant("It is a."), user("And B?")]
    second = gpt.responses.create(model=TERRA, input=turn_2, extra_body=EXPLICIT_MODE)
    long = tokenizer.count(LONG)
    assert long >= 1024
    assert split(first) == (long + tokenizer.count("What is A?"), 0, long)
    rest = sum(tokenizer.count(text) for text in ("What is A?", "It is a.", "And B?"))
    assert split(second) == (long + rest, long, 0)
    assert [request.api for request in server.requests] == ["openai-responses"] * 2
    assert server.requests[1].usage["input_tokens_details"] == {
        "cached_tokens": long,
        "cache_write_tokens": 0,
    }


def test_the_usage_parses_into_uncached_read_and_written_tokens_that_add_up(
    gpt: Any, tokenizer: Tokenizer
) -> None:
    gpt.responses.create(model=TERRA, input=[system(EXPLICIT), user("What is A?")])
    response = gpt.responses.create(model=TERRA, input=[system(EXPLICIT), user("What is C?")])
    long, question = tokenizer.count(LONG), tokenizer.count("What is C?")
    parsed = parse_input_tokens(response)
    assert parsed == InputTokens(0, long, question, 0, tokenizer.count(DEFAULT_ANSWER))
    assert parse_input_tokens(response.usage) == parsed
    assert parsed.prompt_tokens == response.usage.input_tokens


def test_the_answer_is_a_completed_response_object(gpt: Any) -> None:
    response = gpt.responses.create(model=TERRA, input="What is A?")
    assert response.id.startswith("resp_")
    assert (response.object, response.model, response.status) == ("response", TERRA, "completed")
    [item] = response.output
    assert (item.type, item.role, item.status) == ("message", "assistant", "completed")
    assert item.id.startswith("msg_")
    assert response.output_text == DEFAULT_ANSWER
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_max_output_tokens_cuts_the_answer_to_whole_words_and_marks_it_incomplete(
    gpt: Any, tokenizer: Tokenizer
) -> None:
    response = gpt.responses.create(model=TERRA, input="What is A?", max_output_tokens=2)
    assert response.output_text == "Emulated"
    assert response.usage.output_tokens == tokenizer.count("Emulated") <= 2
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * len(DEFAULT_ANSWER.split()),
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_a_streamed_answer_is_the_apis_events_and_its_last_carries_the_same_usage(
    gpt: Any, server: CloudCacheServer
) -> None:
    conversation = [system(EXPLICIT), user("What is A?")]
    plain = gpt.responses.create(model=TERRA, input=conversation)
    server.reset()
    events = list(gpt.responses.create(model=TERRA, input=conversation, stream=True))
    assert [event.type for event in events] == [*STREAM_EVENTS, "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.usage is None
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == DEFAULT_ANSWER
    done = events[-1].response
    assert done.id == events[0].response.id and done.output[0].id == events[2].item.id
    assert done.output_text == DEFAULT_ANSWER and done.status == "completed"
    assert split(done) == split(plain)  # the cache saw the same request
    assert parse_input_tokens(done) == parse_input_tokens(plain)
    assert server.requests[0].body["stream"] is True


def test_a_streamed_answer_cut_at_max_output_tokens_ends_incomplete(gpt: Any) -> None:
    events = list(
        gpt.responses.create(model=TERRA, input="What is A?", max_output_tokens=2, stream=True)
    )
    assert [event.type for event in events][-2:] == [
        "response.output_item.done",
        "response.incomplete",
    ]
    last = events[-1].response
    assert (last.status, last.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert last.output_text == "Emulated" == events[-2].item.content[0].text


def test_the_sdks_stream_helper_assembles_the_answer_and_its_usage(gpt: Any) -> None:
    if not hasattr(gpt.responses, "stream"):
        pytest.skip(f"openai {openai.__version__} has no responses.stream helper")
    conversation = [system(EXPLICIT), user("What is A?")]
    with gpt.responses.stream(model=TERRA, input=conversation) as stream:
        text = "".join(
            event.delta for event in stream if event.type == "response.output_text.delta"
        )
        final = stream.get_final_response()
    assert text == final.output_text == DEFAULT_ANSWER
    assert split(final)[2] == final.usage.input_tokens  # the first request writes it all


def test_instructions_and_a_string_input_are_two_blocks_and_only_the_second_is_marked(
    gpt: Any, server: CloudCacheServer, tokenizer: Tokenizer
) -> None:
    long, question = tokenizer.count(LONG), tokenizer.count("What is A?")
    first = gpt.responses.create(model=TERRA, instructions=LONG, input="What is A?")
    again = gpt.responses.create(model=TERRA, instructions=LONG, input="What is A?")
    other = gpt.responses.create(model=TERRA, instructions=LONG, input="What is C?")
    assert split(first) == (long + question, 0, long + question)  # implicit: at the question
    assert split(again) == (long + question, long + question, 0)
    assert split(other) == (long + question, 0, long + question)  # nothing ends at LONG
    assert server.requests[0].body["instructions"] == LONG


def test_a_previous_answer_sent_back_as_input_is_an_assistant_message(
    gpt: Any, tokenizer: Tokenizer
) -> None:
    turn_1 = [system(EXPLICIT), user("What is A?")]
    first = gpt.responses.create(model=TERRA, input=turn_1)
    history = [item.model_dump(exclude_none=True) for item in first.output]
    second = gpt.responses.create(model=TERRA, input=[*turn_1, *history, user("And B?")])
    long, first_q, answer, second_q = (
        tokenizer.count(text) for text in (LONG, "What is A?", DEFAULT_ANSWER, "And B?")
    )
    assert history[0]["content"][0]["type"] == "output_text"
    assert split(second) == (long + first_q + answer + second_q, long + first_q, answer + second_q)


@pytest.mark.parametrize(
    "conversation",
    [
        pytest.param([system(EXPLICIT), user("What is A?")], id="system-and-user"),
        pytest.param(
            [system(EXPLICIT), user("What is A?"), assistant("It is a."), user("And B?")],
            id="two-turns",
        ),
    ],
)
def test_a_request_is_cached_as_the_same_chat_completions_request(
    gpt: Any, server: CloudCacheServer, conversation: list[dict[str, Any]]
) -> None:
    for model in (TERRA, OLDER):
        marked = model == TERRA
        messages = [as_chat(item, marked=marked) for item in conversation]
        server.reset()
        chats = [gpt.chat.completions.create(model=model, messages=messages) for _ in range(2)]
        server.reset()
        items = [as_responses(item, marked=marked) for item in conversation]
        responses = [gpt.responses.create(model=model, input=items) for _ in range(2)]
        assert [split(r) for r in responses] == [chat_split(c) for c in chats], model
        assert [parse_input_tokens(r) for r in responses] == [parse_input_tokens(c) for c in chats]


def as_chat(item: dict[str, Any], *, marked: bool) -> dict[str, Any]:
    """``item`` as a Chat Completions message: ``text`` parts, markers kept if ``marked``."""
    parts = [
        {"type": "text", "text": part["text"]} | marker_of(part, marked=marked)
        for part in item["content"]
    ]
    return {"role": item["role"], "content": parts}


def as_responses(item: dict[str, Any], *, marked: bool) -> dict[str, Any]:
    """``item`` with its markers dropped unless ``marked``."""
    parts = [
        {key: value for key, value in part.items() if key != "prompt_cache_breakpoint"}
        | marker_of(part, marked=marked)
        for part in item["content"]
    ]
    return {**item, "content": parts}


def marker_of(part: dict[str, Any], *, marked: bool) -> dict[str, Any]:
    """``part``'s breakpoint marker if it has one and ``marked``, as a field to add."""
    if marked and "prompt_cache_breakpoint" in part:
        return {"prompt_cache_breakpoint": part["prompt_cache_breakpoint"]}
    return {}


def chat_split(completion: Any) -> tuple[int, int, int | None]:
    """:func:`split` of a Chat Completions answer."""
    usage = completion.usage
    return split_of(usage.prompt_tokens, usage.prompt_tokens_details)


def test_an_older_model_is_served_by_the_automatic_cache_in_128_token_steps(
    gpt: Any, server: CloudCacheServer
) -> None:
    first = gpt.responses.create(model=OLDER, input=LONG, extra_body={"prompt_cache_key": "k"})
    second = gpt.responses.create(model=OLDER, input=LONG, extra_body={"prompt_cache_key": "k"})
    prompt = first.usage.input_tokens
    assert split(first) == (prompt, 0, None)
    assert split(second) == (prompt, 1024 + (prompt - 1024) // 128 * 128, None)
    assert "cache_write_tokens" not in server.requests[1].usage["input_tokens_details"]


@pytest.mark.parametrize(
    ("model", "request_fields", "said"),
    [
        pytest.param(
            TERRA,
            {"input": "What is A?", "extra_body": {"stream": "yes"}},
            "'stream' must be a boolean",
            id="stream-not-a-boolean",
        ),
        pytest.param(
            TERRA,
            {"input": [user("What is A?"), assistant("It is a.", EXPLICIT), user("And B?")]},
            "not supported on assistant messages",
            id="marker-on-assistant",
        ),
        pytest.param(
            OLDER,
            {"input": [system(EXPLICIT), user("What is A?")]},
            f"not supported with the model '{OLDER}'",
            id="marker-to-older-model",
        ),
        pytest.param(
            OLDER,
            {"input": "What is A?", "extra_body": EXPLICIT_MODE},
            "'prompt_cache_options' is not supported",
            id="options-to-older-model",
        ),
        pytest.param(
            TERRA,
            {"input": [{"role": "user", "content": [IMAGE]}]},
            "only text parts",
            id="image-part",
        ),
        pytest.param(
            TERRA,
            {"input": [{"type": "function_call_output", "call_id": "c1", "output": "4"}]},
            "only 'message' items",
            id="tool-output-item",
        ),
    ],
)
def test_a_refused_request_is_a_400_that_records_nothing(
    gpt: Any, server: CloudCacheServer, model: str, request_fields: dict[str, Any], said: str
) -> None:
    gpt.responses.create(model=model, input="An accepted request.")
    before = server.requests
    with pytest.raises(openai.BadRequestError, match=said):
        gpt.responses.create(model=model, **request_fields)
    assert server.requests == before


def test_a_request_without_an_api_key_is_refused(server: CloudCacheServer) -> None:
    httpx = pytest.importorskip("httpx")
    url = f"{server.openai_base_url}/responses"
    response = httpx.post(url, json={"model": TERRA, "input": "What is A?"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert server.requests == []


def test_the_pilots_responses_requests_carry_its_breakpoints_and_read_them_back(
    gpt: Any, server: CloudCacheServer, tokenizer: Tokenizer, marked_parts: MarkedParts
) -> None:
    """``responses.create(**prompt.to_openai_responses())`` on gpt-5.6: the plan's
    markers and explicit mode arrive, the next turn reads what the first wrote, and
    the usage reaches the pilot (``observe``)."""
    from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
    from contextpilot_rag.cloud import CloudCacheConfig, rules_for

    cloud = CloudCacheConfig(enabled=True, rules=rules_for("openai", TERRA), model=TERRA)
    pilot = ContextPilot(PilotConfig(system_prompt=LONG, cloud=cloud), tokenizer=tokenizer)
    docs = [ContextBlock(f"Passage {n}. " * 300, id=f"d{n}") for n in range(4)]
    usages = []
    for turn, wanted in enumerate(((0, 1), (1, 2))):
        prompt = pilot.optimize(
            [docs[n] for n in wanted], f"Question {turn}?", conversation_id="chat"
        )
        # an SDK that does not name prompt_cache_options (before 2.5x) takes it in extra_body
        named = "prompt_cache_options" in inspect.signature(gpt.responses.create).parameters
        request = prompt.to_openai_responses(extra_body=not named)
        response = gpt.responses.create(model=TERRA, **request)
        pilot.observe(prompt, response)
        pilot.record_answer(prompt, response.output_text)
        usages.append(parse_input_tokens(response))
        body = server.requests[-1].body
        assert body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
        marked = marked_parts(body)
        assert 1 <= len(marked) <= 4 and all(role != "assistant" for role, _ in marked)
    assert usages[0].cache_write_tokens > 0 and usages[0].cache_read_tokens == 0
    assert usages[1].cache_read_tokens >= usages[0].cache_write_tokens // 2
