"""``contextpilot-rag``: the demo (on a real engine by default, ``--engine sim`` for the
instant simulated run), the real-engine benchmark (``bench --suite engine``) and the
engines the project runs (``engine install|start|stop|status``) and the
OpenAI-compatible proxy (``serve``, docs/serve.md) and the answer-quality check of the
pilot's arms on an endpoint (``eval``, docs/eval.md).

The simulated benchmarks are scripts of a source checkout: ``python benchmarks/bench.py``
(docs/benchmarks.md) and ``python benchmarks/route_sim.py`` (routing policies on a trace).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TextIO

import httpx
from rich.console import Console
from rich.table import Table

from . import __version__
from .batch.progress import rich_step_progress
from .bench.commands import add_bench_parser, add_engine_arguments, run_bench, run_demo
from .engines.cli import add_engine_parser, run_engine_command
from .engines.errors import EngineError
from .errors import (
    ConfigError,
    ContextPilotError,
    ProviderError,
)
from .evaluation.cli import add_eval_parser, run_eval_command
from .experiment import ExperimentResult, run_multiturn, run_online
from .jsonl import process_lines
from .pilot import ContextPilot, PilotConfig, pilot_on_store
from .serve.cli import add_serve_parser, run_serve
from .stores.url import redacted
from .tenants import SALT_KEY_ENV, TenantConfig

__all__ = ["main"]

_COLUMNS = ("arm", "hit ratio", "prompt tokens", "computed tokens", "computed vs unmodified")
_DEMO_DOCS_PER_REQUEST = 15
EXIT_BROKEN_PIPE = 141
"""``optimize`` when its reader went away (``| head``): 128 + SIGPIPE, as a shell
reports a Unix tool the signal ended."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="contextpilot-rag",
        description="Reorder, de-duplicate and annotate RAG context for prefix-cache reuse.",
        epilog="Benchmarks run from a source checkout: python benchmarks/bench.py, "
        "python benchmarks/route_sim.py (see docs/benchmarks.md).",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="unmodified vs contextpilot_rag on a real engine (installed on first use); "
        "--engine sim: the instant simulated run",
        epilog="exit codes: 0 done; 1 the engine failed or cannot be reached, or LangChain "
        "is missing (real engine); 2 bad arguments (--requests below 10, a negative --seed, "
        "--endpoint without --model, a --plot that cannot be written)",
    )
    add_engine_arguments(demo, sim=True)
    demo.add_argument(
        "--requests", type=int, default=400, help="--engine sim: online requests (default 400)"
    )
    demo.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    demo.add_argument(
        "--plot",
        default="out/demo.png",
        help="real engine: where to write the PNG (default out/demo.png)",
    )
    add_bench_parser(commands)
    add_engine_parser(commands)
    add_serve_parser(commands)
    add_eval_parser(commands)
    optimize = commands.add_parser(
        "optimize",
        help="the pilot over JSON Lines: requests (documents + question) in, prompts out",
        description="Read one request or answer per line (JSON), write one result per "
        "line: the prompt's messages, or the error of a line that could not be used. "
        "Formats: docs/cli.md.",
        epilog="exit codes: 0 every line used; 1 some line could not be used (its error is "
        "its output line and on stderr); 2 bad arguments (an input that cannot be read, an "
        "output that cannot be written or is the input) or a store that cannot be opened "
        "or does not answer; 141 the output's reader went away (e.g. | head)",
    )
    optimize.add_argument(
        "-i", "--input", default="-", help="JSON Lines to read (default -: standard input)"
    )
    optimize.add_argument(
        "-o", "--output", default="-", help="where to write (default -: standard output)"
    )
    optimize.add_argument(
        "--store",
        help="a shared store for conversations and the index (redis://… or sqlite:///…; "
        "default: this process's memory)",
    )
    optimize.add_argument(
        "--stop-on-error",
        action="store_true",
        help="stop at the first line that cannot be used (the lines before it are written)",
    )
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
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    console.print(
        "Replaying synthetic RAG traffic (15 documents per request, Zipf-like popularity) "
        "through a vLLM-style prefix cache sized at 25% of what the unmodified prompts "
        "would need.\n"
    )
    with rich_step_progress() as progress:
        online = run_online(
            n_docs=max(args.requests, _DEMO_DOCS_PER_REQUEST),  # a request draws k distinct ones
            n_requests=args.requests,
            k=_DEMO_DOCS_PER_REQUEST,
            seed=args.seed,
            progress=progress,
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


def _optimize(args: argparse.Namespace) -> int:
    """``optimize``: 2 before the first line when the store or a file cannot be used."""
    try:
        pilot = _optimize_pilot(args.store)
        with contextlib.ExitStack() as files:
            source = _optimize_input(args.input, files)
            sink = _optimize_output(args.output, source, files)
            failed = _write_results(pilot, source, sink, stop_on_error=args.stop_on_error)
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except _OutputFailed as failed_write:  # a full disk: the output is truncated
        print(f"contextpilot-rag optimize: {failed_write}", file=sys.stderr)
        return 2
    except ContextPilotError as exc:
        message = str(exc)
        if args.store:
            message = message.replace(args.store, redacted(args.store))
        print(f"contextpilot-rag optimize: {message}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def _optimize_pilot(store: str | None) -> ContextPilot:
    """The pilot on ``store``, checked to answer (a store that does not is a
    ``ConfigError``; the pilot would else plan alone and fail each conversation). Its
    tenants' ``cache_salt`` derive from ``$CONTEXTPILOT_SALT_KEY`` where set, so runs
    and processes sharing a store (and ``serve``) give a tenant the same salts."""
    salt_key = os.environ.get(SALT_KEY_ENV) or None
    config = None if salt_key is None else PilotConfig(tenants=TenantConfig(salt_key=salt_key))
    return ContextPilot(config) if store is None else pilot_on_store(config, store)


def _optimize_input(path: str, files: contextlib.ExitStack) -> TextIO:
    """The input, read as standard input is: UTF-8 (an undecodable byte becomes its
    line's error, surrogateescape), lines ending at ``\\n`` only."""
    if path != "-":
        try:
            return files.enter_context(_jsonl_reader(path))
        except OSError as exc:
            raise ConfigError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    try:
        descriptor = sys.stdin.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return sys.stdin  # replaced by a caller (tests): already text
    return files.enter_context(_jsonl_reader(descriptor))


def _jsonl_reader(file: str | int) -> TextIO:
    """A path, or a descriptor left open when the reader closes."""
    return open(
        file,
        encoding="utf-8-sig",  # a leading byte-order mark (Windows editors) is no text
        errors="surrogateescape",
        newline="\n",
        closefd=isinstance(file, str),
    )


def _optimize_output(path: str, source: TextIO, files: contextlib.ExitStack) -> TextIO:
    """The output, opened (truncated) only once it is known not to be the input."""
    if path == "-":
        try:  # JSON Lines in UTF-8 whatever the locale, as the input is read
            descriptor = sys.stdout.fileno()
        except (AttributeError, ValueError, io.UnsupportedOperation):
            return sys.stdout  # replaced by a caller (tests): already text
        sink = open(descriptor, "w", encoding="utf-8", newline="\n", closefd=False)  # noqa: SIM115 - closed by files
    elif _same_regular_file(source, path):
        raise ConfigError(f"the output {path!r} is the input: write to another file")
    else:
        try:
            sink = open(path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed by files
        except OSError as exc:
            raise ConfigError(f"cannot write {path!r}: {exc.strerror or exc}") from None
    files.callback(_close_output, sink)  # its last flush can fail too (a full disk)
    return sink


def _same_regular_file(source: TextIO, path: str) -> bool:
    try:
        read, written = os.fstat(source.fileno()), os.stat(path)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False  # nothing there yet, or an input without a file
    return stat.S_ISREG(written.st_mode) and os.path.samestat(read, written)


def _write_results(
    pilot: ContextPilot, source: Iterable[str], sink: TextIO, *, stop_on_error: bool
) -> bool:
    """Each line's result to ``sink`` as it is made; whether some line failed."""
    failed = False
    for result in process_lines(pilot, source):
        _emit(sink, json.dumps(result, ensure_ascii=False) + "\n")
        error = result.get("error")
        if error is not None:
            failed = True
            print(f"line {result['line']}: {error['type']}: {error['message']}", file=sys.stderr)
            if stop_on_error:
                break
        _emit(sink, None)
    return failed


class _OutputFailed(Exception):
    """The output could not be written (not a closed pipe: that ends quietly)."""


def _emit(sink: TextIO, text: str | None) -> None:
    """Write ``text`` to ``sink`` (``None``: flush it)."""
    with _writing():
        if text is None:
            sink.flush()
        else:
            sink.write(text)


def _close_output(sink: TextIO) -> None:
    with _writing():
        sink.close()


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    """A failed write of the output as :class:`_OutputFailed` (a closed pipe stays a
    ``BrokenPipeError``: it ends the command quietly)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _OutputFailed(f"cannot write the output: {exc.strerror or exc}") from None


def _discard_stdout() -> None:
    """Point standard output at /dev/null: the interpreter's last flush of what the
    gone reader did not take then succeeds quietly (the Python docs' SIGPIPE recipe)."""
    with contextlib.suppress(AttributeError, ValueError, OSError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``contextpilot-rag`` command."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(arguments)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    if args.command == "engine":
        return run_engine_command(args, console)
    if args.command == "bench":
        return _on_engine(run_bench, args, console)
    if args.command == "serve":
        return run_serve(args, console)
    if args.command == "eval":
        return run_eval_command(args, console, arguments)
    if args.command == "optimize":
        return _optimize(args)
    if args.engine == "sim" and not args.endpoint:
        return _on_engine(_demo, args, console)
    return _on_engine(run_demo, args, console)


def _on_engine(
    command: Callable[[argparse.Namespace, Console], int],
    args: argparse.Namespace,
    console: Console,
) -> int:
    """``demo`` or ``bench``: 2 for bad arguments (``--endpoint`` without ``--model``,
    a negative seed), 1 for an engine that cannot be installed, started or reached, or
    that fails a request."""
    try:
        return command(args, console)
    except ConfigError as error:
        console.print(f"error: {error}", style="red", markup=False, highlight=False)
        return 2
    except (EngineError, ProviderError) as error:
        console.print(f"error: {error}", style="red", markup=False, highlight=False)
        return 1
    except httpx.HTTPError as error:
        where = f" ({error.request.url})" if _has_request(error) else ""
        message = f"error: the engine failed{where}: {type(error).__name__}: {error}"
        console.print(message, style="red", markup=False, highlight=False)
        return 1


def _has_request(error: httpx.HTTPError) -> bool:
    try:
        error.request  # noqa: B018 - raises RuntimeError when the error carries none
    except RuntimeError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
