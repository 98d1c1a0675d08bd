"""What a run shows: per arm and metric the mean with its interval, the paired
difference from ``unmodified`` with its interval and the drop flag; evidence
retention and failed requests per arm. As rich tables, JSON, a PNG and markdown.

A **significant drop** (:func:`~.stats.significant_drop`) is flagged when the whole
interval of ``arm − unmodified`` lies below ``−tolerance`` over at least
:data:`~.stats.MIN_CLUSTERS` clusters: the data cannot be explained by noise alone.
On fewer clusters the flag reads ``few``: the run cannot decide. Its absence is not
proof of no loss: read the interval's lower end as the largest loss the run cannot
rule out.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.sections import pyplot, save_figure
from .arms import BASELINE
from .run import ArmRun, EvalRun
from .stats import (
    Estimate,
    bootstrap_mean,
    paired_difference,
    significant_drop,
    too_few_clusters,
)

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "METRICS",
    "ArmSummary",
    "EvalSummary",
    "MetricSummary",
    "markdown",
    "plot",
    "rich_tables",
    "summarize",
    "to_json",
    "write_json",
]

METRICS = {
    "f1": "token F1",
    "rouge_l": "ROUGE-L",
    "answerability": "answerability",
    "citations": "citations valid",
}
"""Metric key → its name in tables."""


@dataclass(frozen=True)
class MetricSummary:
    metric: str
    estimate: Estimate | None
    difference: Estimate | None
    """``arm − unmodified`` on the tasks both score (``None`` for the baseline)."""
    significant_drop: bool

    @property
    def flag(self) -> str:
        """``"DROP"``, ``"no"``, ``"few"`` (fewer clusters than a verdict needs) or
        ``""`` (no difference: the baseline, or no task both arms score)."""
        if self.difference is None:
            return ""
        if self.significant_drop:
            return "DROP"
        return "few" if too_few_clusters(self.difference) else "no"


@dataclass(frozen=True)
class ArmSummary:
    name: str
    description: str
    metrics: tuple[MetricSummary, ...]
    prompts: int
    changed_prompts: int
    """Prompts that differ from ``unmodified``'s for the same task."""
    retained_prompts: int
    lost: tuple[tuple[str, str], ...]
    errors: tuple[tuple[str, str], ...]
    deduplicated_blocks: int
    claims_retention: bool

    @property
    def retention_ok(self) -> bool:
        return not self.lost

    def metric(self, key: str) -> MetricSummary:
        return next(m for m in self.metrics if m.metric == key)


@dataclass(frozen=True)
class EvalSummary:
    arms: tuple[ArmSummary, ...]
    resamples: int
    seed: int
    tolerance: float
    confidence: float

    @property
    def retention_lost(self) -> bool:
        """An arm that claims retention lost a block."""
        return any(arm.claims_retention and not arm.retention_ok for arm in self.arms)

    @property
    def failed_requests(self) -> int:
        return sum(len(arm.errors) for arm in self.arms)

    @property
    def drops(self) -> list[tuple[str, str]]:
        """``(arm, metric)`` of every significant drop."""
        return [(a.name, m.metric) for a in self.arms for m in a.metrics if m.significant_drop]

    def arm(self, name: str) -> ArmSummary:
        return next(arm for arm in self.arms if arm.name == name)


def _scores(run: ArmRun, metric: str) -> list[float | None]:
    return [None if r.scores is None else r.scores.get(metric) for r in run.results]


def summarize(
    run: EvalRun,
    *,
    resamples: int = 2000,
    seed: int = 0,
    tolerance: float = 0.0,
    confidence: float = 0.95,
) -> EvalSummary:
    """Means, paired differences from ``unmodified`` and flags (see :mod:`.stats`)."""
    options: dict[str, Any] = {"resamples": resamples, "seed": seed, "confidence": confidence}
    baseline = run.arm(BASELINE)
    arms = tuple(_arm_summary(run, arm_run, baseline, tolerance, options) for arm_run in run.arms)
    return EvalSummary(arms, resamples, seed, tolerance, confidence)


def _arm_summary(
    run: EvalRun, arm_run: ArmRun, baseline: ArmRun, tolerance: float, options: dict[str, Any]
) -> ArmSummary:
    clusters = [task.cluster for task in run.tasks]
    metrics = []
    for metric in METRICS:
        scores = _scores(arm_run, metric)
        kept = [(s, c) for s, c in zip(scores, clusters, strict=True) if s is not None]
        estimate = bootstrap_mean([s for s, _ in kept], [c for _, c in kept], **options)
        difference = None
        if arm_run is not baseline:
            difference = paired_difference(_scores(baseline, metric), scores, clusters, **options)
        drop = significant_drop(difference, tolerance)
        metrics.append(MetricSummary(metric, estimate, difference, drop))
    pairs = zip(arm_run.results, baseline.results, strict=True)
    return ArmSummary(
        name=arm_run.arm.name,
        description=arm_run.arm.description,
        metrics=tuple(metrics),
        prompts=len(arm_run.results),
        changed_prompts=sum(
            mine.prompt.messages != theirs.prompt.messages for mine, theirs in pairs
        ),
        retained_prompts=len(arm_run.results) - len({task_id for task_id, _ in arm_run.lost}),
        lost=arm_run.lost,
        errors=arm_run.errors,
        deduplicated_blocks=sum(r.prompt.deduplicated for r in arm_run.results),
        claims_retention=arm_run.arm.claims_retention,
    )


# -- text --------------------------------------------------------------------------


def _interval(estimate: Estimate | None, signed: bool = False) -> str:
    if estimate is None:
        return "–"
    fmt = "+.3f" if signed else ".3f"
    return f"{estimate.mean:{fmt}} [{estimate.low:{fmt}}, {estimate.high:{fmt}}]"


def _retention(arm: ArmSummary) -> str:
    if arm.retention_ok:
        return "100%"
    return f"{arm.retained_prompts / arm.prompts:.1%} ({len(arm.lost)} blocks lost)"


def _metric_rows(summary: EvalSummary) -> list[list[str]]:
    rows = []
    for arm in summary.arms:
        for m in arm.metrics:
            n = m.estimate.n if m.estimate is not None else 0
            flag = m.flag or "–"
            rows.append(
                [
                    arm.name,
                    METRICS[m.metric],
                    str(n),
                    _interval(m.estimate),
                    _interval(m.difference, signed=True),
                    flag,
                ]
            )
    return rows


_METRIC_HEADERS = ("arm", "metric", "n", "mean [95% CI]", "Δ vs unmodified [95% CI]", "drop")
_ARM_HEADERS = ("arm", "prompts", "changed", "retained", "as notes", "failed")
_ARM_HEADERS_LONG = (
    "arm",
    "prompts",
    "changed vs unmodified",
    "evidence retained",
    "blocks sent as notes",
    "failed requests",
)


def _arm_rows(summary: EvalSummary) -> list[list[str]]:
    return [
        [
            arm.name,
            str(arm.prompts),
            str(arm.changed_prompts),
            _retention(arm),
            str(arm.deduplicated_blocks),
            str(len(arm.errors)),
        ]
        for arm in summary.arms
    ]


def _range(estimate: Estimate | None, signed: bool = False) -> tuple[str, str]:
    if estimate is None:
        return "–", ""
    mean, bound = ("+.3f", "+.2f") if signed else (".3f", ".2f")
    return f"{estimate.mean:{mean}}", f"{estimate.low:{bound}}–{estimate.high:{bound}}"


def rich_tables(summary: EvalSummary, title: str = "answer quality") -> list[Table]:
    """One narrow table per metric (arms as rows), then the retention table."""
    from rich import box
    from rich.table import Table

    percent = f"{summary.confidence:.0%} CI"
    tables = []
    for metric, label in METRICS.items():
        table = Table(title=f"{title}: {label}", box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("arm", no_wrap=True)
        for header in ("n", "mean", percent, "Δ", f"Δ {percent}", "drop"):
            table.add_column(header, justify="right", no_wrap=True)
        for arm in summary.arms:
            m = arm.metric(metric)
            flag = m.flag
            table.add_row(
                arm.name,
                str(m.estimate.n if m.estimate is not None else 0),
                *_range(m.estimate),
                *_range(m.difference, signed=True),
                flag,
                style="bold red" if m.significant_drop else None,
            )
        tables.append(table)
    arms = Table(title="evidence retention and requests", box=box.SIMPLE_HEAD, title_justify="left")
    for header in _ARM_HEADERS:
        arms.add_column(header, justify="left" if header == "arm" else "right", no_wrap=True)
    for arm, row in zip(summary.arms, _arm_rows(summary), strict=True):
        arms.add_row(*row, style=None if arm.retention_ok else "bold red")
    return [*tables, arms]


def markdown(summary: EvalSummary, facts: str) -> str:
    """The tables as markdown, after a line of ``facts`` (model, tasks, settings)."""
    from ..bench.sections import markdown_table

    lines = [facts, ""]
    lines += markdown_table(_METRIC_HEADERS, _metric_rows(summary))
    lines += [""]
    lines += markdown_table(_ARM_HEADERS_LONG, _arm_rows(summary))
    return "\n".join(lines)


# -- JSON --------------------------------------------------------------------------


def _estimate(estimate: Estimate | None) -> dict[str, Any] | None:
    return None if estimate is None else asdict(estimate)


def to_json(run: EvalRun, summary: EvalSummary, meta: dict[str, Any]) -> dict[str, Any]:
    """The whole run: settings, per-arm summary, and per task every arm's answer,
    scores and token counts."""
    return {
        "meta": {
            **meta,
            "seconds": round(run.seconds, 3),
            "settings": asdict(run.settings),
            "bootstrap": {
                "resamples": summary.resamples,
                "seed": summary.seed,
                "confidence": summary.confidence,
                "tolerance": summary.tolerance,
                "clusters": "conversation",
            },
        },
        "arms": {arm.name: _arm_json(arm) for arm in summary.arms},
        "tasks": [_task_json(run, index) for index in range(len(run.tasks))],
    }


def _arm_json(arm: ArmSummary) -> dict[str, Any]:
    return {
        "description": arm.description,
        "metrics": {
            m.metric: {
                "estimate": _estimate(m.estimate),
                "difference_vs_unmodified": _estimate(m.difference),
                "significant_drop": m.significant_drop,
                "verdict": m.flag or None,
            }
            for m in arm.metrics
        },
        "changed_prompts": arm.changed_prompts,
        "retention": {
            "prompts": arm.prompts,
            "retained_prompts": arm.retained_prompts,
            "all_retained": arm.retention_ok,
            "lost": [{"task_id": t, "block_id": b} for t, b in arm.lost],
        },
        "deduplicated_blocks": arm.deduplicated_blocks,
        "failed_requests": [{"task_id": t, "error": e} for t, e in arm.errors],
    }


def _task_json(run: EvalRun, index: int) -> dict[str, Any]:
    task = run.tasks[index]
    arms = {}
    for arm_run in run.arms:
        result = arm_run.results[index]
        done = result.completion
        arms[arm_run.arm.name] = {
            "answer": done.text,
            "error": done.error,
            "scores": None if result.scores is None else asdict(result.scores),
            "prompt_tokens": done.prompt_tokens,
            "cached_tokens": done.cached_tokens,
            "completion_tokens": done.completion_tokens,
            "seconds": round(done.seconds, 3),
            "lost_blocks": list(result.prompt.lost),
        }
    return {
        "task_id": task.task_id,
        "conversation_id": task.conversation_id,
        "turn": task.turn,
        "question": task.question,
        "documents": [block.id for block in task.documents],
        "answerable": task.answerable,
        "references": list(task.references),
        "arms": arms,
    }


def write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# -- plot --------------------------------------------------------------------------


def plot(summary: EvalSummary, path: Path, title: str) -> bool:
    """One panel per metric: each arm's mean with its interval. ``False`` when
    matplotlib is missing (the ``eval`` or ``bench`` extra)."""
    plt = pyplot()
    if plt is None:
        return False
    names = [arm.name for arm in summary.arms]
    figure, axes = plt.subplots(1, len(METRICS), figsize=(4.0 * len(METRICS), 4.2))
    for axis, (metric, label) in zip(axes, METRICS.items(), strict=True):
        estimates = [arm.metric(metric).estimate for arm in summary.arms]
        means = [e.mean if e is not None else math.nan for e in estimates]
        below = [e.mean - e.low if e is not None else 0.0 for e in estimates]
        above = [e.high - e.mean if e is not None else 0.0 for e in estimates]
        colors = [
            "tab:red" if arm.metric(metric).significant_drop else "tab:blue" for arm in summary.arms
        ]
        axis.bar(range(len(names)), means, yerr=[below, above], capsize=4, color=colors)
        axis.set_xticks(range(len(names)), [n.replace("+", "+\n") for n in names], fontsize=8)
        axis.set_ylim(0, 1.05)
        axis.set_title(label)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)
