"""The real-engine suite (``contextpilot-rag bench --suite engine``), written into docs.

    python benchmarks/engine.py --write docs/benchmarks.md --plot docs/img/engine_suite.png
    python benchmarks/engine.py --engine llama-server ...        # llama.cpp instead of vLLM
                                                       # (section engine-suite-llama-server)
    python benchmarks/engine.py --endpoint URL --model NAME ...  # any running server

Installs the engine on first use (``contextpilot_rag.engines``), starts it on
loopback, runs online, batch, multi-turn and the LangChain and LlamaIndex paths (each
arm from an empty cache, requests one at a time), stops it, and writes the
``engine-suite`` section
(``engine-suite-llama-server`` with ``--engine llama-server``,
``engine-suite-endpoint`` with ``--endpoint``; ``--section`` names another):
per arm mean/p95 TTFT, prefill time, the engine's cached and computed tokens, the
simulated prediction for the same token ids, and the issue's targets. One run: the
ratios compare arms measured back to back on one engine; each timed arm is sent
``--repeats`` times (default 3) and its median pass reported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lib.sections import provenance, write_section
from rich.console import Console

from contextpilot_rag.batch.progress import rich_step_progress
from contextpilot_rag.bench.commands import add_engine_arguments, engine_session
from contextpilot_rag.bench.engine_report import (
    SUITE_WORKLOADS,
    markdown,
    plot,
    rich_tables,
    run_suite,
    write_json,
)
from contextpilot_rag.bench.engine_suite import check_repeats

SECTION = "engine-suite"
REPEATS = 3


def section_name(args: argparse.Namespace) -> str:
    """``--section``, else the section of the engine the run used."""
    if args.section:
        return str(args.section)
    if args.endpoint:
        return f"{SECTION}-endpoint"
    return SECTION if args.engine == "vllm" else f"{SECTION}-{args.engine}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(parser, suite_kv_cache=True)
    parser.add_argument("--workloads", default=",".join(SUITE_WORKLOADS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, help="docs file to write the section into")
    parser.add_argument("--plot", type=Path, help="PNG of the results")
    parser.add_argument("--json", type=Path, help="raw results as JSON")
    parser.add_argument("--section", help="generated section to write (default: by engine)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help=f"passes per arm, the median reported (default {REPEATS})",
    )
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    console = Console()
    workloads = [w for w in args.workloads.split(",") if w]
    with engine_session(args, console) as engine, rich_step_progress() as progress:
        result = run_suite(
            engine,
            workloads,
            seed=args.seed,
            on_arm=lambda name, n: progress(name, n),
            on_workload=(lambda so_far: write_json(so_far, args.json)) if args.json else None,
            repeats=args.repeats,
        )
    for table in rich_tables(result):
        console.print(table)
    if args.json:
        write_json(result, args.json)
    plotted = bool(args.plot) and plot(result, args.plot)
    if args.write:
        command = "python benchmarks/engine.py " + " ".join(sys.argv[1:] if argv is None else argv)
        body = provenance(
            command.strip(),
            args.repeats,
            "ratios within the run; each pass sends every arm once (on vLLM the arms "
            "interleaved request by request, each under its own cache_salt on one reset "
            "cache), the arms in reverse order on every other pass; per arm the pass of "
            "median prefill time is shown (every pass's range beside it), and a speed-up "
            "is the median of the passes' ratios; the framework paths (langchain, "
            "llamaindex, and the direct pilot arm beside them) run one pass",
        )
        if plotted:
            body += f"\n\n![real-engine suite]({args.plot.relative_to(args.write.parent)})"
        section = section_name(args)
        write_section(args.write, section, body + "\n\n" + markdown(result))
        console.print(f"wrote section {section} of {args.write}")
    if args.json:
        console.print(json.dumps({"json": str(args.json)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
