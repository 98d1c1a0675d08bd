"""Hosted prompt caches off the cloud families' shape: input-token cost where the
families do not go, written into docs.

    python benchmarks/cloud_variants.py --write docs/benchmarks.md \
        --plot docs/img/cloud_variants.png

The ``cloud`` section (``benchmarks/cloud.py``) measures the workloads the targets of
issue 25 name. Users' prompts differ in ways that move what caching pays: a model whose
minimum cacheable prefix is four times the default, a system prompt of thousands of
tokens (agents), few long documents instead of many short ones, short ones (memories,
facts) whose prompts stay under the minimum, documents of many lengths (the reorder
weighs a block by its tokens), the one-hour cache lifetime (whose write a single read
does not repay), OpenAI's ``gpt-5.6`` models (which cache only at breakpoints and charge
for writes). Each variant here changes one of these on the same families (seeds 0–2,
``--scale`` of their size) and replays baseline and ours through the emulated caches
exactly as the ``cloud`` section does
(``contextpilot_rag.bench.cloud_suite.run_cloud_workload``). Checked: ours costs no
more than the baseline on any workload (no-overlap: at most 2% more, the target of the
``cloud`` section). Deterministic (seeded workloads, simulated time): one run.
Emulated from the providers' published rules, not measured on their servers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from lib.sections import markdown_table, provenance, pyplot, save_figure, write_or_print
from rich.progress import track

from contextpilot_rag.bench.cloud_suite import DEFAULT_MODELS, run_cloud_workload
from contextpilot_rag.bench.cloud_workloads import CloudWorkload, cloud_workload
from contextpilot_rag.bench.workloads import SYSTEM_PROMPT, log_uniform

SECTION = "cloud-variants"
SEEDS = (0, 1, 2)
LONG_SYSTEM_TIMES = 30  # the default system prompt repeated: ~4,200 tokens
LONG_DOCUMENT_TIMES = 8  # each document repeated: ~1,600 tokens
SHORT_DOCUMENT_WORDS = 20  # each document cut to its first words: ~40 tokens, a memory
VARIED_DOCUMENT_WORDS = (40.0, 400.0)  # log-uniform per document (the families' range)
NO_OVERLAP_LIMIT = 1.02  # ours / baseline, at most (the cloud section's target)


@dataclass(frozen=True)
class Variant:
    name: str
    short: str  # the plot's label
    families: tuple[str, ...]
    providers: tuple[str, ...]
    models: dict[str, str]
    change: Callable[[CloudWorkload], CloudWorkload]
    ttl: str = "5m"  # Anthropic breakpoints' lifetime, baseline and ours alike


def _same(workload: CloudWorkload) -> CloudWorkload:
    return workload


def _long_system(workload: CloudWorkload) -> CloudWorkload:
    return replace(workload, system_prompt=SYSTEM_PROMPT * LONG_SYSTEM_TIMES)


def _long_documents(workload: CloudWorkload) -> CloudWorkload:
    """Every document ``LONG_DOCUMENT_TIMES`` as long, and only the first 3 of each
    request's documents kept (the same prompt length in fewer, longer blocks)."""
    corpus = {doc_id: text * LONG_DOCUMENT_TIMES for doc_id, text in workload.corpus.items()}
    requests = tuple(
        replace(timed, request=replace(timed.request, doc_ids=timed.request.doc_ids[:3]))
        for timed in workload.requests
    )
    return replace(workload, corpus=corpus, requests=requests)


def _short_documents(workload: CloudWorkload) -> CloudWorkload:
    """Every document cut to its first ``SHORT_DOCUMENT_WORDS`` words (what memory
    layers hand over: a fact a sentence long); first turns then stay under the
    models' minimum cacheable prefix."""
    corpus = {
        doc_id: " ".join(text.split()[:SHORT_DOCUMENT_WORDS])
        for doc_id, text in workload.corpus.items()
    }
    return replace(workload, corpus=corpus)


def _varied_documents(workload: CloudWorkload) -> CloudWorkload:
    """Every document given a length of its own, log-uniform in ``VARIED_DOCUMENT_WORDS``
    (its words repeated or cut; drawn from its id, so a document has one length in
    every request and every run): MTRAG's passages span 60-380 words."""
    corpus = {}
    for doc_id, text in workload.corpus.items():
        rng = np.random.default_rng(zlib.crc32(doc_id.encode("utf-8")))
        words = text.split()
        count = round(log_uniform(rng, VARIED_DOCUMENT_WORDS))
        corpus[doc_id] = " ".join(words[i % len(words)] for i in range(count))
    return replace(workload, corpus=corpus)


ALL = ("multi-turn", "multi-session", "no-overlap")
VARIANTS = (
    Variant(
        "a model with a 4,096-token minimum (`claude-haiku-4-5`)",
        "minimum 4,096",
        ALL,
        ("anthropic",),
        {**DEFAULT_MODELS, "anthropic": "claude-haiku-4-5"},
        _same,
    ),
    Variant(
        f"a long system prompt (the default {LONG_SYSTEM_TIMES} times)",
        "long system prompt",
        ALL,
        ("anthropic", "openai"),
        dict(DEFAULT_MODELS),
        _long_system,
    ),
    Variant(
        f"3 long documents a request (each {LONG_DOCUMENT_TIMES} times as long)",
        "3 long documents",
        ("multi-turn", "multi-session"),
        ("anthropic", "openai"),
        dict(DEFAULT_MODELS),
        _long_documents,
    ),
    Variant(
        f"short documents (each cut to its first {SHORT_DOCUMENT_WORDS} words, a memory)",
        "short documents",
        ALL,
        ("anthropic", "openai"),
        dict(DEFAULT_MODELS),
        _short_documents,
    ),
    Variant(
        "documents of {:.0f}–{:.0f} words, each a length of its own".format(*VARIED_DOCUMENT_WORDS),
        "varied document lengths",
        ALL,
        ("anthropic", "openai"),
        dict(DEFAULT_MODELS),
        _varied_documents,
    ),
    Variant(
        "OpenAI's breakpoints (`gpt-5.6-terra`: cached only at a breakpoint, writes 1.25×;"
        " baseline: the request as it comes, or a system-prompt breakpoint besides OpenAI's"
        " own and a key per user)",
        "gpt-5.6 breakpoints",
        ALL,
        ("openai",),
        {**DEFAULT_MODELS, "openai": "gpt-5.6-terra"},
        _same,
    ),
    Variant(
        'the one-hour lifetime (`"ttl": "1h"` on every breakpoint, baseline and ours)',
        "one-hour lifetime",
        ALL,
        ("anthropic",),
        dict(DEFAULT_MODELS),
        _same,
        ttl="1h",
    ),
)

Job = tuple[int, str, int, float]  # variant index, family, seed, scale
Result = tuple[
    int, str, int, str, str, float, float
]  # ..., provider, model, ratio, tokens a request


def run_job(job: Job) -> list[Result]:
    index, family, seed, scale = job
    variant = VARIANTS[index]
    workload = variant.change(cloud_workload(family, seed, scale))
    runs = run_cloud_workload(workload, variant.providers, variant.models, ttl=variant.ttl)
    return [
        (
            index,
            family,
            seed,
            run.provider,
            run.model,
            run.ratio,
            run.ours.prompt_tokens / run.ours.requests,
        )
        for run in runs
    ]


def _within(family: str, ratio: float) -> bool:
    if family == "no-overlap":
        return 1 / ratio <= NO_OVERLAP_LIMIT
    return ratio >= 1.0


def rows_of(results: Sequence[Result]) -> list[list[str]]:
    groups: dict[tuple[int, str, str], list[Result]] = {}
    for result in results:
        groups.setdefault((result[0], result[1], result[3]), []).append(result)
    rows = []
    for (index, family, provider), group in sorted(groups.items()):
        ratios = [result[5] for result in group]
        tokens = statistics.mean(result[6] for result in group)
        rows.append(
            [
                VARIANTS[index].name,
                family,
                f"{provider} (`{group[0][4]}`)",
                str(len(group)),
                f"{min(ratios):.2f}x / {statistics.median(ratios):.2f}x / {max(ratios):.2f}x",
                f"{tokens:,.0f}",
                "yes" if all(_within(family, ratio) for ratio in ratios) else "**no**",
            ]
        )
    return rows


def plot(results: Sequence[Result], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    rows = rows_of(results)
    short = {variant.name: variant.short for variant in VARIANTS}
    labels = [f"{short[row[0]]}: {row[1]}, {row[2].split(' ')[0]}" for row in rows]
    worst = [float(row[4].split("x")[0]) for row in rows]
    figure, axis = plt.subplots(figsize=(7, 0.32 * len(rows) + 1.2))
    axis.barh(range(len(rows)), worst, color="#4c72b0")
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_yticks(range(len(rows)), labels, fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("baseline / ours, input-token cost, worst seed (> 1: ours cheaper)")
    return save_figure(figure, path)


def markdown(results: Sequence[Result], command: str, scale: float, seconds: float) -> str:
    rows = rows_of(results)
    failing = [row for row in rows if row[-1] != "yes"]
    verdict = (
        "Ours costs no more than the baseline on every workload (no-overlap: within 2%)."
        if not failing
        else f"Ours costs more than the baseline on {len(failing)} of {len(rows)} rows (**no**)."
    )
    lines = [
        "## Hosted prompt caches off the families' shape (`benchmarks/cloud_variants.py`)",
        "",
        provenance(command, 1, "none: seeded workloads on simulated time, deterministic"),
        f"- workloads: the `cloud` section's families, seeds {SEEDS[0]}–{SEEDS[-1]}, at "
        f"{scale:g} of their size, each changed as its row says; baseline and ours as in "
        "the `cloud` section (the cheaper of two unmodified practices; emulated caches)",
        "",
        verdict,
        "",
        *markdown_table(
            [
                "variant",
                "family",
                "provider (model)",
                "seeds",
                "baseline / ours, min / median / max",
                "ours, prompt tokens a request",
                "ours no dearer",
            ],
            rows,
        ),
        "",
        f"Run time {seconds:.0f} s.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.5, help="family size (0.5)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--write", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    jobs = [
        (index, family, seed, args.scale)
        for index, variant in enumerate(VARIANTS)
        for family in variant.families
        for seed in SEEDS
    ]
    started = time.perf_counter()
    results: list[Result] = []
    with Pool(max(1, args.jobs)) as pool:
        for found in track(pool.imap(run_job, jobs), total=len(jobs), description="variants"):
            results += found
    seconds = time.perf_counter() - started
    command = "python benchmarks/cloud_variants.py " + " ".join(argv)
    text = markdown(results, command, args.scale, seconds)
    if args.plot and plot(results, args.plot) and args.write:
        image = args.plot.relative_to(args.write.parent)
        text += f"\n\n![hosted caches off the families' shape]({image})"
    write_or_print(text + "\n", SECTION, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
