"""The official SDKs send the pilot's provider-shaped requests as designed: the
Anthropic SDK's ``messages.create(**prompt.to_anthropic())`` and the OpenAI SDK's
``chat.completions.create(**prompt.to_openai_request())`` put the content blocks,
``cache_control`` markers and ``prompt_cache_key`` on the wire (captured by an httpx
mock transport: no network), and the usage they return feeds ``pilot.observe``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Tokenizer
from contextpilot_rag.cloud import CloudCacheConfig

httpx = pytest.importorskip("httpx")

ANTHROPIC_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 20,
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    },
}


def _docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(f"Document {n}. " + f"{n} fact. " * 300, id=n) for n in names]


def _recording(reply: dict[str, Any], sent: list[dict[str, Any]], http: Any = httpx) -> Any:
    """An ``http`` (httpx, or httpx2 for SDKs built on it) client that records each
    request body and answers ``reply``."""

    def handle(request: Any) -> Any:
        sent.append(json.loads(request.content))
        return http.Response(200, json=reply)

    return http.Client(transport=http.MockTransport(handle))


def _uses_httpx2(sdk: Any) -> bool:
    return "httpx2" in getattr(sdk._base_client, "__dict__", {})


@pytest.fixture
def cloud_pilot(tokenizer: Tokenizer) -> ContextPilot:
    return ContextPilot(
        PilotConfig(system_prompt="Rules. " * 1200, cloud=CloudCacheConfig(enabled=True)),
        tokenizer=tokenizer,
    )


def test_the_anthropic_sdk_sends_blocks_and_markers_and_usage_comes_back(
    cloud_pilot: ContextPilot,
) -> None:
    anthropic = pytest.importorskip("anthropic")
    http = pytest.importorskip("httpx2") if _uses_httpx2(anthropic) else httpx
    sent: list[dict[str, Any]] = []
    client = anthropic.Anthropic(
        api_key="test",
        base_url="http://anthropic.test",
        http_client=_recording(ANTHROPIC_REPLY, sent, http),
    )
    cloud_pilot.optimize(_docs("a", "b", "c"), "Q1?")
    prompt = cloud_pilot.optimize(_docs("a", "b", "d"), "Q2?")
    response = client.messages.create(
        model="claude-sonnet-4-6", max_tokens=16, **prompt.to_anthropic()
    )
    (body,) = sent
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    parts = body["messages"][0]["content"]
    assert [part.get("cache_control") for part in parts] == [
        None,
        {"type": "ephemeral"},
        None,
        None,
    ]
    assert "".join(part["text"] for part in parts) == prompt.messages[-1]["content"]
    assert cloud_pilot.observe(prompt, response) == 1  # predicted a and b cached; none served


def test_the_openai_sdk_sends_the_cache_key(cloud_pilot: ContextPilot) -> None:
    openai = pytest.importorskip("openai")
    reply = {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-5.1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 3000,
            "completion_tokens": 1,
            "total_tokens": 3001,
            "prompt_tokens_details": {"cached_tokens": 2944},
        },
    }
    sent: list[dict[str, Any]] = []
    client = openai.OpenAI(
        api_key="test", base_url="http://openai.test/v1", http_client=_recording(reply, sent)
    )
    prompt = cloud_pilot.optimize(_docs("a"), "Q?")
    response = client.chat.completions.create(model="gpt-5.1", **prompt.to_openai_request())
    (body,) = sent
    assert body["prompt_cache_key"] == prompt.prompt_cache_key
    assert body["messages"] == prompt.to_openai()
    assert cloud_pilot.observe(prompt, response) == 0
