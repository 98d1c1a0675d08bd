"""A rich display of install steps on stderr: a spinner and the elapsed time for the
running step, a check mark (or "skipped") for those done. rich is imported here only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .install import InstallEvent, InstallProgress

__all__ = ["rich_install_progress"]

_MARKS = {
    "done": "[green]✓[/green]",
    "adopted": "[green]✓ (found)[/green]",
    "skipped": "[dim]✓ already there[/dim]",
    "failed": "[red]✗ failed[/red]",
}


@contextlib.contextmanager
def rich_install_progress() -> Iterator[InstallProgress]:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(finished_text=" "),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as display:
        tasks: dict[str, TaskID] = {}

        def report(event: InstallEvent) -> None:
            if event.state == "start":
                tasks[event.step] = display.add_task(event.step, total=1)
                return
            task = tasks[event.step]
            mark = _MARKS.get(event.state, event.state)
            display.update(task, description=f"{event.step}  {mark}", completed=1)
            display.stop_task(task)

        yield report
