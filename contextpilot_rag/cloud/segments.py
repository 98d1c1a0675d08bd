"""Where a user message splits into content blocks.

A hosted provider caches a prefix only up to a content-block boundary, so the pilot's
user message is sent as several text blocks: the context header with the first
context block, each further context block, then the tail (notes and question). The
split must come out the same when the message is sent again as history in a later
turn, or the later request would not share the bytes the earlier one cached. So it
is computed from the message text alone, by one function, in both cases:

- a block starts at its label line (``[label]`` alone on a line). Untrusted text
  never holds such a line (:mod:`contextpilot_rag.escaping` escapes it), so the first
  label line of the next label after the previous block's start is that block;
- the tail starts at the first paragraph after the last label line that begins with
  the literal lead-in of a note or of the question, which untrusted text never
  begins a line with either; when none is found, at the rendered question
  (``question_suffix``, given when the question template has no lead-in) if the
  message ends with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["SplitSpec", "split_user_message"]


class SplitSpec(NamedTuple):
    """What :func:`split_user_message` needs besides the text, kept by a prompt so
    that its messages are split only when a provider-shaped request is built."""

    labels: Sequence[str]
    lead_ins: Sequence[str]
    question_suffix: str = ""


def split_user_message(
    text: str,
    labels: Sequence[str],
    lead_ins: Sequence[str],
    question_suffix: str = "",
) -> tuple[int, ...]:
    """The offsets where content blocks after the first start in a user message
    carrying context blocks ``labels`` in order: one per context block after the
    first, then the tail's. Offsets are strictly increasing and inside ``text``;
    one that cannot be found is left out (the text then splits less, the same way
    every time)."""
    cuts: list[int] = []
    position = 0
    last_label = -1
    for number, label in enumerate(labels):
        start = _label_line(text, label, position)
        if start < 0:
            break
        if number and start > (cuts[-1] if cuts else 0):
            cuts.append(start)
        position, last_label = start + 1, start
    tail = _tail_start(text, max(last_label, 0), lead_ins, question_suffix)
    if tail > (cuts[-1] if cuts else 0) and tail < len(text):
        cuts.append(tail)
    return tuple(cuts)


def _label_line(text: str, label: str, position: int) -> int:
    """The first offset >= ``position`` where the line ``[label]`` starts; -1 if none."""
    line = f"[{label}]\n"
    start = text.find(line, position)
    while start > 0 and text[start - 1] != "\n":
        start = text.find(line, start + 1)
    return start


def _tail_start(text: str, after: int, lead_ins: Sequence[str], question_suffix: str) -> int:
    """Where the notes and question begin after offset ``after``; -1 if not found."""
    found = [
        start + 2
        for lead_in in lead_ins
        if lead_in and (start := text.find("\n\n" + lead_in, after)) >= 0
    ]
    if found:
        return min(found)
    if question_suffix and text.endswith(question_suffix):
        return len(text) - len(question_suffix)
    return -1
