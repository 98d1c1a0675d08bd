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
from langchain_core.runnables import RunnableConfig, ensure_config
from typing_extensions import override

from ._documents import PilotOptions, check_query, check_session_id, optimize_documents
from ._settings import PilotSettings

__all__ = ["ContextPilotRetriever"]

_CONFIGURABLE_SOURCE = 'config["configurable"]["session_id"]'


class ContextPilotRetriever(BaseRetriever, PilotSettings):
    """Wraps ``base_retriever``: calls it (as a child run, so callbacks and tracing
    see it), runs the pilot on its documents and returns new ``Document``s in the
    optimized order, each with a :class:`ContextPilotAnnotation` in
    ``metadata["contextpilot"]``. The caller's documents are never mutated.

    The output holds exactly the base retriever's documents, each once (a
    permutation): with ``dedup=True`` the documents the session already showed
    come last, flagged ``deduplicated``. An empty result is returned as ``[]``
    without calling the pilot. A base retriever that raises, returns something
    other than ``Document``s (:class:`~contextpilot_rag.InvalidInputError`) or a
    document without text (:class:`~contextpilot_rag.InvalidBlockError`) fails the
    call before the pilot stores anything.

    The session id of a call is, first to last: a ``session_id=`` keyword of
    ``invoke``/``ainvoke``, ``config["configurable"]["session_id"]`` (as
    ``RunnableWithMessageHistory`` sets it), the ``session_id`` field.
    """

    base_retriever: RetrieverLike
    """The retriever (any ``Runnable[str, list[Document]]``) whose results are optimized."""

    @override
    def invoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        # BaseRetriever does not hand the config to _get_relevant_documents: read the
        # session id here and pass it on as a keyword argument.
        config = ensure_config(config)
        kwargs["session_id"] = self._session_for_call(config, kwargs)
        return super().invoke(input, config, **kwargs)

    @override
    async def ainvoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        config = ensure_config(config)
        kwargs["session_id"] = self._session_for_call(config, kwargs)
        return await super().ainvoke(input, config, **kwargs)

    @override
    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        query = check_query(query)
        documents = self.base_retriever.invoke(query, config={"callbacks": run_manager.get_child()})
        return optimize_documents(self.pilot, documents, query, self._options(session_id))

    @override
    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        query = check_query(query)
        documents = await self.base_retriever.ainvoke(
            query, config={"callbacks": run_manager.get_child()}
        )
        # The pilot is in-memory and fast (no I/O): called inline, not in a thread.
        return optimize_documents(self.pilot, documents, query, self._options(session_id))

    def _session_for_call(self, config: RunnableConfig, kwargs: dict[str, Any]) -> str | None:
        if "session_id" in kwargs:
            return check_session_id(kwargs.pop("session_id"), "session_id")
        configured = config.get("configurable", {}).get("session_id")
        if configured is not None:
            return check_session_id(configured, _CONFIGURABLE_SOURCE)
        return self.session_id

    def _options(self, session_id: str | None) -> PilotOptions:
        return self.pilot_options(session_id if session_id is not None else self.session_id)
