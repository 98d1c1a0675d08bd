"""The pilot's prompt as LangChain chat messages for hosted prompt caches: Anthropic
``cache_control`` markers where the pilot's cache plan put breakpoints (for
``ChatAnthropic``), or plain text with ``prompt_cache_key`` and the plan's
``prompt_cache_retention`` (for ``ChatOpenAI``).

The core shapes the request (:meth:`Prompt.to_anthropic
<contextpilot_rag.Prompt.to_anthropic>`, :meth:`Prompt.to_openai_request
<contextpilot_rag.Prompt.to_openai_request>`); this module only wraps its messages.
The last message carries :data:`MESSAGE_KEY` in ``additional_kwargs`` (the prompt's
request id, cache key and retention), which neither chat model sends and
:class:`ContextPilotCallbackHandler` pairs the model call with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableLambda,
    RunnableSerializable,
    ensure_config,
)
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field
from typing_extensions import TypedDict, override

from contextpilot_rag import ContextPilot, PilotConfig, Prompt
from contextpilot_rag.cloud import CloudCacheConfig
from contextpilot_rag.errors import ConfigError, InvalidInputError
from contextpilot_rag.pilot import structure_guard_of

from ._documents import check_documents, check_query, document_to_block
from ._settings import configured_conversation, conversation_keyword

__all__ = [
    "MESSAGE_KEY",
    "CachedPromptAnnotation",
    "ContextPilotPromptBuilder",
    "Provider",
    "build_cached_messages",
    "with_prompt_cache_key",
]

Provider = Literal["anthropic", "openai"]

MESSAGE_KEY = "contextpilot"
"""The ``additional_kwargs`` key of the last built message: a :class:`CachedPromptAnnotation`."""

_MESSAGE_TYPES: Mapping[str, type[BaseMessage]] = {
    "system": SystemMessage,
    "user": HumanMessage,
    "assistant": AIMessage,
}


class CachedPromptAnnotation(TypedDict):
    """What the last built message carries under :data:`MESSAGE_KEY`."""

    request_id: str
    prompt_cache_key: str | None
    conversation_id: str | None
    prompt_cache_retention: str | None
    prompt_cache_options: dict[str, str] | None


def build_cached_messages(prompt: Prompt, provider: Provider = "anthropic") -> list[BaseMessage]:
    """``prompt`` as LangChain messages (system, the conversation's history, the turn).

    ``"anthropic"``: every message's content is the list of text blocks of
    :meth:`Prompt.to_anthropic <contextpilot_rag.Prompt.to_anthropic>`, with
    ``"cache_control"`` on the blocks where :attr:`Prompt.cache_plan
    <contextpilot_rag.Prompt.cache_plan>` put breakpoints: ``ChatAnthropic`` sends them
    as they are. ``"openai"``: plain string contents (OpenAI caches automatically), or
    for a plan made with OpenAI's breakpoint rules (``gpt-5.6`` and later) the text
    blocks of :meth:`Prompt.to_openai_request
    <contextpilot_rag.Prompt.to_openai_request>` with ``"prompt_cache_breakpoint"``,
    which ``ChatOpenAI`` sends as they are; send the prompt's cache key, retention and
    cache options with :func:`with_prompt_cache_key`."""
    messages: list[BaseMessage] = []
    options: dict[str, str] | None = None
    if provider == "anthropic":
        request = prompt.to_anthropic()
        if request.get("system"):
            messages.append(SystemMessage(content=request["system"]))
    elif provider == "openai":
        request = prompt.to_openai_request(cache_key=False, cache_retention=False)
        options = request.get("prompt_cache_options")
    else:
        raise InvalidInputError(f"provider must be 'anthropic' or 'openai', got {provider!r}")
    messages += [_MESSAGE_TYPES[m["role"]](content=m["content"]) for m in request["messages"]]
    messages[-1].additional_kwargs[MESSAGE_KEY] = CachedPromptAnnotation(
        request_id=prompt.request_id,
        prompt_cache_key=prompt.prompt_cache_key,
        conversation_id=prompt.conversation_id,
        prompt_cache_retention=prompt.prompt_cache_retention,
        prompt_cache_options=options,
    )
    return messages


def annotation_of(messages: Sequence[BaseMessage]) -> CachedPromptAnnotation | None:
    """The annotation built messages carry (on the last one that has it), or ``None``."""
    for message in reversed(messages):
        annotation = getattr(message, "additional_kwargs", {}).get(MESSAGE_KEY)
        if isinstance(annotation, Mapping) and isinstance(annotation.get("request_id"), str):
            return CachedPromptAnnotation(
                request_id=annotation["request_id"],
                prompt_cache_key=annotation.get("prompt_cache_key"),
                conversation_id=annotation.get("conversation_id"),
                prompt_cache_retention=_str_or_none(annotation.get("prompt_cache_retention")),
                prompt_cache_options=_options_or_none(annotation.get("prompt_cache_options")),
            )
    return None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _options_or_none(value: object) -> dict[str, str] | None:
    if not isinstance(value, Mapping):
        return None
    return {str(name): str(option) for name, option in value.items()}


def with_prompt_cache_key(
    model: Runnable[LanguageModelInput, BaseMessage],
) -> Runnable[list[BaseMessage], BaseMessage]:
    """``model`` called with the ``prompt_cache_key`` of the built messages it gets, and
    the ``prompt_cache_retention`` and ``prompt_cache_options`` their cache plan asks
    for (``ChatOpenAI`` sends them as request fields; the options in ``extra_body``,
    added to the model's own, since the ``openai`` SDK names them only in its recent
    releases); a field the messages lack is not sent. Streams as ``model`` does."""

    def bind_key(messages: list[BaseMessage]) -> Runnable[LanguageModelInput, BaseMessage]:
        annotation = annotation_of(messages)
        if annotation is None:
            return model
        sent: dict[str, Any] = {
            "prompt_cache_key": annotation["prompt_cache_key"],
            "prompt_cache_retention": annotation["prompt_cache_retention"],
        }
        fields = {name: value for name, value in sent.items() if value is not None}
        options = annotation["prompt_cache_options"]
        if options is not None:  # in extra_body: openai SDKs before 2.5x do not name it
            extra_body = dict(getattr(model, "extra_body", None) or {})
            fields["extra_body"] = {**extra_body, "prompt_cache_options": options}
        return model.bind(**fields) if fields else model

    return RunnableLambda(bind_key, name="with_prompt_cache_key")


_PLANNED = PilotConfig(cloud=CloudCacheConfig(enabled=True))


class ContextPilotPromptBuilder(RunnableSerializable[Mapping[str, Any], list[BaseMessage]]):
    """A runnable from ``{"documents": [...], "question": "..."}`` to the chat messages
    of the pilot's prompt (:func:`build_cached_messages`), for ``ChatAnthropic``
    (markers on content blocks) or ``ChatOpenAI`` (through :func:`with_prompt_cache_key`)::

        builder = ContextPilotPromptBuilder(pilot=pilot, system="Answer from the documents.")
        chain = {"documents": retriever, "question": RunnablePassthrough()} | builder | claude

    It runs ``pilot.optimize`` on the documents itself: give it a plain retriever's
    documents (those of :class:`ContextPilotRetriever` are accepted, but that retriever
    has run the pilot on them once already). The chat history is the pilot's: with a
    conversation id — the input's ``"conversation_id"``, else
    ``config["configurable"]`` ``conversation_id`` / ``session_id`` / ``thread_id``,
    else the field — the prompt carries the conversation's earlier turns, byte for byte
    as they were sent, and documents it already showed are named rather than repeated;
    record each answer with ``pilot.record_answer(conversation_id, answer.text)``. A
    conversation id is a non-empty ``str``; an ``int`` or ``UUID`` ``thread_id`` names
    the conversation ``str(thread_id)``.

    No documents (a retrieval with no hit): in a conversation, the pilot's prompt of
    the turn (the history and the question; the turn enters the history, so record
    its answer as any other); without one, the system prompt and the question line
    alone, as the pilot writes them (plain content, no :data:`MESSAGE_KEY`: there is
    no pilot prompt to pair or cache).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pilot: ContextPilot = Field(default_factory=lambda: ContextPilot(_PLANNED))
    """The pilot that owns the context index, the conversations and the cache plan. Its
    ``PilotConfig.cloud`` must have ``enabled=True`` (:class:`ConfigError` otherwise):
    without it the prompts carry no breakpoints. Defaults to a new pilot with the
    Anthropic rules."""

    provider: Provider = "anthropic"
    """``"anthropic"``: content blocks with ``cache_control``; ``"openai"``: plain text."""

    def __init__(self, **data: Any) -> None:
        # here, not in a validator: pydantic would wrap ConfigError in a ValidationError
        pilot = data.get("pilot")
        if isinstance(pilot, ContextPilot) and not pilot.config.cloud.enabled:
            raise ConfigError(
                "ContextPilotPromptBuilder needs a pilot that plans cache breakpoints: "
                "ContextPilot(PilotConfig(cloud=CloudCacheConfig(enabled=True, ...)))"
            )
        super().__init__(**data)

    system: str | None = None
    """The system prompt (``None``: none)."""

    conversation_id: str | None = Field(default=None, min_length=1)
    """The conversation when neither the input nor the config names one."""

    id_key: str | None = None
    """Metadata key holding a document's block id (else ``Document.id``, else a hash)."""

    @override
    def invoke(
        self, input: Mapping[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        config = ensure_config(config)
        return self._call_with_config(
            lambda value: self._build(value, config), input, config, run_type="prompt"
        )

    @override
    async def ainvoke(
        self, input: Mapping[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        config = ensure_config(config)

        async def build(value: Mapping[str, Any]) -> list[BaseMessage]:
            # off the event loop: the pilot tokenizes new documents, and a shared store
            # (Redis, SQLite) is a blocking round trip
            return await run_in_executor(config, self._build, value, config)

        return await self._acall_with_config(build, input, config, run_type="prompt")

    def _build(self, value: Mapping[str, Any], config: RunnableConfig) -> list[BaseMessage]:
        if not isinstance(value, Mapping):
            raise InvalidInputError(
                "ContextPilotPromptBuilder takes {'documents': [...], 'question': '...'}, "
                f"got {type(value).__name__}"
            )
        question = check_query(value.get("question"))
        documents = check_documents(value.get("documents", []))
        conversation_id = self._conversation(value, config)
        if not documents and conversation_id is None:
            return self._question_only(question)
        blocks = [document_to_block(doc, n, self.id_key) for n, doc in enumerate(documents)]
        prompt = self.pilot.optimize(
            blocks, question, conversation_id=conversation_id, system=self.system
        )
        return build_cached_messages(prompt, self.provider)

    def _question_only(self, question: str) -> list[BaseMessage]:
        """The messages of a request without documents (a retrieval with no hit) and
        without a conversation: the system prompt and the pilot's question line, as
        the pilot writes them, with no context and no :data:`MESSAGE_KEY` (no pilot
        prompt, so nothing to pair or cache)."""
        config = self.pilot.config
        system = self.system if self.system is not None else config.system_prompt
        query = structure_guard_of(self.pilot).escape(question)
        texts = [
            (SystemMessage, system),
            (HumanMessage, config.question_template.format(query=query)),
        ]
        return [kind(content=self._content(text)) for kind, text in texts if text and text.strip()]

    def _content(self, text: str) -> str | list[str | dict[str, Any]]:
        """``text`` as a message content of :attr:`provider` (without cache markers)."""
        return [{"type": "text", "text": text}] if self.provider == "anthropic" else text

    def _conversation(self, value: Mapping[str, Any], config: RunnableConfig) -> str | None:
        named = conversation_keyword(dict(value), "builder input")
        if named is None:
            named = configured_conversation(config.get("configurable") or {})
        return named if named is not None else self.conversation_id
