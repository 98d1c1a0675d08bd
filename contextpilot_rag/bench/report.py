"""Presenting experiment results: rich progress and tables for the terminal, markdown
for docs/benchmarks.md, a bar chart when matplotlib is installed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .batch import BatchArm, BatchResult
from .suite import ExperimentResult, LatencyResult

__all__ = [
    "batch_markdown",
    "batch_table",
    "experiment_markdown",
    "experiment_table",
    "latency_markdown",
    "latency_table",
    "plot_hit_ratios",
    "progress_bars",
    "save_figure",
]

_COLUMNS = ("arm", "hit ratio", "prompt tokens", "computed tokens", "computed vs unmodified")


@contextlib.contextmanager
def progress_bars() -> Iterator[Callable[[str, int], Callable[[], None]]]:
    """A ``progress(label, total)`` factory drawing one rich bar per task."""
    with Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    ) as bars:

        def start(label: str, total: int) -> Callable[[], None]:
            task = bars.add_task(label, total=total)
            return lambda: bars.advance(task)

        yield start


def _rows(result: ExperimentResult) -> list[tuple[str, ...]]:
    base = result.arm("unmodified").computed_tokens
    rows: list[tuple[str, ...]] = []
    for arm in result.arms:
        rows.append(
            (
                arm.name,
                f"{arm.hit_ratio:.1%}",
                f"{arm.prompt_tokens:,}",
                f"{arm.computed_tokens:,}",
                f"{arm.computed_tokens / base:.1%}",
            )
        )
    return rows


def experiment_table(result: ExperimentResult) -> Table:
    table = Table(title=f"{result.name} (cache capacity {result.capacity_tokens:,} tokens)")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "arm" else "right")
    for row in _rows(result):
        table.add_row(*row)
    return table


def experiment_markdown(result: ExperimentResult) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(result)]
    misses = sum(arm.dedup_misses for arm in result.arms)
    lines.append("")
    lines.append(
        f"Cache capacity {result.capacity_tokens:,} tokens; de-duplicated blocks missing "
        f"from the rendered history: {misses}."
    )
    return "\n".join(lines)


def _latency_rows(result: LatencyResult) -> list[tuple[str, str]]:
    return [
        ("requests", f"{result.requests:,}"),
        ("optimize() median", f"{result.p50_ms:.3f} ms"),
        ("optimize() p99", f"{result.p99_ms:.3f} ms"),
        ("median, first 10% of the stream", f"{result.first_decile_p50_ms:.3f} ms"),
        ("median, last 10% of the stream", f"{result.last_decile_p50_ms:.3f} ms"),
        ("last / first", f"{result.drift:.2f}x"),
        (
            "max index tokens / capacity",
            f"{result.max_index_tokens:,} / {result.capacity_tokens:,}",
        ),
        ("max index nodes", f"{result.max_index_nodes:,}"),
        *_reference_rows(result),
    ]


def _reference_rows(result: LatencyResult) -> list[tuple[str, str]]:
    ours, reference = result.ours_on_reference_stream, result.reference
    if ours is None or reference is None:
        return []
    head = f"first {reference.requests:,} requests"
    return [
        (
            f"{head}: median, ours / reference",
            f"{ours.p50_ms:.3f} / {reference.p50_ms:.3f} ms "
            f"({reference.p50_ms / ours.p50_ms:.0f}x faster)",
        ),
        (
            f"{head}: reference first 10% → last 10%",
            f"{reference.first_decile_p50_ms:.3f} → {reference.last_decile_p50_ms:.3f} ms",
        ),
    ]


def latency_table(result: LatencyResult) -> Table:
    table = Table(title="optimize() latency over a long stream")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for row in _latency_rows(result):
        table.add_row(*row)
    return table


def latency_markdown(result: LatencyResult) -> str:
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in _latency_rows(result)]
    return "\n".join(lines)


def plot_hit_ratios(results: Sequence[ExperimentResult], path: Path) -> bool:
    """Per experiment, two bar charts over its arms: prefix-cache hit ratio and
    computed (uncached) prompt tokens relative to the unmodified prompts. False
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(len(results), 2, figsize=(12, 3.2 * len(results)), squeeze=False)
    for row, result in zip(axes, results, strict=True):
        names = [arm.name for arm in result.arms]
        base = result.arm("unmodified").computed_tokens
        panels = (
            ("prefix-cache hit ratio (%)", [arm.hit_ratio * 100 for arm in result.arms]),
            (
                "computed tokens, % of unmodified (lower: better)",
                [arm.computed_tokens / base * 100 for arm in result.arms],
            ),
        )
        for axis, (label, values) in zip(row, panels, strict=True):
            bars = axis.barh(names, values, color="#4c72b0")
            axis.bar_label(bars, fmt="%.1f%%")
            axis.set_xlabel(label)
            axis.set_title(f"{result.name}, capacity {result.capacity_tokens:,} tokens")
            axis.invert_yaxis()
            axis.margins(x=0.15)
    return save_figure(figure, path)


_BATCH_COLUMNS = (
    "arm",
    "hit ratio (25% capacity)",
    "hit ratio (unbounded)",
    "build + schedule",
    "optimize_batch",
    "plan memory",
    "note",
)


def _batch_row(arm: BatchArm) -> tuple[str, ...]:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    missing = arm.plan_s is None and arm.note.startswith(("unavailable", "not "))
    return (
        arm.name,
        "-" if missing else f"{arm.hit_ratio:.1%}",
        "-" if missing else f"{arm.hit_ratio_unbounded:.1%}",
        seconds(arm.plan_s),
        seconds(arm.total_s),
        "-" if arm.peak_mb is None else f"{arm.peak_mb:,.0f} MB",
        arm.note,
    )


def batch_table(result: BatchResult) -> Table:
    table = Table(title=f"batch of {result.requests:,} (capacity {result.capacity_tokens:,})")
    for column in _BATCH_COLUMNS:
        table.add_column(column, justify="left" if column in ("arm", "note") else "right")
    for arm in result.arms:
        table.add_row(*_batch_row(arm))
    return table


def batch_markdown(result: BatchResult) -> str:
    lines = ["| " + " | ".join(_BATCH_COLUMNS) + " |", "|" + "---|" * len(_BATCH_COLUMNS)]
    lines += ["| " + " | ".join(_batch_row(arm)) + " |" for arm in result.arms]
    return "\n".join(lines)


def save_figure(figure: Any, path: Path) -> bool:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
