"""litellm_contextpilot on the real LiteLLM proxy server, as docs/integrations/litellm.md
sets it up: a callbacks module with a ``ContextPilotHook`` and a
``ContextPilotRoutingStrategy``, listed under ``litellm_settings.callbacks``, over three
loopback OpenAI-compatible engines with prefix caches; requests sent with the OpenAI
SDK, the ``contextpilot`` field in ``extra_body``. Offline: LiteLLM's bundled
model-cost map, no telemetry, no database.

The proxy is LiteLLM's ``proxy`` extra, installed by ``make test`` in an environment
of its own (``.venv-litellm-proxy``: it pins LiteLLM to the newest release whose extra
resolves, which need not be the one the rest of the suite runs); ``LITELLM_PROXY_PYTHON``
names another interpreter that has it. Without one, these tests skip, saying so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "integrations" / "litellm") not in sys.path:  # until the package is installed
    sys.path.insert(0, str(ROOT / "integrations" / "litellm"))
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # read by litellm at import time

pytest.importorskip("litellm", reason="litellm is not installed (make test installs it)")
openai = pytest.importorskip("openai", reason="the OpenAI SDK is not installed")

from litellm_contextpilot.testing import LiteLLMProxy, find_proxy_python  # noqa: E402

from contextpilot_rag.testing import OpenAICompatibleServer  # noqa: E402

PROXY_PYTHON = find_proxy_python(
    [
        os.environ.get("LITELLM_PROXY_PYTHON"),
        ROOT / ".venv-litellm-proxy" / "bin" / "python",
        sys.executable,
    ]
)
if PROXY_PYTHON is None:
    pytest.skip(
        "LiteLLM's proxy is not installed: `make test` installs it in .venv-litellm-proxy "
        "(pip install -e . -e 'integrations/litellm[proxy]'), or set LITELLM_PROXY_PYTHON "
        "to a Python that has litellm[proxy] and litellm-contextpilot",
        allow_module_level=True,
    )

MODEL = "rag-model"
NAMES = ("a", "b", "c")
CALLBACKS = """\
from litellm_contextpilot import ContextPilotHook, ContextPilotRoutingStrategy

hook = ContextPilotHook()
strategy = ContextPilotRoutingStrategy("combined")
"""
DOCUMENTS = [
    {"id": f"doc{i}", "text": f"Document {i} explains topic {i} in detail. " * 30}
    for i in range(12)
]


def reply_of(name: str) -> str:
    return f"answer from server {name}"


def replies_of(name: str) -> Callable[[list[dict[str, Any]]], str]:
    return lambda _messages: reply_of(name)


class Gateway(NamedTuple):
    fleet: list[OpenAICompatibleServer]
    client: Any  # openai.OpenAI, to the proxy


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    """One proxy for the module (it takes a while to start); each test uses its own
    conversations and documents. Answers stream slowly enough that concurrent calls
    overlap, so the strategy sees them in flight."""
    with ExitStack() as stack:
        fleet = [
            stack.enter_context(
                OpenAICompatibleServer(model=MODEL, reply=replies_of(name), token_delay_s=0.1)
            )
            for name in NAMES
        ]
        proxy = LiteLLMProxy(
            MODEL,
            [server.base_url for server in fleet],
            callbacks_source=CALLBACKS,
            callbacks=("contextpilot_callbacks.hook", "contextpilot_callbacks.strategy"),
            python=str(PROXY_PYTHON),
            pythonpath=[ROOT / "integrations" / "litellm"],
        )
        stack.enter_context(proxy)
        client = openai.OpenAI(base_url=proxy.base_url, api_key=proxy.api_key, max_retries=0)
        yield Gateway(fleet, client)


def ask(
    client: Any, conversation: str, turn: int, documents: list[dict[str, Any]], *, stream: bool
) -> str:
    """The answer to one turn sent with the ``contextpilot`` field, streamed or not."""
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Question {turn} of {conversation}?"}],
        "extra_body": {"contextpilot": {"documents": documents, "conversation_id": conversation}},
    }
    if not stream:
        return str(client.chat.completions.create(**request).choices[0].message.content)
    chunks = client.chat.completions.create(**request, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def requests_of(fleet: list[OpenAICompatibleServer]) -> list[dict[str, Any]]:
    return [request for server in fleet for request in server.requests]


def test_a_conversations_later_turns_go_back_to_the_replica_holding_its_prefix(
    gateway: Gateway,
) -> None:
    client = gateway.client
    conversations = ("alpha", "beta", "gamma")

    def first_turn(i: int) -> str:
        return ask(client, conversations[i], 1, DOCUMENTS[3 * i : 3 * i + 3], stream=False)

    with ThreadPoolExecutor(len(conversations)) as pool:  # first turns at once
        first = list(pool.map(first_turn, range(len(conversations))))
    later = [  # then one at a time, on an idle fleet, streamed or not
        ask(client, c, 2, DOCUMENTS[3 * i + 1 : 3 * i + 4], stream=i % 2 == 0)
        for i, c in enumerate(conversations)
    ]
    assert len(set(first)) > 1  # the strategy spread the concurrent first turns
    assert later == first  # and sent each conversation back to its own replica


def test_the_field_is_applied_in_the_proxy_and_never_reaches_the_engine(
    gateway: Gateway,
) -> None:
    fleet, client = gateway
    for turn, documents in enumerate((DOCUMENTS[9:11], DOCUMENTS[10:12]), start=1):
        ask(client, "chat-delta", turn, documents, stream=turn == 2)
    sent = [r for r in requests_of(fleet) if "chat-delta" in r["messages"][-1]["content"]]
    assert len(sent) == 2
    assert all("contextpilot" not in request for request in sent)
    first, second = (request["messages"] for request in sent)
    assert [m["role"] for m in first] == ["system", "user"]
    assert "[doc9]" in first[-1]["content"] and "[doc10]" in first[-1]["content"]
    # the hook recorded the first answer (LiteLLM's success callback, in the proxy)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] in {reply_of(name) for name in NAMES}
    assert "[doc11]" in second[-1]["content"] and "[doc10]" not in second[-1]["content"]


def test_a_request_without_the_field_reaches_the_engine_as_sent(gateway: Gateway) -> None:
    fleet, client = gateway
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Is this request untouched?"},
    ]
    client.chat.completions.create(model=MODEL, messages=messages)
    sent = [r for r in requests_of(fleet) if r["messages"][-1] == messages[-1]]
    assert [request["messages"] for request in sent] == [messages]


@pytest.mark.parametrize(
    ("field", "stream", "message"),
    [
        ({"documents": []}, False, "non-empty unless"),
        ({"documents": ["x"], "conversation": "c"}, False, "unknown keys ['conversation']"),
        ("not an object", True, "must be an object"),
    ],
)
def test_a_malformed_field_is_refused_with_a_400_that_says_why(
    gateway: Gateway, field: object, stream: bool, message: str
) -> None:
    fleet, client = gateway
    before = len(requests_of(fleet))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Refused?"}],
            extra_body={"contextpilot": field},
            stream=stream,
        )
    assert refused.value.status_code == 400
    assert message in refused.value.message
    assert len(requests_of(fleet)) == before  # nothing was sent on


def test_an_id_reused_for_another_text_is_refused_with_a_400_not_a_500(gateway: Gateway) -> None:
    fleet, client = gateway
    ask(client, "chat-epsilon", 1, [{"id": "reused", "text": "The first text."}], stream=False)
    before = len(requests_of(fleet))
    with pytest.raises(openai.BadRequestError, match="registered with a different text"):
        ask(client, "chat-epsilon", 2, [{"id": "reused", "text": "Another text."}], stream=False)
    assert len(requests_of(fleet)) == before
