"""Presenting the main benchmark's results: markdown tables for docs/benchmarks.md, a
bar chart when matplotlib is installed, rich progress bars for the terminal."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from contextpilot_rag.batch.progress import rich_step_progress
from contextpilot_rag.experiment import ExperimentResult

from .batch import BatchArm, BatchResult
from .sections import pyplot, save_figure, spread
from .suite import LatencyResult

__all__ = [
    "batch_markdown",
    "experiment_markdown",
    "latency_markdown",
    "ordered_map",
    "plot_hit_ratios",
    "progress_bars",
    "save_figure",
]

_COLUMNS = ("arm", "hit ratio", "prompt tokens", "computed tokens", "computed vs unmodified")


progress_bars = rich_step_progress  # one step per call

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def ordered_map(
    function: Callable[[_In], _Out],
    items: Iterable[_In],
    processes: int,
    tick: Callable[[], None],
) -> list[_Out]:
    """``function`` of every item, in order, on ``processes`` forked worker processes
    (1 or fewer: in this process), calling ``tick`` as each result arrives."""
    if processes <= 1:
        results = []
        for item in items:
            results.append(function(item))
            tick()
        return results
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = []
        for result in pool.imap(function, items):
            results.append(result)
            tick()
        return results


def experiment_markdown(result: ExperimentResult) -> str:
    base = result.arm("unmodified").computed_tokens
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for arm in result.arms:
        cells = (
            arm.name,
            f"{arm.hit_ratio:.1%}",
            f"{arm.prompt_tokens:,}",
            f"{arm.computed_tokens:,}",
            f"{arm.computed_tokens / base:.1%}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    misses = sum(arm.dedup_misses for arm in result.arms)
    lines.append("")
    lines.append(
        f"Cache capacity {result.capacity_tokens:,} tokens; de-duplicated blocks missing "
        f"from the rendered history: {misses}."
    )
    return "\n".join(lines)


def _latency_rows(result: LatencyResult) -> list[tuple[str, str]]:
    def ms(field: str) -> str:
        return spread([getattr(run, field) for run in result.runs], ".3f", " ms")

    return [
        ("requests per run", f"{result.requests:,}"),
        ("optimize() median", ms("p50_ms")),
        ("optimize() p99", ms("p99_ms")),
        ("median, first 10% of the stream", ms("first_decile_p50_ms")),
        ("median, last 10% of the stream", ms("last_decile_p50_ms")),
        ("last / first", spread([run.drift for run in result.runs], ".2f", "x")),
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
            f"{head}: median, ours / reference (first run)",
            f"{ours.p50_ms:.3f} / {reference.p50_ms:.3f} ms "
            f"({reference.p50_ms / ours.p50_ms:.0f}x faster)",
        ),
        (
            f"{head}: reference first 10% → last 10%",
            f"{reference.first_decile_p50_ms:.3f} → {reference.last_decile_p50_ms:.3f} ms",
        ),
    ]


def latency_markdown(result: LatencyResult) -> str:
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in _latency_rows(result)]
    return "\n".join(lines)


def plot_hit_ratios(results: Sequence[ExperimentResult], path: Path) -> bool:
    """Per experiment, two bar charts over its arms: prefix-cache hit ratio and
    computed (uncached) prompt tokens relative to the unmodified prompts. False
    without matplotlib."""
    plt = pyplot()
    if plt is None:
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
    plan = spread(arm.plan_runs_s, ".2f", " s") if arm.plan_runs_s else seconds(arm.plan_s)
    return (
        arm.name,
        "-" if missing else f"{arm.hit_ratio:.1%}",
        "-" if missing else f"{arm.hit_ratio_unbounded:.1%}",
        plan,
        seconds(arm.total_s),
        "-" if arm.peak_mb is None else f"{arm.peak_mb:,.0f} MB",
        arm.note,
    )


def batch_markdown(result: BatchResult) -> str:
    lines = ["| " + " | ".join(_BATCH_COLUMNS) + " |", "|" + "---|" * len(_BATCH_COLUMNS)]
    lines += ["| " + " | ".join(_batch_row(arm)) + " |" for arm in result.arms]
    return "\n".join(lines)
