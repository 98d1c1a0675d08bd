"""``ContextPilotRetriever``: any LangChain retriever, its results reordered for
prefix-cache reuse and annotated by a :class:`~contextpilot_rag.ContextPilot`."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever, RetrieverLike
from langchain_core.runnables import RunnableConfig, ensure_config, patch_config
from langchain_core.runnables.config import run_in_executor
from typing_extensions import override

from ._documents import check_query, optimize_documents
from ._settings import PilotSettings, configured_conversation, conversation_keyword

__all__ = ["ContextPilotRetriever"]


class ContextPilotRetriever(BaseRetriever, PilotSettings):
    """Wraps ``base_retriever``: calls it (as a child run that carries the caller's
    callbacks, tags and metadata, so tracing sees it), runs the pilot on its
    documents and returns new ``Document``s in the optimized order, each with a
    :class:`ContextPilotAnnotation` in ``metadata["contextpilot"]``. The caller's
    documents are never mutated. Keywords of ``invoke`` / ``ainvoke`` other than the
    conversation id (``k=3``, a filter, ...) go to the base retriever.

    The output holds exactly the base retriever's documents, each once (a
    permutation): with ``dedup=True`` the documents the conversation already showed
    come last, flagged ``deduplicated``. An empty result is returned as ``[]``
    without calling the pilot. A base retriever that raises, returns something
    other than ``Document``s (:class:`~contextpilot_rag.InvalidInputError`) or a
    document without text (:class:`~contextpilot_rag.InvalidBlockError`) fails the
    call before the pilot stores anything.

    The conversation id of a call is, first to last: a ``conversation_id=`` (or its
    alias ``session_id=``) keyword of ``invoke``/``ainvoke``;
    ``config["configurable"]["conversation_id"]``, then ``["session_id"]`` (as
    ``RunnableWithMessageHistory`` sets it), then ``["thread_id"]`` (LangGraph's);
    the ``conversation_id`` field. An alias and its name given in one place with
    different values raise :class:`~contextpilot_rag.errors.ConfigError`. An ``int``
    or ``UUID`` ``thread_id`` names the conversation ``str(thread_id)``. The config is
    read only with ``dedup=True``, the only case that uses a conversation.

    ``dedup`` stays off by default: it is safe only when the chain's prompt still
    contains the earlier turns' documents (see :attr:`PilotSettings.dedup`).
    """

    base_retriever: RetrieverLike
    """The retriever (any ``Runnable[str, list[Document]]``) whose results are optimized."""

    @override
    def invoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        # BaseRetriever does not hand the config to _get_relevant_documents: read the
        # conversation id here and pass it, and the config, on as keyword arguments.
        config = ensure_config(config)
        kwargs["conversation_id"] = self._conversation_for_call(config, kwargs)
        return super().invoke(input, config, **kwargs, parent_config=config)

    @override
    async def ainvoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        config = ensure_config(config)
        kwargs["conversation_id"] = self._conversation_for_call(config, kwargs)
        return await super().ainvoke(input, config, **kwargs, parent_config=config)

    @override
    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        conversation_id: str | None = None,
        parent_config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        query = check_query(query)
        child = patch_config(parent_config, callbacks=run_manager.get_child())
        documents = self.base_retriever.invoke(query, child, **kwargs)
        return optimize_documents(self.pilot, documents, query, self.pilot_options(conversation_id))

    @override
    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        conversation_id: str | None = None,
        parent_config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        query = check_query(query)
        child = patch_config(parent_config, callbacks=run_manager.get_child())
        documents = await self.base_retriever.ainvoke(query, child, **kwargs)
        # In a worker thread: tokenizing new documents takes a while, and a pilot on a
        # shared store (SQLite, Redis) waits for it; the event loop must not.
        options = self.pilot_options(conversation_id)
        pilot = self.pilot
        return await run_in_executor(None, optimize_documents, pilot, documents, query, options)

    def _conversation_for_call(self, config: RunnableConfig, kwargs: dict[str, Any]) -> str | None:
        """The call's conversation id (``None``: the field's); pops the keywords, which
        are not the base retriever's. Without dedup the conversation is not used, so
        the config's is not read: a chain's ``thread_id`` is none of our business."""
        named = conversation_keyword(kwargs, "invoke keywords")
        if named is not None or not self.dedup:
            return named
        return configured_conversation(config.get("configurable") or {})
