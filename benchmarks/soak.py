"""Soak of ``ContextPilot.optimize``: a million conversation turns from many tenants,
on the in-memory store and on a loopback Redis, checking that latency and memory stay
flat and within the pilot's bounds.

    python benchmarks/soak.py --write docs/benchmarks.md --plot docs/img/soak.png

Workload (``lib/soak_workload.py``, fixed ``--seed``): 50 tenants, 500 conversations
open at once, each of 2 to 10 turns and then left (never ended: the store's bounds must
drop it), a new one starting in its place; each turn carries shared and private blocks
(some from the conversation's earlier turns) and records an answer. Every store runs
the same stream in a fresh child process (so that its memory is its own): each
``optimize`` call is timed, and every ``--calls / --windows`` calls the script records
the window's p50 and p99, the process's resident memory (RSS), the conversations the
store holds and the tenants' context-index sizes (and, for Redis, the server's memory).
The first ``--warmup`` of the calls fill the store and the indexes to their bounds; the
targets compare the first window after them with the last:

- p99 of the last window at most 1.5× that of the first;
- RSS at the end at most 10% above RSS after the warm-up (memory flat);
- conversations held and every tenant's index within ``PilotConfig.max_conversations``
  and ``TenantConfig.index`` at every window, no open conversation losing its history,
  and no turn failed by a store error (counted, and the run goes on: a Redis that does
  not answer within the store's timeout fails the call);
- Redis: median ``optimize`` latency after the warm-up at most 1 ms above the in-memory
  store's (issue 21).

Redis runs on loopback: a ``redis-server`` the script starts (``redis-server`` on PATH)
in a temporary directory, or ``--redis-url``. Writes the ``soak`` generated section.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lib.loopback_redis import loopback_redis
from lib.report import save_figure
from lib.sections import markdown_table, provenance, write_or_print
from lib.soak_workload import SoakShape, SoakWorkload

from contextpilot_rag import ContextPilot, ConversationStore, PilotConfig
from contextpilot_rag.batch.progress import rich_progress
from contextpilot_rag.conversations import InMemoryConversationStore
from contextpilot_rag.errors import StoreError
from contextpilot_rag.stores import open_store
from contextpilot_rag.tenants import TenantConfig

SECTION = "soak"
STORES = ("memory", "redis")
P99_RATIO_MAX = 1.5  # last window / first window after the warm-up
RSS_GROWTH_MAX = 0.10  # RSS at the end over RSS after the warm-up, minus one
REDIS_OVERHEAD_MAX_MS = 1.0  # issue 21: median optimize, Redis minus memory
OPEN_SHARE = 4  # the store holds this many times the open conversations, at least
SALT_KEY = "soak-benchmark-salt-key"  # fixed, as a fleet sharing a store configures it


@dataclass(frozen=True)
class Window:
    """The state after ``calls`` calls, with the latencies of the window ending there."""

    calls: int
    seconds: float  # since the first call
    p50_ms: float
    p99_ms: float
    rss_mb: float
    conversations: int  # held by the store
    index_nodes: int  # all tenants' context indexes together
    index_tokens: int
    max_tenant_nodes: int
    max_tenant_tokens: int
    history_lost: int  # prompts so far whose conversation the store had dropped
    store_errors: int  # turns so far that a store error failed (StoreError)
    server_mb: float | None = None  # Redis used_memory
    server_keys: int | None = None


@dataclass(frozen=True)
class Bounds:
    max_conversations: int
    tenant_max_nodes: int | None
    tenant_capacity_tokens: int | None
    tenants: int  # in the workload, each with its own index


@dataclass
class _Tally:
    history_lost: int = 0  # prompts whose conversation the store had dropped
    store_errors: int = 0  # turns a store error failed (the run goes on)


@dataclass(frozen=True)
class SoakResult:
    store: str
    calls: int
    warmup_calls: int
    median_ms: float  # every call after the warm-up
    rss_start_mb: float  # before the first call
    bounds: Bounds
    windows: tuple[Window, ...]

    @property
    def first(self) -> Window:
        """The first window after the warm-up."""
        return next(w for w in self.windows if w.calls > self.warmup_calls)

    @property
    def warm(self) -> Window:
        """The state when the warm-up ended (the window before :attr:`first`)."""
        index = self.windows.index(self.first)
        return self.windows[index - 1] if index else self.first

    @property
    def last(self) -> Window:
        return self.windows[-1]

    @property
    def p99_ratio(self) -> float:
        return self.last.p99_ms / self.first.p99_ms

    @property
    def rss_growth(self) -> float:
        return self.last.rss_mb / self.warm.rss_mb - 1

    def filled_at(self) -> tuple[int | None, int | None]:
        """The calls after which the store held its bound of conversations, and after
        which the tenants' indexes held 95% of their token bound (None: not reached)."""
        bounds = self.bounds
        store = next(
            (w.calls for w in self.windows if w.conversations >= bounds.max_conversations), None
        )
        if bounds.tenant_capacity_tokens is None:
            return store, None
        full = 0.95 * bounds.tenants * bounds.tenant_capacity_tokens
        indexes = next((w.calls for w in self.windows if w.index_tokens >= full), None)
        return store, indexes

    def filled_in_warmup(self) -> bool:
        """Whether the store and the indexes reached their bounds within the warm-up:
        else memory after it still grows by design, and its growth says nothing."""
        store, indexes = self.filled_at()
        indexes_ok = indexes is not None or self.bounds.tenant_capacity_tokens is None
        return (
            store is not None
            and store <= self.warmup_calls
            and indexes_ok
            and (indexes or 0) <= self.warmup_calls
        )

    def within_bounds(self) -> bool:
        bounds = self.bounds
        return all(
            w.conversations <= bounds.max_conversations
            and (bounds.tenant_max_nodes is None or w.max_tenant_nodes <= bounds.tenant_max_nodes)
            and (
                bounds.tenant_capacity_tokens is None
                or w.max_tenant_tokens <= bounds.tenant_capacity_tokens
            )
            for w in self.windows
        )

    def met(self) -> bool:
        return (
            self.p99_ratio <= P99_RATIO_MAX
            and self.rss_growth <= RSS_GROWTH_MAX
            and self.filled_in_warmup()
            and self.within_bounds()
            and self.last.history_lost == 0
            and self.last.store_errors == 0
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SoakResult:
        data = dict(data)
        windows = tuple(Window(**w) for w in data.pop("windows"))
        return cls(bounds=Bounds(**data.pop("bounds")), windows=windows, **data)


def rss_mb() -> float:
    """This process's resident memory now (Linux ``/proc``; elsewhere the peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


class Probe:
    """Reads a pilot's sizes between windows: the conversations its store holds, its
    tenants' indexes and, given ``redis_url``, the Redis server's memory."""

    def __init__(
        self, store: ConversationStore, tenants: Sequence[str], *, redis_url: str | None = None
    ) -> None:
        self.store, self.tenants = store, tenants
        self.server: Any = None
        if redis_url is not None:
            import redis

            self.server = redis.Redis.from_url(redis_url.split("?", 1)[0])

    def window(
        self, pilot: ContextPilot, calls: int, seconds: float, latencies_ms: Any, tally: _Tally
    ) -> Window:
        p50, p99 = np.percentile(latencies_ms, [50, 99])
        stats = [pilot.index_stats(tenant=tenant) for tenant in self.tenants]
        server_mb = server_keys = None
        if self.server is not None:
            server_mb = int(self.server.info("memory")["used_memory"]) / (1024 * 1024)
            server_keys = int(self.server.dbsize())
        return Window(
            calls=calls,
            seconds=seconds,
            p50_ms=float(p50),
            p99_ms=float(p99),
            rss_mb=rss_mb(),
            conversations=len(self.store),
            index_nodes=sum(s.nodes for s in stats),
            index_tokens=sum(s.tokens for s in stats),
            max_tenant_nodes=max(s.nodes for s in stats),
            max_tenant_tokens=max(s.tokens for s in stats),
            history_lost=tally.history_lost,
            store_errors=tally.store_errors,
            server_mb=server_mb,
            server_keys=server_keys,
        )


def soak_config(max_conversations: int = PilotConfig.max_conversations) -> PilotConfig:
    """The default configuration, with a fixed tenant salt key (as every process of a
    fleet sharing a store must have) and ``max_conversations``."""
    tenants = TenantConfig(salt_key=SALT_KEY)
    return PilotConfig(max_conversations=max_conversations, tenants=tenants)


def soak(
    store: str,
    calls: int,
    *,
    windows: int = 100,
    warmup: float = 0.1,
    seed: int = 0,
    config: PilotConfig | None = None,
    shape: SoakShape | None = None,
    redis_url: str | None = None,
    progress: Callable[[int], None] = lambda n: None,
) -> SoakResult:
    """``calls`` turns of the soak workload through one pilot on ``store`` (``memory``
    or ``redis``, at ``redis_url``), in this process."""
    config = config or soak_config()
    shape = shape or SoakShape()
    if config.max_conversations < OPEN_SHARE * shape.active:
        raise SystemExit(
            f"--max-conversations must be at least {OPEN_SHARE}× the open conversations "
            "(--active): else the store drops conversations still in use"
        )
    workload = SoakWorkload(shape, seed)
    pilot, probe = _open(store, config, workload.tenant_names, redis_url)
    windows = max(1, min(windows, calls))
    ends = [round(calls * (i + 1) / windows) for i in range(windows)]
    latencies_ms = np.full(calls, np.nan)  # touched now, so that it adds no RSS later
    rss_start = rss_mb()
    recorded: list[Window] = []
    tally, done, started = _Tally(), 0, time.perf_counter()
    for end in ends:
        _play(pilot, workload, latencies_ms[done:end], tally)
        progress(end - done)
        seconds = time.perf_counter() - started
        recorded.append(probe.window(pilot, end, seconds, latencies_ms[done:end], tally))
        done = end
    warmup_calls = _warmup_calls(ends, warmup)
    tenant_index = config.tenants.index
    return SoakResult(
        store=store,
        calls=calls,
        warmup_calls=warmup_calls,
        median_ms=float(np.median(latencies_ms[warmup_calls:])),
        rss_start_mb=rss_start,
        bounds=Bounds(
            config.max_conversations,
            tenant_index.max_nodes,
            tenant_index.capacity_tokens,
            shape.tenants,
        ),
        windows=tuple(recorded),
    )


def _open(
    store: str, config: PilotConfig, tenants: Sequence[str], redis_url: str | None
) -> tuple[ContextPilot, Probe]:
    """A pilot on ``store`` and a probe of it. Memory: the store ``store=None`` would
    make, given explicitly so that the probe can count it; Redis: the URL, as users
    give it, and a second client of the same store for the probe."""
    bound, ttl_s = config.max_conversations, config.conversation_ttl_s
    if store == "memory":
        memory = InMemoryConversationStore(max_conversations=bound, ttl_s=ttl_s)
        return ContextPilot(config, store=memory), Probe(memory, tenants)
    if redis_url is None:
        raise ValueError("the redis store needs a redis_url")
    held = open_store(redis_url, max_conversations=bound, ttl_s=ttl_s)
    return ContextPilot(config, store=redis_url), Probe(held, tenants, redis_url=redis_url)


def _play(pilot: ContextPilot, workload: SoakWorkload, latencies_ms: Any, tally: _Tally) -> None:
    """One turn per slot of ``latencies_ms``, each ``optimize`` timed into its slot
    (a failed one too: its caller waited that long) and its answer recorded."""
    for slot in range(len(latencies_ms)):
        turn = workload.next_turn()
        before = time.perf_counter_ns()
        try:
            prompt = pilot.optimize(
                turn.blocks, turn.query, conversation_id=turn.conversation_id, tenant=turn.tenant
            )
        except StoreError:
            latencies_ms[slot] = (time.perf_counter_ns() - before) / 1e6
            tally.store_errors += 1
            continue
        latencies_ms[slot] = (time.perf_counter_ns() - before) / 1e6
        tally.history_lost += prompt.history_lost
        try:
            pilot.record_answer(prompt, turn.answer)
        except StoreError:
            tally.store_errors += 1


def _warmup_calls(ends: Sequence[int], warmup: float) -> int:
    """The end of the last window inside the first ``warmup`` of the calls (0: none),
    never the last window."""
    inside = [end for end in ends[:-1] if end <= warmup * ends[-1]]
    return inside[-1] if inside else 0


def run_child(store: str, args: argparse.Namespace, redis_url: str | None) -> SoakResult:
    """:func:`soak` of one store in a fresh interpreter, its memory its own."""
    with tempfile.TemporaryDirectory() as scratch:
        result_path = Path(scratch) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", store]
        command += ["--calls", str(args.calls), "--windows", str(args.windows)]
        command += ["--warmup", str(args.warmup), "--seed", str(args.seed)]
        command += ["--max-conversations", str(args.max_conversations)]
        command += ["--active", str(args.active)]
        command += ["--result", str(result_path)]
        if redis_url:
            command += ["--redis-url", redis_url]
        subprocess.run(command, check=True)
        return SoakResult.from_json(json.loads(result_path.read_text(encoding="utf-8")))


def child_main(args: argparse.Namespace) -> int:
    config = soak_config(args.max_conversations)
    with rich_progress() as bars:
        advance = bars(f"soak, {args.child} store", args.calls)
        result = soak(
            args.child,
            args.calls,
            windows=args.windows,
            warmup=args.warmup,
            seed=args.seed,
            config=config,
            shape=SoakShape(active=args.active),
            redis_url=args.redis_url,
            progress=advance,
        )
    Path(args.result).write_text(json.dumps(asdict(result)), encoding="utf-8")
    return 0


def _mb(value: float) -> str:
    return f"{value:,.0f} MB"


def _bound(value: int | None) -> str:
    return "none" if value is None else f"{value:,}"


def _calls(calls: int | None) -> str:
    return "never" if calls is None else f"{calls:,}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def redis_overhead_ms(results: Sequence[SoakResult]) -> float | None:
    by_store = {r.store: r for r in results}
    if not {"memory", "redis"} <= by_store.keys():
        return None
    return by_store["redis"].median_ms - by_store["memory"].median_ms


def latency_rows(results: Sequence[SoakResult]) -> list[list[str]]:
    return [
        [
            r.store,
            f"{r.calls:,}",
            f"{r.warmup_calls:,}",
            f"{r.median_ms:.3f}",
            f"{r.first.p50_ms:.3f} / {r.last.p50_ms:.3f}",
            f"{r.first.p99_ms:.3f} / {r.last.p99_ms:.3f}",
            f"{r.p99_ratio:.2f}×",
            f"{r.last.seconds / r.calls * 1e6:,.0f} µs",
            _yes(r.met()),
        ]
        for r in results
    ]


def memory_rows(results: Sequence[SoakResult]) -> list[list[str]]:
    rows = []
    for r in results:
        peak_conversations = max(w.conversations for w in r.windows)
        server = "-"
        if r.last.server_mb is not None and r.warm.server_mb is not None:
            server = (
                f"{_mb(r.warm.server_mb)} / {_mb(r.last.server_mb)} ({r.last.server_keys:,} keys)"
            )
        store_full, indexes_full = r.filled_at()
        rows.append(
            [
                r.store,
                f"{_calls(store_full)} / {_calls(indexes_full)}",
                f"{_mb(r.rss_start_mb)} / {_mb(r.warm.rss_mb)} / {_mb(r.last.rss_mb)}",
                f"{r.rss_growth:+.1%}",
                f"{peak_conversations:,} / {r.bounds.max_conversations:,}",
                f"{max(w.max_tenant_nodes for w in r.windows):,} / "
                f"{_bound(r.bounds.tenant_max_nodes)}",
                f"{max(w.max_tenant_tokens for w in r.windows):,} / "
                f"{_bound(r.bounds.tenant_capacity_tokens)}",
                f"{r.last.history_lost:,}",
                server,
            ]
        )
    return rows


def target_rows(results: Sequence[SoakResult]) -> list[list[str]]:
    rows = []
    for r in results:
        rows += [
            [
                f"{r.store}: p99, last window / first after warm-up",
                f"≤ {P99_RATIO_MAX:g}×",
                f"{r.p99_ratio:.2f}×",
                _yes(r.p99_ratio <= P99_RATIO_MAX),
            ],
            [
                f"{r.store}: store and indexes at their bounds by the end of the warm-up",
                "yes",
                _yes(r.filled_in_warmup()),
                _yes(r.filled_in_warmup()),
            ],
            [
                f"{r.store}: RSS growth after warm-up",
                f"≤ {RSS_GROWTH_MAX:.0%}",
                f"{r.rss_growth:+.1%}",
                _yes(r.rss_growth <= RSS_GROWTH_MAX),
            ],
            [
                f"{r.store}: conversations and tenant indexes within their bounds",
                "every window",
                _yes(r.within_bounds()),
                _yes(r.within_bounds()),
            ],
            [
                f"{r.store}: open conversations that lost their history",
                "0",
                f"{r.last.history_lost:,}",
                _yes(r.last.history_lost == 0),
            ],
            [
                f"{r.store}: turns failed by a store error",
                "0",
                f"{r.last.store_errors:,}",
                _yes(r.last.store_errors == 0),
            ],
        ]
    overhead = redis_overhead_ms(results)
    if overhead is not None:
        rows.append(
            [
                "Redis overhead: median optimize after warm-up, Redis minus memory",
                f"≤ {REDIS_OVERHEAD_MAX_MS:g} ms",
                f"{overhead:.3f} ms",
                _yes(overhead <= REDIS_OVERHEAD_MAX_MS),
            ]
        )
    return rows


def markdown(
    results: Sequence[SoakResult], argv: Sequence[str], shape: SoakShape, plot: Path | None
) -> str:
    first = results[0]
    lines = [  # under the hand-written heading and description of docs/benchmarks.md
        provenance(
            "python benchmarks/soak.py " + " ".join(argv),
            1,
            "one run per store, each in a fresh process; every window's p50 and p99 are "
            f"over its {first.calls // len(first.windows):,} calls",
        ),
        "",
        f"{shape.tenants} tenants ({shape.docs_per_tenant} private documents each, "
        f"{shape.shared_docs} shared), {shape.active} conversations open at once, each of "
        f"{shape.min_turns} to {shape.max_turns} turns with {shape.blocks_per_turn} "
        "documents per turn, then left for the store's bounds to drop; an answer recorded "
        f"per turn. {len(first.windows)} windows; the first {first.warmup_calls:,} calls "
        "are the warm-up. Bounds: `PilotConfig.max_conversations` and "
        "`TenantConfig.index` (nodes, tokens) per tenant.",
        "",
        "### Targets",
        "",
        *markdown_table(["measure", "target", "measured", "met"], target_rows(results)),
        "",
        "### Latency of `optimize` (ms)",
        "",
        *markdown_table(
            [
                "store",
                "calls",
                "warm-up calls",
                "median after warm-up",
                "p50 first / last window",
                "p99 first / last window",
                "p99 last / first",
                "wall time per turn",
                "targets met",
            ],
            latency_rows(results),
        ),
        "",
        "First window: the first after the warm-up. Wall time per turn includes "
        "`record_answer` and the workload itself.",
        "",
        "### Memory and bounds",
        "",
        *markdown_table(
            [
                "store",
                "store / indexes full after calls",
                "RSS before / after warm-up / end",
                "RSS growth after warm-up",
                "conversations held, most / bound",
                "tenant index nodes, most / bound",
                "tenant index tokens, most / bound",
                "history lost",
                "Redis memory after warm-up / end",
            ],
            memory_rows(results),
        ),
        "",
        "Indexes full: all tenants' indexes together hold 95% of their token bound. RSS "
        "before: once the workload and the pilot are built, before the first call.",
    ]
    if plot is not None:
        lines += ["", f"![p99 latency and RSS over the soak](img/{plot.name})"]
    return "\n".join(lines)


def plot_soak(results: Sequence[SoakResult], path: Path) -> bool:
    """p99 per window and RSS over the calls, one line per store; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (latency, memory) = plt.subplots(1, 2, figsize=(12, 4))
    for r in results:
        calls = [w.calls for w in r.windows]
        latency.plot(calls, [w.p99_ms for w in r.windows], label=f"{r.store} p99")
        latency.plot(calls, [w.p50_ms for w in r.windows], "--", label=f"{r.store} p50")
        memory.plot(calls, [w.rss_mb for w in r.windows], label=r.store)
    for axis in (latency, memory):
        axis.axvline(results[0].warmup_calls, color="grey", linestyle=":", label="warm-up end")
        axis.set_xlabel("optimize calls")
        axis.legend()
    latency.set_yscale("log")  # p50 and the p99 spikes on one axis
    latency.set_ylabel("optimize latency per window (ms, log scale)")
    memory.set_ylabel("process RSS (MB)")
    return save_figure(figure, path)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000, help="per store (1,000,000)")
    parser.add_argument("--stores", default="memory,redis", help="memory,redis (both)")
    parser.add_argument("--windows", type=int, default=100, help="measurement windows (100)")
    parser.add_argument("--warmup", type=float, default=0.1, help="warm-up share (0.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-conversations",
        type=int,
        default=PilotConfig.max_conversations,
        help="PilotConfig.max_conversations (the default configuration's)",
    )
    parser.add_argument(
        "--active",
        type=int,
        default=SoakShape.active,
        help=f"conversations open at once ({SoakShape.active})",
    )
    parser.add_argument("--redis-url", help="a Redis database to use (default: start one)")
    parser.add_argument("--json", type=Path, help="also write every window's figures here")
    parser.add_argument("--write", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--child", choices=STORES, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or any(s not in STORES for s in stores):
        parser.error(f"--stores takes a comma-separated list of {', '.join(STORES)}")
    if args.calls < 2 or args.windows < 2 or args.active < 1 or not 0 <= args.warmup < 1:
        parser.error("--calls and --windows must be >= 2, --active >= 1, --warmup in [0, 1)")
    args.stores = stores
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for store in args.stores:
            if store == "memory":
                results.append(run_child(store, args, None))
            elif args.redis_url:
                results.append(run_child(store, args, _with_fresh_prefix(args.redis_url)))
            else:
                with loopback_redis(Path(scratch)) as url:
                    results.append(run_child(store, args, url))
            r = results[-1]
            print(
                f"{store}: median {r.median_ms:.3f} ms, p99 {r.first.p99_ms:.3f} → "
                f"{r.last.p99_ms:.3f} ms, RSS {r.warm.rss_mb:,.0f} → {r.last.rss_mb:,.0f} MB",
                file=sys.stderr,
            )
    if args.plot:
        plot_soak(results, args.plot)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1), encoding="utf-8")
    text = markdown(results, argv, SoakShape(active=args.active), args.plot) + "\n"
    write_or_print(text, SECTION, args.write)
    return 0


def _with_fresh_prefix(url: str) -> str:
    """``url`` with a key prefix of this run's own, so that an earlier run's keys on
    the same database are neither read nor counted."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}key_prefix=soak-{secrets.token_hex(4)}:"


if __name__ == "__main__":
    sys.exit(main())
