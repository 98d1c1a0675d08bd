"""``contextpilot-rag``: a demo of prompt optimization on the embedded default.

Benchmarks are scripts of a source checkout, not commands of the installed package:
``python benchmarks/bench.py`` (docs/benchmarks.md) and ``python benchmarks/route_sim.py``
(routing policies on a trace).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from .batch.progress import rich_step_progress
from .experiment import ExperimentResult, run_multiturn, run_online

__all__ = ["main"]

_COLUMNS = ("arm", "hit ratio", "prompt tokens", "computed tokens", "computed vs unmodified")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="contextpilot-rag",
        description="Reorder, de-duplicate and annotate RAG context for prefix-cache reuse.",
        epilog="Benchmarks run from a source checkout: python benchmarks/bench.py, "
        "python benchmarks/route_sim.py (see docs/benchmarks.md).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="a small end-to-end run on synthetic RAG traffic (offline)"
    )
    demo.add_argument("--requests", type=int, default=400, help="online requests (default 400)")
    demo.add_argument("--seed", type=int, default=0)
    return parser


def _experiment_table(result: ExperimentResult) -> Table:
    table = Table(title=f"{result.name} (cache capacity {result.capacity_tokens:,} tokens)")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "arm" else "right")
    base = result.arm("unmodified").computed_tokens
    for arm in result.arms:
        table.add_row(
            arm.name,
            f"{arm.hit_ratio:.1%}",
            f"{arm.prompt_tokens:,}",
            f"{arm.computed_tokens:,}",
            f"{arm.computed_tokens / base:.1%}",
        )
    return table


def _demo(args: argparse.Namespace, console: Console) -> int:
    if args.requests < 10:
        console.print("[red]--requests must be at least 10[/red]")
        return 2
    console.print(
        "Replaying synthetic RAG traffic (15 documents per request, Zipf-like popularity) "
        "through a vLLM-style prefix cache sized at 25% of what the unmodified prompts "
        "would need.\n"
    )
    with rich_step_progress() as progress:
        online = run_online(
            n_docs=args.requests, n_requests=args.requests, seed=args.seed, progress=progress
        )
        multiturn = run_multiturn(
            n_sessions=max(4, args.requests // 10),
            turns=4,
            interleave=8,
            n_docs=max(args.requests, 100),  # each session needs ~45 distinct docs
            seed=args.seed,
            progress=progress,
        )
    console.print(_experiment_table(online))
    console.print(_experiment_table(multiturn))
    console.print(
        "hit ratio = prompt tokens served from cache; computed = prompt tokens the engine "
        "must prefill. Full benchmark (source checkout): `python benchmarks/bench.py`, "
        "results in docs/benchmarks.md."
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``contextpilot-rag`` command."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return _demo(args, Console())


if __name__ == "__main__":
    raise SystemExit(main())
