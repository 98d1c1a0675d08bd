"""Memories as a prompt section, byte for byte the way the core renders blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextpilot_rag import render_block

from ._errors import Mem0ResponseError
from ._results import ANNOTATION_KEY, result_block

__all__ = ["format_memories"]


def format_memories(
    response: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, notes: bool = True
) -> str:
    """The memories section of a prompt: each memory ``[label]``, its text and a blank
    line, in the order given, then (``notes=True``) the response's notes, each followed
    by a blank line.

    ``response`` is what :meth:`ContextPilotMemory.search` returned, its ``"results"``
    list, or a plain mem0 search response. Only results the pilot sent in full are
    rendered: de-duplicated ones (named by the location note) and blank memories are
    left out. Identical input gives identical bytes; for a ``ContextPilotMemory``
    response it is exactly the text between the context header and the question in
    ``response["contextpilot"]["messages"][-1]["content"]``.
    """
    if isinstance(response, Mapping):
        results, summary = response.get("results"), response.get(ANNOTATION_KEY)
    else:
        results, summary = response, None
    if not isinstance(results, Sequence) or isinstance(results, (str, bytes)):
        raise Mem0ResponseError("format_memories() takes a search response or its 'results' list")
    parts = [_render(result, position) for position, result in enumerate(results)]
    rendered = list(dict.fromkeys(part for part in parts if part))  # a repeat renders once
    if notes and isinstance(summary, Mapping):
        rendered += [note + "\n\n" for note in summary.get("notes", ())]
    return "".join(rendered)


def _render(result: object, position: int) -> str:
    annotation = result.get(ANNOTATION_KEY) if isinstance(result, Mapping) else None
    if isinstance(annotation, Mapping) and annotation.get("status") != "sent":
        return ""
    block = result_block(result, position)
    return render_block(block) if block is not None else ""
