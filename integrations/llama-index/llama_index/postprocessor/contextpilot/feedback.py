"""``ContextPilotEventHandler``: the engine's cache truth from every LlamaIndex LLM call
back to the pilot whose nodes the call carried.

How a postprocessing is related to the LLM call of the same query: by the span tree.
LlamaIndex runs every instrumented method in a span and tells span handlers each span's
parent; the ContextPilot postprocessor dispatches a :class:`ContextPilotPromptEvent`
from inside its span, and LLM start / end events carry the LLM call's span. The query
engine's or chat engine's top span (the *root*) holds both, so the pairing is exact
however many queries run at once (threads, asyncio tasks). A contextvar set by the
postprocessor would be simpler but would leak into the next LLM call of the same task
or thread whenever a retrieval is not followed by one; spans end, contextvars do not.
When the retrieval and the LLM call share no root (called one after the other by the
application), :class:`~contextpilot_rag.feedback.CallFeedback` pairs them only when a
single retrieval waits and the LLM call is made on its own: no span but the LLM's own
(one call runs as nested spans of the LLM's methods) encloses it, so an LLM call inside
an engine (a condense-question step) never takes another query's prompt.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.exception import ExceptionEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
    LLMCompletionStartEvent,
)
from llama_index.core.instrumentation.span import BaseSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index_instrumentation import get_dispatcher
from llama_index_instrumentation.dispatcher import Dispatcher

from contextpilot_rag import ContextPilot
from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.feedback import CallFeedback, FeedbackCounts

from .base import ContextPilotPromptEvent

__all__ = ["ContextPilotEventHandler"]

logger = logging.getLogger(__name__)


class _SpanTree(BaseSpanHandler[BaseSpan]):
    """Tells :class:`CallFeedback` each span's parent as it starts (and whether it is
    an LLM's own), and its end; keeps no spans itself."""

    _feedback: CallFeedback = PrivateAttr()

    def __init__(self, feedback: CallFeedback) -> None:
        super().__init__()
        self._feedback = feedback

    @classmethod
    def class_name(cls) -> str:
        return "ContextPilotSpanTree"

    def span_enter(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_started(id_, parent_id, of_model=isinstance(instance, BaseLLM))

    def span_exit(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_ended(id_)

    def span_drop(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.model_failed(id_)
        self._feedback.run_ended(id_)

    def new_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_span_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        return None

    def prepare_to_exit_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> None:
        return None

    def prepare_to_drop_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        return None


class ContextPilotEventHandler(BaseEventHandler):
    """Reports what the engine served from its prefix cache for each LLM call of a query
    to ``pilot`` (:meth:`ContextPilot.observe <contextpilot_rag.ContextPilot.observe>` by
    request id), so a prefix the engine no longer holds stops steering reorders.

    Attach it, with the span handler it needs, to LlamaIndex's root dispatcher::

        handler = ContextPilotEventHandler(pilot).attach()

    An LLM call is paired with the prompt a :class:`ContextPilotNodePostprocessor` of the
    same ``pilot`` built under the same root span (one query or chat turn), when exactly
    one waits; else, for an LLM called on its own (not inside an engine), with the
    single prompt left over from an earlier, finished span (the postprocessor called
    on its own), when exactly one waits; else it is counted ``unmatched``. A failed
    LLM call leaves its prompt to the next one under the same root. The usage is read
    from the response's ``raw`` (the OpenAI response:
    ``usage.prompt_tokens_details.cached_tokens``; when streaming, the last chunk, so
    ask ``OpenAILike`` for ``stream_options={"include_usage": True}``) or
    ``additional_kwargs`` (``ContextPilotLLM``'s ``cached_tokens``). Nothing it does
    raises into the query: failures are logged and counted (:attr:`counts`).
    Thread-safe; memory bounded by ``max_runs``.
    """

    pilot: ContextPilot = Field(exclude=True, repr=False)
    max_runs: int = 10_000

    _feedback: CallFeedback = PrivateAttr()
    _spans: _SpanTree = PrivateAttr()

    def __init__(self, pilot: ContextPilot, *, max_runs: int = 10_000) -> None:
        if not isinstance(pilot, ContextPilot):
            raise InvalidInputError(
                f"ContextPilotEventHandler needs a ContextPilot, got {type(pilot).__name__}"
            )
        # a condense-question call must not take another query's leftover prompt
        feedback = CallFeedback(pilot, max_runs=max_runs, leftovers="standalone")
        fields: dict[str, Any] = {"pilot": pilot, "max_runs": max_runs}
        super().__init__(**fields)
        self._feedback = feedback
        self._spans = _SpanTree(feedback)

    @classmethod
    def class_name(cls) -> str:
        return "ContextPilotEventHandler"

    @property
    def counts(self) -> FeedbackCounts:
        """LLM calls ``observed`` (and requests ``evicted``), ``unmatched``, answered
        with ``no_usage``, or ``failed`` to observe."""
        return self._feedback.counts

    @property
    def span_handler(self) -> BaseSpanHandler[BaseSpan]:
        """The span handler that tells this handler each span's parent."""
        return self._spans

    def attach(self, dispatcher: Dispatcher | None = None) -> ContextPilotEventHandler:
        """Add this handler and its :attr:`span_handler` to ``dispatcher`` (default:
        LlamaIndex's root dispatcher, which sees every span and event); once only."""
        dispatcher = dispatcher or get_dispatcher()
        if not any(handler is self for handler in dispatcher.event_handlers):
            dispatcher.add_event_handler(self)
        if not any(handler is self._spans for handler in dispatcher.span_handlers):
            dispatcher.add_span_handler(self._spans)
        return self

    def detach(self, dispatcher: Dispatcher | None = None) -> None:
        """Undo :meth:`attach`."""
        dispatcher = dispatcher or get_dispatcher()
        dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not self]
        dispatcher.span_handlers = [h for h in dispatcher.span_handlers if h is not self._spans]

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        try:
            self._handle(event)
        except Exception:  # the query must not fail over feedback
            logger.warning(
                "ContextPilotEventHandler failed on %s", type(event).__name__, exc_info=True
            )

    def _handle(self, event: BaseEvent) -> None:
        feedback = self._feedback
        if isinstance(event, ContextPilotPromptEvent):
            if event.pilot is self.pilot:
                feedback.prompt_sent(event.span_id, event.request_id)
        elif isinstance(event, (LLMChatStartEvent, LLMCompletionStartEvent)):
            feedback.model_started(event.span_id)
        elif isinstance(event, (LLMChatEndEvent, LLMCompletionEndEvent)):
            feedback.model_ended(event.span_id, event.response)
        elif isinstance(event, ExceptionEvent):
            feedback.model_failed(event.span_id)
