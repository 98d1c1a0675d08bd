"""The cloud emulator's HTTP surface without any SDK: provider-shaped errors that leave
the caches and the request record untouched, automatic caching, 1-hour TTLs over
simulated time, OpenAI's ``prompt_cache_retention``. (The SDK-driven tests are in
tests/integrations/test_cloud_emulator.py.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.sim import OpenAICacheRules
from contextpilot_rag.testing.cloud_server import CloudCacheServer, cache_control_paths

if TYPE_CHECKING:
    from conftest import FakeClock

LONG = "Retrieved passage about prefix caching and context reuse. " * 200
USER_HI = {"role": "user", "content": "Hi"}
HEADERS = {"x-api-key": "test", "anthropic-version": "2023-06-01"}


@pytest.fixture
def server(clock: FakeClock) -> Iterator[CloudCacheServer]:
    """The emulator on simulated time: ``clock`` (tests/conftest.py) moves only when told."""
    with CloudCacheServer(clock=clock) as emulator:
        yield emulator


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def message(server: CloudCacheServer, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": "claude-test", "max_tokens": 16, **fields}
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return post(f"{server.anthropic_base_url}/v1/messages", body, HEADERS)


def marked_system(cache_control: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": LONG, "cache_control": cache_control}]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"system": marked_system({"type": "ephemeral", "ttl": "2h"})}, "'5m' or '1h'"),
        ({"system": marked_system({"type": "persistent"})}, "'ephemeral'"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"messages": [USER_HI, {"role": "assistant", "content": []}, USER_HI]}, "non-empty"),
        ({"messages": [{"role": "user", "content": ""}]}, "non-empty content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": " \n"}]}]},
            "non-whitespace text",
        ),
        (
            {"system": [{"type": "text", "text": "", "cache_control": {"type": "ephemeral"}}]},
            "cache_control cannot be set for empty text blocks",
        ),
        (
            {
                "system": [
                    {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                    {
                        "type": "text",
                        "text": "b",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    },
                ]
            },
            "longer ttl",
        ),
    ],
)
def test_a_bad_messages_request_is_an_anthropic_invalid_request_error(
    server: CloudCacheServer, fields: dict[str, Any], says: str
) -> None:
    status, body = message(server, **fields)
    assert status == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert says in body["error"]["message"]
    assert server.requests == [] and server.anthropic_cache.cached_prefixes == 0


def test_a_final_assistant_message_may_be_empty(server: CloudCacheServer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": []}]
    status, _ = message(server, messages=messages)
    assert status == 200


def test_a_messages_request_without_a_key_is_an_authentication_error(
    server: CloudCacheServer,
) -> None:
    url = f"{server.anthropic_base_url}/v1/messages"
    status, body = post(url, {"model": "m", "max_tokens": 1, "messages": []}, {})
    assert (status, body["error"]["type"]) == (401, "authentication_error")


def test_top_level_cache_control_marks_the_last_block(server: CloudCacheServer) -> None:
    messages = [{"role": "user", "content": LONG}]
    message(server, messages=messages, cache_control={"type": "ephemeral"})
    status, body = message(server, messages=messages, cache_control={"type": "ephemeral"})
    assert status == 200 and body["usage"]["cache_read_input_tokens"] >= 1024
    assert server.requests[0].cache_control_paths == ["cache_control"]


def test_a_1_hour_breakpoint_survives_5_minutes(server: CloudCacheServer, clock: FakeClock) -> None:
    system = marked_system({"type": "ephemeral", "ttl": "1h"})
    _, first = message(server, system=system)
    clock.advance(1800)
    _, second = message(server, system=system)
    written = first["usage"]["cache_creation"]["ephemeral_1h_input_tokens"]
    assert written >= 1024 and second["usage"]["cache_read_input_tokens"] == written


def test_an_unknown_retention_is_an_openai_error(server: CloudCacheServer) -> None:
    body = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": LONG}],
        "prompt_cache_retention": "1w",
    }
    status, answer = post(
        f"{server.openai_base_url}/chat/completions", body, {"authorization": "Bearer t"}
    )
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert server.requests == []


def test_24h_retention_outlives_the_in_memory_lifetime(
    server: CloudCacheServer, clock: FakeClock
) -> None:
    url = f"{server.openai_base_url}/chat/completions"
    body = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": LONG}],
        "prompt_cache_retention": "24h",
    }
    post(url, body, {"authorization": "Bearer t"})
    clock.advance(7200)
    _, answer = post(url, body, {"authorization": "Bearer t"})
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1024


@pytest.mark.parametrize(("default", "cached"), [("in_memory", False), ("24h", True)])
def test_a_request_naming_no_retention_takes_the_rules_default(
    clock: FakeClock, default: Literal["in_memory", "24h"], cached: bool
) -> None:
    rules = OpenAICacheRules(default_retention=default)
    with CloudCacheServer(clock=clock, openai_rules=rules) as emulator:
        url = f"{emulator.openai_base_url}/chat/completions"
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": LONG}]}
        post(url, body, {"authorization": "Bearer t"})
        clock.advance(600)
        _, answer = post(url, body, {"authorization": "Bearer t"})
    assert (answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1024) is cached


def test_an_unknown_default_retention_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        OpenAICacheRules(default_retention="1h")  # type: ignore[arg-type]


def test_cache_control_paths_cover_tools_system_messages_and_top_level() -> None:
    marker = {"cache_control": {"type": "ephemeral"}}
    body = {
        "tools": [{"name": "t"}, {"name": "u", **marker}],
        "system": [{"type": "text", "text": "s", **marker}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "q", **marker}]}],
        **marker,
    }
    assert cache_control_paths(body) == [
        "tools[1]",
        "system[0]",
        "messages[0].content[0]",
        "cache_control",
    ]


def test_bad_server_configuration_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        CloudCacheServer(port=-1)
    with pytest.raises(ConfigError):
        CloudCacheServer(answer="")
