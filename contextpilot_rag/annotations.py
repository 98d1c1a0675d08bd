"""Notes that keep the model informed after reordering and de-duplication.

The order note restores the retriever's ranking; location notes point at blocks that
were sent earlier in the conversation. Notes use the blocks' position-independent
labels and are placed after all blocks, so they never break a shared prefix.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from .blocks import ContextBlock
from .errors import ConfigError

__all__ = ["NoteTemplates", "location_note", "order_note"]


@dataclass(frozen=True)
class NoteTemplates:
    """Wording of the notes. ``order`` receives ``{labels}``; ``location`` receives
    ``{labels}`` and ``{turns}``; ``location_item`` renders one ``{label}``/``{turn}``."""

    order: str = (
        "The documents above are not in order of relevance. "
        "Ranked from most to least relevant: {labels}."
    )
    location: str = (
        "Also relevant, and not repeated here: {items}, shown earlier in this conversation."
    )
    location_item: str = "[{label}] (turn {turn})"
    separator: str = ", "

    def __post_init__(self) -> None:
        for name, fields in (
            ("order", ("{labels}",)),
            ("location", ("{items}",)),
            ("location_item", ("{label}", "{turn}")),
        ):
            template = getattr(self, name)
            if not isinstance(template, str) or any(f not in template for f in fields):
                raise ConfigError(f"NoteTemplates.{name} must be a str containing {fields}")
            try:  # other placeholders would fail only later, inside optimize()
                template.format(labels="", items="", label="", turn=1)
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    f"NoteTemplates.{name} may use only the placeholders {fields}: {exc!r}"
                ) from exc


def order_note(
    original: Sequence[ContextBlock],
    shown: Sequence[ContextBlock],
    templates: NoteTemplates,
) -> str | None:
    """The ranking of ``original`` when the ``shown`` blocks are not in their original
    relative order; ``None`` when nothing moved."""
    rank = {block.id: position for position, block in enumerate(original)}
    positions = [rank[block.id] for block in shown]
    if all(a < b for a, b in itertools.pairwise(positions)):
        return None
    labels = templates.separator.join(f"[{block.label}]" for block in original)
    return templates.order.format(labels=labels)


def location_note(
    deduplicated: Sequence[tuple[ContextBlock, int]], templates: NoteTemplates
) -> str | None:
    """One note naming each de-duplicated block and the (1-based) turn that holds it."""
    if not deduplicated:
        return None
    items = templates.separator.join(
        templates.location_item.format(label=block.label, turn=turn + 1)
        for block, turn in deduplicated
    )
    return templates.location.format(items=items)
