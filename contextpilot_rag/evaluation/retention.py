"""Evidence retention: no retrieved block may vanish from a prompt.

Checked on the messages actually sent, not on what the pilot says it did. A block is
*retained* by a prompt when

* its rendering (label line and text, exactly as the prompt renders it) is in the
  prompt's last message (this turn's), or
* its rendering is in an earlier user message of the prompt (the conversation history
  the prompt carries) **and** the last message has a location-note line naming its
  label, so the model is pointed at it.

Anything else — a block cut short, left out, or de-duplicated against a turn the
prompt no longer carries, or carried without a note — is *lost*.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ExpectedBlock", "lost_blocks", "shown_labels"]

_LABEL_LINE = re.compile(r"^\[([^\[\]\s]+)\]$", re.MULTILINE)


@dataclass(frozen=True)
class ExpectedBlock:
    """A block the prompt must retain: its id, the label the prompt shows it under
    and its exact rendering (``render_block`` with that label)."""

    block_id: str
    label: str
    rendered: str


def _names(line: str, label: str) -> bool:
    return re.search(rf"(?<![\w.:-]){re.escape(label)}(?![\w.:-])", line) is not None


def lost_blocks(
    messages: Sequence[Mapping[str, str]],
    expected: Iterable[ExpectedBlock],
    location_lead_in: str,
) -> tuple[str, ...]:
    """The ids of the ``expected`` blocks that ``messages`` do not retain (see the
    module docstring). ``location_lead_in`` is the text a location note starts with
    (``"Also relevant, shown in earlier turns:"`` by default)."""
    if not messages:
        return tuple(block.block_id for block in expected)
    final = str(messages[-1].get("content", ""))
    history = [
        str(message.get("content", ""))
        for message in messages[:-1]
        if message.get("role") == "user"
    ]
    lead_in = location_lead_in.strip()
    note_lines = [
        line.strip()[len(lead_in) :]
        for line in final.splitlines()
        if lead_in and line.strip().startswith(lead_in)
    ]
    lost = []
    for block in expected:
        text = block.rendered.rstrip("\n")
        if text in final:
            continue
        in_history = any(text in content for content in history)
        pointed_at = any(_names(line, block.label) for line in note_lines)
        if not (in_history and pointed_at):
            lost.append(block.block_id)
    return tuple(lost)


def shown_labels(messages: Iterable[Mapping[str, str]]) -> frozenset[str]:
    """The labels the prompt's user messages show as label lines (``[label]``)."""
    labels: set[str] = set()
    for message in messages:
        if message.get("role") == "user":
            labels.update(_LABEL_LINE.findall(str(message.get("content", ""))))
    return frozenset(labels)
