"""A rich progress display for long batch builds (rich is imported only when one is
shown, so the batch layer stays importable without it)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

from .plan import Progress as ProgressFactory

__all__ = ["rich_progress", "rich_step_progress"]


@contextlib.contextmanager
def rich_progress() -> Iterator[ProgressFactory]:
    """A ``progress(label, total) -> advance(n)`` factory drawing one bar per phase
    (on stderr, so piped output stays clean)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bars:

        def start(label: str, total: int) -> Callable[[int], None]:
            task = bars.add_task(label, total=total)
            return lambda n: bars.advance(task, n)

        yield start


@contextlib.contextmanager
def rich_step_progress() -> Iterator[Callable[[str, int], Callable[[], None]]]:
    """:func:`rich_progress` for callers that advance one step per call
    (``progress(label, total) -> advance()``)."""
    with rich_progress() as bars:
        yield lambda label, total: functools.partial(bars(label, total), 1)
