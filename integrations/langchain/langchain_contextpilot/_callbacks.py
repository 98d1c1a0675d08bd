"""``ContextPilotCallbackHandler``: the engine's cache truth from every LangChain model
call back to the pilot whose documents the call carried.

LangChain tells callback handlers of every run of a chain with its ``run_id`` and
``parent_run_id``. A :class:`ContextPilotRetriever` (or a retriever over
:class:`ContextPilotCompressor`) returns documents whose annotation names their prompt's
``request_id``; the chat model's end brings the engine's usage report. The pairing of
the two is :class:`~contextpilot_rag.feedback.CallFeedback`'s: within one root run, or a
single retrieval left over from an earlier run, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from typing_extensions import override

from contextpilot_rag import ContextPilot
from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.feedback import CallFeedback, FeedbackCounts

from ._cached_messages import annotation_of
from ._documents import ANNOTATION_KEY

__all__ = ["ContextPilotCallbackHandler"]


class ContextPilotCallbackHandler(BaseCallbackHandler):
    """Reports what the engine served from its prefix cache for each model call of a
    chain to ``pilot`` (:meth:`ContextPilot.observe <contextpilot_rag.ContextPilot.observe>`
    by request id), so a prefix the engine no longer holds stops steering reorders.

    Attach it to the whole chain, so that it sees the retriever and the model::

        handler = ContextPilotCallbackHandler(pilot)
        chain.invoke(question, config={"callbacks": [handler]})

    A model call whose messages were built by :class:`ContextPilotPromptBuilder` (or
    :func:`build_cached_messages`) is paired with the prompt they name. Any other is
    paired with the pilot prompt retrieved under the same root run, when exactly one
    waits; else with the single prompt retrieved in an earlier, finished run (a
    retriever invoked on its own), when exactly one waits; else it is counted
    ``unmatched``. A model call that
    fails (``with_retry``, ``with_fallbacks``) leaves its prompt to the next model call
    of the same chain. Request ids are numbered per pilot: attach it to chains whose
    retrievers use ``pilot``. The usage is read from the answer message's
    ``usage_metadata`` (``input_token_details.cache_read``) or ``response_metadata`` /
    ``llm_output`` ``token_usage`` (``prompt_tokens_details.cached_tokens``);
    ``ChatOpenAI`` reports it when streaming only with ``stream_usage=True``. Nothing it
    does raises into the chain: failures are logged and counted (:attr:`counts`).
    Thread-safe, for sync and async chains (in async chains its events run in
    LangChain's executor, off the event loop); memory bounded by ``max_runs``.
    """

    # In async chains LangChain runs the events of a handler that is not inline in its
    # executor, each awaited before the chain goes on (so the runs still arrive in
    # order): an answer's observation waits for the pilot's lock, which another
    # thread's optimize holds across a shared store's round trips, and the event loop
    # must not wait with it.
    run_inline = False

    def __init__(self, pilot: ContextPilot, *, max_runs: int = 10_000) -> None:
        if not isinstance(pilot, ContextPilot):
            raise InvalidInputError(
                f"ContextPilotCallbackHandler needs a ContextPilot, got {type(pilot).__name__}"
            )
        self.pilot = pilot
        self._feedback = CallFeedback(pilot, max_runs=max_runs)

    @property
    def counts(self) -> FeedbackCounts:
        """Model calls ``observed`` (and requests ``evicted``), ``unmatched``, answered
        with ``no_usage``, or ``failed`` to observe."""
        return self._feedback.counts

    @property
    def observed(self) -> int:
        """Model calls whose cache usage the pilot received."""
        return self.counts.observed

    @property
    def unmatched(self) -> int:
        """Model calls no pilot prompt could be paired with without guessing."""
        return self.counts.unmatched

    @property
    def no_usage(self) -> int:
        """Paired model calls whose answer carried no cache information."""
        return self.counts.no_usage

    # -- the run tree ---------------------------------------------------------------------

    @override
    def on_chain_start(
        self,
        serialized: dict[str, Any],
        inputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_started(run_id, parent_run_id)

    @override
    def on_chain_end(
        self,
        outputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_ended(run_id)

    @override
    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_ended(run_id)

    @override
    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_started(run_id, parent_run_id)

    @override
    def on_tool_end(
        self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._feedback.run_ended(run_id)

    @override
    def on_tool_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_ended(run_id)

    # -- retrievals -----------------------------------------------------------------------

    @override
    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_started(run_id, parent_run_id)

    @override
    def on_retriever_end(
        self,
        documents: Sequence[Document],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        for request_id in _request_ids(documents):
            self._feedback.prompt_sent(run_id, request_id)
        self._feedback.run_ended(run_id)

    @override
    def on_retriever_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_ended(run_id)

    # -- model calls ----------------------------------------------------------------------

    @override
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.run_started(run_id, parent_run_id)
        self._feedback.model_started(run_id, _message_request_id(messages))

    @override
    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_started(run_id, parent_run_id)

    @override
    def on_llm_end(
        self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._feedback.model_ended(run_id, response)

    @override
    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._feedback.model_failed(run_id)
        self._feedback.run_ended(run_id)

    def _model_started(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        self._feedback.run_started(run_id, parent_run_id)
        self._feedback.model_started(run_id)


def _message_request_id(messages: object) -> str | None:
    """The request id built messages (:func:`build_cached_messages`) name, when the
    model call's messages name exactly one."""
    if not isinstance(messages, Sequence):
        return None
    found = {
        annotation["request_id"]
        for batch in messages
        if isinstance(batch, Sequence)
        for annotation in [annotation_of(batch)]
        if annotation is not None
    }
    return found.pop() if len(found) == 1 else None


def _request_ids(documents: object) -> list[str]:
    """The distinct request ids the documents' annotations name, in order."""
    if not isinstance(documents, Sequence):
        return []
    found: dict[str, None] = {}
    for doc in documents:
        metadata = getattr(doc, "metadata", None)
        annotation = metadata.get(ANNOTATION_KEY) if isinstance(metadata, Mapping) else None
        request_id = annotation.get("request_id") if isinstance(annotation, Mapping) else None
        if isinstance(request_id, str) and request_id:
            found[request_id] = None
    return list(found)
