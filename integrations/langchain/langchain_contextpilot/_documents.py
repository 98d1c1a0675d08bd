"""LangChain ``Document`` ↔ ``ContextBlock``, and the one call both adapters make:
run the pilot on a retriever's documents and return annotated copies.

Invariant: the documents returned are the documents given, each exactly once (a
permutation of the input, never mutated); only ``metadata["contextpilot"]`` is new.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from langchain_core.documents import Document
from typing_extensions import TypedDict

from contextpilot_rag import ContextBlock, ContextPilot, Prompt
from contextpilot_rag.errors import InvalidBlockError, InvalidInputError

__all__ = [
    "ANNOTATION_KEY",
    "NOTE_SEPARATOR",
    "ContextPilotAnnotation",
    "PilotOptions",
    "check_conversation_id",
    "check_documents",
    "check_query",
    "document_to_block",
    "optimize_documents",
]

ANNOTATION_KEY = "contextpilot"
"""The ``Document.metadata`` key that holds a :class:`ContextPilotAnnotation`."""

NOTE_SEPARATOR = "\n\n"  # what the core writes after each note


class ContextPilotAnnotation(TypedDict):
    """``metadata["contextpilot"]`` of every document the adapters return.

    ``rank`` is the document's position in the base retriever's result and
    ``position`` its position in the returned list (both 0-based); ``moved`` is
    ``rank != position``. ``matched``: the document belongs to the prefix an earlier
    prompt already sent (``PromptStats.blocks_matched``). ``deduplicated``: the
    session already showed it in an earlier turn, so :func:`format_documents` leaves
    its text out and the location note names it by ``label`` (only with
    ``dedup=True``). ``label``: the label the prompt shows the document under
    (:meth:`Prompt.label_of <contextpilot_rag.Prompt.label_of>`; longer than the
    block's own when another block of the prompt, history included, has that one).
    ``repeat``: the base retriever returned the same document (same id and text)
    earlier in this result; it is rendered once. ``order_note`` / ``location_note``:
    the notes of this request (the same on all its documents), ``None`` when there is
    none; ``annotate=False`` leaves out the order note only (the location note is what
    names the de-duplicated documents). ``request_id``: the request id of the pilot's
    prompt (the same on all its documents), which :class:`ContextPilotCallbackHandler` pairs
    with the model call and :meth:`ContextPilot.observe
    <contextpilot_rag.ContextPilot.observe>` takes. ``conversation_id``: the conversation
    the pilot de-duplicated against (``None`` unless ``dedup=True``); ``session_id``
    holds the same value under the name earlier releases used. ``history_lost``: that
    conversation had expired or been evicted, and this turn started it again without
    its history (:attr:`Prompt.history_lost <contextpilot_rag.Prompt.history_lost>`).
    """

    block_id: str
    label: str
    rank: int
    position: int
    moved: bool
    matched: bool
    deduplicated: bool
    repeat: bool
    order_note: str | None
    location_note: str | None
    request_id: str
    conversation_id: str | None
    session_id: str | None
    history_lost: bool


@dataclass(frozen=True)
class PilotOptions:
    """The adapter options of one call (see :class:`ContextPilotRetriever`)."""

    conversation_id: str | None = None
    dedup: bool = False
    annotate: bool = True
    id_key: str | None = None


def optimize_documents(
    pilot: ContextPilot, documents: object, query: str, options: PilotOptions
) -> list[Document]:
    """Run ``pilot.optimize`` on ``documents`` and return annotated copies in the
    optimized order: the blocks sent in full first, then the de-duplicated ones;
    each exact repeat right after its first occurrence. No documents: ``[]`` (with
    dedup in a conversation the pilot records the turn, without documents, so its
    history window counts turns as the application's history does). Errors are raised
    before the pilot stores anything."""
    query = check_query(query)
    docs = check_documents(documents)
    conversation_id = options.conversation_id if options.dedup else None
    if not docs:
        if conversation_id is not None:
            # a retrieval with no hit is still a turn: the pilot's history window
            # counts it, as the application's chat history does
            pilot.optimize([], query, conversation_id=conversation_id)
        return []
    blocks = [document_to_block(doc, position, options.id_key) for position, doc in enumerate(docs)]
    prompt = pilot.optimize(blocks, query, conversation_id=conversation_id)
    # The location note stays whatever ``annotate`` says: it is all that points to the
    # text of a de-duplicated document, which format_documents leaves out.
    order_note = prompt.order_note if options.annotate else None
    return _annotated(docs, blocks, prompt, (order_note, prompt.location_note))


def check_documents(documents: object) -> list[Document]:
    """``documents`` as a list, or :class:`InvalidInputError` (a ``TypeError``)
    when it is not a list of LangChain ``Document``s."""
    if isinstance(documents, (str, bytes, Mapping, Document)) or not isinstance(
        documents, Iterable
    ):
        raise InvalidInputError(
            f"expected a list of langchain_core.documents.Document, got {type(documents).__name__}"
        )
    docs = list(documents)
    for position, doc in enumerate(docs):
        if not isinstance(doc, Document):
            raise InvalidInputError(
                f"document {position} is {type(doc).__name__}, expected "
                "langchain_core.documents.Document (does the base retriever return Documents?)"
            )
    return docs


def check_query(query: object) -> str:
    """The query, or :class:`InvalidInputError` when it is not a string (a common
    LCEL slip: piping a dict into a retriever)."""
    if not isinstance(query, str):
        raise InvalidInputError(
            f"the retriever query must be a str, got {type(query).__name__}; "
            "route the question string to the retriever (e.g. itemgetter('question'))"
        )
    return query


def check_conversation_id(conversation_id: object, source: str) -> str | None:
    """A conversation id is a non-empty string or ``None``; else
    :class:`InvalidInputError` naming ``source``."""
    if conversation_id is None or (isinstance(conversation_id, str) and conversation_id):
        return conversation_id
    raise InvalidInputError(f"{source} must be a non-empty str or None, got {conversation_id!r}")


def document_to_block(document: Document, position: int, id_key: str | None = None) -> ContextBlock:
    """The block of a document: its ``page_content``; its id from
    ``metadata[id_key]`` when ``id_key`` is set and present, else ``Document.id``,
    else a content hash. Empty text or an unusable id: :class:`InvalidBlockError`."""
    try:
        block_id = _document_id(document, id_key)
        if block_id is None:
            return ContextBlock(document.page_content)
        return ContextBlock(document.page_content, id=block_id)
    except InvalidBlockError as exc:
        raise InvalidBlockError(
            f"document {position} (id {document.id!r}) cannot be a context block: {exc}"
        ) from exc


def _document_id(document: Document, id_key: str | None) -> str | None:
    if id_key is not None:
        value = document.metadata.get(id_key)
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return str(value)
        if value is not None:
            raise InvalidBlockError(
                f"metadata[{id_key!r}] must be a str or int to serve as block id, got {value!r}"
            )
    return document.id or None


def _output_order(blocks: list[ContextBlock], prompt: Prompt) -> list[int]:
    """Input positions in output order."""
    positions_of: dict[str, list[int]] = {}
    for position, block in enumerate(blocks):
        positions_of.setdefault(block.id, []).append(position)
    return [position for block in prompt.placed_blocks for position in positions_of[block.id]]


def _annotated(
    docs: list[Document],
    blocks: list[ContextBlock],
    prompt: Prompt,
    notes: tuple[str | None, str | None],
) -> list[Document]:
    matched, deduplicated = prompt.matched_ids, prompt.deduplicated_ids
    seen: set[str] = set()
    result = []
    for position, rank in enumerate(_output_order(blocks, prompt)):
        block = blocks[rank]
        annotation = ContextPilotAnnotation(
            block_id=block.id,
            label=prompt.label_of(block.id),
            rank=rank,
            position=position,
            moved=rank != position,
            matched=block.id in matched,
            deduplicated=block.id in deduplicated,
            repeat=block.id in seen,
            order_note=notes[0],
            location_note=notes[1],
            request_id=prompt.request_id,
            conversation_id=prompt.conversation_id,
            session_id=prompt.conversation_id,
            history_lost=prompt.history_lost,
        )
        seen.add(block.id)
        metadata = {**docs[rank].metadata, ANNOTATION_KEY: annotation}
        result.append(docs[rank].model_copy(update={"metadata": metadata}))
    return result
