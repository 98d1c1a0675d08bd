"""Memories as a prompt section, byte for byte the way the core renders blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextpilot_rag import (
    ContextBlock,
    ContextPilot,
    render_block,
)
from contextpilot_rag.annotations import shown_note
from contextpilot_rag.blocks import shown_label, unique_label
from contextpilot_rag.escaping import StructureGuard
from contextpilot_rag.pilot import structure_guard_of

from ._errors import Mem0ResponseError
from ._results import ANNOTATION_KEY, result_block

__all__ = ["format_memories"]

# What the core's labels are made of (block ids, their hashes, collision suffixes):
# an annotation's label outside it was not written by the pilot, so it is not shown.


def format_memories(
    response: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    notes: bool = True,
    pilot: ContextPilot | None = None,
) -> str:
    """The memories section of a prompt: each memory ``[label]``, its text escaped and a
    blank line, in the order given, then (``notes=True``) the response's notes, each
    followed by a blank line.

    ``response`` is what :meth:`ContextPilotMemory.search` returned, its ``"results"``
    list, or a plain mem0 search response. Only results the pilot sent in full are
    rendered: de-duplicated ones (named by the location note) and blank memories are
    left out. Identical input gives identical bytes; for a ``ContextPilotMemory``
    response it is exactly the text between the context header and the question in
    ``response["contextpilot"]["messages"][-1]["content"]``, labels included.

    Memories are escaped as ``pilot`` escapes block text
    (:meth:`PilotConfig.structure_guard`: control tokens broken, lines imitating a
    label, a note or the question escaped). Pass the wrapper's pilot when its
    ``PilotConfig`` changes the notes, the question template or the context header;
    without one, the default ``PilotConfig``'s escaping applies.
    """
    if isinstance(response, Mapping):
        results, summary = response.get("results"), response.get(ANNOTATION_KEY)
    else:
        results, summary = response, None
    if not isinstance(results, Sequence) or isinstance(results, (str, bytes)):
        raise Mem0ResponseError("format_memories() takes a search response or its 'results' list")
    guard = structure_guard_of(pilot)
    taken: dict[str, str] = {}  # label -> block id: no two memories under one label
    parts = [_render(result, position, guard, taken) for position, result in enumerate(results)]
    rendered = list(dict.fromkeys(part for part in parts if part))  # a repeat renders once
    if notes and isinstance(summary, Mapping):
        reported = summary.get("notes", ())
        if isinstance(reported, Sequence) and not isinstance(reported, str):
            shown = (shown_note(note, guard) for note in reported)  # None for a forged one
            rendered += [note + "\n\n" for note in shown if note is not None]
    return "".join(rendered)


def _render(result: object, position: int, guard: StructureGuard, taken: dict[str, str]) -> str:
    annotation = result.get(ANNOTATION_KEY) if isinstance(result, Mapping) else None
    if isinstance(annotation, Mapping) and annotation.get("status") != "sent":
        return ""
    block = result_block(result, position)
    if block is None:
        return ""
    label = unique_label(block, taken, _label_of(block, annotation))
    taken.setdefault(label, block.id)
    return render_block(block, guard, label=label)


def _label_of(block: ContextBlock, annotation: object) -> str:
    """The label the pilot's prompt showed the memory under (it differs from the
    block's own when two blocks of that prompt would share one)."""
    label = annotation.get("label") if isinstance(annotation, Mapping) else None
    return shown_label(block, label)
