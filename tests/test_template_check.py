"""Checking an engine's chat template for a cacheable history (the engine runs are in
tests/test_engines.py: they need llama-server)."""

from __future__ import annotations

import socket

import pytest

from contextpilot_rag.engines.template_check import TemplateCheck, check_chat_template
from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.serve import ServeConfig
from contextpilot_rag.serve.cli import template_advice
from contextpilot_rag.testing import OpenAICompatibleServer


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_template_that_keeps_the_history_needs_nothing() -> None:
    assert TemplateCheck(True, True, "/tokenize").advice is None


@pytest.mark.parametrize(
    ("system_message", "wording"),
    [(False, "moves the system message"), (None, "refuses a system message")],
)
def test_a_template_fixed_by_folding_advises_system_into_user(
    system_message: bool | None, wording: str
) -> None:
    advice = TemplateCheck(system_message, True, "/apply-template").advice
    assert advice is not None and wording in advice and "system_into_user=True" in advice


def test_a_template_that_rewrites_earlier_turns_is_named_without_a_fix() -> None:
    advice = TemplateCheck(False, False, "/tokenize").advice
    assert advice is not None and "rewrites earlier turns" in advice
    assert "system_into_user" not in advice


def test_an_engine_without_a_rendering_endpoint_tells_nothing() -> None:
    with OpenAICompatibleServer() as server:  # no /tokenize, no /apply-template
        assert check_chat_template(server.base_url, "m") is None
        config = ServeConfig(endpoints=(server.base_url,), model="m")
        assert template_advice(config) is None


def test_an_unreachable_engine_tells_nothing() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    assert check_chat_template(url, "m", timeout_s=2.0) is None


@pytest.mark.parametrize(("url", "model"), [("ftp://h", "m"), (None, "m"), ("http://h", "")])
def test_a_bad_url_or_model_is_refused(url: object, model: str) -> None:
    with pytest.raises(InvalidInputError):
        check_chat_template(url, model)  # type: ignore[arg-type]
