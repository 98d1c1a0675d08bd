"""``ChatContextPilot``'s connection fields (``api_key``, ``timeout``, ``max_retries``)
reaching the HTTP requests it makes, and its LangChain serialization: ``dumpd`` then
``load`` rebuilds an equal model, and the key is never written in plain text. Real
loopback servers, offline."""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contextpilot_rag import ConfigError
from contextpilot_rag.errors import RoutingError
from contextpilot_rag.routing import Endpoint, RoutingClient
from contextpilot_rag.testing import OpenAICompatibleServer

pytest.importorskip("langchain_core")

from langchain_contextpilot import ChatContextPilot
from langchain_core._api import LangChainBetaWarning
from langchain_core.load import dumpd, load
from routed_fleet import question

KEY = "sk-test-0123456789abcdef"
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


class HeaderServer:
    """A loopback chat endpoint that answers every ``POST`` with one JSON completion and
    records the ``Authorization`` header of each request."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.authorizations.append(self.headers.get("Authorization"))
                body = json.dumps(ANSWER).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def header_server() -> Iterator[HeaderServer]:
    server = HeaderServer()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXTPILOT_API_KEY", raising=False)


def answer_once(model: ChatContextPilot) -> str:
    try:
        return model.invoke("hello").text
    finally:
        model.close()


# -- api_key, timeout, max_retries -------------------------------------------------------------


def test_api_key_is_sent_as_a_bearer_token(header_server: HeaderServer) -> None:
    answer_once(ChatContextPilot(endpoints=[header_server.base_url], model="m", api_key=KEY))
    assert header_server.authorizations == [f"Bearer {KEY}"]


def test_api_key_comes_from_the_environment_when_not_given(
    header_server: HeaderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTPILOT_API_KEY", KEY)
    model = ChatContextPilot(endpoints=[header_server.base_url], model="m")
    assert model.api_key is not None and model.api_key.get_secret_value() == KEY
    answer_once(model)
    assert header_server.authorizations == [f"Bearer {KEY}"]


def test_no_key_sends_no_authorization(header_server: HeaderServer) -> None:
    answer_once(ChatContextPilot(endpoints=[header_server.base_url], model="m"))
    assert header_server.authorizations == [None]


def test_an_endpoint_with_its_own_key_keeps_it(header_server: HeaderServer) -> None:
    own = Endpoint(header_server.base_url, api_key="sk-own-key")
    answer_once(ChatContextPilot(endpoints=[own], model="m", api_key=KEY))
    assert header_server.authorizations == ["Bearer sk-own-key"]


def test_the_key_is_not_shown(header_server: HeaderServer) -> None:
    model = ChatContextPilot(endpoints=[header_server.base_url], model="m", api_key=KEY)
    assert KEY not in repr(model) and KEY not in str(model.model_dump())
    model.close()


def test_timeout_and_max_retries_configure_the_client() -> None:
    model = ChatContextPilot(
        endpoints=["http://127.0.0.1:9/v1"], model="m", timeout=7.5, max_retries=4
    )
    assert model.client is not None
    assert model.client.config.timeout_s == 7.5
    assert model.client.config.max_attempts == 5
    model.close()


def test_timeout_bounds_each_wait_for_the_engine(slow_server: OpenAICompatibleServer) -> None:
    model = ChatContextPilot(
        endpoints=[slow_server.base_url], model="m", timeout=0.01, max_retries=0
    )
    with pytest.raises(RoutingError) as failure:
        model.invoke(question())
    model.close()
    assert len(failure.value.attempts) == 1


@pytest.mark.parametrize("option", [{"api_key": KEY}, {"timeout": 3.0}, {"max_retries": 1}])
def test_connection_options_with_a_given_client_are_a_config_error(
    option: dict[str, Any],
) -> None:
    with (
        RoutingClient(["http://127.0.0.1:9/v1"], model="m") as client,
        pytest.raises(ConfigError, match="client"),
    ):
        ChatContextPilot(client=client, **option)


# -- serialization -------------------------------------------------------------------------


def round_trip(model: ChatContextPilot, secrets: dict[str, str]) -> ChatContextPilot:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangChainBetaWarning)  # load() is beta
        loaded = load(
            dumpd(model),
            allowed_objects=[ChatContextPilot],
            valid_namespaces=["langchain_contextpilot"],
            secrets_map=secrets,
        )
    assert isinstance(loaded, ChatContextPilot)
    return loaded


def settings_of(model: ChatContextPilot) -> dict[str, Any]:
    assert model.client is not None
    config = model.client.config
    return {
        "fields": model.model_dump(exclude={"metadata", "api_key"}),
        "endpoints": list(model.endpoints or ()),
        "policy": model.policy,
        "key": model.api_key.get_secret_value() if model.api_key else None,
        "client": (config.timeout_s, config.max_attempts, config.model, model._identifying_params),
    }


def test_dumpd_then_load_rebuilds_an_equal_model() -> None:
    fleet = [
        "http://127.0.0.1:9/v1",
        Endpoint("http://127.0.0.1:10/v1", models=("m",), rtt_s=0.002, region="eu"),
    ]
    model = ChatContextPilot(
        endpoints=fleet,
        model="m",
        policy="least-load",
        api_key=KEY,
        timeout=9.0,
        max_retries=1,
        max_tokens=64,
        temperature=0.2,
    )
    loaded = round_trip(model, {"CONTEXTPILOT_API_KEY": KEY})
    assert settings_of(loaded) == settings_of(model)
    assert loaded.endpoints == fleet
    model.close()
    loaded.close()


def test_the_key_is_dumped_as_a_secret_reference_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTPILOT_API_KEY", KEY)  # a key from the environment, too
    model = ChatContextPilot(endpoints=["http://127.0.0.1:9/v1"], model="m")
    dumped = dumpd(model)
    assert KEY not in json.dumps(dumped)
    assert dumped["kwargs"]["api_key"] == {
        "lc": 1,
        "type": "secret",
        "id": ["CONTEXTPILOT_API_KEY"],
    }
    model.close()


@pytest.mark.parametrize(
    "endpoint",
    [f"http://user:{KEY}@127.0.0.1:9/v1", Endpoint("http://127.0.0.1:9/v1", api_key=KEY)],
)
def test_endpoint_credentials_make_the_model_not_serializable(endpoint: Any) -> None:
    model = ChatContextPilot(endpoints=[endpoint], model="m")
    dumped = dumpd(model)
    assert dumped["type"] == "not_implemented"
    assert KEY not in json.dumps(dumped)
    model.close()


def test_a_model_over_a_given_client_is_not_serializable() -> None:
    with RoutingClient(["http://127.0.0.1:9/v1"], model="m") as client:
        assert dumpd(ChatContextPilot(client=client))["type"] == "not_implemented"
