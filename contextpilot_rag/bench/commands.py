"""``contextpilot-rag demo`` on a real engine, ``contextpilot-rag bench --suite engine``
and ``bench --suite cloud`` (input-token cost on emulated hosted prompt caches).

``demo`` and ``bench --suite engine`` take the engine the same way: the project's own
(``--engine vllm`` or ``llama-server``, installed on first use with progress shown,
started on loopback and stopped on exit, Ctrl-C included) or any running
OpenAI-compatible server (``--endpoint URL --model NAME``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..batch.progress import rich_step_progress
from ..errors import ConfigError
from .engine_report import (
    SUITE_WORKLOADS,
    SuiteResult,
    markdown,
    plot,
    rich_tables,
    run_suite,
    speedup,
    suite_kv_cache_gib,
    write_json,
)
from .engine_suite import (
    ArmRun,
    EngineTarget,
    WorkloadRun,
    check_repeats,
    median_pass,
    run_workload,
)
from .engine_workloads import SYSTEM, EngineRequest, multiturn_workload, online_workload

__all__ = [
    "add_bench_parser",
    "add_engine_arguments",
    "check_output_paths",
    "engine_session",
    "run_bench",
    "run_cloud_bench",
    "run_demo",
]


def add_engine_arguments(
    parser: argparse.ArgumentParser, *, sim: bool = False, suite_kv_cache: bool = False
) -> None:
    """The engine options shared by ``demo`` and ``bench``; ``suite_kv_cache``: the
    default of ``--kv-cache-gib`` is the benchmark suite's (:func:`suite_kv_cache_gib`,
    resolved when the engine starts), else 2."""
    kinds = ["vllm", "llama-server", *(["sim"] if sim else [])]
    parser.add_argument(
        "--engine",
        choices=kinds,
        default="vllm",
        help="the project's engine to install (first use) and run on loopback (default vllm)"
        + ("; sim: the instant simulated run, no engine" if sim else ""),
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="use this running OpenAI-compatible server instead (its /v1 root)",
    )
    parser.add_argument(
        "--model",
        help="with --endpoint: the served model name; otherwise the project's model "
        "(smollm2, the default, or gemma3 with llama-server)",
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=int,
        default=None if suite_kv_cache else 2,
        help="vLLM KV cache size in GiB (default "
        + (
            "one that holds every interleaved arm, 6 in bf16, 12 in float32, or as much as "
            "the memory on the engine's cores allows)"
            if suite_kv_cache
            else "2)"
        ),
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=32,
        help="vLLM prefix-cache block size in tokens, a multiple of 32 (default 32)",
    )


@contextlib.contextmanager
def engine_session(args: argparse.Namespace, console: Console) -> Iterator[EngineTarget]:
    """The engine ``args`` name, running; a project engine is stopped on exit."""
    from ..engines import (
        external_engine,
        install_engine,
        installed_engine,
        start_engine,
        usable_cpus,
    )

    if args.endpoint:
        if not args.model:
            raise ConfigError("--endpoint needs --model (the served model name)")
        yield _probed(_answering(external_engine(args.endpoint, args.model)))
        return
    kind, model = args.engine, args.model or "smollm2"
    if installed_engine(kind, model) is None:
        console.print(f"Installing {kind} with {model} (first run only) ...")
        install_engine(kind, model, progress=True)
    with console.status(f"Starting {kind} ({model}) on 127.0.0.1 ..."):
        # alone on the machine: the model worker's threads pinned to every core
        engine = start_engine(
            kind,
            model,
            block_size=args.block_size,
            kv_cache_gib=(
                args.kv_cache_gib if args.kv_cache_gib is not None else suite_kv_cache_gib()
            ),
            cpu_bind=usable_cpus(),
        )
    with engine:
        console.print(f"{kind} serving {engine.model_name} at {engine.base_url}")
        yield engine


def _answering(engine: Any) -> Any:
    """``engine`` once its ``GET /models`` answers (any status but 404, which says the
    URL is not an OpenAI API root): else :class:`EngineError`, before a run starts."""
    import httpx

    from ..engines.errors import EngineError

    url = f"{engine.base_url}/models"
    try:
        status = httpx.get(url, timeout=10.0).status_code
    except httpx.HTTPError as exc:
        raise EngineError(f"cannot reach {engine.base_url}: {type(exc).__name__}: {exc}") from None
    if status == 404:
        raise EngineError(
            f"no OpenAI-compatible API at {engine.base_url} (GET {url}: HTTP 404); "
            "give the server's /v1 root"
        )
    return engine


def _probed(engine: Any) -> Any:
    """An external engine with the block size and cache capacity its ``/metrics``
    page reports (vLLM's ``vllm:cache_config_info``), where it has one."""
    import httpx

    from ..engines.cache_info import block_size_from_metrics, kv_cache_tokens_from_metrics

    root = engine.base_url.removesuffix("/v1")
    try:
        text = httpx.get(f"{root}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return engine
    block_size = block_size_from_metrics(text)
    if block_size is None:
        return engine
    return replace(
        engine, block_size=block_size, kv_cache_tokens=kv_cache_tokens_from_metrics(text)
    )


def _progress_arm(progress: Any) -> Callable[[str, int], Callable[[], None]]:
    def on_arm(name: str, total: int) -> Callable[[], None]:
        return progress(name, total)  # type: ignore[no-any-return]

    return on_arm


# -- bench --------------------------------------------------------------------------


def add_bench_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="the benchmarks: a real engine, or hosted prompt-cache cost (--suite cloud)",
        description="--suite engine (default) runs online, batch, multi-turn and the "
        "LangChain and LlamaIndex paths on a real engine (one request at a time) and "
        "reports TTFT, the engine's cached/computed tokens and the simulated prediction "
        "for the same prompts. --suite cloud replays multi-turn, multi-session and "
        "no-overlap workloads through emulated Anthropic and OpenAI prompt caches and "
        "reports input-token cost, unmodified vs contextpilot_rag.",
        epilog="exit codes: 0 done; 1 the engine failed or cannot be reached; 2 bad "
        "arguments (among them a --json, --markdown or --plot that cannot be written)",
    )
    bench.add_argument(
        "--suite",
        choices=["engine", "cloud"],
        default="engine",
        help="engine: a real engine (default); cloud: input-token cost on hosted prompt "
        "caches (Anthropic, OpenAI), unmodified vs contextpilot_rag, on their emulators",
    )
    add_engine_arguments(bench, suite_kv_cache=True)
    bench.add_argument(
        "--provider",
        choices=["anthropic", "openai", "both"],
        default="both",
        help="--suite cloud: whose cache rules and prices (default both)",
    )
    bench.add_argument(
        "--emulated",
        action="store_true",
        default=True,
        help="--suite cloud: replay on the emulated provider caches, no API key (the default)",
    )
    live = bench.add_argument_group(
        "--suite cloud --live",
        "measure on the provider's API with your key (ANTHROPIC_API_KEY / OPENAI_API_KEY): "
        "every arm's requests at the workloads' send times, the usage each response "
        "reports beside the emulator's prediction. It costs money: see docs/cloud.md",
    )
    live.add_argument(
        "--live",
        action="store_true",
        help="send the requests to the provider's API instead of the emulator (one "
        "--provider; --model names the provider model)",
    )
    live.add_argument("--base-url", help="the API's base URL (default: the provider's own)")
    live.add_argument(
        "--max-usd",
        type=float,
        default=1.0,
        help="the most the run may cost; a run that could cost more is refused before "
        "anything is sent (default 1)",
    )
    live.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="send times relative to the workloads' (default 1; smaller is faster but "
        "lets less expire than the workload would)",
    )
    live.add_argument(
        "--workers", type=int, default=8, help="requests in flight at most (default 8)"
    )
    live.add_argument(
        "--max-tokens",
        type=int,
        help="output tokens per request (default: 1 on Anthropic, 16 on OpenAI, whose "
        "reasoning models refuse a cap that fits no visible token)",
    )
    live.add_argument(
        "--families",
        default="multi-turn,multi-session,no-overlap",
        help="comma-separated workload families, each at --seed (default: all three)",
    )
    bench.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="--suite cloud: workload size relative to the documented run (default 1)",
    )
    bench.add_argument(
        "--workloads",
        default=",".join(SUITE_WORKLOADS),
        help=f"comma-separated subset of {','.join(SUITE_WORKLOADS)} (default: all)",
    )
    bench.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    bench.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="--suite engine: passes per arm, the median reported (default 1; the "
        "documented run uses 3)",
    )
    bench.add_argument("--json", type=Path, help="also write the results as JSON here")
    bench.add_argument("--plot", type=Path, help="also write a PNG of the results here")
    bench.add_argument("--markdown", type=Path, help="also write the results as markdown here")


def check_output_paths(*paths: Path | None) -> None:
    """Raise :class:`ConfigError` for a path (``None``: not asked for) that a run
    could not write at its end: a directory, a file that cannot be written, or a
    folder that cannot be made (missing folders are made when it is written)."""
    for path in paths:
        if path is not None:
            _check_output_path(Path(path))


def _check_output_path(path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"{path} is a directory: give a file name to write")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{path} cannot be written (permission denied)")
        return
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"cannot write {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write {path}: {folder} is not writable")


def _check_bm25() -> None:
    """:class:`MissingExtraError` (exit 2) when rank-bm25, which the real-engine
    workloads retrieve with, is not installed."""
    from ..retrievers._optional import import_optional

    import_optional("rank_bm25", "bm25")


def run_bench(args: argparse.Namespace, console: Console) -> int:
    if args.suite == "cloud":
        return run_cloud_bench(args, console)  # it checks its outputs first
    check_output_paths(args.json, args.markdown, args.plot)
    if args.live:
        raise ConfigError("--live measures the cloud suite: add --suite cloud")
    workloads = [w.strip() for w in str(args.workloads).split(",") if w.strip()]
    check_repeats(args.repeats)
    _check_bm25()  # before an engine starts: the workloads retrieve with BM25
    with engine_session(args, console) as engine, rich_step_progress() as progress:
        result = run_suite(
            engine,
            workloads,
            seed=args.seed,
            on_arm=_progress_arm(progress),
            repeats=args.repeats,
        )
    _report(result, args, console, _ENGINE_REPORT)
    return 0


class _Report:
    """A suite's report functions: rich tables, JSON, markdown, plot."""

    def __init__(self, tables: Any, json: Any, text: Any, png: Any) -> None:
        self.tables, self.json, self.text, self.png = tables, json, text, png


_ENGINE_REPORT = _Report(rich_tables, write_json, markdown, plot)


def _report(result: Any, args: argparse.Namespace, console: Console, report: _Report) -> None:
    for table in report.tables(result):
        console.print(table)
    if args.json:
        report.json(result, args.json)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.text(result) + "\n", encoding="utf-8")
    if args.plot and report.png(result, args.plot):
        console.print(f"plot: {args.plot}")


def run_cloud_bench(args: argparse.Namespace, console: Console) -> int:
    """``bench --suite cloud``: the cost benchmark on the emulated provider caches."""
    from ..cloud import DEFAULT_PRICES
    from .cloud_report import markdown, plot, rich_tables, write_json
    from .cloud_suite import DEFAULT_MODELS, PROVIDERS, run_cloud_suite

    check_output_paths(args.json, args.markdown, args.plot)
    if args.live:
        return run_live_cloud_bench(args, console)
    providers = PROVIDERS if args.provider == "both" else (args.provider,)
    models = dict(DEFAULT_MODELS)
    if args.model:
        if len(providers) != 1:
            raise ConfigError("--model names one provider's model: add --provider anthropic|openai")
        if args.model not in DEFAULT_PRICES:
            raise ConfigError(f"no list price for --model {args.model!r} (cloud.DEFAULT_PRICES)")
        models[providers[0]] = args.model
    console.print(
        "Emulated from the providers' published cache rules (no API key, no network): "
        "figures say what those rules predict, not what the providers' servers measure."
    )
    with rich_step_progress() as progress:
        result = run_cloud_suite(
            providers, scale=args.scale, models=models, progress=_progress_arm(progress)
        )
    _report(result, args, console, _Report(rich_tables, write_json, markdown, plot))
    return 0


def run_live_cloud_bench(args: argparse.Namespace, console: Console) -> int:
    """``bench --suite cloud --live``: the same arms on the provider's API."""
    from .cloud_live import (
        LiveOptions,
        LiveRunStopped,
        live_markdown,
        live_plot,
        live_tables,
        run_live_suite,
        write_live_json,
    )
    from .cloud_workloads import FAMILIES, CloudWorkload, cloud_workload

    if args.provider == "both":
        raise ConfigError("--live measures one provider: --provider anthropic or openai")
    families = [f.strip() for f in str(args.families).split(",") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ConfigError(f"--families must name some of {', '.join(FAMILIES)}; got {unknown}")
    options = LiveOptions(
        args.provider,
        model=args.model,
        base_url=args.base_url,
        max_usd=args.max_usd,
        time_scale=args.time_scale,
        workers=args.workers,
        max_tokens=args.max_tokens,
    )

    def workloads_at(scale: float) -> list[CloudWorkload]:
        return [cloud_workload(family, args.seed, scale) for family in families]

    workloads = workloads_at(args.scale)
    console.print(
        f"Live: {options.provider} ({options.chosen_model}) at "
        f"{args.base_url or 'the provider API'}; at most {options.max_usd:g} USD."
    )
    report = _Report(live_tables, write_live_json, live_markdown, live_plot)
    try:
        with rich_step_progress() as progress:
            result = run_live_suite(
                workloads,
                options,
                progress=_progress_arm(progress),
                scale=args.scale,
                workloads_at=workloads_at,
            )
    except LiveRunStopped as stopped:
        if stopped.partial is not None:  # what the money bought so far (marked incomplete)
            console.print("[yellow]the run stopped: the requests every arm answered[/yellow]")
            _report(stopped.partial, args, console, report)
        raise
    _report(result, args, console, report)
    console.print(f"spent {result.spent_usd:.4f} USD (run {result.run_id})")
    return 0


# -- demo ---------------------------------------------------------------------------


def run_demo(args: argparse.Namespace, console: Console) -> int:
    """Several users at once through a LangChain RAG chain over BM25 on the bundled
    MTRAG corpus, then one multi-turn conversation; each twice (unmodified, then
    through contextpilot_rag), on a real engine; every arm :data:`DEMO_PASSES` times."""
    from .langchain_path import langchain_available

    check_output_paths(Path(args.plot))
    _check_bm25()
    if not langchain_available():
        console.print(
            "[red]The real-engine demo runs a LangChain chain: install langchain-openai and "
            "the langchain-contextpilot integration (make does), or use --engine sim.[/red]"
        )
        return 1
    users = online_workload(topics=2, users_per_topic=2, questions=3, k=4, seed=args.seed)
    talk = multiturn_workload(conversations=1, turns=5, k=3, max_tokens=32, seed=args.seed)
    console.print(
        "Corpus: 350 MTRAG passages (IBM, Apache-2.0), BM25. Scenario 1: 4 users at once, "
        "3 questions each, through a LangChain chain (ChatOpenAI) — plain, then with "
        f"ContextPilotRetriever and its callback handler, {DEMO_PASSES} times each (the "
        "median shown). Scenario 2: one 5-turn MTRAG "
        "conversation whose documents stay in the conversation — plain, then the pilot "
        "(repeated documents de-duplicated); and the same conversation in LangChain's "
        "history pattern (questions and answers only) — plain, then documents in the "
        "pilot's order.\n"
    )
    with engine_session(args, console) as engine, rich_step_progress() as progress:
        on_arm = _progress_arm(progress)
        plain, ours = _users_scenario(engine, users.requests, on_arm)
        conversation = run_workload(engine, talk, on_arm=on_arm, repeats=DEMO_PASSES)
        facts = f"{getattr(engine, 'kind', 'external')} · {engine.model_name}"
    scenarios = [
        WorkloadRun("4 users, LangChain", "", (plain, ours)),
        replace(conversation, name="5-turn chat"),
    ]
    console.print(_demo_table(scenarios, facts))
    path = Path(args.plot)
    if _demo_plot(scenarios, path, facts):
        console.print(f"plot: {path}")
    return 0


DEMO_PASSES = 3
"""Passes of every demo arm: a small machine's speed drifts from minute to minute, and
the median of paired passes is what a reader can trust (docs/benchmarks.md)."""


def _users_scenario(
    engine: EngineTarget, requests: Sequence[EngineRequest], on_arm: Callable[[str, int], Any]
) -> tuple[ArmRun, ArmRun]:
    """The users' LangChain chain, plain and through a fresh pilot, :data:`DEMO_PASSES`
    times each, the order swapped on every other pass; each arm's median pass."""
    from ..pilot import ContextPilot, PilotConfig
    from .langchain_path import run_langchain_arm

    passes: dict[str, list[ArmRun]] = {"unmodified": [], "contextpilot": []}
    for number in range(DEMO_PASSES):
        names = list(passes) if number % 2 == 0 else list(passes)[::-1]
        for name in names:
            pilot = (
                ContextPilot(PilotConfig(system_prompt=SYSTEM)) if name != "unmodified" else None
            )
            label = f"users: {name}" + (f" (pass {number + 1})" if number else "")
            arm, _ = run_langchain_arm(
                name,
                engine,
                requests,
                pilot=pilot,
                concurrent=True,
                tick=on_arm(label, len(requests)),
            )
            passes[name].append(arm)
    return median_pass(passes["unmodified"]), median_pass(passes["contextpilot"])


def _demo_table(scenarios: list[WorkloadRun], facts: str) -> Table:
    table = Table(title=f"contextpilot_rag on a real engine ({facts})")
    for column in ("scenario", "arm", "mean TTFT s", "p95 TTFT s", "cached", "computed"):
        named = column in ("scenario", "arm")
        table.add_column(column, justify="left" if named else "right", no_wrap=named)
    # the median of the passes' own ratios, not the ratio of the median passes shown
    table.add_column(f"speed-up (median of {DEMO_PASSES} passes)", justify="right")
    for run in scenarios:
        for arm in run.arms:
            base = run.baseline_of(arm.name)
            table.add_row(
                run.name,
                arm.name,
                f"{arm.mean_ttft_s:.2f}",
                f"{arm.p95_ttft_s:.2f}",
                f"{arm.cached_tokens:,} ({arm.cached_tokens / max(1, arm.prompt_tokens):.0%})",
                f"{arm.computed_tokens:,}",
                f"{speedup(base, arm)[0]:.2f}x",
            )
    return table


def _demo_plot(scenarios: list[WorkloadRun], path: Path, facts: str) -> bool:
    return plot(SuiteResult({"model": facts, "kind": "demo"}, list(scenarios)), path)
