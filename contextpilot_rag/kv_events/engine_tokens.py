"""The engine's own tokens of a chat prompt, from vLLM's ``POST /tokenize``.

The tracker must look a prompt up by the tokens the engine cached, chat template
included, which only the engine knows for sure. vLLM answers ``{"model": ...,
"messages": [...]}`` at ``/tokenize`` (server root, not under ``/v1``) with
``{"tokens": [...], "count": ..., "max_model_len": ...}``, applying the chat template
with the generation prompt as ``/v1/chat/completions`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

from ..errors import EndpointError, InvalidInputError
from ..routing.client.endpoints import display_url

__all__ = ["engine_token_ids"]


def _tokenize_url(base_url: str) -> str:
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/tokenize"


def engine_token_ids(
    base_url: str,
    model: str,
    messages: Sequence[Mapping[str, str]],
    *,
    timeout_s: float = 10.0,
    client: httpx.Client | None = None,
) -> list[int]:
    """The token ids the engine at ``base_url`` (``http://host:port``, with or without
    ``/v1``) makes of ``messages`` (OpenAI chat format, e.g. ``prompt.messages``) for
    ``model`` (its served model name). Raises
    :class:`~contextpilot_rag.errors.EndpointError` when the engine answers with an
    error status or without a token list, and httpx's errors when it cannot be
    reached. ``client``: an httpx client to reuse (none: a short-lived one)."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        shown = display_url(base_url) if isinstance(base_url, str) else type(base_url).__name__
        raise InvalidInputError(f"base_url must be an http(s) URL, got {shown!r}")
    if not isinstance(model, str) or not model:
        raise InvalidInputError("model must be a non-empty str")
    if isinstance(messages, (str, bytes)) or not all(isinstance(m, Mapping) for m in messages):
        raise InvalidInputError("messages must be a sequence of chat message mappings")
    body = {"model": model, "messages": [dict(message) for message in messages]}
    if client is None:
        with httpx.Client(timeout=timeout_s, trust_env=False) as own:
            response = own.post(_tokenize_url(base_url), json=body)
    else:
        response = client.post(_tokenize_url(base_url), json=body, timeout=timeout_s)
    where = display_url(_tokenize_url(base_url))  # errors name it without credentials
    if response.status_code >= 400:
        raise EndpointError(
            f"{where} answered {response.status_code}: {response.text[:200]}",
            response.status_code,
        )
    try:
        tokens = response.json()["tokens"]
    except (ValueError, KeyError, TypeError) as exc:
        raise EndpointError(f"{where} sent no token list", response.status_code) from exc
    if not isinstance(tokens, list) or not all(
        isinstance(token, int) and not isinstance(token, bool) for token in tokens
    ):
        raise EndpointError(f"{where} sent a malformed token list", 200)
    return tokens
