"""Whether an engine's chat template keeps a conversation's earlier turns as a prefix.

A prefix cache serves a conversation's history only when each turn's rendered prompt
starts with the previous turn's (its generation prompt included, the answer following
it). Some publishers' templates break that: Mistral Nemo's renders the system message
inside the *last* user message, so the system prompt moves every turn and the engine
recomputes the history from the previous user message on; others refuse a system
message (Gemma 2's, as transformers and vLLM render it). :func:`check_chat_template`
renders a short probe conversation the way the pilot builds it, with the system prompt
as a system message and folded into the first user message
(``PilotConfig(system_into_user=True)``), through the engine's own renderer: vLLM's
``POST /tokenize`` with ``messages`` (token ids) or llama-server's
``POST /apply-template`` (text), both at the server root.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from ..blocks import ContextBlock
from ..errors import InvalidInputError
from ..pilot import ContextPilot, PilotConfig
from ..routing.client.endpoints import display_url

__all__ = ["TemplateCheck", "check_chat_template"]

_TURNS = 3
_TOKEN_SLACK = 4
"""Token ids the renderings may differ by at a turn's end: the tokenizer may merge the
generation prompt's last characters with the answer that follows it (the engine then
recomputes those few tokens only)."""

Rendering = str | list[int]


@dataclass(frozen=True)
class TemplateCheck:
    """``system_message``: whether every turn's rendering extends the previous one with
    the system prompt as a system message (``None``: the template refused the system
    message); ``folded``: the same with ``PilotConfig(system_into_user=True)``;
    ``renderer``: the endpoint that rendered them."""

    system_message: bool | None
    folded: bool
    renderer: str

    @property
    def advice(self) -> str | None:
        """What to change, or ``None`` when the default keeps the history cacheable."""
        if self.system_message:
            return None
        if self.folded:
            what = (
                "refuses a system message"
                if self.system_message is None
                else "moves the system message, so each turn recomputes the history"
            )
            return (
                f"the engine's chat template {what}; set PilotConfig(system_into_user=True) "
                "(serve: --system-into-user)"
            )
        return (
            "the engine's chat template rewrites earlier turns (e.g. drops their reasoning), "
            "so its prefix cache cannot serve a conversation's history"
        )


def check_chat_template(
    base_url: str,
    model: str,
    *,
    timeout_s: float = 10.0,
    client: httpx.Client | None = None,
) -> TemplateCheck | None:
    """How the chat template of the engine at ``base_url`` (with or without ``/v1``)
    serving ``model`` treats a conversation's history (:class:`TemplateCheck`), or
    ``None`` when the engine renders chat prompts at neither ``/tokenize`` (vLLM) nor
    ``/apply-template`` (llama-server), or cannot be reached. Sends a handful of small
    requests; generates nothing."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        shown = display_url(base_url) if isinstance(base_url, str) else type(base_url).__name__
        raise InvalidInputError(f"base_url must be an http(s) URL, got {shown!r}")
    if not isinstance(model, str) or not model:
        raise InvalidInputError("model must be a non-empty str")
    root = base_url.rstrip("/").removesuffix("/v1")
    plain, folded = _probe(PilotConfig()), _probe(PilotConfig(system_into_user=True))
    own = client is None
    http = httpx.Client(timeout=timeout_s, trust_env=False) if client is None else client
    try:
        for renderer in (_vllm_renderer(root, model), _llama_renderer(root)):
            first = renderer(http, folded[0])
            if first is None:
                continue  # not this engine's endpoint
            folded_ok = _extends([first, *(renderer(http, turn) for turn in folded[1:])])
            renderings = [renderer(http, turn) for turn in plain]
            system = None if None in renderings else _extends(renderings)
            return TemplateCheck(system, bool(folded_ok), renderer.name)
        return None
    except httpx.HTTPError:
        return None
    finally:
        if own:
            http.close()


def _probe(config: PilotConfig) -> list[list[dict[str, str]]]:
    """The messages of a short conversation's turns, as the pilot builds them."""
    pilot = ContextPilot(config)
    turns = []
    for turn in range(_TURNS):
        block = ContextBlock(f"Note {turn}: the harbour opens at {6 + turn} o'clock.")
        prompt = pilot.optimize(
            [block], f"When does the harbour open ({turn})?", conversation_id="c"
        )
        turns.append(prompt.to_openai())
        pilot.record_answer(prompt, f"At {6 + turn} o'clock.")
    return turns


def _extends(renderings: Sequence[Rendering | None]) -> bool | None:
    """Whether each rendering starts with the previous one (``None``: one is missing)."""
    if any(rendering is None for rendering in renderings):
        return None
    for earlier, later in itertools.pairwise(renderings):
        assert earlier is not None and later is not None
        if isinstance(earlier, str):
            if not (isinstance(later, str) and later.startswith(earlier)):
                return False
            continue
        pairs = zip(earlier, later, strict=False)
        shared = sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))
        if shared < len(earlier) - _TOKEN_SLACK:
            return False
    return True


class _Renderer:
    """One engine's chat rendering endpoint: ``None`` for a refused request (a template
    error) and for an endpoint the server does not have."""

    def __init__(self, name: str, url: str, body: Mapping[str, object], key: str) -> None:
        self.name, self._url, self._body, self._key = name, url, body, key

    def __call__(
        self, http: httpx.Client, messages: Sequence[Mapping[str, str]]
    ) -> Rendering | None:
        response = http.post(self._url, json={**self._body, "messages": list(messages)})
        if response.status_code >= 400:
            return None
        try:
            value = response.json()[self._key]
        except (ValueError, KeyError, TypeError):
            return None
        # llama-server answers /tokenize without "content" with no tokens: not a rendering
        return value if isinstance(value, (str, list)) and value else None


def _vllm_renderer(root: str, model: str) -> _Renderer:
    return _Renderer("/tokenize", f"{root}/tokenize", {"model": model}, "tokens")


def _llama_renderer(root: str) -> _Renderer:
    return _Renderer("/apply-template", f"{root}/apply-template", {}, "prompt")
