"""``contextpilot-rag``: a demo on the embedded default and the benchmark suite."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    pass

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="contextpilot-rag",
        description="Reorder, de-duplicate and annotate RAG context for prefix-cache reuse.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="a small end-to-end run on synthetic RAG traffic (offline, ~20 s)"
    )
    demo.add_argument("--requests", type=int, default=400, help="online requests (default 400)")
    demo.add_argument("--seed", type=int, default=0)
    bench = commands.add_parser("bench", help="the full benchmark behind docs/benchmarks.md")
    bench.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    bench.add_argument("--no-reference", action="store_true", help="skip the reference arm")
    bench.add_argument("--latency-requests", type=int, default=100_000)
    bench.add_argument("--write", type=Path, help="write the markdown report to this file")
    bench.add_argument("--plot", type=Path, help="write a hit-ratio chart (PNG) to this file")
    bench.add_argument(
        "--batch-sizes",
        type=lambda text: [int(part) for part in text.split(",") if part],
        default=[2000, 12_000, 100_000],
        help="batch-mode sizes, comma separated (default 2000,12000,100000; '' for none)",
    )
    bench.add_argument(
        "--reference-timeout",
        type=float,
        default=300.0,
        help="seconds the reference batch mode may take per size (default 300)",
    )
    bench.add_argument(
        "--reference-max-requests",
        type=int,
        default=2000,
        help="run the reference batch mode only up to this size (its build is quadratic: "
        "4,000 requests take ~3 min on 2 cores, 12,000 do not finish in 10 min)",
    )
    bench.add_argument("--seed", type=int, default=0)
    _add_route_sim(commands)
    return parser


KEPT_SECTIONS_MARKER = "<!-- sections below are written by other benchmarks and kept -->"


def _add_route_sim(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    route = commands.add_parser(
        "route-sim",
        help="compare routing policies on a trace in the fleet simulator",
    )
    route.add_argument("--trace", type=Path, required=True, help="Mooncake-format .jsonl trace")
    route.add_argument(
        "--policies",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=None,
        help="comma-separated policy names (default: every registered policy installed here)",
    )
    route.add_argument("--regions", type=int, default=3)
    route.add_argument("--replicas-per-region", type=int, default=1)
    route.add_argument("--tune-fraction", type=float, default=0.5)
    route.add_argument("--seed", type=int, default=0)
    route.add_argument("--json", action="store_true", help="print the results as JSON only")
    route.add_argument("--plot", type=Path, help="write a p95 TTFT / E2E bar chart (PNG)")


def _demo(args: argparse.Namespace, console: Console) -> int:
    from .bench.report import experiment_table, progress_bars
    from .bench.suite import run_multiturn, run_online

    if args.requests < 10:
        console.print("[red]--requests must be at least 10[/red]")
        return 2
    console.print(
        "Replaying synthetic RAG traffic (15 documents per request, Zipf-like popularity) "
        "through a vLLM-style prefix cache sized at 25% of what the unmodified prompts "
        "would need.\n"
    )
    with progress_bars() as progress:
        online = run_online(
            n_docs=args.requests,
            n_requests=args.requests,
            seed=args.seed,
            with_reference=False,
            progress=progress,
        )
        sessions = max(4, args.requests // 10)
        multiturn = run_multiturn(
            n_sessions=sessions,
            turns=4,
            interleave=8,
            n_docs=max(args.requests, 100),  # each session needs ~45 distinct docs
            seed=args.seed,
            progress=progress,
        )
    console.print(experiment_table(online))
    console.print(experiment_table(multiturn))
    console.print(
        "hit ratio = prompt tokens served from cache; computed = prompt tokens the engine "
        "must prefill. Full benchmark: `contextpilot-rag bench` (see docs/benchmarks.md)."
    )
    return 0


def _bench(args: argparse.Namespace, console: Console) -> int:
    from .bench.batch import run_batch
    from .bench.document import benchmark_markdown
    from .bench.report import (
        batch_table,
        experiment_table,
        latency_table,
        plot_hit_ratios,
        progress_bars,
    )
    from .bench.suite import run_latency, run_multiturn, run_online

    scale = 4 if args.quick else 1
    with progress_bars() as progress:
        online = run_online(
            n_docs=2000 // scale,
            n_requests=2000 // scale,
            seed=args.seed,
            with_reference=not args.no_reference,
            progress=progress,
        )
        multiturn, multiturn_uncached = (
            run_multiturn(
                n_sessions=200 // scale,
                n_docs=2000 // scale,
                seed=args.seed,
                cache_answers=cache_answers,
                progress=progress,
            )
            for cache_answers in (True, False)
        )
        latency = run_latency(
            n_requests=args.latency_requests // scale,
            reference_requests=0 if args.no_reference else 2000 // scale,
            progress=progress,
        )
        batches = [
            run_batch(
                size // scale,
                seed=args.seed,
                reference_timeout_s=(
                    None
                    if args.no_reference or size > args.reference_max_requests
                    else args.reference_timeout
                ),
                progress=progress,
            )
            for size in args.batch_sizes
        ]
    for result in (online, multiturn, multiturn_uncached):
        console.print(experiment_table(result))
    console.print(latency_table(latency))
    for batch in batches:
        console.print(batch_table(batch))
    plotted = bool(args.plot) and plot_hit_ratios([online, multiturn], args.plot)
    if args.write:
        image = None
        if plotted:  # link the chart relative to the report
            image = Path(os.path.relpath(args.plot.resolve(), args.write.resolve().parent))
        command = "contextpilot-rag " + " ".join(args.argv)
        report = benchmark_markdown(
            command, online, multiturn, multiturn_uncached, latency, batches, image
        )
        args.write.parent.mkdir(parents=True, exist_ok=True)
        if args.write.exists():  # sections other benchmarks wrote (routing) are kept
            old = args.write.read_text(encoding="utf-8")
            if KEPT_SECTIONS_MARKER in old:
                report = report.rstrip("\n") + "\n\n" + old[old.index(KEPT_SECTIONS_MARKER) :]
        args.write.write_text(report, encoding="utf-8")
        console.print(f"wrote {args.write}")
    return 0


def _route_sim(args: argparse.Namespace, console: Console) -> int:
    from .bench.routing import route_sim_progress, route_sim_table, run_route_sim
    from .errors import ConfigError

    errors = Console(stderr=True)  # stdout carries only the table or the JSON
    try:
        with route_sim_progress(errors) as progress:
            rows = run_route_sim(
                args.trace,
                policies=args.policies,
                regions=args.regions,
                replicas_per_region=args.replicas_per_region,
                tune_fraction=args.tune_fraction,
                seed=args.seed,
                progress=progress,
            )
    except (ConfigError, OSError) as exc:
        errors.print(f"[red]route-sim: {exc}[/red]")
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        title = (
            f"{args.trace.name}: {args.regions} regions x {args.replicas_per_region} "
            f"replicas, held-out {1 - args.tune_fraction:.0%} of the trace"
        )
        console.print(route_sim_table(rows, title))
    if args.plot:
        _plot_route_sim(rows, args.plot, errors)
    return 0


def _plot_route_sim(rows: list[dict[str, Any]], path: Path, errors: Console) -> None:
    from .bench.routing import plot_route_sim

    if plot_route_sim(rows, path):
        errors.print(f"wrote {path}")
    else:
        errors.print("[yellow]matplotlib is not installed; no plot written[/yellow]")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``contextpilot-rag`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    if args.command == "demo":
        return _demo(args, console)
    if args.command == "route-sim":
        return _route_sim(args, console)
    return _bench(args, console)


if __name__ == "__main__":
    raise SystemExit(main())
