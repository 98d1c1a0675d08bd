"""The options the adapters share, as pydantic fields, and the one vocabulary of the
conversation key: ``conversation_id`` (as in the core, the Mem0 adapter and the serve
API), with ``session_id`` accepted as its alias."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from contextpilot_rag import ContextPilot
from contextpilot_rag.errors import ConfigError

from ._documents import PilotOptions, check_conversation_id

__all__ = ["PilotSettings", "conversation_keyword"]


class PilotSettings(BaseModel):
    """Fields of :class:`ContextPilotRetriever`, :class:`ContextPilotCompressor` and
    :class:`ContextPilotDocumentTransformer`. ``session_id=`` is accepted by the
    constructor as an alias of ``conversation_id=`` (two different values:
    :class:`~contextpilot_rag.errors.ConfigError`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pilot: ContextPilot = Field(default_factory=ContextPilot)
    """The pilot that owns the context index. Share one per process (per engine
    fleet) across retrievers and chains: prefixes are shared only within one
    index. Defaults to a new ``ContextPilot()``."""

    conversation_id: str | None = Field(default=None, min_length=1)
    """The conversation to de-duplicate against (only used with ``dedup=True``).
    The retriever also reads it per call (see :class:`ContextPilotRetriever`)."""

    dedup: bool = False
    """De-duplicate documents the conversation already showed. Off by default: a
    de-duplicated document is sent by its label only, which is safe only when the
    prompt your chain builds still contains the earlier turns' documents (their full
    text, in the history the model sees); a chain that sends each turn's context
    alone would leave the model a label without its text. Deduplicated documents are
    kept in the output, flagged."""

    annotate: bool = True
    """Put the pilot's order note in the metadata, so that :func:`format_documents`
    writes it after the documents. The location note (only with ``dedup=True``) is
    kept either way: it names the de-duplicated documents, whose text the prompt
    leaves out, so without it they would vanish from the prompt."""

    id_key: str | None = None
    """Metadata key holding the block id. Used when set and present; otherwise
    ``Document.id``, otherwise a hash of the text."""

    def __init__(self, **data: Any) -> None:
        # here, not in a validator: pydantic would wrap ConfigError in a ValidationError
        conversation_id = conversation_keyword(data, "constructor")
        if conversation_id is not None:
            data["conversation_id"] = conversation_id
        super().__init__(**data)

    @property
    def session_id(self) -> str | None:
        """Alias of :attr:`conversation_id` (the name earlier releases used)."""
        return self.conversation_id

    def pilot_options(self, conversation_id: str | None) -> PilotOptions:
        """The options of one call, for ``conversation_id`` (``None``: the field's)."""
        if conversation_id is None:
            conversation_id = self.conversation_id
        return PilotOptions(
            conversation_id=conversation_id,
            dedup=self.dedup,
            annotate=self.annotate,
            id_key=self.id_key,
        )


def conversation_keyword(options: dict[str, Any], where: str) -> str | None:
    """Pop ``conversation_id`` and its alias ``session_id`` from ``options`` (keywords
    given ``where``) and return the conversation id they name, or ``None``. Two
    different values: :class:`ConfigError`; a value that is not a non-empty string:
    :class:`~contextpilot_rag.errors.InvalidInputError`."""
    return _one_of(options.pop("conversation_id", None), options.pop("session_id", None), where)


def configured_conversation(configurable: Mapping[str, Any]) -> str | None:
    """The conversation id of ``config["configurable"]``: ``conversation_id``, else its
    alias ``session_id`` (two different values: :class:`ConfigError`), else LangGraph's
    ``thread_id`` (an ``int`` or ``UUID`` one as its ``str()``), else ``None``."""
    where = 'config["configurable"]'
    named = _one_of(configurable.get("conversation_id"), configurable.get("session_id"), where)
    if named is not None:
        return named
    thread_id = configurable.get("thread_id")
    if isinstance(thread_id, UUID) or (
        isinstance(thread_id, int) and not isinstance(thread_id, bool)
    ):
        return str(thread_id)  # LangGraph takes any of these as a thread id
    return check_conversation_id(thread_id, f'{where}["thread_id"]')


def _one_of(conversation_id: object, session_id: object, where: str) -> str | None:
    if conversation_id is not None and session_id is not None and conversation_id != session_id:
        raise ConfigError(
            f"conversation_id={conversation_id!r} and its alias session_id={session_id!r} "
            f"given ({where}) name different conversations; give one of them"
        )
    if conversation_id is not None:
        return check_conversation_id(conversation_id, f"{where} conversation_id")
    return check_conversation_id(session_id, f"{where} session_id")
