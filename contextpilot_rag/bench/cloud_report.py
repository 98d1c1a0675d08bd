"""Presenting the cloud-cache cost benchmark: the targets of issue 25, rich tables for
the terminal, markdown for ``docs/benchmarks.md``, a PNG and JSON."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..cloud.prices import PRICES_READ_ON
from .cloud_suite import CloudRun, CloudSuiteResult
from .cloud_workloads import (
    FAMILIES,
    NO_OVERLAP_GAP_RANGE_S,
    NO_OVERLAP_K_RANGE,
    SESSION_GAP_RANGE_S,
    TOPICS_RANGE,
    USER_GAP_RANGE_S,
)
from .sections import pyplot, save_figure

__all__ = ["TARGETS", "FamilyCheck", "checks", "markdown", "plot", "rich_tables", "write_json"]

TARGETS = {"multi-turn": 1.6, "multi-session": 1.4, "no-overlap": 1.02}
"""Multi-turn and multi-session: the smallest baseline / ours over the seeds must reach
the figure; no-overlap: the largest ours / baseline must stay under it."""


@dataclass(frozen=True)
class FamilyCheck:
    """One family on one provider: baseline cost / ours over its seeds, and the target."""

    family: str
    provider: str
    model: str
    seeds: int
    ratios: tuple[float, ...]
    bounds: tuple[float, ...] = ()  # per seed, :attr:`CloudRun.bound` (0: not computed)
    chat_bounds: tuple[float, ...] = ()  # per seed, :attr:`CloudRun.chat_bound`

    @property
    def worst_ours_over_baseline(self) -> float:
        return max(1 / ratio for ratio in self.ratios)

    @property
    def target(self) -> str:
        if self.family == "no-overlap":
            return f"ours / baseline <= {TARGETS[self.family]:.2f}x"
        return f"baseline / ours >= {TARGETS[self.family]:.1f}x (min)"

    @property
    def measured(self) -> str:
        if self.family == "no-overlap":
            return f"{self.worst_ours_over_baseline:.3f}x (max)"
        return f"{min(self.ratios):.2f}x (min)"

    @property
    def bound(self) -> str:
        """The best minimum over the seeds any strategy could reach (ratio families)."""
        return self._smallest(self.bounds)

    @property
    def chat_bound(self) -> str:
        """The best minimum over the seeds a strategy whose turns extend the previous
        prompt could reach (ratio families)."""
        return self._smallest(self.chat_bounds)

    def _smallest(self, bounds: tuple[float, ...]) -> str:
        if self.family == "no-overlap" or not bounds or not all(bounds):
            return "—"
        return f"{min(bounds):.2f}x (min)"

    @property
    def within_bound(self) -> str:
        """Whether the target is reachable at all by prompts whose turns extend the
        previous prompt (as the pilot's do): ``no`` when even that bound misses it
        (no-overlap: sending the baseline itself meets it)."""
        if self.family == "no-overlap":
            return "yes"
        if not self.chat_bounds or not all(self.chat_bounds):
            return "—"
        return "yes" if min(self.chat_bounds) >= TARGETS[self.family] else "no"

    @property
    def met(self) -> bool:
        if self.family == "no-overlap":
            return self.worst_ours_over_baseline <= TARGETS[self.family]
        return min(self.ratios) >= TARGETS[self.family]


def checks(result: CloudSuiteResult) -> list[FamilyCheck]:
    found = []
    for family in FAMILIES:
        for provider in result.providers:
            runs = result.runs_of(family, provider)
            if runs:
                ratios = tuple(run.ratio for run in runs)
                bounds = tuple(run.bound for run in runs)
                chat = tuple(run.chat_bound for run in runs)
                model = runs[0].model
                found.append(FamilyCheck(family, provider, model, len(runs), ratios, bounds, chat))
    return found


_SUMMARY = (
    "family",
    "provider (model)",
    "seeds",
    "min",
    "median",
    "max",
    "target",
    "met",
    "bound: any prompt",
    "bound: chat-append",
    "within the chat-append bound",
)
_DETAIL = (
    "family",
    "seed",
    "provider",
    "baseline practice",
    "baseline $",
    "ours $",
    "baseline / ours",
    "bound: any / chat-append",
    "ours of chat-append bound",
    "chat-append bound $, none read across conversations",
    "prompt tokens, ours / baseline",
    "baseline read / written",
    "ours read / written",
    "ours breakpoints / request (max)",
)


def _summary_rows(result: CloudSuiteResult) -> list[tuple[str, ...]]:
    return [
        (
            check.family,
            f"{check.provider} ({check.model})",
            str(check.seeds),
            f"{min(check.ratios):.2f}x",
            f"{statistics.median(check.ratios):.2f}x",
            f"{max(check.ratios):.2f}x",
            check.target + ("; measured " + check.measured if check.family == "no-overlap" else ""),
            "yes" if check.met else "no",
            check.bound,
            check.chat_bound,
            check.within_bound,
        )
        for check in checks(result)
    ]


def _tokens(read: int, written: int) -> str:
    return f"{read:,} / {written:,}"


def _detail_row(run: CloudRun) -> tuple[str, ...]:
    base, ours = run.baseline, run.ours
    breakpoints = (  # none on OpenAI's automatic cache; some on Anthropic and gpt-5.6
        f"{ours.breakpoints_per_request:.2f} ({ours.max_breakpoints})"
        if ours.max_breakpoints
        else "—"
    )
    return (
        run.family,
        str(run.seed),
        run.provider,
        base.name,
        f"{base.cost_usd:.3f}",
        f"{ours.cost_usd:.3f}",
        f"{run.ratio:.2f}x",
        f"{run.bound:.2f}x / {run.chat_bound:.2f}x" if run.bound and run.chat_bound else "—",
        (
            f"{run.least_chat_cost_usd / ours.cost_usd:.0%}"
            if run.chat_bound and ours.cost_usd
            else "—"
        ),
        (
            f"{run.least_chat_cost_usd:.3f} ({run.least_chat_own_cost_usd:.3f})"
            if run.least_chat_own_cost_usd
            else "—"
        ),
        f"{ours.prompt_tokens / max(1, base.prompt_tokens):.1%}",
        _tokens(base.cache_read_tokens, base.cache_write_tokens),
        _tokens(ours.cache_read_tokens, ours.cache_write_tokens),
        breakpoints,
    )


def rich_tables(result: CloudSuiteResult) -> list[Any]:
    """Per run, then the summary against the targets."""
    from rich.table import Table

    detail = Table(title="input-token cost per workload (emulated)")
    for column in _DETAIL:
        detail.add_column(column, justify="left" if column in _DETAIL[:4] else "right")
    for run in result.runs:
        detail.add_row(*_detail_row(run))
    summary = Table(title="baseline cost / ours, over seeds (issue 25 targets)")
    for column in _SUMMARY:
        summary.add_column(column, justify="left" if column in _SUMMARY[:2] else "right")
    for row in _summary_rows(result):
        summary.add_row(*row)
    return [detail, summary]


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _prices(result: CloudSuiteResult) -> str:
    rows = []
    for price in result.prices:
        writes = (
            f"{price.cache_write_5m} / {price.cache_write_1h}"
            if price.cache_write_5m is not None
            else "— (no write premium)"
        )
        rows.append(
            (
                price.provider,
                f"`{price.model}`",
                f"{price.input}",
                f"{price.cache_read}",
                writes,
                f"{price.read_on}, {price.source}",
            )
        )
    headers = ("provider", "model", "input", "cache read", "cache write 5m / 1h", "read on, from")
    return _md_table(headers, rows)


def _ranges() -> str:
    """What each seed draws (``cloud_workloads``' ranges)."""

    def span(bounds: tuple[float, float], unit: str = "") -> str:
        return f"{bounds[0]:g}–{bounds[1]:g}{unit}"

    return (
        "- drawn per seed (seconds log-uniform, counts uniform): multi-turn, the mean gap "
        f"between conversation starts {span(SESSION_GAP_RANGE_S, ' s')}; multi-session, "
        f"the mean gap between users {span(USER_GAP_RANGE_S, ' s')} and "
        f"{span(TOPICS_RANGE)} knowledge bases; no-overlap, the mean gap between requests "
        f"{span(NO_OVERLAP_GAP_RANGE_S, ' s')} and {span(NO_OVERLAP_K_RANGE)} documents "
        "a request"
    )


def _workloads(result: CloudSuiteResult) -> str:
    seen: dict[tuple[str, int], str] = {}
    for run in result.runs:
        seen.setdefault((run.family, run.seed), run.description)
    lines = [f"- {family}, seed {seed}: {text}" for (family, seed), text in seen.items()]
    return "\n".join([_ranges(), *lines])


def markdown(result: CloudSuiteResult) -> str:
    """The price assumptions, the summary against the targets, every run."""
    failed = [c for c in checks(result) if not c.met]
    verdict = (
        "Every target is met."
        if not failed
        else "Not met: "
        + "; ".join(f"{c.family} on {c.provider} ({c.measured})" for c in failed)
        + "."
    )
    return "\n\n".join(
        [
            "**Emulated, not measured on the providers' servers.** Every request is replayed "
            "through `contextpilot_rag.sim.provider_cache` (`AnthropicCacheModel`, "
            "`OpenAICacheModel`: the providers' published cache rules, read on "
            f"{PRICES_READ_ON}; see [cloud_emulator.md](cloud_emulator.md)) at its "
            "simulated send time, tokens counted with the offline cl100k tokenizer, and "
            "billed with `contextpilot_rag.cloud.input_cost` at the list prices below "
            "(USD per million input tokens; output tokens are not counted). Ratios are "
            "input-token cost, baseline / ours (> 1: ours is cheaper). To measure the same "
            "arms on the provider's API with your key (it costs money; the report puts "
            "each measured figure beside this emulator's prediction): `contextpilot-rag "
            "bench --suite cloud --live --provider anthropic --scale 0.03 --max-usd 5` "
            "(or `--provider openai`; [cloud.md](cloud.md)).",
            _prices(result),
            "Baseline: the same requests unmodified (documents in retrieval order, every "
            "turn's documents kept in the conversation, no de-duplication), with the "
            "cheaper, per workload, of two common practices — Anthropic: a breakpoint on "
            "the system prompt, or on the system prompt and the last user message; OpenAI: "
            "no `prompt_cache_key`, or one per user. Ours: the pilot's prompts (reorder, "
            "de-duplication, notes, cache plan on) sent as `Prompt.to_anthropic()` / "
            "`Prompt.to_openai_request()`. Never more than 4 breakpoints in a request "
            "(checked on every request).",
            "Bound: the least input cost any prompt strategy could pay for the same "
            "requests while keeping what the unmodified request gives the model (the "
            "system prompt, every document the conversation has retrieved so far, every "
            "question and answer so far), from `contextpilot_rag.bench.cloud_bound`: the "
            "larger of a per-text bound (each text paid once, then read back at the "
            "read price, a write premium once where it pays) and a prefix-aware one (a "
            "request reads from the cache at most what it shares with one earlier "
            "request, since every cache entry is a prefix of one earlier prompt), both "
            "without time-to-live, minimum prefix, order or markup. *bound: any prompt* "
            "= baseline cost / that least cost, the largest ratio any strategy could "
            "reach. It lets a later turn read its new documents from other "
            "conversations' prompts, which no chat prompt can: a later turn's prompt "
            "starts with its conversation's history, which ends with a question no other "
            "conversation asked. *bound: chat-append* is the same bound for the "
            "strategies whose every turn starts with the previous turn's whole prompt "
            "(the chat-history convention, and the byte-stable prefixes the pilot keeps "
            "across turns) and carries only what the request must carry: a document a "
            "conversation first retrieves at a later turn is paid (then read at its later "
            "turns), and only a first turn reads across conversations, at most what it "
            "shares with one earlier conversation's first turn before its question, nothing "
            "where that is below the model's minimum cacheable prefix, and all first turns "
            "together no more than their trie allows (`separation_bound`: requests that "
            "share little part early; `least_chat_append_cost`). *ours of chat-append "
            "bound* = that least cost / "
            "ours; *within the chat-append bound*: whether the target is reachable at all "
            "by such prompts on every seed. In parentheses beside that least cost, the "
            "same bound with no first turn reading from another conversation: the "
            "difference is what the bound credits to first turns reading across "
            "conversations, to be set against the gap between ours and the bound (the bound "
            "also knows which turn is a conversation's last, so it never writes what no "
            "later turn reads).",
            _workloads(result),
            "### Summary against the targets\n\n"
            + _md_table(_SUMMARY, _summary_rows(result))
            + "\n\n"
            + verdict,
            "### Every workload\n\n"
            + _md_table(_DETAIL, [_detail_row(run) for run in result.runs])
            + "\n\nread / written: cache-read and cache-write input tokens (OpenAI writes "
            "nothing billable: a write is an uncached input token). Run time "
            f"{result.elapsed_s:.0f} s.",
        ]
    )


def plot(result: CloudSuiteResult, path: Path) -> bool:
    """Baseline / ours per family and provider (each seed a dot, targets dashed); ``False``
    when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    found = checks(result)
    figure, axis = plt.subplots(figsize=(7.5, 4))
    for position, check in enumerate(found):
        color = "tab:orange" if check.provider == "anthropic" else "tab:green"
        axis.bar(position, statistics.median(check.ratios), color=color, alpha=0.6)
        axis.scatter([position] * len(check.ratios), check.ratios, color="black", s=12, zorder=3)
        if check.family != "no-overlap" and check.chat_bounds and all(check.chat_bounds):
            axis.scatter(
                [position] * len(check.chat_bounds),
                check.chat_bounds,
                color="grey",
                marker="_",
                s=120,
            )
        target = TARGETS[check.family]
        goal = 1 / target if check.family == "no-overlap" else target
        axis.hlines(goal, position - 0.4, position + 0.4, colors="red", linestyles="dashed")
    axis.set_xticks(range(len(found)), [f"{c.family}\n{c.provider}" for c in found], fontsize=8)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_ylabel("input cost, baseline / ours")
    axis.set_title(
        "Hosted prompt caches, emulated\n(bars: median; dots: seeds; grey dashes: each seed's "
        "chat-append bound; red dashed: target)",
        fontsize=9,
    )
    return save_figure(figure, path)


def write_json(result: CloudSuiteResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "elapsed_s": result.elapsed_s,
        "scale": result.scale,
        "models": dict(result.models),
        "runs": [
            {**asdict(run), "ratio": run.ratio, "baseline": run.baseline.name}
            for run in result.runs
        ],
        "checks": [{**asdict(c), "met": c.met} for c in checks(result)],
    }
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
