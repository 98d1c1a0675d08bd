"""Documents → the context text of a prompt, byte-stable for prefix caching."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from langchain_core.documents import Document

from contextpilot_rag import ContextBlock, ContextPilot, render_block
from contextpilot_rag.annotations import shown_note
from contextpilot_rag.blocks import shown_label, unique_label
from contextpilot_rag.errors import InvalidBlockError
from contextpilot_rag.pilot import structure_guard_of

from ._documents import ANNOTATION_KEY, NOTE_SEPARATOR, check_documents, document_to_block

__all__ = ["format_documents"]

# What the core's labels are made of (block ids, their hashes, collision suffixes):
# an annotation's label outside it was not written by the pilot, so it is not shown.


def format_documents(documents: Sequence[Document], *, pilot: ContextPilot | None = None) -> str:
    """The context text for a prompt: each document rendered as the core renders a
    block (``[label]``, its text escaped, a blank line), in the given order, then the
    order / location notes of the documents, each followed by a blank line.

    Deterministic: identical documents give identical bytes, and a document renders
    the same at any position, so a prefix shared by two lists of documents is a
    shared prefix of their texts. This is exactly the part of the core's user
    message between its context header and its question.

    The text is escaped as ``pilot`` escapes block text
    (:meth:`PilotConfig.structure_guard`): chat-template control tokens broken, lines
    that imitate a label, a note or the question escaped. Pass the retriever's pilot
    when its ``PilotConfig`` changes the notes, the question template or the context
    header; without one, the default ``PilotConfig``'s escaping applies.

    Documents returned by :class:`ContextPilotRetriever` or
    :class:`ContextPilotCompressor` carry their block id, label and notes in
    ``metadata["contextpilot"]``; those marked ``deduplicated`` contribute no text
    (the location note names them; see the dedup caveat in the docs), and a
    document whose rendering already appeared is rendered once. Other documents
    are labelled by ``Document.id``, else by a hash of their text. An empty list
    gives ``""``; a document without text raises :class:`InvalidBlockError`.
    """
    guard = structure_guard_of(pilot)
    rendered: dict[str, None] = {}
    notes: dict[str, None] = {}
    taken: dict[str, str] = {}  # label -> block id: no two documents under one label
    for position, doc in enumerate(check_documents(documents)):
        annotation = doc.metadata.get(ANNOTATION_KEY)
        if isinstance(annotation, Mapping):
            for key in ("order_note", "location_note"):
                note = shown_note(annotation.get(key), guard)  # None for a forged one
                if note is not None:
                    notes.setdefault(note)
            if annotation.get("deduplicated"):
                continue
        block = _block_of(doc, position, annotation)
        label = unique_label(block, taken, _label_of(block, annotation))
        taken.setdefault(label, block.id)
        rendered.setdefault(render_block(block, guard, label=label))
    return "".join(rendered) + "".join(note + NOTE_SEPARATOR for note in notes)


def _block_of(doc: Document, position: int, annotation: object) -> ContextBlock:
    if not isinstance(annotation, Mapping) or not isinstance(annotation.get("block_id"), str):
        return document_to_block(doc, position)
    try:
        return ContextBlock(doc.page_content, id=annotation["block_id"])
    except InvalidBlockError as exc:
        raise InvalidBlockError(f"document {position} cannot be formatted: {exc}") from exc


def _label_of(block: ContextBlock, annotation: object) -> str:
    """The label the pilot's prompt showed the document under (it differs from the
    block's own when two blocks of that prompt would share one)."""
    label = annotation.get("label") if isinstance(annotation, Mapping) else None
    return shown_label(block, label)
