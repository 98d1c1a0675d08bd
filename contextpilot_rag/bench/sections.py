"""Generated sections of ``docs/``: each benchmark (and ``contextpilot-rag eval
--write``) owns the sections it writes.

A section is the text between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->``; its first lines say how it was produced
(:func:`provenance`: command, date, machine, number of runs and the spread of timed
figures). :func:`write_section` replaces one section in place, or appends it, and
never touches the rest of the file, so several benchmarks write into one document and
prose around the sections stays hand-written. ``tests/test_docs_figures.py`` checks
that every measured figure of ``docs/`` lies inside such a section.

It is part of the package (not of ``benchmarks/lib``, which re-exports it) because an
installed command writes such sections too.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

__all__ = [
    "begin_marker",
    "end_marker",
    "machine",
    "markdown_table",
    "provenance",
    "pyplot",
    "save_figure",
    "spread",
    "write_or_print",
    "write_section",
]


def begin_marker(name: str) -> str:
    return f"<!-- BEGIN GENERATED: {name} -->"


def end_marker(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


def write_section(path: Path, name: str, body: str) -> None:
    """Put ``body`` into ``path`` as the generated section ``name``: in place of that
    section if the file has it, else appended at the end; the rest is kept."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise ValueError(f"section names are letters, digits, '.', '_' and '-'; got {name!r}")
    begin, end = begin_marker(name), end_marker(name)
    section = f"{begin}\n\n{body.strip()}\n\n{end}"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    start = old.find(begin)
    stop = old.find(end, start) if start >= 0 else -1
    if start >= 0 and stop >= 0:
        new = old[:start] + section + old[stop + len(end) :]
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new, encoding="utf-8")


def machine() -> str:
    """Architecture, CPU model where Linux tells it, core count and Python: seconds
    measured on different machines are not comparable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line]
    except OSError:
        names = []
    cpu = f"{platform.machine()} ({names[0]})" if names else platform.machine()
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}"
    )


def provenance(command: str, runs: int, spread_note: str) -> str:
    """The opening lines of a generated section. ``spread_note`` says how timed figures
    vary over the ``runs`` (or that the figures are deterministic)."""
    return "\n".join(
        [
            f"- command: `{command}`",
            f"- date: {date.today().isoformat()}; machine: {machine()}{_load()}",
            f"- runs: {runs}; spread: {spread_note}",
        ]
    )


def _load() -> str:
    """The 1-minute load average as the section is written, where the OS tells it:
    timings taken next to other work are slower, and this says how busy the machine was."""
    try:
        return f"; 1-minute load average {os.getloadavg()[0]:.2f} at the end of the run"
    except (AttributeError, OSError):
        return ""


def spread(values: Sequence[float], fmt: str, unit: str = "") -> str:
    """``median unit`` for one value, ``median unit (min–max, n runs)`` for several."""
    median = format(statistics.median(values), fmt) + unit
    if len(values) < 2:
        return median
    return f"{median} ({min(values):{fmt}}–{max(values):{fmt}}{unit}, {len(values)} runs)"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Lines of a markdown table; every column after the first is right-aligned."""
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def write_or_print(text: str, name: str, path: Path | None) -> None:
    """Write ``text`` as the section ``name`` of ``path`` (saying so on stderr), or,
    without a path, print it."""
    if path:
        write_section(path, name, text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or ``None`` when
    matplotlib is not installed (the ``bench`` and ``eval`` extras bring it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(figure: Any, path: Path) -> bool:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
