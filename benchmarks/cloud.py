"""Hosted prompt caches: input-token cost, unmodified vs contextpilot_rag, written into docs.

    python benchmarks/cloud.py --write docs/benchmarks.md --plot docs/img/cloud.png
    python benchmarks/cloud.py --provider anthropic --scale 0.2      # a quick look

The suite of ``contextpilot-rag bench --suite cloud`` (issue 25): multi-turn,
multi-session and no-overlap workloads (several seeds each) replayed on a simulated
clock through the emulated Anthropic and OpenAI prompt caches
(``contextpilot_rag.sim.provider_cache``, the providers' published rules), each request
billed at a dated list price. Arms: the unmodified requests with the cheaper of two
common caching practices, and the pilot's prompts. Writes the ``cloud`` section: the
price assumptions, min/median/max of baseline cost / ours per family and provider
against the targets, and every workload's tokens read and written. Deterministic
(seeded workloads, simulated time): one run. Emulated, not measured on the providers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lib.sections import provenance, write_section
from rich.console import Console

from contextpilot_rag.batch.progress import rich_step_progress
from contextpilot_rag.bench.cloud_report import markdown, plot, rich_tables, write_json
from contextpilot_rag.bench.cloud_suite import PROVIDERS, run_cloud_suite

SECTION = "cloud"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=[*PROVIDERS, "both"], default="both")
    parser.add_argument("--scale", type=float, default=1.0, help="workload size (default 1)")
    parser.add_argument("--write", type=Path, help="docs file to write the section into")
    parser.add_argument("--plot", type=Path, help="PNG of the ratios")
    parser.add_argument("--json", type=Path, help="raw results as JSON")
    args = parser.parse_args(argv)
    console = Console()
    providers = PROVIDERS if args.provider == "both" else (args.provider,)
    with rich_step_progress() as progress:
        result = run_cloud_suite(
            providers, scale=args.scale, progress=lambda name, n: progress(name, n)
        )
    for table in rich_tables(result):
        console.print(table)
    if args.json:
        write_json(result, args.json)
    plotted = bool(args.plot) and plot(result, args.plot)
    if args.write:
        command = "python benchmarks/cloud.py " + " ".join(sys.argv[1:] if argv is None else argv)
        body = provenance(
            command.strip(), 1, "none: seeded workloads on simulated time, deterministic"
        )
        body = "## Hosted prompt caches: input-token cost (`benchmarks/cloud.py`)\n\n" + body
        if plotted:
            body += f"\n\n![hosted prompt caches]({args.plot.relative_to(args.write.parent)})"
        write_section(args.write, SECTION, body + "\n\n" + markdown(result))
        console.print(f"wrote section {SECTION} of {args.write}")
    console.print(f"run time {result.elapsed_s:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
