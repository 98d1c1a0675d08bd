"""Compare routing policies on a trace in the fleet simulator.

    python benchmarks/route_sim.py --trace ../shared/data/mooncake/synthetic_trace.jsonl \\
        [--regions 3] [--replicas-per-region 1] [--tune-fraction 0.5] [--json] [--plot out.png]

A Mooncake-format trace is replayed once per policy (tunable policies learn on the
first part and are frozen; each policy is evaluated on the held-out rest with a fresh
fleet); an SCBench-style KV-lookup trace selects the TTCA experiment. The protocol is
in ``lib/route_sim.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from lib.report import progress_bars
from lib.route_sim import plot_route_sim, route_sim_table, run_route_sim
from rich.console import Console

from contextpilot_rag.errors import ConfigError


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="Mooncake-format .jsonl trace")
    parser.add_argument(
        "--policies",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=None,
        help="comma-separated policy names (default: every registered policy installed here)",
    )
    parser.add_argument("--regions", type=int, default=3)
    parser.add_argument("--replicas-per-region", type=int, default=1)
    parser.add_argument("--tune-fraction", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("--plot", type=Path, help="write a p95 TTFT / E2E bar chart (PNG)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    errors = Console(stderr=True)  # stdout carries only the table or the JSON
    try:
        with progress_bars() as progress:
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
        Console().print(route_sim_table(rows, title))
    if args.plot:
        if plot_route_sim(rows, args.plot):
            errors.print(f"wrote {args.plot}")
        else:
            errors.print("[yellow]matplotlib is not installed; no plot written[/yellow]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
