"""A loopback emulator of hosted APIs' prompt caches, for tests and benchmarks.

:class:`CloudCacheServer` speaks the Anthropic Messages API (``POST /v1/messages``) and
OpenAI Chat Completions (``POST /v1/chat/completions``), streamed (SSE) or not, and
OpenAI's Responses API (``POST /v1/responses``, streamed or not). It answers every
request with a fixed short text and the usage the provider's *published* cache rules
give it (:mod:`contextpilot_rag.sim.provider_cache`): Anthropic's
``cache_creation_input_tokens`` / ``cache_read_input_tokens`` from explicit
``cache_control`` breakpoints, OpenAI's ``cached_tokens`` from automatic caching with
``prompt_cache_key`` routing, and, for the ``gpt-5.6`` models
(:data:`~contextpilot_rag.cloud.rules.OPENAI_BREAKPOINT_MODELS` and their releases),
``cached_tokens`` and ``cache_write_tokens`` from their breakpoints
(``prompt_cache_options``, ``prompt_cache_breakpoint``; other models refuse both with a
400, as OpenAI's older models do). The figures are emulated, not measured. The
official SDKs run unchanged against it::

    with CloudCacheServer() as server:
        claude = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="test")
        gpt = openai.OpenAI(base_url=server.openai_base_url, api_key="test")

Request and response shapes follow the API references: Messages
(https://platform.claude.com/docs/en/api/messages, streaming events
https://platform.claude.com/docs/en/build-with-claude/streaming: ``message_start``,
``content_block_start``, ``ping``, ``content_block_delta``, ``content_block_stop``,
``message_delta`` with the cumulative usage, ``message_stop``), Chat Completions
(https://platform.openai.com/docs/api-reference/chat, the usage chunk of
``stream_options.include_usage``) and Responses
(https://platform.openai.com/docs/api-reference/responses: a ``response`` whose one
``message`` output holds the answer as ``output_text``; ``usage.input_tokens`` with
``input_tokens_details.cached_tokens`` / ``cache_write_tokens``; streamed as the
semantic events ``response.created`` … ``response.output_text.delta`` …
``response.completed``, the last carrying the usage). Errors are the
providers' JSON error objects: a request with five breakpoints, a message without
content (but a final assistant one) or a whitespace-only text block is an HTTP 400
``invalid_request_error``, as the API answers it.

A Responses request is cached exactly as the same conversation sent to Chat
Completions: ``instructions`` is a first system message (no marker), a string
``input`` one user message, each ``input_text`` / ``output_text`` part a text part
(markers on ``input_text`` parts only). Other input item or part types, ``tools``,
``previous_response_id``, ``conversation``, ``prompt`` (they would change the prompt)
are 400s; an answer cut at ``max_output_tokens`` is ``"incomplete"`` (streamed, its
last event is ``response.incomplete``).

Tokens are counted with the project's default tokenizer (offline), the same for both
APIs: a text block counts its text, any other block (a tool, an image, a tool result)
its JSON; for the ``gpt-5.6`` models each text content part (a string content is one)
is one cache block counting its text, after one block of the tools' JSON. Time is the
``clock`` callable's seconds (a :class:`~contextpilot_rag.sim.provider_cache.ManualClock`
in tests, so TTLs expire without sleeping).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..cloud.model_names import match_model_name
from ..cloud.rules import OPENAI_BREAKPOINT_MODELS, ProviderRules
from ..errors import CacheControlError, ConfigError
from ..sim.provider_cache import (
    AnthropicCacheModel,
    CacheBlock,
    OpenAIBreakpointCacheModel,
    OpenAICacheModel,
    OpenAICacheRules,
)
from ..tokenizers import Tokenizer, default_tokenizer
from ..usage import InputTokens
from .openai_server import (
    _Answer,
    _ChatFormat,
    _Envelope,
    _Handler,
    _json_body,
    _limit_answer,
    _LoopbackServer,
    _optional_bool,
    _Outcome,
    _parse_chat,
    _RequestError,
    _split_words,
    _stream_payloads,
)

__all__ = ["DEFAULT_ANSWER", "CloudCacheServer", "EmulatedRequest", "cache_control_paths"]

DEFAULT_ANSWER = "Emulated answer."
"""The text every request is answered with unless the server is given another."""

_JSON = dict[str, Any]
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
}


@dataclass(frozen=True)
class EmulatedRequest:
    """One answered request: which API (``"anthropic"``, ``"openai"`` for Chat
    Completions, ``"openai-responses"``), its JSON body as received, the ``usage`` object
    sent back, and the ``anthropic-version`` / ``anthropic-beta`` headers (None if
    absent; API keys are never recorded)."""

    api: Literal["anthropic", "openai", "openai-responses"]
    body: dict[str, Any]
    usage: dict[str, Any]
    anthropic_version: str | None = None
    anthropic_beta: str | None = None

    @property
    def cache_control_paths(self) -> list[str]:
        """Where the body carries ``cache_control`` markers (see :func:`cache_control_paths`)."""
        return cache_control_paths(self.body)


def cache_control_paths(body: Mapping[str, Any]) -> list[str]:
    """The places of ``cache_control`` in a request body, in cache order, spelled like
    ``"system[1]"``, ``"messages[2].content[0]"``, ``"tools[0]"`` or ``"cache_control"``
    (Anthropic's top-level automatic caching). Works on Anthropic and OpenAI-format
    bodies alike."""
    paths = [f"tools[{i}]" for i, tool in _items(body.get("tools")) if "cache_control" in tool]
    paths += [f"system[{i}]" for i, block in _items(body.get("system")) if "cache_control" in block]
    for m, message in _items(body.get("messages")):
        if "cache_control" in message:
            paths.append(f"messages[{m}]")
        for b, block in _items(message.get("content")):
            if "cache_control" in block:
                paths.append(f"messages[{m}].content[{b}]")
    if "cache_control" in body:
        paths.append("cache_control")
    return paths


def _items(value: object) -> list[tuple[int, Mapping[str, Any]]]:
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, Mapping)]


def _anthropic_error(error: _RequestError) -> _JSON:
    kind = _ANTHROPIC_ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


class _BlockReader:
    """Turns an Anthropic request body into :class:`CacheBlock` s in cache order;
    ``ttl_s`` maps the ``cache_control.ttl`` names on offer to seconds (no ``ttl``:
    ``"5m"``)."""

    def __init__(self, tokenizer: Tokenizer, ttl_s: Mapping[str, float]) -> None:
        self._tokenizer = tokenizer
        self._ttl_s = ttl_s

    def read(self, body: _JSON) -> list[CacheBlock]:
        blocks = [
            self._block(tool, "tools", f"tools[{i}]", opens=True)
            for i, tool in enumerate(_list(body.get("tools"), "tools"))
        ]
        blocks += self._content(body.get("system"), "system", "system")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _RequestError("messages: must be a non-empty list of message objects")
        for m, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise _RequestError(f"messages.{m}.role: Input should be 'user' or 'assistant'")
            content = self._content(message.get("content"), message["role"], f"messages.{m}")
            if not content and (m < len(messages) - 1 or message["role"] != "assistant"):
                raise _RequestError(
                    f"messages.{m}: all messages must have non-empty content except for "
                    "the optional final assistant message"
                )
            blocks += content
        return self._with_automatic_breakpoint(blocks, body)

    def _content(self, content: object, role: str, where: str) -> list[CacheBlock]:
        if content is None and role == "system":
            return []
        if isinstance(content, str):
            if not content.strip():
                return []
            return [self._block({"type": "text", "text": content}, role, where, opens=True)]
        parts = _list(content, f"{where}.content")
        return [
            self._block(part, role, f"{where}.content.{i}", opens=i == 0)
            for i, part in enumerate(parts)
        ]

    def _block(self, part: object, role: str, where: str, *, opens: bool) -> CacheBlock:
        if not isinstance(part, dict):
            raise _RequestError(f"{where}: Input should be an object")
        content = {key: value for key, value in part.items() if key != "cache_control"}
        text = content.get("text") if content.get("type") == "text" else None
        if content.get("type") == "text" and not (isinstance(text, str) and text.strip()):
            if "cache_control" in part:
                raise _RequestError(f"{where}: cache_control cannot be set for empty text blocks")
            raise _RequestError(f"{where}: text content blocks must contain non-whitespace text")
        counted = text if isinstance(text, str) else json.dumps(content, sort_keys=True)
        key = json.dumps({"role": role, "opens": opens, "block": content}, sort_keys=True)
        ttl_s = self._ttl(part["cache_control"], where) if "cache_control" in part else None
        return CacheBlock(key, self._tokenizer.count(counted), ttl_s)

    def _ttl(self, cache_control: object, where: str) -> float:
        if not isinstance(cache_control, dict) or cache_control.get("type") != "ephemeral":
            raise _RequestError(f"{where}.cache_control.type: Input should be 'ephemeral'")
        ttl = cache_control.get("ttl", "5m")
        if ttl not in self._ttl_s:
            offered = " or ".join(repr(name) for name in sorted(self._ttl_s, reverse=True))
            raise _RequestError(f"{where}.cache_control.ttl: Input should be {offered}")
        return self._ttl_s[ttl]

    def _with_automatic_breakpoint(self, blocks: list[CacheBlock], body: _JSON) -> list[CacheBlock]:
        """A top-level ``cache_control`` (automatic caching) marks the last block."""
        if "cache_control" not in body or not blocks:
            return blocks
        ttl_s = self._ttl(body["cache_control"], "cache_control")
        last = blocks[-1]
        if last.breakpoint_ttl_s is not None:
            return blocks
        return [*blocks[:-1], CacheBlock(last.key, last.tokens, ttl_s)]


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _RequestError(f"{where}: Input should be a valid list")
    return value


@dataclass(frozen=True)
class _AnthropicOptions:
    model: str
    max_tokens: int
    stream: bool


def _anthropic_options(body: _JSON) -> _AnthropicOptions:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _RequestError("model: Field required (a non-empty string)")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _RequestError("max_tokens: Field required (an integer >= 1)")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _RequestError("stream: Input should be a valid boolean")
    return _AnthropicOptions(model, max_tokens, stream)


@dataclass(frozen=True)
class _OpenAICacheOptions:
    key: str | None
    retention: Literal["in_memory", "24h"] | None  # None: the rules' default_retention


def _openai_cache_options(body: _JSON) -> _OpenAICacheOptions:
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise _RequestError("'prompt_cache_key' must be a string")
    retention = body.get("prompt_cache_retention")
    if retention == "24h":
        return _OpenAICacheOptions(key, "24h")
    if retention == "in_memory":
        return _OpenAICacheOptions(key, "in_memory")
    if retention is not None:
        raise _RequestError("'prompt_cache_retention' must be 'in_memory' or '24h'")
    return _OpenAICacheOptions(key, None)


_BREAKPOINT = "prompt_cache_breakpoint"


@dataclass(frozen=True)
class _TextMessage:
    """One message of an OpenAI prompt as the caches see it, whichever API sent it: its
    role, its text parts (objects with a string ``"text"``, perhaps a breakpoint marker;
    a string content is one part) and where the request put it (``"messages[2]"``,
    ``"input[0]"``, ``"instructions"``), for error messages."""

    role: str
    parts: tuple[_JSON, ...]
    where: str

    @property
    def segment(self) -> str:
        """The text the automatic cache tokenizes: ``<|role|>\\n{text}\\n``, the text
        parts joined by newlines (the chat template of :mod:`.openai_server`)."""
        text = "\n".join(part["text"] for part in self.parts)
        return f"<|{self.role}|>\n{text}\n"


@dataclass(frozen=True)
class _OpenAIPrompt:
    """An OpenAI prompt in cache order: the tools' JSON (if any), then the messages."""

    tools: object
    messages: tuple[_TextMessage, ...]


def _chat_prompt(body: _JSON) -> _OpenAIPrompt:
    """The prompt of a Chat Completions body checked by ``_parse_chat``."""
    messages = tuple(
        _TextMessage(message["role"], _chat_parts(message.get("content")), f"messages[{m}]")
        for m, message in enumerate(body["messages"])
    )
    return _OpenAIPrompt(body.get("tools"), messages)


def _chat_parts(content: str | list[_JSON] | None) -> tuple[_JSON, ...]:
    if isinstance(content, str):
        return ({"type": "text", "text": content},)
    return tuple(content or ())


@dataclass(frozen=True)
class _BreakpointRequest:
    """An OpenAI request as the breakpoint cache sees it: its blocks and, in implicit
    mode, the block ending its latest user or tool message."""

    blocks: list[CacheBlock]
    implicit_block: int | None


class _PartReader:
    """Turns the prompt of a request for a breakpoint model into :class:`CacheBlock` s:
    one of the tools' JSON if any, then one per text content part in message order,
    keyed by role, place and text. A part with ``prompt_cache_breakpoint: {"mode":
    "explicit"}`` carries a breakpoint; ``rules.unmarked_roles`` may not carry one."""

    def __init__(self, tokenizer: Tokenizer, rules: ProviderRules, lifetime_s: float) -> None:
        self._tokenizer = tokenizer
        self._rules = rules
        self._lifetime_s = lifetime_s

    def read(self, body: _JSON, prompt: _OpenAIPrompt) -> _BreakpointRequest:
        """``prompt``'s blocks; ``body`` gives its ``prompt_cache_options``."""
        implicit_mode = _prompt_cache_mode(body, self._rules) == "implicit"
        blocks = [self._tools_block(prompt.tools)] if prompt.tools else []
        implicit_block = None
        for message in prompt.messages:
            parts = self._parts(message)
            blocks += parts
            if parts and message.role in ("user", "tool"):
                implicit_block = len(blocks) - 1
        return _BreakpointRequest(blocks, implicit_block if implicit_mode else None)

    def _tools_block(self, tools: object) -> CacheBlock:
        text = json.dumps(tools, sort_keys=True)
        return CacheBlock(json.dumps({"tools": text}), self._tokenizer.count(text))

    def _parts(self, message: _TextMessage) -> list[CacheBlock]:
        return [
            self._block(part, message.role, f"{message.where}.content[{i}]", opens=i == 0)
            for i, part in enumerate(message.parts)
        ]

    def _block(self, part: _JSON, role: str, where: str, *, opens: bool) -> CacheBlock:
        text = part["text"]
        key = json.dumps({"role": role, "opens": opens, "text": text}, sort_keys=True)
        marked = self._marked(part, role, where)
        return CacheBlock(key, self._tokenizer.count(text), self._lifetime_s if marked else None)

    def _marked(self, part: _JSON, role: str, where: str) -> bool:
        if _BREAKPOINT not in part:
            return False
        if part[_BREAKPOINT] != {"mode": "explicit"}:
            raise _RequestError(f"'{where}.{_BREAKPOINT}' must be {{'mode': 'explicit'}}")
        if role in self._rules.unmarked_roles:
            raise _RequestError(f"'{where}.{_BREAKPOINT}' is not supported on {role} messages")
        return True


def _prompt_cache_mode(body: _JSON, rules: ProviderRules) -> Literal["implicit", "explicit"]:
    """``prompt_cache_options.mode`` (default ``"implicit"``), its ``ttl`` checked."""
    options = body.get("prompt_cache_options")
    if options is None:
        return "implicit"
    if not isinstance(options, dict) or not set(options) <= {"mode", "ttl"}:
        raise _RequestError("'prompt_cache_options' must be an object of 'mode' and 'ttl'")
    mode = options.get("mode", "implicit")
    if mode not in ("implicit", "explicit"):
        raise _RequestError("'prompt_cache_options.mode' must be 'implicit' or 'explicit'")
    ttl = options.get("ttl", "30m")
    if not isinstance(ttl, str) or ttl not in rules.ttl_s:
        offered = " or ".join(repr(ttl) for ttl in rules.ttl_s)
        raise _RequestError(f"'prompt_cache_options.ttl' must be {offered}")
    return "explicit" if mode == "explicit" else "implicit"


def _refuse_breakpoint_fields(body: _JSON, prompt: _OpenAIPrompt, model: str) -> None:
    """A model without breakpoints takes neither ``prompt_cache_options`` nor markers."""
    if body.get("prompt_cache_options") is not None:
        raise _RequestError(f"'prompt_cache_options' is not supported with the model {model!r}")
    for message in prompt.messages:
        for i, part in enumerate(message.parts):
            if _BREAKPOINT in part:
                raise _RequestError(
                    f"'{message.where}.content[{i}].{_BREAKPOINT}' is not supported with the "
                    f"model {model!r}"
                )


_PART_TYPE_OF_ROLE = {
    "user": "input_text",
    "system": "input_text",
    "developer": "input_text",
    "assistant": "output_text",
}
_UNEMULATED_RESPONSES_FIELDS = ("tools", "previous_response_id", "conversation", "prompt")


@dataclass(frozen=True)
class _ResponsesRequest:
    """A checked Responses request: its model, ``max_output_tokens``, prompt and
    whether the answer is streamed."""

    model: str
    max_output_tokens: int | None
    prompt: _OpenAIPrompt
    stream: bool


def _parse_responses(body: _JSON) -> _ResponsesRequest:
    """Check a Responses body: a request (streamed or not) whose prompt is
    ``instructions`` (one block, no marker) then the ``input`` messages."""
    stream = _optional_bool(body.get("stream"), "stream")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _RequestError("'model' must be a non-empty string")
    for name in _UNEMULATED_RESPONSES_FIELDS:
        if body.get(name):
            raise _RequestError(
                f"'{name}' is not emulated on /v1/responses; send the prompt in 'input'"
            )
    messages = _instructions(body.get("instructions")) + _input_messages(body.get("input"))
    prompt = _OpenAIPrompt(None, messages)
    return _ResponsesRequest(model, _max_output_tokens(body), prompt, stream)


def _max_output_tokens(body: _JSON) -> int | None:
    value = body.get("max_output_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise _RequestError("'max_output_tokens' must be an integer >= 1")
    return value


def _instructions(value: object) -> tuple[_TextMessage, ...]:
    if value is None:
        return ()
    if not isinstance(value, str):
        raise _RequestError("'instructions' must be a string")
    return (_TextMessage("system", ({"type": "input_text", "text": value},), "instructions"),)


def _input_messages(value: object) -> tuple[_TextMessage, ...]:
    """``input``: a string (one user message) or a non-empty list of message items."""
    if isinstance(value, str):
        return (_TextMessage("user", ({"type": "input_text", "text": value},), "input"),)
    if not isinstance(value, list) or not value:
        raise _RequestError("'input' must be a string or a non-empty list of input items")
    return tuple(_input_message(item, f"input[{i}]") for i, item in enumerate(value))


def _input_message(item: object, where: str) -> _TextMessage:
    if not isinstance(item, dict):
        raise _RequestError(f"'{where}' must be an input item object")
    if item.get("type", "message") != "message":
        raise _RequestError(
            f"'{where}.type' {item['type']!r} is not emulated: only 'message' items"
        )
    role = item.get("role")
    if not isinstance(role, str) or role not in _PART_TYPE_OF_ROLE:
        raise _RequestError(f"'{where}.role' must be 'user', 'system', 'developer' or 'assistant'")
    part_type = _PART_TYPE_OF_ROLE[role]
    content = item.get("content")
    if isinstance(content, str):
        return _TextMessage(role, ({"type": part_type, "text": content},), where)
    if not isinstance(content, list):
        raise _RequestError(f"'{where}.content' must be a string or a list of content parts")
    for i, part in enumerate(content):
        _check_text_part(part, part_type, f"{where}.content[{i}]")
    return _TextMessage(role, tuple(content), where)


def _check_text_part(part: object, part_type: str, where: str) -> None:
    """A content part must be ``{"type": part_type, "text": <string>}`` (more fields,
    such as a marker or ``annotations``, may follow)."""
    text = part.get("text") if isinstance(part, dict) and part.get("type") == part_type else None
    if isinstance(text, str):
        return
    raise _RequestError(
        f"'{where}' must be {{'type': '{part_type}', 'text': <string>}}: only text parts "
        f"('{part_type}' on this role) are emulated"
    )


@dataclass(frozen=True)
class _PromptTokens:
    """An OpenAI prompt's tokens as its cache counted them; ``cache_write_tokens`` is
    None from the automatic cache, which reports no writes."""

    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int | None


@dataclass(frozen=True)
class _OpenAIAPI:
    """One OpenAI endpoint as the record sees it: its ``EmulatedRequest.api`` name and
    how it writes the ``usage`` object (from the prompt's and the answer's tokens)."""

    name: Literal["openai", "openai-responses"]
    usage: Callable[[_PromptTokens, int], _JSON]


@dataclass(frozen=True)
class _OpenAIRequest:
    """An OpenAI request bound for a cache: the endpoint, its ``body`` as received (for
    the record and its cache options), its prompt and model, and the answer's tokens."""

    api: _OpenAIAPI
    body: _JSON
    prompt: _OpenAIPrompt
    model: str
    completion_tokens: int


class _CloudEngine:
    """The emulated caches, the clock and the record of requests. Thread-safe.

    Invariant: ``_requests[i]`` is the i-th request admitted to a cache model since the
    last reset (both change together, under ``_lock``)."""

    token_delay_s = 0.0

    def __init__(
        self,
        *,
        anthropic: AnthropicCacheModel,
        openai: OpenAICacheModel,
        openai_breakpoint: OpenAIBreakpointCacheModel,
        tokenizer: Tokenizer,
        clock: Callable[[], float],
        answer: str,
    ) -> None:
        self.anthropic = anthropic
        self.openai = openai
        self.openai_breakpoint = openai_breakpoint
        self._tokenizer = tokenizer
        self._blocks = _BlockReader(tokenizer, anthropic.rules.ttl_s)
        self._parts = _PartReader(tokenizer, openai_breakpoint.rules, openai_breakpoint.lifetime_s)
        self._clock = clock
        self._answer = answer
        self._lock = threading.Lock()
        self._requests: list[EmulatedRequest] = []

    def take_disconnect(self) -> bool:
        return False

    def requests(self) -> list[EmulatedRequest]:
        with self._lock:
            return copy.deepcopy(self._requests)

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()
            self.anthropic.reset()
            self.openai.reset()
            self.openai_breakpoint.reset()

    def messages(self, body: _JSON, version: str | None, beta: str | None) -> tuple[_Answer, _JSON]:
        """Answer a Messages request: the reply and its ``usage`` object. ``version``
        and ``beta`` are the ``anthropic-version`` / ``anthropic-beta`` headers."""
        options = _anthropic_options(body)
        blocks = self._blocks.read(body)
        answer = _limit_answer(self._answer, self._tokenizer, options.max_tokens)
        with self._lock:
            try:
                usage = self.anthropic.request(blocks, now_s=self._clock(), model=options.model)
            except CacheControlError as exc:
                raise _RequestError(str(exc)) from None
            api_usage = _anthropic_usage(usage, answer.completion_tokens)
            self._requests.append(
                EmulatedRequest("anthropic", copy.deepcopy(body), api_usage, version, beta)
            )
        return answer, api_usage

    def chat(self, body: _JSON) -> tuple[_Outcome, str, bool]:
        """Answer a Chat Completions request: outcome, model name, include_usage."""
        parsed = _parse_chat(body)
        model = parsed.options.model or "gpt-emulated"
        answer = _limit_answer(self._answer, self._tokenizer, parsed.options.max_tokens)
        request = _OpenAIRequest(
            _CHAT_API, body, _chat_prompt(body), model, answer.completion_tokens
        )
        return _Outcome(answer, self._openai_usage(request)), model, parsed.options.include_usage

    def responses(self, body: _JSON) -> tuple[_Outcome, _ResponsesRequest]:
        """Answer a Responses request: outcome, the checked request."""
        parsed = _parse_responses(body)
        answer = _limit_answer(self._answer, self._tokenizer, parsed.max_output_tokens)
        request = _OpenAIRequest(
            _RESPONSES_API, body, parsed.prompt, parsed.model, answer.completion_tokens
        )
        return _Outcome(answer, self._openai_usage(request)), parsed

    def _openai_usage(self, request: _OpenAIRequest) -> _JSON:
        """Admit an OpenAI request to its cache, record it, and return its ``usage``
        object. A ``gpt-5.6`` model's goes to the breakpoint cache, any other's to the
        automatic one. Everything is checked before either cache is touched."""
        cache = _openai_cache_options(request.body)
        if match_model_name(request.model, OPENAI_BREAKPOINT_MODELS):
            return self._breakpoint_usage(request, cache.key)
        _refuse_breakpoint_fields(request.body, request.prompt, request.model)
        return self._automatic_usage(request, cache)

    def _automatic_usage(self, request: _OpenAIRequest, cache: _OpenAICacheOptions) -> _JSON:
        tools = request.prompt.tools
        segments = [json.dumps(tools, sort_keys=True)] if tools else []
        segments += [message.segment for message in request.prompt.messages]
        tokens = [t for segment in segments for t in self._tokenizer.encode(segment)]
        with self._lock:
            usage = self.openai.request(
                tokens,
                now_s=self._clock(),
                prompt_cache_key=cache.key,
                retention=cache.retention,
                model=request.model,
            )
            return self._record_openai(
                request, _PromptTokens(usage.prompt_tokens, usage.cached_tokens, None)
            )

    def _breakpoint_usage(self, request: _OpenAIRequest, key: str | None) -> _JSON:
        parsed = self._parts.read(request.body, request.prompt)
        with self._lock:
            usage = self.openai_breakpoint.request(
                parsed.blocks,
                now_s=self._clock(),
                prompt_cache_key=key,
                model=request.model,
                implicit_block=parsed.implicit_block,
            )
            tokens = usage.tokens
            counted = _PromptTokens(
                tokens.prompt_tokens, tokens.cache_read_tokens, tokens.cache_write_tokens
            )
            return self._record_openai(request, counted)

    def _record_openai(self, request: _OpenAIRequest, tokens: _PromptTokens) -> _JSON:
        """Record an answered OpenAI request and return its ``usage`` object; the
        caller holds ``_lock``."""
        api_usage = request.api.usage(tokens, request.completion_tokens)
        body = copy.deepcopy(request.body)
        self._requests.append(EmulatedRequest(request.api.name, body, api_usage))
        return api_usage


def _anthropic_usage(tokens: InputTokens, output_tokens: int) -> _JSON:
    """The Messages API's ``usage`` object."""
    return {
        "input_tokens": tokens.uncached_tokens,
        "cache_creation_input_tokens": tokens.cache_write_tokens,
        "cache_read_input_tokens": tokens.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": tokens.cache_write_5m_tokens,
            "ephemeral_1h_input_tokens": tokens.cache_write_1h_tokens,
        },
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _chat_usage(tokens: _PromptTokens, completion_tokens: int) -> _JSON:
    """The Chat Completions ``usage`` object."""
    return {
        "prompt_tokens": tokens.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": tokens.prompt_tokens + completion_tokens,
        "prompt_tokens_details": _cache_details(tokens, audio_tokens=0),
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _responses_usage(tokens: _PromptTokens, output_tokens: int) -> _JSON:
    """The Responses API's ``usage`` object."""
    return {
        "input_tokens": tokens.prompt_tokens,
        "input_tokens_details": _cache_details(tokens),
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens.prompt_tokens + output_tokens,
    }


def _cache_details(tokens: _PromptTokens, **zeros: int) -> _JSON:
    """``cached_tokens``, then ``zeros``, then ``cache_write_tokens`` where the cache
    reports writes (the breakpoint models')."""
    details: _JSON = {"cached_tokens": tokens.cached_tokens, **zeros}
    if tokens.cache_write_tokens is not None:
        details["cache_write_tokens"] = tokens.cache_write_tokens
    return details


_CHAT_API = _OpenAIAPI("openai", _chat_usage)
_RESPONSES_API = _OpenAIAPI("openai-responses", _responses_usage)


@dataclass(frozen=True)
class _ResponseAnswer:
    """One Responses answer, the pieces its ``response`` object and its stream's
    events share (the same ids in every event)."""

    model: str
    answer: _Answer
    usage: _JSON
    response_id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def status(self) -> str:
        """``"incomplete"`` for an answer cut at ``max_output_tokens``, as the API
        reports it; else ``"completed"``."""
        return "incomplete" if self.answer.finish_reason == "length" else "completed"

    def text_part(self, text: str) -> _JSON:
        return {"type": "output_text", "text": text, "annotations": []}

    def message(self, status: str, content: list[_JSON]) -> _JSON:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def response(self, *, done: bool = True) -> _JSON:
        """The ``response`` object: whole when ``done``; else as a stream's first
        events carry it (``"in_progress"``, no output, no usage yet)."""
        status = self.status if done else "in_progress"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        output = [self.message(status, [self.text_part(self.answer.text)])] if done else []
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "model": self.model,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": self.usage if done else None,
        }

    def events(self) -> Iterator[tuple[str, _JSON]]:
        """The streaming events of the answer, in the API's order, each with its
        ``sequence_number``: the response created and in progress, its message and
        text part added, the text in word deltas, the part, the message and the
        response done (``response.completed``, or ``response.incomplete`` for an
        answer cut short), the last carrying the usage."""
        item = {"item_id": self.message_id, "output_index": 0}
        part = {**item, "content_index": 0}
        events: list[_JSON] = [
            {"type": "response.created", "response": self.response(done=False)},
            {"type": "response.in_progress", "response": self.response(done=False)},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": self.message("in_progress", []),
            },
            {"type": "response.content_part.added", **part, "part": self.text_part("")},
        ]
        events += [
            {"type": "response.output_text.delta", **part, "delta": piece, "logprobs": []}
            for piece in _split_words(self.answer.text)
        ]
        text = self.answer.text
        events += [
            {"type": "response.output_text.done", **part, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **part, "part": self.text_part(text)},
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": self.message(self.status, [self.text_part(text)]),
            },
            {"type": f"response.{self.status}", "response": self.response()},
        ]
        for number, event in enumerate(events):
            yield event["type"], {**event, "sequence_number": number}


def _message_events(model: str, answer: _Answer, usage: _JSON) -> Iterator[tuple[str, _JSON]]:
    """The Messages streaming events of one text answer, in the API's order."""
    start_usage = {**usage, "output_tokens": 1}
    message = _message_object(model, [], None, start_usage)
    yield "message_start", {"type": "message_start", "message": message}
    block = {"type": "text", "text": ""}
    yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    yield "ping", {"type": "ping"}
    for piece in _split_words(answer.text):
        delta = {"type": "text_delta", "text": piece}
        yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    stop = {"stop_reason": _stop_reason(answer), "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": stop, "usage": usage}
    yield "message_stop", {"type": "message_stop"}


def _message_object(
    model: str, content: list[_JSON], stop_reason: str | None, usage: _JSON
) -> _JSON:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def _stop_reason(answer: _Answer) -> str:
    return "max_tokens" if answer.finish_reason == "length" else "end_turn"


class _CloudHandler(_Handler):
    """Routes the APIs; errors on ``/v1/messages`` are Anthropic-shaped, others OpenAI's."""

    server_version = "contextpilot-cloud-emulator"

    def _routes(self) -> dict[tuple[str, str], Callable[[bytes], None]]:
        return {
            ("GET", "/health"): self._health,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/responses"): self._responses,
        }

    def _send_error(self, error: _RequestError) -> None:
        if self.path.startswith("/v1/messages"):
            self._send_json(error.status, _anthropic_error(error))
        else:
            super()._send_error(error)

    def _send_named_events(self, events: Iterator[tuple[str, _JSON]]) -> None:
        """An SSE stream of ``event: <name>`` frames, each with its JSON ``data``."""
        self._send_sse(
            f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
        )

    def _require_key(self) -> None:
        if not (self.headers.get("x-api-key") or self.headers.get("authorization")):
            raise _RequestError("missing API key: send x-api-key or Authorization", status=401)

    def _messages(self, raw: bytes) -> None:
        self._require_key()
        body = _json_body(raw)
        engine: _CloudEngine = self.server.engine
        answer, usage = engine.messages(
            body, self.headers.get("anthropic-version"), self.headers.get("anthropic-beta")
        )
        model = body["model"]
        if not body.get("stream"):
            content = [{"type": "text", "text": answer.text}]
            self._send_json(200, _message_object(model, content, _stop_reason(answer), usage))
            return
        self._send_named_events(_message_events(model, answer, usage))

    def _chat(self, raw: bytes) -> None:
        self._require_key()
        engine: _CloudEngine = self.server.engine
        body = _json_body(raw)
        outcome, model, include_usage = engine.chat(body)
        fmt = _ChatFormat(_Envelope.new(_ChatFormat.id_prefix, model))
        if not body.get("stream"):
            self._send_json(200, fmt.response(outcome.answer, outcome.usage))
            return
        payloads = _stream_payloads(fmt, outcome, include_usage=include_usage, delay_s=0.0)
        self._send_event_stream(payloads)

    def _responses(self, raw: bytes) -> None:
        self._require_key()
        engine: _CloudEngine = self.server.engine
        outcome, request = engine.responses(_json_body(raw))
        answer = _ResponseAnswer(request.model, outcome.answer, outcome.usage)
        if not request.stream:
            self._send_json(200, answer.response())
            return
        self._send_named_events(answer.events())


class CloudCacheServer(_LoopbackServer):
    """Anthropic Messages, OpenAI Chat Completions and Responses on loopback, with
    emulated prompt caches (module docstring). ``clock`` gives the simulated seconds of
    each request (default: ``time.monotonic``); ``answer`` is every reply's text (cut
    to ``max_tokens`` / ``max_output_tokens`` whole words). The caches are public as
    :attr:`anthropic_cache`, :attr:`openai_cache` and :attr:`openai_breakpoint_cache`
    (the ``gpt-5.6`` models'; ``openai_breakpoint_rules`` its rules, ``openai_rules``
    its routing); ``requests`` lists the answered requests, in order.
    """

    thread_name: ClassVar[str] = "cloud-emulator"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        anthropic_rules: ProviderRules | None = None,
        openai_rules: OpenAICacheRules | None = None,
        openai_breakpoint_rules: ProviderRules | None = None,
        clock: Callable[[], float] | None = None,
        tokenizer: Tokenizer | None = None,
        answer: str = DEFAULT_ANSWER,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ConfigError(f"host must be a non-empty string, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(
                f"port must be an integer in 0..65535 (0: any free port), got {port!r}"
            )
        if clock is not None and not callable(clock):
            raise ConfigError("clock must be a callable returning seconds, or None")
        if not isinstance(answer, str) or not answer:
            raise ConfigError("answer must be a non-empty string")
        self.anthropic_cache = AnthropicCacheModel(anthropic_rules)
        self.openai_cache = OpenAICacheModel(openai_rules)
        self.openai_breakpoint_cache = OpenAIBreakpointCacheModel(
            openai_breakpoint_rules, openai_rules
        )
        self._engine = _CloudEngine(
            anthropic=self.anthropic_cache,
            openai=self.openai_cache,
            openai_breakpoint=self.openai_breakpoint_cache,
            tokenizer=tokenizer or default_tokenizer(),
            clock=clock or time.monotonic,
            answer=answer,
        )
        super().__init__(host=host, port=port, engine=self._engine, handler=_CloudHandler)

    @property
    def anthropic_base_url(self) -> str:
        """``http://<host>:<port>``: the Anthropic SDK's ``base_url`` (it adds ``/v1/messages``)."""
        return self.root_url

    @property
    def openai_base_url(self) -> str:
        """``http://<host>:<port>/v1``: the OpenAI SDK's ``base_url``."""
        return f"{self.root_url}/v1"

    @property
    def requests(self) -> list[EmulatedRequest]:
        """A copy of the answered requests, in the order the caches saw them."""
        return self._engine.requests()

    def reset(self) -> None:
        """Forget the recorded requests and empty every cache."""
        self._engine.reset()
