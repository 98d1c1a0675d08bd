"""``ContextPilotCompressor``: the pilot as a LangChain document compressor, for
``ContextualCompressionRetriever`` and compressor pipelines."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables.config import run_in_executor
from typing_extensions import override

from ._documents import optimize_documents
from ._settings import PilotSettings

__all__ = ["ContextPilotCompressor"]


class ContextPilotCompressor(BaseDocumentCompressor, PilotSettings):
    """Reorders and annotates the documents it is given, exactly as
    :class:`ContextPilotRetriever` does with its base retriever's results (same
    fields, same output contract). Put it last in a compressor pipeline: what comes
    after it should not reorder the documents again.

    LangChain passes no config to compressors, so the conversation id comes from the
    ``conversation_id`` field (alias ``session_id``) only.
    """

    @override
    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        return optimize_documents(self.pilot, documents, query, self.pilot_options(None))

    @override
    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        # In a worker thread: tokenizing new documents takes a while, and a pilot on a
        # shared store (SQLite, Redis) waits for it; the event loop must not.
        return await run_in_executor(None, self.compress_documents, documents, query, callbacks)
