"""What planning for hosted prompt caches adds to ``ContextPilot.optimize``.

    python benchmarks/cloud_overhead.py --write docs/benchmarks.md

The same requests through two pilots, one with ``PilotConfig.cloud`` off (the
default) and one with it on (Anthropic rules: breakpoint plan and ``prompt_cache_key``
for every prompt). Workloads: the synthetic online stream (single-turn requests, 15
documents each) and the multi-turn workload (sessions of five turns, answers recorded)
of ``contextpilot_rag.bench.workloads``. Each run times every ``optimize`` call of both
pilots, the sides alternating, ``--runs`` times; the figure is the median per call and
the ratio of the medians within a run. Writes the ``cloud-overhead`` generated section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lib.sections import markdown_table, provenance, spread, write_or_print

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
from contextpilot_rag.bench.workloads import Workload, multiturn_workload, online_workload
from contextpilot_rag.cloud import CloudCacheConfig

SIDES = {"off (default)": False, "on": True}


def median_ms(workload: Workload, planned: bool, requests: int) -> float:
    """Median milliseconds of one ``optimize`` call over the first ``requests``."""
    pilot = ContextPilot(PilotConfig(cloud=CloudCacheConfig(enabled=planned)))
    blocks = {doc_id: ContextBlock(text, id=doc_id) for doc_id, text in workload.corpus.items()}
    timings = []
    for request in workload.requests[:requests]:
        documents = [blocks[doc_id] for doc_id in request.doc_ids]
        start = time.perf_counter_ns()
        pilot.optimize(
            documents, request.query, system=workload.system_prompt, conversation_id=request.session
        )
        timings.append((time.perf_counter_ns() - start) / 1e6)
        if request.session is not None:
            pilot.record_answer(request.session, "An answer from the documents.")
    return statistics.median(timings)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    workloads = {"online": online_workload(seed=1), "multi-turn": multiturn_workload(seed=1)}
    rows = []
    for name, workload in workloads.items():
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(max(1, args.runs)):  # alternate, so drift hits both sides alike
            for side, planned in SIDES.items():
                times[side].append(median_ms(workload, planned, args.requests))
        ratios = [on / off for on, off in zip(times["on"], times["off (default)"], strict=True)]
        rows.append(
            [
                name,
                spread(times["off (default)"], ".3f"),
                spread(times["on"], ".3f"),
                spread(ratios, ".2f", "x"),
            ]
        )
        print(f"{name}: done", file=sys.stderr)
    out = [
        "## Cache planning for hosted APIs: cost per `optimize` call"
        " (`benchmarks/cloud_overhead.py`)",
        "",
        provenance(
            "python benchmarks/cloud_overhead.py " + " ".join(argv),
            max(1, args.runs),
            "median of the per-run medians with min–max; the sides alternate within a run",
        ),
        "",
        f"First {args.requests:,} requests of each workload; milliseconds per call.",
        "",
        *markdown_table(
            ["workload", "planning off ms", "planning on ms", "on / off (within a run)"], rows
        ),
    ]
    write_or_print("\n".join(out) + "\n", "cloud-overhead", args.write)


if __name__ == "__main__":
    main()
