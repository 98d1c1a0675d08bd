"""The options both adapters share, as pydantic fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from contextpilot_rag import ContextPilot

from ._documents import PilotOptions

__all__ = ["PilotSettings"]


class PilotSettings(BaseModel):
    """Fields of :class:`ContextPilotRetriever` and :class:`ContextPilotCompressor`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pilot: ContextPilot = Field(default_factory=ContextPilot)
    """The pilot that owns the context index. Share one per process (per engine
    fleet) across retrievers and chains: prefixes are shared only within one
    index. Defaults to a new ``ContextPilot()``."""

    session_id: str | None = Field(default=None, min_length=1)
    """The conversation to de-duplicate against (only used with ``dedup=True``).
    The retriever also reads it per call from ``config["configurable"]["session_id"]``."""

    dedup: bool = False
    """De-duplicate documents the session already showed. Off by default: safe only
    when the prompt your chain builds still contains the earlier turns' context
    (see the docs). Deduplicated documents are kept in the output, flagged."""

    annotate: bool = True
    """Put the pilot's order / location notes in the metadata, so that
    :func:`format_documents` writes them after the documents."""

    id_key: str | None = None
    """Metadata key holding the block id. Used when set and present; otherwise
    ``Document.id``, otherwise a hash of the text."""

    def pilot_options(self, session_id: str | None) -> PilotOptions:
        return PilotOptions(
            session_id=session_id, dedup=self.dedup, annotate=self.annotate, id_key=self.id_key
        )
