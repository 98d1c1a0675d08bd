"""The main section of docs/benchmarks.md, from the results of ``benchmarks/bench.py``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from contextpilot_rag.batch import REFINE_UP_TO
from contextpilot_rag.experiment import ExperimentResult

from .batch import REFINE_ARM_UP_TO, BatchResult
from .report import batch_markdown, experiment_markdown, latency_markdown
from .sections import provenance
from .suite import LatencyResult

__all__ = ["SECTION", "benchmark_markdown"]

SECTION = "bench"
"""The name of the generated section this benchmark owns."""


def benchmark_markdown(
    command: str,
    online: ExperimentResult,
    multiturn: ExperimentResult,
    multiturn_uncached: ExperimentResult,
    latency: LatencyResult,
    batches: Sequence[BatchResult],
    plot: Path | None,
) -> str:
    """The body of the ``bench`` section of docs/benchmarks.md."""
    runs = len(latency.runs)
    lines = [
        "## Prompt optimization: hit ratio, latency, batch mode (`benchmarks/bench.py`)",
        "",
        provenance(
            command,
            runs,
            "hit ratios and token counts are deterministic (seeded workloads); timings "
            + (
                f"show the median with min–max over {runs} runs"
                if runs > 1
                else "are from one run, spread not measured"
            ),
        ),
        "- cache model: `contextpilot_rag.sim.PrefixCacheModel`, vLLM-style (16-token "
        "blocks, chained hashes, lookup stops at the first miss, LRU eviction), capacity "
        "25% of the unmodified prompts' distinct cacheable tokens",
        "- prompts tokenized whole with tiktoken cl100k (offline copy) and a `<|role|>` "
        "line per message; hit ratio = cached prompt tokens / prompt tokens",
        "- workloads: `contextpilot_rag.bench.workloads` (synthetic MultiHopRAG-like corpus, "
        "~200-token documents, Zipf-like popularity: 80% of document slots in the top 20% "
        "of documents, a 141-token system prompt)",
        "",
        "### Summary against the targets",
        "",
        targets_markdown(online, multiturn, multiturn_uncached, latency),
        "",
        f"### Online: {online.arm('unmodified').requests:,} requests, 15 documents each",
        "",
        "Requests arrive one at a time; each arm builds its prompts in arrival order. "
        "`ours (retrieval order)` keeps the retriever's order for blocks that match no "
        "cached prefix, `ours` (the default) orders them by popularity. The reference arm "
        "uses the reference implementation's online `reorder` and our rendering, so only "
        "the ordering differs.",
        "",
        experiment_markdown(online),
        "",
        f"### Multi-turn: {multiturn.arm('unmodified').requests:,} turns "
        "(sessions of 5 turns, 16 interleaved, ~40% of each later turn's documents "
        "retrieved before in the session)",
        "",
        "History (earlier user messages and answers) is part of every prompt. "
        "`unmodified` re-sends every retrieved document; `ours` replaces documents "
        "already in the history by a location note. The engine keeps the KV of the "
        "answers it decodes, as vLLM v1 and SGLang do (each answer is a fixed ~30-token "
        "text), so the next turn reuses the whole previous exchange.",
        "",
        experiment_markdown(multiturn),
        "",
        "The same prompts on an engine that caches prompt tokens only (the next turn "
        "recomputes each answer and the last partial block before it):",
        "",
        experiment_markdown(multiturn_uncached),
        "",
        f"### optimize() latency, {latency.requests:,}-request stream",
        "",
        "Wall time of each `ContextPilot.optimize` call (blocks already constructed; "
        "each document tokenized once, on first sight), index capacity "
        f"{latency.capacity_tokens:,} tokens.",
        "",
        latency_markdown(latency),
        "",
        *batch_section(batches),
    ]
    if plot is not None:
        lines += [f"![hit ratio per arm]({plot.as_posix()})", ""]
    return "\n".join(lines)


def targets_markdown(
    online: ExperimentResult,
    multiturn: ExperimentResult,
    multiturn_uncached: ExperimentResult,
    latency: LatencyResult,
) -> str:
    def share(result: ExperimentResult) -> float:
        return result.arm("ours").computed_tokens / result.arm("unmodified").computed_tokens

    rows = [
        ("online hit ratio", ">= 22%", f"{online.arm('ours').hit_ratio:.1%}",
         online.arm("ours").hit_ratio >= 0.22),
        ("optimize() median", "<= 0.2 ms", f"{latency.p50_ms:.3f} ms", latency.p50_ms <= 0.2),
        ("optimize() last 10% / first 10%", "<= 1.5x", f"{latency.drift:.2f}x",
         latency.drift <= 1.5),
        ("multi-turn computed tokens vs unmodified", "<= 65%", f"{share(multiturn):.1%}",
         share(multiturn) <= 0.65),
        ("... same, engine caching prompt tokens only", "(<= 65%)",
         f"{share(multiturn_uncached):.1%}", share(multiturn_uncached) <= 0.65),
    ]  # fmt: skip
    return _target_table(rows)


def batch_section(batches: Sequence[BatchResult]) -> list[str]:
    """The batch-mode part of the report, with its own target summary."""
    if not batches:
        return []
    lines = [
        "### Batch mode (`optimize_batch`)",
        "",
        "One batch of N online-workload requests (D = 2,000 documents, k = 15) planned at "
        "once and replayed in its execution order. *build + schedule* is the planner alone "
        "(block codes in, orders and schedule out); *optimize_batch* adds validation, "
        "tokenizing each distinct block once, rendering every prompt (with its order note) "
        "and entering it into the context index. *plan memory* is the peak allocated while "
        "planning (tracemalloc, numpy included) in a fresh process; the note gives that "
        "process's peak RSS (interpreter and workload included). The reference runs its "
        "batch mode (`build_and_schedule`, CPU) in a child process with a time limit; its "
        "prompts use our rendering without notes. `ours` and the arms after it use "
        "`plan_batch`'s defaults, which refine plans of up to "
        f"{REFINE_UP_TO:,} requests (one local-search pass after the build); *ours, refine "
        "off* / *ours, refine on* is `ours` the other way round, up to "
        f"{REFINE_ARM_UP_TO:,} requests.",
        "",
    ]
    targets = batch_targets_markdown(batches)
    if targets:  # only for the sizes the targets name
        lines += [targets, ""]
    for result in batches:
        lines += [
            f"#### {result.requests:,} requests (capacity {result.capacity_tokens:,} tokens)",
            "",
            batch_markdown(result),
            "",
        ]
    return lines


def batch_targets_markdown(batches: Sequence[BatchResult]) -> str:
    by_size = {result.requests: result for result in batches}
    rows: list[tuple[str, str, str, bool]] = []
    small = by_size.get(2000)
    if small is not None:
        ours = small.arm("ours")
        rows.append(
            (
                "2,000: hit ratio at 25% capacity",
                ">= 35%",
                f"{ours.hit_ratio:.1%}",
                ours.hit_ratio >= 0.35,
            )
        )
        rows.append(
            (
                "2,000: build + schedule",
                "<= 2 s",
                f"{ours.plan_s or 0:.2f} s",
                ours.plan_s is not None and ours.plan_s <= 2,
            )
        )
    large, middle = by_size.get(100_000), by_size.get(12_000)
    if large is not None:
        ours = large.arm("ours")
        rows.append(
            (
                "100,000: build + schedule",
                "<= 60 s",
                f"{ours.plan_s or 0:.1f} s",
                ours.plan_s is not None and ours.plan_s <= 60,
            )
        )
        if ours.peak_mb is not None:
            rows.append(
                ("100,000: plan memory", "<= 4 GB", f"{ours.peak_mb:,.0f} MB", ours.peak_mb <= 4096)
            )
        if middle is not None:
            ratio = ours.hit_ratio / middle.arm("ours").hit_ratio
            rows.append(
                (
                    "100,000 vs 12,000: hit ratio",
                    "no more than 10% below",
                    f"{ours.hit_ratio:.1%} vs {middle.arm('ours').hit_ratio:.1%}",
                    ratio >= 0.90,  # higher at scale is fine: more requests share more
                )
            )
    return _target_table(rows) if rows else ""


def _target_table(rows: Sequence[tuple[str, str, str, bool]]) -> str:
    lines = ["| measure | target | measured | met |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {target} | {value} | {'yes' if met else 'no'} |"
        for name, target, value, met in rows
    ]
    return "\n".join(lines)
