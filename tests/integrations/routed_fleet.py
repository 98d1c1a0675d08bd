"""What the framework models over ``RoutingClient`` are asked, and how their fleet is
checked (the fixtures that start the fleet are in conftest.py)."""

from __future__ import annotations

from contextpilot_rag.routing import RoutingClient
from contextpilot_rag.testing import OpenAICompatibleServer

SERVER_NAMES = ("a", "b", "c")
CONTEXT = "\n\n".join(f"[doc{i}]\n" + f"Document {i} is about topic {i}. " * 40 for i in range(4))


def reply_of(name: str) -> str:
    """What server ``name`` answers: six words, streamed one word per delta."""
    return f"answer from server {name} in words"


def question(text: str = "Which topic comes first?") -> list[dict[str, str]]:
    """A long shared context (about 1,200 tokens) and a short question."""
    return [
        {"role": "system", "content": "Answer from the documents."},
        {"role": "user", "content": f"{CONTEXT}\n\n{text}"},
    ]


def idle(client: RoutingClient) -> bool:
    """No request in flight or queued on any endpoint."""
    return all(r.in_flight == 0 and r.queued_tokens == 0 for r in client.replicas)


def served_by(fleet: list[OpenAICompatibleServer]) -> dict[str, int]:
    """Base URL → how many completion requests that server answered."""
    return {server.base_url: len(server.requests) for server in fleet}


# An engine's streamed tool calls, split as engines split them: id and name first, then
# pieces of the arguments; the second call's arguments are not JSON.
TOOL_DELTAS = [
    {"role": "assistant", "content": None},
    {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "look"}}]},
    {"tool_calls": [{"index": 0, "function": {"name": "up", "arguments": '{"q": '}}]},
    {"tool_calls": [{"index": 1, "id": "c2", "type": "function", "function": {"name": "lookup"}}]},
    {"tool_calls": [{"index": 1, "function": {"arguments": "not json"}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"cats"}'}}]},
]
