"""Notes that keep the model informed after reordering and de-duplication.

The order note restores the retriever's ranking; location notes point at blocks that
were sent earlier in the conversation. Notes use the blocks' position-independent
labels and are placed after all blocks, so they never break a shared prefix.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .blocks import ContextBlock
from .errors import ConfigError
from .escaping import StructureGuard

__all__ = ["NoteTemplates", "location_note", "order_note", "shown_note"]


@dataclass(frozen=True)
class NoteTemplates:
    """Wording of the notes. ``order`` receives ``{labels}`` (every block's label,
    most relevant first). ``location`` receives ``{groups}``: one ``location_group``
    per earlier turn, earliest first, each with that turn's ``{labels}`` and,
    optionally, its 1-based ``{turn}`` (e.g. ``"{labels} (turn {turn})"``), counting
    the turns the prompt renders (behind a history window the first shown is 1). Labels
    (as the blocks show them, without brackets) are joined by ``separator``, groups
    by ``group_separator``.

    The defaults are terse on purpose: notes sit in the uncached tail of every
    prompt, so each token is paid on every request. The default location note names
    blocks by label only: a label is unique in the conversation, so it points at
    the block exactly, whereas a turn number would ask the model to count turns."""

    order: str = "Most relevant first: {labels}"
    location: str = "Also relevant, shown in earlier turns: {groups}"
    location_group: str = "{labels}"
    separator: str = " "
    group_separator: str = " "

    def __post_init__(self) -> None:
        for name, required, allowed in (
            ("order", ("labels",), ("labels",)),
            ("location", ("groups",), ("groups",)),
            ("location_group", ("labels",), ("labels", "turn")),
        ):
            template = getattr(self, name)
            if not isinstance(template, str) or any(
                "{" + field + "}" not in template for field in required
            ):
                raise ConfigError(f"NoteTemplates.{name} must be a str containing {required}")
            try:  # other placeholders would fail only later, inside optimize()
                template.format(**dict.fromkeys(allowed, 1))
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    f"NoteTemplates.{name} may use only the placeholders {allowed}: {exc!r}"
                ) from exc
        for name in ("separator", "group_separator"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"NoteTemplates.{name} must be a str")


def order_note(
    original: Sequence[ContextBlock],
    shown: Sequence[ContextBlock],
    templates: NoteTemplates,
    labels: Mapping[str, str] | None = None,
) -> str | None:
    """The ranking of ``original`` when the ``shown`` blocks are not in their original
    relative order; ``None`` when nothing moved. ``labels`` (block id → label shown)
    overrides the blocks' own labels where it has one."""
    rank = {block.id: position for position, block in enumerate(original)}
    positions = [rank[block.id] for block in shown]
    if all(a < b for a, b in itertools.pairwise(positions)):
        return None
    if labels:
        names = [labels.get(block.id, block.label) for block in original]
    else:
        names = [block.label for block in original]
    return templates.order.format(labels=templates.separator.join(names))


def location_note(
    deduplicated: Sequence[tuple[ContextBlock, int]],
    templates: NoteTemplates,
    labels: Mapping[str, str] | None = None,
) -> str | None:
    """One note naming the de-duplicated blocks, grouped by the (0-based, shown
    1-based) turn that holds them, earliest turn first."""
    if not deduplicated:
        return None
    by_turn: dict[int, list[str]] = {}
    for block, turn in deduplicated:
        by_turn.setdefault(turn, []).append(_label(block, labels))
    groups = templates.group_separator.join(
        templates.location_group.format(labels=templates.separator.join(labels), turn=turn + 1)
        for turn, labels in sorted(by_turn.items())
    )
    return templates.location.format(groups=groups)


def _label(block: ContextBlock, labels: Mapping[str, str] | None) -> str:
    return labels.get(block.id, block.label) if labels else block.label


def shown_note(reported: object, guard: StructureGuard) -> str | None:
    """A note as an outside record (document metadata an adapter wrote) reports it:
    the text when the pilot could have made it (:meth:`StructureGuard.is_note` of the
    pilot's layout), else ``None``: a forged record cannot add a question line, a label
    line or a turn marker to the prompt through a note."""
    if not isinstance(reported, str) or not guard.is_note(reported):
        return None
    return reported
