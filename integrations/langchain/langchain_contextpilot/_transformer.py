"""``ContextPilotDocumentTransformer``: the pilot as a LangChain document transformer,
beside ``LongContextReorder`` in document pipelines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.documents import BaseDocumentTransformer, Document
from langchain_core.runnables.config import run_in_executor
from typing_extensions import override

from contextpilot_rag.errors import InvalidInputError

from ._documents import optimize_documents
from ._settings import PilotSettings, conversation_keyword

__all__ = ["ContextPilotDocumentTransformer"]


class ContextPilotDocumentTransformer(BaseDocumentTransformer, PilotSettings):
    """Reorders and annotates the documents it is given, exactly as
    :class:`ContextPilotRetriever` does with its base retriever's results (same
    fields, same output contract: a permutation of the input, never mutated).

    ``transform_documents(documents, query=...)``: the ``query`` keyword is required
    (the pilot's prompt ends with it); ``conversation_id=`` (or its alias
    ``session_id=``) overrides the field for this call. A missing or non-string
    query, or documents that are not ``Document``s, raise
    :class:`~contextpilot_rag.InvalidInputError` before the pilot stores anything.
    Other keywords are refused the same way, so a misspelt option is not ignored.
    """

    @override
    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        options = dict(kwargs)
        conversation_id = conversation_keyword(options, "transform_documents keywords")
        if "query" not in options:
            raise InvalidInputError(
                "transform_documents needs the question as query=...; the pilot's prompt "
                "ends with it"
            )
        query = options.pop("query")
        if options:
            raise InvalidInputError(
                f"transform_documents got unknown keywords {sorted(options)}; it takes "
                "query=, conversation_id= (or session_id=)"
            )
        return optimize_documents(self.pilot, documents, query, self.pilot_options(conversation_id))

    @override
    async def atransform_documents(
        self, documents: Sequence[Document], **kwargs: Any
    ) -> list[Document]:
        # Off the event loop, as the retriever's ainvoke: tokenizing new documents takes a
        # while, and a pilot on a shared store waits for its round trips.
        return await run_in_executor(None, self.transform_documents, documents, **kwargs)
