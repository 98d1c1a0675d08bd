"""``ChatContextPilot``: a LangChain chat model over a
:class:`~contextpilot_rag.routing.RoutingClient`. Every call is routed over a fleet of
OpenAI-compatible endpoints by the client's policy and streamed from the engine; the
routing facts (which endpoint answered, TTFT, cached prompt tokens) come back on the
message."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.load.serializable import SerializedConstructor, SerializedNotImplemented
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    InvalidToolCall,
    ToolCall,
    UsageMetadata,
    convert_to_openai_messages,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils import secret_from_env
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr
from typing_extensions import override

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import ChatResult as RoutedAnswer
from contextpilot_rag.routing import Endpoint, Policy, RoutingClient
from contextpilot_rag.routing.client import OwnedClient, client_source

__all__ = ["ChatContextPilot"]

API_KEY_ENV = "CONTEXTPILOT_API_KEY"
"""Where ``api_key`` comes from when not given: the key clients of ``contextpilot-rag
serve`` send (``contextpilot_rag.serve.API_KEY_ENV``; not imported, to keep the serve
package unloaded)."""

_CLIENT_OPTIONS = ("api_key", "timeout", "max_retries")


class ChatContextPilot(OwnedClient, BaseChatModel):
    """A chat model whose requests a :class:`RoutingClient` routes over a fleet.

    Build it from a client (``client=``; the caller keeps and closes it) or from
    ``endpoints=`` with ``model=`` and ``policy=`` (the model creates the client and
    :meth:`close` / :meth:`aclose` close it). Giving both, or neither, raises
    :class:`~contextpilot_rag.errors.ConfigError` before any client is created.

    Each engine delta is one :class:`AIMessageChunk`, yielded as it arrives; a last,
    empty chunk carries the routing facts. On every answer ``response_metadata``
    holds ``endpoint``, ``model_name``, ``ttft_s``, ``e2e_s``, ``cached_tokens``,
    ``prompt_tokens``, ``finish_reason``, ``attempts`` and ``routing_reason``, and
    ``usage_metadata`` the token counts (the cache hit as
    ``input_token_details["cache_read"]``) when the engine reported them.

    ``stop``, ``max_tokens``, ``temperature`` and any other call keyword (``bind``,
    ``invoke``) go to the engine unchanged; ``None`` values are left out.

    Tools: :meth:`bind_tools` sends them in OpenAI format; the engine's tool calls come
    back as ``AIMessage.tool_calls`` (arguments parsed; unparsable ones in
    ``invalid_tool_calls``), and when streaming on the last chunk as whole
    ``tool_call_chunks`` (the client joins the engine's fragments).

    Connection: ``api_key`` (default ``$CONTEXTPILOT_API_KEY``, the key
    ``contextpilot-rag serve`` takes) is sent as a bearer token to every endpoint
    that has no key of its own; ``timeout`` bounds each attempt's every wait for
    progress, in seconds (the client's ``timeout_s``); ``max_retries``: further
    attempts after a failed one (the client's ``max_attempts`` minus one). With
    ``client=`` the client's own settings apply, and giving these too raises
    :class:`~contextpilot_rag.errors.ConfigError`.

    Serialization: ``langchain_core.load.dumpd`` writes the endpoints, the policy name
    and the fields, the key only as a secret reference (``CONTEXTPILOT_API_KEY``), and
    ``load(..., valid_namespaces=["langchain_contextpilot"], secrets_map=...)`` builds an
    equal model. A model built from ``client=``, a policy object, or an endpoint that
    carries its own credentials (URL ``user:password@`` or ``Endpoint.api_key``) is
    written as not serializable, so no secret is ever dumped in plain text.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: RoutingClient | None = Field(default=None, exclude=True)
    """The routing client (created from ``endpoints`` when not given)."""
    endpoints: Sequence[str | Endpoint] | None = Field(default=None, exclude=True, repr=False)
    """Base URLs (``http://host:port/v1``) or :class:`Endpoint` objects of the fleet."""
    model: str | None = None
    """The model to ask for, with ``endpoints=`` (``None``: every model they list)."""
    policy: str | Policy = Field(default="combined", exclude=True)
    """A routing policy name or object, with ``endpoints=``."""
    max_tokens: int | None = None
    """The longest answer, in tokens (``None``: the engine's default)."""
    temperature: float | None = None
    """Sampling temperature (``None``: the engine's default)."""
    api_key: SecretStr | None = Field(
        default_factory=secret_from_env(API_KEY_ENV, default=None), repr=False
    )
    """The bearer token for endpoints without their own (default
    ``$CONTEXTPILOT_API_KEY``, read when the model is built)."""
    timeout: float | None = None
    """Seconds each attempt may wait for progress (``None``: the client's default)."""
    max_retries: int | None = None
    """Attempts after a failed one (``None``: the client's default)."""

    _owns_client: bool = PrivateAttr(default=False)

    def __init__(self, **data: Any) -> None:
        client_source("ChatContextPilot", data)
        _check_client_options(data)
        if data.get("endpoints") is not None:
            data["endpoints"] = [_endpoint_of(endpoint) for endpoint in data["endpoints"]]
        super().__init__(**data)
        if self.client is None:  # here, not in a validator: pydantic would wrap ConfigError
            self.client = RoutingClient(
                _with_key(self.endpoints or (), self.api_key),
                model=self.model,
                policy=self.policy,
                **_client_limits(self.timeout, self.max_retries),
            )
            self._owns_client = True

    @classmethod
    @override
    def is_lc_serializable(cls) -> bool:
        return True

    @property
    @override
    def lc_secrets(self) -> dict[str, str]:
        return {"api_key": API_KEY_ENV}

    @override
    def to_json(self) -> SerializedConstructor | SerializedNotImplemented:
        """The constructor form (endpoints and policy included), or "not implemented"
        when the model holds what cannot be written without a secret or a live object."""
        endpoints = list(self.endpoints or ())
        if not (self._owns_client and isinstance(self.policy, str)) or any(
            _has_credentials(endpoint) for endpoint in endpoints
        ):
            return self.to_json_not_implemented()
        serialized = super().to_json()
        if serialized["type"] == "constructor":
            kwargs = serialized["kwargs"]
            kwargs["endpoints"] = [_endpoint_json(endpoint) for endpoint in endpoints]
            kwargs["policy"] = self.policy
        return serialized

    @property
    def _routing(self) -> RoutingClient:
        if self.client is None:
            raise ConfigError("ChatContextPilot has no RoutingClient")
        return self.client

    @property
    @override
    def _llm_type(self) -> str:
        return "contextpilot-routing"

    @property
    @override
    def _identifying_params(self) -> dict[str, Any]:
        client = self._routing
        return {
            "model": client.model,
            "policy": client.policy.name,
            "replicas": sorted(replica.replica_id for replica in client.replicas),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    @override
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        answer = self._routing.chat(
            convert_to_openai_messages(messages), **self._params(stop, kwargs)
        )
        return _chat_result(answer)

    @override
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        answer = await self._routing.achat(
            convert_to_openai_messages(messages), **self._params(stop, kwargs)
        )
        return _chat_result(answer)

    @override
    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        stream = self._routing.stream(
            convert_to_openai_messages(messages), **self._params(stop, kwargs)
        )
        with stream:  # closing early cancels the request and releases its counters
            for delta in stream:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if run_manager is not None:
                    run_manager.on_llm_new_token(delta, chunk=chunk)
                yield chunk
            yield _last_chunk(stream.result)

    @override
    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        stream = self._routing.astream(
            convert_to_openai_messages(messages), **self._params(stop, kwargs)
        )
        try:
            async for delta in stream:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if run_manager is not None:
                    await run_manager.on_llm_new_token(delta, chunk=chunk)
                yield chunk
            yield _last_chunk(stream.result)
        finally:
            await stream.aclose()

    @override
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model with ``tools`` (dicts, pydantic models, functions or LangChain
        tools, converted to OpenAI's format) sent on every call. ``tool_choice``:
        ``"auto"``, ``"none"``, ``"required"`` (or ``"any"``), a tool's name, or an
        OpenAI ``tool_choice`` dict."""
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            if tool_choice == "any":
                tool_choice = "required"
            elif isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
                tool_choice = {"type": "function", "function": {"name": tool_choice}}
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def _params(self, stop: list[str] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The engine parameters of one call: the fields, overridden by the call's."""
        params = {"max_tokens": self.max_tokens, "temperature": self.temperature, "stop": stop}
        return {key: value for key, value in {**params, **kwargs}.items() if value is not None}


def _check_client_options(data: Mapping[str, Any]) -> None:
    given = [name for name in _CLIENT_OPTIONS if data.get(name) is not None]
    if data.get("client") is not None and given:
        raise ConfigError(
            f"{', '.join(given)} go with endpoints=; a given client has its own settings"
        )


def _endpoint_of(endpoint: object) -> object:
    """An endpoint as given, or an :class:`Endpoint` built from a mapping of its
    fields (what :meth:`ChatContextPilot.to_json` writes)."""
    if not isinstance(endpoint, Mapping):
        return endpoint
    try:
        return Endpoint(**endpoint)
    except TypeError as exc:
        raise ConfigError(f"an endpoint mapping must hold Endpoint fields: {exc}") from exc


def _with_key(
    endpoints: Sequence[str | Endpoint], api_key: SecretStr | None
) -> list[str | Endpoint]:
    """The fleet, ``api_key`` given to every endpoint without its own."""
    if api_key is None:
        return list(endpoints)
    key = api_key.get_secret_value()
    return [
        Endpoint(endpoint, api_key=key)
        if isinstance(endpoint, str)
        else endpoint
        if endpoint.api_key
        else replace(endpoint, api_key=key)
        for endpoint in endpoints
    ]


def _client_limits(timeout: float | None, max_retries: int | None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if timeout is not None:
        limits["timeout_s"] = timeout
    if max_retries is not None:
        limits["max_attempts"] = max_retries + 1
    return limits


def _has_credentials(endpoint: str | Endpoint) -> bool:
    """Whether ``endpoint`` carries a secret of its own (URL userinfo or a key)."""
    url = endpoint if isinstance(endpoint, str) else endpoint.base_url
    authority = url.partition("://")[2].partition("/")[0]
    return "@" in authority or (isinstance(endpoint, Endpoint) and bool(endpoint.api_key))


def _endpoint_json(endpoint: str | Endpoint) -> str | dict[str, Any]:
    """A URL as given; an :class:`Endpoint` as its fields that differ from the defaults."""
    if isinstance(endpoint, str):
        return endpoint
    values = {field.name: getattr(endpoint, field.name) for field in fields(endpoint)}
    defaults = {field.name: field.default for field in fields(endpoint)}
    return {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in values.items()
        if name == "base_url" or value != defaults[name]
    }


def _chat_result(answer: RoutedAnswer) -> ChatResult:
    tool_calls, invalid = _tool_calls(answer)
    message = AIMessage(
        content=answer.text,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
        response_metadata=_routing_facts(answer),
        usage_metadata=_usage(answer),
    )
    return ChatResult(generations=[ChatGeneration(message=message)])


def _tool_calls(answer: RoutedAnswer) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """The engine's tool calls (OpenAI format) as LangChain's, arguments parsed."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for raw in answer.tool_calls:
        try:
            call = parse_tool_call(dict(raw), return_id=True)
        except OutputParserException as exc:
            invalid.append(make_invalid_tool_call(dict(raw), str(exc)))
            continue
        if call is not None:
            calls.append(ToolCall(name=call["name"], args=call["args"], id=call.get("id")))
    return calls, invalid


def _last_chunk(answer: RoutedAnswer) -> ChatGenerationChunk:
    """The empty chunk that closes a stream: metadata merges by concatenating strings
    and adding numbers, so the routing facts travel on this one chunk only."""
    message = AIMessageChunk(
        content="",
        tool_call_chunks=[
            tool_call_chunk(
                name=call.get("function", {}).get("name"),
                args=call.get("function", {}).get("arguments"),
                id=call.get("id"),
                index=index,
            )
            for index, call in enumerate(answer.tool_calls)
        ],
        response_metadata=_routing_facts(answer),
        usage_metadata=_usage(answer),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message)


def _routing_facts(answer: RoutedAnswer) -> dict[str, Any]:
    return {
        "endpoint": answer.endpoint,
        "model_name": answer.model,
        "ttft_s": answer.ttft_s,
        "e2e_s": answer.e2e_s,
        "prompt_tokens": answer.prompt_tokens,
        "cached_tokens": answer.cached_tokens,
        "finish_reason": answer.finish_reason,
        "attempts": answer.attempts,
        "routing_reason": answer.decision.reason,
    }


def _usage(answer: RoutedAnswer) -> UsageMetadata | None:
    """LangChain's token counts, when the engine reported both sides."""
    if answer.prompt_tokens is None or answer.completion_tokens is None:
        return None
    usage = UsageMetadata(
        input_tokens=answer.prompt_tokens,
        output_tokens=answer.completion_tokens,
        total_tokens=answer.prompt_tokens + answer.completion_tokens,
    )
    if answer.cached_tokens is not None:
        usage["input_token_details"] = {"cache_read": answer.cached_tokens}
    return usage
