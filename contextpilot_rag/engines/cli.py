"""``contextpilot-rag engine install|start|stop|status`` (also ``python -m
contextpilot_rag.engines``). Exit codes: 0 ok, 1 failure, 2 usage error."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from ._commands import directory_size
from ._stamps import read_stamp
from .errors import EngineError, EngineInstallError, EngineStartError
from .home import EngineLayout
from .install import install_engine
from .models import ENGINE_KINDS, MODELS
from .running import KVEventPorts
from .start import start_engine
from .state import StopOutcome, detach_engine, read_records, stop_recorded

__all__ = ["add_engine_commands", "add_engine_parser", "run_engine_command"]

DEFAULT_PORTS = {"vllm": 8030, "llama-server": 8012}


def _selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine", choices=ENGINE_KINDS, default="vllm", help="which engine (default: vllm)"
    )
    parser.add_argument(
        "--model",
        choices=tuple(MODELS),
        default="smollm2",
        help="smollm2 = SmolLM2-135M-Instruct (default; both engines), "
        "gemma3 = gemma-3-270m base model (llama-server only)",
    )


def _start_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--port", type=int, help="port on 127.0.0.1 (default: 8030 vllm, 8012 llama-server)")
    add("--kv-cache-gib", type=int, default=2, help="vLLM KV-cache size in GiB (default 2)")
    add("--block-size", type=int, default=32, help="vLLM block size, a multiple of 32 (default 32)")
    add("--max-model-len", type=int, help="tokens per request (default: model context, max 8192)")
    add("--slots", type=int, default=1, help="llama-server parallel slots (default 1)")
    add("--threads", type=int, help="llama-server CPU threads (default: all cores)")
    add(
        "--kv-events-port",
        type=int,
        help="vLLM: publish KV-cache events to tcp://127.0.0.1:PORT (the subscriber binds it); "
        "replay on PORT+1",
    )
    add(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="vLLM compute dtype (default auto: float32 unless the CPU has native bf16)",
    )
    add(
        "--cpu-bind",
        default="nobind",
        help="vLLM worker CPU binding: nobind (default), auto (vLLM's: pins every instance "
        "to the same core), or cores such as 0-1",
    )
    add(
        "--enforce-eager",
        action="store_true",
        help="vLLM without torch.compile: a faster start-up, slower serving",
    )
    add("--startup-timeout", type=float, default=600.0, help="seconds to wait (default 600)")


def add_engine_commands(commands: Any) -> None:
    """Add ``install``, ``start``, ``stop`` and ``status`` to a subparsers object
    (``dest`` of the sub-command: ``engine_command``)."""
    install = commands.add_parser("install", help="install an engine and a model (idempotent)")
    _selection(install)
    start = commands.add_parser("start", help="start an engine in the background on loopback")
    _selection(start)
    _start_options(start)
    stop = commands.add_parser("stop", help="stop engines started by `engine start`")
    which = stop.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="stop every recorded engine")
    which.add_argument("--port", type=int, help="stop the engine on this port")
    commands.add_parser("status", help="installed engines and models, running engines")


def add_engine_parser(commands: Any) -> None:
    """Add the ``engine`` command to the ``contextpilot-rag`` subparsers."""
    engine = commands.add_parser(
        "engine",
        help="install, start, stop real inference engines (vLLM CPU, llama-server)",
        description="Inference engines run by the project, under the engine home "
        "($CONTEXTPILOT_ENGINE_HOME, default ~/.cache/contextpilot-rag/engines).",
        epilog="exit codes: 0 ok; 1 failure (install, start, interrupted, stop --port with "
        "no engine there); 2 bad arguments",
    )
    add_engine_commands(engine.add_subparsers(dest="engine_command", required=True))


def run_engine_command(args: argparse.Namespace, console: Console) -> int:
    """Run a parsed ``engine`` sub-command; the exit code."""
    layout = EngineLayout.default()
    handlers = {"install": _install, "start": _start, "stop": _stop, "status": _status}
    try:
        return handlers[args.engine_command](args, layout, console)
    except ConfigError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    except (EngineInstallError, EngineStartError) as error:
        console.print(f"[red]error:[/red] {error}")
        if error.log_tail:
            console.print(error.log_tail, markup=False, highlight=False)
        return 1
    except EngineError as error:
        console.print(f"[red]error:[/red] {error}")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 1
    except OSError as error:  # the engine home unwritable, a full disk, ...
        console.print(f"[red]error:[/red] {error} (engine home {layout.home})")
        return 1


def _size(num_bytes: int) -> str:
    if num_bytes < 1000:
        return f"{num_bytes} B"
    scaled = float(num_bytes)
    for unit in ("KB", "MB", "GB"):
        scaled /= 1000
        if scaled < 1000 or unit == "GB":
            break
    return f"{scaled:.1f} {unit}"


def _install(args: argparse.Namespace, layout: EngineLayout, console: Console) -> int:
    started = time.monotonic()
    installed = install_engine(args.engine, args.model, home=layout.home, progress=True)
    console.print(
        f"[green]{installed.kind} {installed.version}[/green] with {installed.model.key} "
        f"ready in {time.monotonic() - started:.0f} s under {layout.home}\n"
        f"  engine: {installed.executable}  ({_size(installed.size_bytes)})\n"
        f"  model:  {installed.model_path}\n"
        f"start it: contextpilot-rag engine start --engine {installed.kind} "
        f"--model {installed.model.key}"
    )
    return 0


def _start(args: argparse.Namespace, layout: EngineLayout, console: Console) -> int:
    port = args.port if args.port is not None else DEFAULT_PORTS[args.engine]
    kv_events = None
    if args.kv_events_port is not None:
        if not 0 < args.kv_events_port < 65535:
            raise ConfigError(
                f"--kv-events-port {args.kv_events_port} is not in 1..65534 "
                "(the replay socket takes the port after it)"
            )
        kv_events = KVEventPorts(args.kv_events_port, args.kv_events_port + 1)
    started = time.monotonic()
    with console.status(f"starting {args.engine} on 127.0.0.1:{port} (vLLM: a few minutes)"):
        engine = start_engine(
            args.engine,
            args.model,
            port=port,
            block_size=args.block_size,
            kv_cache_gib=args.kv_cache_gib,
            max_model_len=args.max_model_len,
            kv_events=kv_events,
            slots=args.slots,
            threads=args.threads,
            enforce_eager=args.enforce_eager,
            dtype=None if args.dtype == "auto" else args.dtype,
            cpu_bind=args.cpu_bind,
            startup_timeout_s=args.startup_timeout,
            home=layout.home,
        )
        record = detach_engine(engine, layout.run_dir)
    console.print(
        f"[green]{record.kind}[/green] serves [bold]{record.model_name}[/bold] at "
        f"{record.base_url} (ready in {time.monotonic() - started:.0f} s)\n"
        f"  pid {record.pid}, prefix cache {record.kv_cache_tokens or '?'} tokens, "
        f"block size {record.block_size}\n  log {record.log_path}\n"
        f"stop it: contextpilot-rag engine stop --port {record.port}"
    )
    return 0


def _stop(args: argparse.Namespace, layout: EngineLayout, console: Console) -> int:
    if args.port is not None and not 1 <= args.port <= 65535:
        raise ConfigError(f"port {args.port!r} is not in 1..65535")
    # records of engines no longer running (a crash, a reboot) do not count: a plain
    # stop removes them beside the one that runs
    running = [r for _, r in read_records(layout.run_dir) if r is not None and r.is_running()]
    if not args.all and args.port is None and len(running) > 1:
        ports = ", ".join(str(record.port) for record in running)
        console.print(
            f"[red]error:[/red] several engines are running (ports {ports}): pass --port P or --all"
        )
        return 2
    outcomes = stop_recorded(layout.run_dir, port=args.port)
    for outcome in outcomes:
        console.print(_describe_stop(outcome))
    if not outcomes:
        where = f" on port {args.port}" if args.port is not None else ""
        console.print(f"no engine recorded{where} in {layout.run_dir}")
        return 1 if args.port is not None else 0
    return 0


def _describe_stop(outcome: StopOutcome) -> str:
    record = outcome.record
    if record is None:
        return f"removed unreadable record {outcome.path}"
    what = f"{record.kind} on port {record.port} (pid {record.pid})"
    if outcome.action == "stopped":
        return f"[green]stopped[/green] {what}"
    return f"[yellow]not running[/yellow] {what}: removed its stale record"


def _status(args: argparse.Namespace, layout: EngineLayout, console: Console) -> int:
    console.print(_installed_table(layout))
    console.print(_running_table(layout))
    return 0


def _under(path: Path, layout: EngineLayout) -> str:
    return str(path.relative_to(layout.home))


def _installed_table(layout: EngineLayout) -> Table:
    table = Table(title=f"Installed (paths under {layout.home})")
    table.add_column("what")
    table.add_column("version / served as")
    table.add_column("path", overflow="fold")
    table.add_column("size", justify="right", no_wrap=True)
    for kind in ENGINE_KINDS:
        stamp = read_stamp(layout.stamp(kind))
        path = layout.vllm_venv if kind == "vllm" else layout.llama_server
        if stamp is None:
            table.add_row(kind, "[dim]not installed[/dim]", _under(path, layout), "")
        else:
            table.add_row(kind, stamp.version, _under(path, layout), _size(stamp.size_bytes))
    for spec in MODELS.values():
        forms = [("GGUF", spec.gguf_path(layout.models_dir))]
        if spec.hf_dir is not None:
            forms.append(("HF, for vLLM", spec.hf_path(layout.models_dir)))
        for form, path in forms:
            if path.exists():
                size = path.stat().st_size if path.is_file() else directory_size(path)
                name, where = f"{spec.key} ({form})", _under(path, layout)
                table.add_row(name, spec.served_name, where, _size(size))
    return table


def _health(base_url: str) -> str:
    with contextlib.suppress(httpx.HTTPError):
        root = base_url.removesuffix("/v1")
        code = httpx.get(f"{root}/health", timeout=1.0, trust_env=False).status_code
        return "[green]healthy[/green]" if code == 200 else f"[yellow]HTTP {code}[/yellow]"
    return "[red]no answer[/red]"


def _running_table(layout: EngineLayout) -> Table:
    table = Table(title="Running (started by `engine start`)")
    for column in ("engine", "model", "url", "pid", "state", "log"):
        table.add_column(column, overflow="fold")
    for path, record in read_records(layout.run_dir):
        if record is None:
            table.add_row("?", "", "", "", "[red]unreadable record[/red]", str(path))
            continue
        state = _health(record.base_url) if record.is_running() else "[red]gone (stale)[/red]"
        table.add_row(
            record.kind, record.model_name, record.base_url, str(record.pid), state, record.log_path
        )
    return table
