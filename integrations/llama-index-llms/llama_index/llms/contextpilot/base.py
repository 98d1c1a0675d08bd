"""The LlamaIndex LLM over a :class:`~contextpilot_rag.routing.RoutingClient`: every
request is routed over a fleet of OpenAI-compatible endpoints by the client's policy
and streamed from the engine, delta by delta.

Which endpoint the engine serves decides both paths (``is_chat_model``):

- ``True`` (default): ``chat`` sends the messages to ``/chat/completions``, and
  ``complete`` sends the prompt there as one user message (the engine applies its chat
  template, as for every other chat model in LlamaIndex);
- ``False`` (base models): ``complete`` sends the prompt to ``/completions`` (through
  ``completion_to_prompt`` unless ``formatted``), and ``chat`` renders the messages
  with ``messages_to_prompt`` and does the same.

Tool calling (chat engines): ``chat_with_tools`` / ``stream_chat_with_tools`` and the
agents built on them send LlamaIndex tools in OpenAI format; the engine's tool calls
come back as :class:`ToolCallBlock` blocks of the answer's message (and OpenAI-shaped
in its ``additional_kwargs["tool_calls"]``), and a history holding them (an assistant message
with tool calls, as blocks or, as LlamaIndex's OpenAI LLMs keep them, in
``additional_kwargs["tool_calls"]``; ``TOOL`` messages with
``additional_kwargs["tool_call_id"]``) is sent as the OpenAI API expects, without the
``ThinkingBlock`` blocks a reasoning model's answers carry. A message with
:class:`ImageBlock` blocks is sent as OpenAI content parts (``image_url``: the block's
URL, or its bytes or file as a base64 data URL); audio, video and document blocks are
refused.

Every answer carries the routing facts in ``additional_kwargs`` (``endpoint``,
``model``, ``ttft_s``, ``e2e_s``, ``prompt_tokens``, ``cached_tokens``,
``completion_tokens``, ``finish_reason``, ``attempts``, ``routing_reason``) and the
engine's usage, OpenAI-shaped, in ``raw["usage"]`` (what ``TokenCountingHandler``
reads). A stream yields one response per engine delta, as it arrives, then a last one
with an empty ``delta`` that carries those facts.

Serialization (``to_dict`` / ``to_json`` and back): the endpoints (URLs, or
:class:`Endpoint` objects as their fields), ``model``, a policy given by name and every
setting round-trip. Secrets are written as given, as ``OpenAILike`` writes its
``api_key``: keep the dict as secret as the key, or leave the key out
(``to_dict(exclude={"api_key"})``) and give it back (``from_dict(data, api_key=...)``).
What instrumentation emits is :meth:`to_payload` (the metadata), which holds none.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from llama_index.core.base.llms.generic_utils import (
    messages_to_prompt as generic_messages_to_prompt,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    ImageBlock,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import (
    Field,
    PrivateAttr,
    field_serializer,
    field_validator,
)
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW, DEFAULT_NUM_OUTPUTS
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection, default_completion_to_prompt
from llama_index.llms.contextpilot._model_list import reported_context_window

from contextpilot_rag.errors import ConfigError, InvalidInputError
from contextpilot_rag.routing import AsyncChatStream, ChatStream, Endpoint, Policy, RoutingClient
from contextpilot_rag.routing import ChatResult as RoutedAnswer
from contextpilot_rag.routing.client import ClientConfig, OwnedClient, client_source

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["ContextPilotLLM"]

MODEL_LIST_TIMEOUT_S = 2.0
"""The longest wait for the endpoints' ``GET /models``, all asked at once (read once,
for the context)."""

Kind = Literal["chat", "completion"]
Payload = str | list[dict[str, Any]]
"""What one request sends: a completion prompt or OpenAI chat messages."""

_Response = TypeVar("_Response", ChatResponse, CompletionResponse)
_MakeResponse = Callable[[str, str | None, RoutedAnswer | None], _Response]


class ContextPilotLLM(OwnedClient, FunctionCallingLLM):
    """A LlamaIndex LLM whose requests a :class:`RoutingClient` routes over a fleet.

    Build it from a client (``client=``; the caller keeps and closes it) or from
    ``endpoints=`` with ``model=`` and ``policy=`` (the LLM creates the client and
    :meth:`close` / :meth:`aclose` close it). Giving both, or neither, raises
    :class:`~contextpilot_rag.errors.ConfigError` before any client is created.

    ``api_key``, ``timeout`` and ``max_retries`` are ``OpenAILike``'s: the key goes as
    a bearer token to every endpoint given as a URL (an :class:`Endpoint` with a key
    of its own keeps it); ``timeout`` bounds each wait for progress of an attempt
    (to connect, for the first token, between two tokens); ``max_retries`` failed
    attempts are retried on another endpoint. With ``client=`` they are the client's
    (shown in the fields; a different value is a ``ConfigError``).

    ``context_window``: ``None`` (default) takes the smallest ``max_model_len`` the
    endpoints report in ``GET /models`` (vLLM, SGLang), read on the first use of
    :attr:`metadata`, once per LLM, from every endpoint at once within one short
    deadline (:data:`MODEL_LIST_TIMEOUT_S`, or ``timeout`` if shorter: LlamaIndex
    reads the metadata on the event loop in its async calls), else LlamaIndex's
    default (also over a given client, whose endpoints the LLM does not see); a
    number is used as given.

    ``is_function_calling_model``: ``False`` unless set, since no OpenAI-compatible
    server says in its model list whether its chat template and parser handle tools
    (``chat_with_tools`` works either way; the flag is what agents and structured
    outputs go by).

    ``max_tokens``, ``temperature``, ``additional_kwargs`` and the keywords of each
    call go to the engine unchanged (``None`` values left out; the call's win).
    """

    client: RoutingClient | None = Field(
        default=None, exclude=True, description="The routing client (created when not given)."
    )
    endpoints: Sequence[str | Endpoint] | None = Field(
        default=None, repr=False, description="Base URLs or Endpoint objects."
    )
    model: str | None = Field(
        default=None, description="The model to ask for, with endpoints= (None: all listed)."
    )
    policy: str | Policy = Field(default="combined", description="Routing policy name or object.")
    api_key: str | None = Field(
        default=None, repr=False, description="Bearer token for the endpoints given as URLs."
    )
    timeout: float = Field(
        default=ClientConfig.timeout_s,
        gt=0,
        description="Seconds an attempt may wait for progress (connect, each token).",
    )
    max_retries: int = Field(
        default=ClientConfig.max_attempts - 1,
        ge=0,
        description="Failed attempts retried on another endpoint.",
    )
    max_tokens: int | None = Field(default=None, description="Longest answer, in tokens.")
    temperature: float | None = Field(default=None, description="Sampling temperature.")
    additional_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Engine parameters sent with every request."
    )
    context_window: int | None = Field(
        default=None,
        gt=0,
        description="The model's context, in tokens (None: as the endpoints report it).",
    )
    is_chat_model: bool = Field(
        default=True, description="The engine serves /chat/completions (else /completions)."
    )
    is_function_calling_model: bool = Field(
        default=False, description="The engine parses tool calls (needs is_chat_model)."
    )

    _owns_client: bool = PrivateAttr(default=False)
    _reported_context: int | None = PrivateAttr(default=None)
    _context_read: bool = PrivateAttr(default=False)
    _context_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, **data: Any) -> None:
        client = client_source("ContextPilotLLM", data)
        if client is not None:
            _take_client_settings(client, data)
        elif data.get("policy", "combined") is None:
            raise ConfigError(
                "policy=None is how a policy object is saved (it does not serialize): "
                "pass policy= (a name or a policy object), e.g. to from_dict / from_json"
            )
        super().__init__(**data)
        if self.is_function_calling_model and not self.is_chat_model:
            raise ConfigError("is_function_calling_model=True needs is_chat_model=True")
        if self.client is None:  # here, not in a validator: pydantic would wrap ConfigError
            self.client = RoutingClient(
                self._fleet(),
                model=self.model,
                policy=self.policy,
                timeout_s=self.timeout,
                max_attempts=self.max_retries + 1,
            )
            self._owns_client = True

    @classmethod
    def class_name(cls) -> str:
        return "ContextPilotLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._context_window(),
            num_output=self.max_tokens or DEFAULT_NUM_OUTPUTS,
            is_chat_model=self.is_chat_model,
            is_function_calling_model=self.is_function_calling_model,
            model_name=self._routing.model or "contextpilot-routing",
        )

    @field_validator("endpoints", mode="before")
    @classmethod
    def _endpoints_from_data(cls, endpoints: Any) -> Any:
        """Endpoints as :meth:`_endpoints_data` writes them: dicts become Endpoints."""
        if isinstance(endpoints, (list, tuple)):
            return [Endpoint(**e) if isinstance(e, Mapping) else e for e in endpoints]
        return endpoints

    @field_serializer("endpoints")
    def _endpoints_data(
        self, endpoints: Sequence[str | Endpoint] | None
    ) -> list[str | dict[str, Any]] | None:
        """URLs as they are, :class:`Endpoint` objects as their fields."""
        if endpoints is None:
            return None
        return [e if isinstance(e, str) else asdict(e) for e in endpoints]

    @field_serializer("policy")
    def _policy_data(self, policy: str | Policy) -> str | None:
        """A policy name; ``None`` for a policy object (it does not serialize) and for
        an LLM over a given client (the client has its own)."""
        return policy if isinstance(policy, str) and self._owns_client else None

    def _fleet(self) -> list[str | Endpoint]:
        """The endpoints to route over, ``api_key`` given to those without a key."""
        return [_with_key(endpoint, self.api_key) for endpoint in self.endpoints or ()]

    def _context_window(self) -> int:
        """``context_window``, else what the endpoints report (read once), else
        LlamaIndex's default."""
        if self.context_window is not None:
            return self.context_window
        with self._context_lock:
            if not self._context_read:
                self._reported_context = self._read_context_window()
                self._context_read = True
        return self._reported_context or DEFAULT_CONTEXT_WINDOW

    def _read_context_window(self) -> int | None:
        if not self._owns_client:  # a given client's endpoints are its own
            return None
        fleet = [e if isinstance(e, Endpoint) else Endpoint(e) for e in self._fleet()]
        return reported_context_window(
            fleet,
            self.model,
            timeout_s=min(MODEL_LIST_TIMEOUT_S, self.timeout),
            transport=self._routing.config.transport,
        )

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The ``chat`` arguments of a tool-calling turn: the tools in OpenAI format,
        ``tool_choice`` ``"required"`` or ``"auto"``, ``parallel_tool_calls``."""
        if not self.is_chat_model:
            raise ConfigError("tool calling needs a chat engine (is_chat_model=True)")
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        specs = [tool.metadata.to_openai_tool(skip_length_check=True) for tool in tools]
        if specs:
            kwargs.setdefault("tools", specs)
            kwargs.setdefault("tool_choice", "required" if tool_required else "auto")
            kwargs.setdefault("parallel_tool_calls", allow_parallel_tool_calls)
        return {"messages": messages, **kwargs}

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The answer's tool calls; arguments that are not a JSON object give ``{}``."""
        selections = []
        for block in response.message.blocks:
            if isinstance(block, ToolCallBlock):
                arguments = block.tool_kwargs
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments) if arguments.strip() else {}
                    except json.JSONDecodeError:
                        arguments = {}
                selections.append(
                    ToolSelection(
                        tool_id=block.tool_call_id or "",
                        tool_name=block.tool_name,
                        tool_kwargs=arguments if isinstance(arguments, dict) else {},
                    )
                )
        if not selections and error_on_no_tool_call:
            raise ValueError("the answer holds no tool call")
        return selections

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        answer = self._answer(*self._chat_request(messages), kwargs)
        return _chat_response(answer.text, None, answer)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        answer = self._answer(*self._completion_request(prompt, formatted), kwargs)
        return _completion_response(answer.text, None, answer)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return _responses(self._stream(*self._chat_request(messages), kwargs), _chat_response)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        stream = self._stream(*self._completion_request(prompt, formatted), kwargs)
        return _responses(stream, _completion_response)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        answer = await self._aanswer(*self._chat_request(messages), kwargs)
        return _chat_response(answer.text, None, answer)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        answer = await self._aanswer(*self._completion_request(prompt, formatted), kwargs)
        return _completion_response(answer.text, None, answer)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        stream = self._astream(*self._chat_request(messages), kwargs)
        return _aresponses(stream, _chat_response)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        stream = self._astream(*self._completion_request(prompt, formatted), kwargs)
        return _aresponses(stream, _completion_response)

    @property
    def _routing(self) -> RoutingClient:
        if self.client is None:
            raise ConfigError("ContextPilotLLM has no RoutingClient")
        return self.client

    def _chat_request(self, messages: Sequence[ChatMessage]) -> tuple[Kind, Payload]:
        if self.is_chat_model:
            return "chat", [_openai_message(index, m) for index, m in enumerate(messages)]
        to_prompt = self.messages_to_prompt or generic_messages_to_prompt  # None: reassigned
        return "completion", to_prompt(messages)

    def _completion_request(self, prompt: str, formatted: bool) -> tuple[Kind, Payload]:
        if self.is_chat_model:
            return "chat", [{"role": MessageRole.USER.value, "content": prompt}]
        to_prompt = self.completion_to_prompt or default_completion_to_prompt
        return "completion", prompt if formatted else to_prompt(prompt)

    def _params(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The engine parameters of one call: the fields, overridden by the call's."""
        fields = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        merged = {**self.additional_kwargs, **fields, **kwargs}
        return {key: value for key, value in merged.items() if value is not None}

    def _answer(self, kind: Kind, payload: Payload, kwargs: Mapping[str, Any]) -> RoutedAnswer:
        ask = self._routing.chat if kind == "chat" else self._routing.complete
        return ask(payload, **self._params(kwargs))

    async def _aanswer(
        self, kind: Kind, payload: Payload, kwargs: Mapping[str, Any]
    ) -> RoutedAnswer:
        ask = self._routing.achat if kind == "chat" else self._routing.acomplete
        return await ask(payload, **self._params(kwargs))

    def _stream(self, kind: Kind, payload: Payload, kwargs: Mapping[str, Any]) -> ChatStream:
        return self._routing.stream(payload, kind=kind, **self._params(kwargs))

    def _astream(self, kind: Kind, payload: Payload, kwargs: Mapping[str, Any]) -> AsyncChatStream:
        return self._routing.astream(payload, kind=kind, **self._params(kwargs))


def _with_key(endpoint: str | Endpoint, api_key: str | None) -> str | Endpoint:
    """``endpoint`` sending ``api_key`` unless it has a key of its own."""
    if api_key is None:
        return endpoint
    if isinstance(endpoint, str):
        return Endpoint(endpoint, api_key=api_key)
    return endpoint if endpoint.api_key else replace(endpoint, api_key=api_key)


def _take_client_settings(client: RoutingClient, data: dict[str, Any]) -> None:
    """With ``client=``, ``timeout`` and ``max_retries`` are the client's: filled in
    when not given, a ``ConfigError`` when given otherwise; ``api_key`` is refused (the
    client's endpoints carry their own keys). A ``policy=None`` (how an LLM over a
    given client serializes its policy) is dropped."""
    if data.get("api_key") is not None:
        raise ConfigError("api_key= goes with endpoints=; a given client's endpoints have theirs")
    own = {"timeout": client.config.timeout_s, "max_retries": client.config.max_attempts - 1}
    for name, value in own.items():
        given = data.setdefault(name, value)
        if given != value:
            raise ConfigError(
                f"{name}={given!r} differs from the given client's {value!r}; "
                "a given client has its own: set it on the RoutingClient"
            )
    if "policy" in data and data["policy"] is None:
        del data["policy"]


def _openai_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """The OpenAI message of ``message``: its text (content parts in block order when
    it holds images), its tool calls (an assistant's :class:`ToolCallBlock` blocks,
    else the OpenAI-shaped ``additional_kwargs["tool_calls"]`` that LlamaIndex's OpenAI
    LLMs write) and, for a ``TOOL`` message, the id of the call it answers. A
    :class:`ThinkingBlock` (a reasoning model's thoughts) is left out, as OpenAI's API
    takes none back; other blocks (audio, video, documents) are refused rather than
    dropped."""
    parts: list[dict[str, Any]] = []
    calls: list[ToolCallBlock] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(index, block))
        elif isinstance(block, ToolCallBlock):
            calls.append(block)
        elif isinstance(block, ThinkingBlock):
            continue
        else:
            raise InvalidInputError(
                f"messages[{index}] holds a {type(block).__name__}; ContextPilotLLM sends "
                "text, images and tool calls only"
            )
    openai_calls = [_openai_tool_call(call) for call in calls] or _kwargs_tool_calls(index, message)
    text = "".join(part["text"] for part in parts if part["type"] == "text")
    images = any(part["type"] == "image_url" for part in parts)
    out: dict[str, Any] = {
        "role": message.role.value,
        "content": parts if images else text or ("" if not openai_calls else None),
    }
    if openai_calls:
        out["tool_calls"] = openai_calls
    if message.role == MessageRole.TOOL:
        call_id = message.additional_kwargs.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidInputError(
                f"messages[{index}] is a tool message without additional_kwargs['tool_call_id']"
            )
        out["tool_call_id"] = call_id
    return out


def _kwargs_tool_calls(index: int, message: ChatMessage) -> list[dict[str, Any]]:
    """An assistant's OpenAI-shaped tool calls from ``additional_kwargs["tool_calls"]``
    (dicts with an ``id`` and a ``function``; SDK objects are dumped), ``[]`` without."""
    found = message.additional_kwargs.get("tool_calls")
    if not found or message.role != MessageRole.ASSISTANT:
        return []
    calls = [c.model_dump() if hasattr(c, "model_dump") else c for c in found]
    if not all(isinstance(c, dict) and c.get("id") and "function" in c for c in calls):
        raise InvalidInputError(
            f"messages[{index}].additional_kwargs['tool_calls'] must be OpenAI tool calls "
            "(each with an 'id' and a 'function')"
        )
    return [{"type": "function", **c} for c in calls]


def _image_part(index: int, block: ImageBlock) -> dict[str, Any]:
    """An OpenAI ``image_url`` content part: the block's URL, else its bytes (or file)
    as a base64 data URL."""
    if block.url is not None:
        url = str(block.url)
    else:
        try:
            data = block.resolve_image(as_base64=True).read().decode("ascii")
        except (ValueError, OSError) as exc:
            raise InvalidInputError(f"messages[{index}]: unreadable image ({exc})") from exc
        url = f"data:{block.image_mimetype or 'image/png'};base64,{data}"
    image_url = {"url": url} if block.detail is None else {"url": url, "detail": block.detail}
    return {"type": "image_url", "image_url": image_url}


def _openai_tool_call(block: ToolCallBlock) -> dict[str, Any]:
    arguments = block.tool_kwargs
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": block.tool_call_id,
        "type": "function",
        "function": {"name": block.tool_name, "arguments": arguments},
    }


def _responses(
    stream: ChatStream, make: _MakeResponse[_Response]
) -> Generator[_Response, None, None]:
    text = ""
    with stream:  # closing the generator early cancels the request
        for delta in stream:
            text += delta
            yield make(text, delta, None)
        yield make(text, "", stream.result)


async def _aresponses(
    stream: AsyncChatStream, make: _MakeResponse[_Response]
) -> AsyncGenerator[_Response, None]:
    text = ""
    try:
        async for delta in stream:
            text += delta
            yield make(text, delta, None)
        yield make(text, "", stream.result)
    finally:
        await stream.aclose()


def _chat_response(text: str, delta: str | None, answer: RoutedAnswer | None) -> ChatResponse:
    blocks: list[TextBlock | ToolCallBlock] = [TextBlock(text=text)]
    calls: dict[str, Any] = {}
    if answer is not None and answer.tool_calls:
        blocks += [
            ToolCallBlock(
                tool_call_id=call.get("id"),
                tool_name=call.get("function", {}).get("name") or "",
                tool_kwargs=call.get("function", {}).get("arguments") or "",
            )
            for call in answer.tool_calls
        ]
        calls["tool_calls"] = [dict(call) for call in answer.tool_calls]
    message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=calls)
    return ChatResponse(message=message, delta=delta, **_answer_fields(answer))


def _completion_response(
    text: str, delta: str | None, answer: RoutedAnswer | None
) -> CompletionResponse:
    return CompletionResponse(text=text, delta=delta, **_answer_fields(answer))


def _answer_fields(answer: RoutedAnswer | None) -> dict[str, Any]:
    """``additional_kwargs`` and ``raw`` of a response (none while streaming)."""
    if answer is None:
        return {}
    facts = {
        "endpoint": answer.endpoint,
        "model": answer.model,
        "ttft_s": answer.ttft_s,
        "e2e_s": answer.e2e_s,
        "prompt_tokens": answer.prompt_tokens,
        "cached_tokens": answer.cached_tokens,
        "completion_tokens": answer.completion_tokens,
        "finish_reason": answer.finish_reason,
        "attempts": answer.attempts,
        "routing_reason": answer.decision.reason,
    }
    return {"additional_kwargs": facts, "raw": {"usage": _usage(answer)}}


def _usage(answer: RoutedAnswer) -> dict[str, Any]:
    """The engine's usage as the OpenAI API writes it (unknown counts left out)."""
    counts = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens}
    usage: dict[str, Any] = {key: value for key, value in counts.items() if value is not None}
    if answer.prompt_tokens is not None and answer.completion_tokens is not None:
        usage["total_tokens"] = answer.prompt_tokens + answer.completion_tokens
    if answer.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
    return usage
