"""The main benchmark: hit ratio (online, multi-turn), optimize() latency, batch mode.

    python benchmarks/bench.py --write docs/benchmarks.md --plot docs/img/hit_ratio.png

``make bench`` installs the reference implementation first, to include its arms.
Writes the ``bench`` generated section of ``--write`` (see ``lib/sections.py``) and
leaves the rest of the file; prints the markdown when ``--write`` is not given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from lib.batch import run_batch
from lib.document import SECTION, benchmark_markdown
from lib.report import plot_hit_ratios, progress_bars
from lib.sections import write_section
from lib.suite import reference_arms, run_latency
from rich.console import Console

from contextpilot_rag.experiment import run_multiturn, run_online


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference arms")
    parser.add_argument("--latency-requests", type=int, default=100_000)
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="timed runs of the latency stream and of each planner (default 3)",
    )
    parser.add_argument("--write", type=Path, help="write the markdown section into this file")
    parser.add_argument("--plot", type=Path, help="write a hit-ratio chart (PNG) to this file")
    parser.add_argument(
        "--batch-sizes",
        type=lambda text: [int(part) for part in text.split(",") if part],
        default=[2000, 12_000, 100_000],
        help="batch-mode sizes, comma separated (default 2000,12000,100000; '' for none)",
    )
    parser.add_argument(
        "--reference-timeout",
        type=float,
        default=300.0,
        help="seconds the reference batch mode may take per size (default 300)",
    )
    parser.add_argument(
        "--reference-max-requests",
        type=int,
        default=2000,
        help="run the reference batch mode only up to this size (its build is quadratic)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    scale = 4 if args.quick else 1
    with progress_bars() as progress:
        online = run_online(
            n_docs=2000 // scale,
            n_requests=2000 // scale,
            seed=args.seed,
            progress=progress,
            extra_arms=None if args.no_reference else reference_arms,
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
            runs=args.runs,
            reference_requests=0 if args.no_reference else 2000 // scale,
            progress=progress,
        )
        batches = [
            run_batch(
                size // scale,
                seed=args.seed,
                runs=args.runs,
                reference_timeout_s=(
                    None
                    if args.no_reference or size > args.reference_max_requests
                    else args.reference_timeout
                ),
                progress=progress,
            )
            for size in args.batch_sizes
        ]
    plotted = bool(args.plot) and plot_hit_ratios([online, multiturn], args.plot)
    image = None
    if plotted and args.write:  # link the chart relative to the report
        image = Path(os.path.relpath(args.plot.resolve(), args.write.resolve().parent))
    command = "python benchmarks/bench.py " + " ".join(argv)
    report = benchmark_markdown(
        command.strip(), online, multiturn, multiturn_uncached, latency, batches, image
    )
    if args.write:
        write_section(args.write, SECTION, report)
        Console(stderr=True).print(f"wrote {args.write}")
    else:
        print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
