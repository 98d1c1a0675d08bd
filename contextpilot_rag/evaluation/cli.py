"""``contextpilot-rag eval``: the arguments and the command (docs/eval.md)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from ..bench.commands import check_output_paths
from ..errors import ConfigError, ContextPilotError
from .arms import ARM_NAMES, DEFAULT_ARMS
from .client import Endpoint, probe
from .report import EvalSummary, markdown, plot, rich_tables, summarize, to_json, write_json
from .run import EvalRun, EvalSettings, run_evaluation
from .stats import check_options
from .tasks import CONTEXTS, MTRAG, EvalTask, load_tasks

__all__ = ["EXIT_CODES", "add_eval_parser", "run_eval_command"]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_RETENTION_LOST = 3
EXIT_DROP = 4
EXIT_FAILED_REQUESTS = 5
EXIT_UNREACHABLE = 6

EXIT_CODES = {
    EXIT_OK: "every prompt retained its evidence, every request was answered, no significant drop",
    EXIT_USAGE: "bad arguments or task file (every invalid line is listed), an output that "
    "cannot be written, or rouge-score missing",
    EXIT_RETENTION_LOST: "an arm that claims evidence retention lost a block (listed)",
    EXIT_DROP: "an arm scored significantly below unmodified on a metric (DROP in the table)",
    EXIT_FAILED_REQUESTS: "requests failed after retries (listed; they score nothing)",
    EXIT_UNREACHABLE: "the endpoint could not be reached",
}
"""Exit status → meaning. When several apply, the first of 3, 5, 4 is returned."""

_LISTED = 10  # lost blocks and failed requests printed; the JSON has all


def _epilog() -> str:
    codes = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items())
    return (
        "exit status:\n" + codes + "\n  (several apply: 3 before 5 before 4)\n\n"
        "docs/eval.md explains the arms, the metrics and how to read the drop flag."
    )


def add_eval_parser(commands: Any) -> None:
    """Add ``eval`` to a subparsers object."""
    parser = commands.add_parser(
        "eval",
        help="answer quality of the pilot's arms vs unmodified prompts on an endpoint",
        description="Send the same tasks unmodified, reordered, reordered+notes and\n"
        "reordered+dedup+notes to an OpenAI-compatible endpoint; score token F1, ROUGE-L,\n"
        "answerability and citation validity; compare each arm with unmodified (paired\n"
        "cluster bootstrap); check that every prompt retains every retrieved block.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--tasks",
        required=True,
        metavar="mtrag|PATH.jsonl",
        help=f"'{MTRAG}' (the bundled MTRAG human subset) or a JSONL task file",
    )
    add("--endpoint", required=True, metavar="URL", help="the server's OpenAI /v1 root")
    add("--model", required=True, metavar="NAME", help="the served model name")
    add(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help=f"comma-separated, of {','.join(ARM_NAMES)} (default: all but the last; "
        "unmodified always runs)",
    )
    add(
        "--contexts",
        choices=CONTEXTS,
        help="MTRAG's documents: bm25 (default: the top-k of BM25 over its 350 passages) or "
        "reference (the passages its annotators answered from)",
    )
    add("--top-k", type=int, help="with --contexts bm25: documents per turn (default 3)")
    add("--limit", type=int, metavar="N", help="only the first N tasks (whole conversations first)")
    add("--max-tokens", type=int, default=128, help="tokens to generate per answer (default 128)")
    add("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    add(
        "--max-history-turns",
        type=int,
        help="history window: the last N turns with documents (default: whole conversations)",
    )
    add("--retries", type=int, default=3, help="retries of a transient failure (default 3)")
    add("--timeout-s", type=float, default=600.0, help="per-attempt timeout (default 600)")
    add("--api-key", help="bearer token (default: $OPENAI_API_KEY, if set)")
    add("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    add("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    add(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="T",
        help="flag a drop only when the whole interval lies below -T (default 0)",
    )
    add(
        "--out",
        type=Path,
        metavar="results.json",
        help="write the results (every answer and score) as JSON here",
    )
    add("--plot", type=Path, metavar="eval.png", help="write a PNG of the per-arm means here")
    add("--write", type=Path, metavar="FILE.md", help="write a generated section into this doc")
    add("--section", help="name of that section (default eval-<tasks>)")


def _settings(args: argparse.Namespace) -> EvalSettings:
    arms = tuple(name.strip() for name in str(args.arms).split(",") if name.strip())
    return EvalSettings(
        arms=arms,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        retries=args.retries,
        max_history_turns=args.max_history_turns,
    )


def _check_rouge() -> None:
    from .metrics import rouge_l

    rouge_l("a", ["a"])


def _prepare(args: argparse.Namespace) -> tuple[EvalSettings, tuple[EvalTask, ...], Endpoint]:
    """Everything checked before the first request (raises ``ContextPilotError``)."""
    settings = _settings(args)
    tasks = load_tasks(args.tasks, contexts=args.contexts, top_k=args.top_k, limit=args.limit)
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    endpoint = Endpoint(args.endpoint, args.model, api_key, args.timeout_s)
    check_options(args.resamples, tolerance=args.tolerance)
    _check_outputs(args)
    _check_rouge()
    return settings, tasks, endpoint


def _check_outputs(args: argparse.Namespace) -> None:
    """``--out``, ``--plot`` and ``--write`` can be written once the run is done."""
    check_output_paths(args.out, args.plot, args.write)
    if args.write is None:
        return
    name = _section_name(args)
    if not re.fullmatch(r"[\w.-]+", name):
        raise ConfigError(f"--section: letters, digits, '.', '_' and '-' only; got {name!r}")
    if args.write.exists():
        try:
            args.write.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--write {str(args.write)!r} cannot be read: {exc}") from None


def run_eval_command(
    args: argparse.Namespace, console: Console, argv: Sequence[str] | None = None
) -> int:
    """Run ``eval``; ``argv`` (the command's arguments) is recorded in ``--write``."""
    from ..batch.progress import rich_step_progress

    try:
        settings, tasks, endpoint = _prepare(args)
    except ContextPilotError as exc:  # TaskFileError lists every bad line
        _error(console, str(exc))
        return EXIT_USAGE
    unreachable = probe(endpoint)
    if unreachable is not None:
        _error(console, f"cannot reach {endpoint.base_url}: {unreachable}")
        return EXIT_UNREACHABLE
    console.print(
        f"{len(tasks)} tasks × {len(settings.arms)} arms → {endpoint.model} at "
        f"{endpoint.base_url}, {settings.concurrency} in flight"
    )
    try:
        with rich_step_progress() as progress:
            run = run_evaluation(tasks, endpoint, settings, progress=progress)
    except ContextPilotError as exc:
        _error(console, str(exc))
        return EXIT_USAGE
    summary = summarize(run, resamples=args.resamples, seed=args.seed, tolerance=args.tolerance)
    _report(run, summary, args, console, argv)
    return _exit_status(summary, console)


def _report(
    run: EvalRun,
    summary: EvalSummary,
    args: argparse.Namespace,
    console: Console,
    argv: Sequence[str] | None,
) -> None:
    title = f"{args.model} on {args.tasks}"
    for table in rich_tables(summary, title):
        console.print(table)
    if args.out:
        write_json(to_json(run, summary, _meta(run, args, argv)), args.out)
        console.print(f"results: {args.out}")
    if args.plot and plot(summary, args.plot, title):
        console.print(f"plot: {args.plot}")
    elif args.plot:
        _error(console, "no plot: matplotlib is missing (pip install 'contextpilot-rag[eval]')")
    if args.write:
        _write_section(run, summary, args, argv)
        console.print(f"section {_section_name(args)!r} written into {args.write}")


def _meta(run: EvalRun, args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    return {
        "command": _command(argv),
        "endpoint": args.endpoint,
        "model": args.model,
        "tasks": args.tasks,
        "contexts": _contexts(args),
        "task_count": len(run.tasks),
    }


def _command(argv: Sequence[str] | None) -> str:
    """The command line, any ``--api-key`` value masked."""
    words = list(argv or [])
    for index, word in enumerate(words):
        if word == "--api-key" and index + 1 < len(words):
            words[index + 1] = "***"
        elif word.startswith("--api-key="):
            words[index] = "--api-key=***"
    return "contextpilot-rag " + shlex.join(words)


def _contexts(args: argparse.Namespace) -> str:
    if args.tasks != MTRAG:
        return "the task file's"
    if args.contexts == "reference":
        return "MTRAG reference passages"
    return f"BM25 top-{args.top_k or 3} of the 350 MTRAG passages"


def _section_name(args: argparse.Namespace) -> str:
    if args.section:
        return str(args.section)
    stem = MTRAG if args.tasks == MTRAG else Path(args.tasks).stem
    return "eval-" + (re.sub(r"[^\w.-]+", "-", stem).strip("-") or "tasks")


def _write_section(
    run: EvalRun, summary: EvalSummary, args: argparse.Namespace, argv: Sequence[str] | None
) -> None:
    from ..bench.sections import provenance, write_section

    settings = run.settings
    window = settings.max_history_turns or "whole conversations"
    facts = (
        f"Model `{args.model}`; tasks `{args.tasks}` ({len(run.tasks)}), documents: "
        f"{_contexts(args)}; "
        f"max tokens {settings.max_tokens}; history window: {window}; "
        f"wall time {run.seconds:.0f} s; intervals: {summary.confidence:.0%}, "
        f"{summary.resamples} cluster-bootstrap resamples, seed {summary.seed}; "
        f"drop tolerance {summary.tolerance:g}."
    )
    body = provenance(_command(argv), 1, "one run; greedy decoding, intervals from the bootstrap")
    write_section(args.write, _section_name(args), body + "\n\n" + markdown(summary, facts))


def _error(console: Console, text: str, style: str = "red") -> None:
    """``text`` as it is (no markup: messages hold ``[...]``), long lines unbroken."""
    console.print(Text(text, style=style), soft_wrap=True)


def _exit_status(summary: EvalSummary, console: Console) -> int:
    if summary.retention_lost:
        for arm in summary.arms:
            for task_id, block_id in arm.lost[:_LISTED]:
                _error(console, f"{arm.name}: {task_id} lost block {block_id}")
        _error(console, "evidence lost: an arm dropped a retrieved block", "bold red")
        return EXIT_RETENTION_LOST
    if summary.failed_requests:
        for arm in summary.arms:
            for task_id, error in arm.errors[:_LISTED]:
                _error(console, f"{arm.name}: {task_id}: {error}")
        _error(console, f"{summary.failed_requests} requests failed", "bold red")
        return EXIT_FAILED_REQUESTS
    if summary.drops:
        drops = ", ".join(f"{arm} {metric}" for arm, metric in summary.drops)
        _error(console, f"significant drop vs unmodified: {drops}", "bold red")
        return EXIT_DROP
    return EXIT_OK
