"""RoutingClient over real llama-server replicas: mean TTFT per policy.

    benchmarks/engines/build_llama_server.sh        # once: llama-server + gemma-3-270m
    python benchmarks/llama_server_routing.py --write docs/benchmarks.md \\
        --plot docs/img/llama_server_routing.png

Fleet: ``--replicas`` llama-server processes on loopback (``-np --slots`` slots each,
``-t 1``, ``--swa-full``, gemma-3-270m Q4_K_M), started fresh for every policy so each
run begins cold. Workload: ``--users`` concurrent conversations of ``--turns`` turns from
the core's multi-turn RAG workload (``bench.workloads.multiturn_workload``: ``--k``
documents per turn, ~40% of a later turn's documents seen before in the conversation).
Every prompt is built by ``ContextPilot.optimize`` (reorder, de-duplicate, annotate)
with the conversation's id, sent with ``RoutingClient.complete`` (the model has no chat
template), and the model's answer is recorded into the conversation. Users start
``--stagger-s`` apart and send their next turn a seeded random pause (exponential, mean
``--think-s``) after the previous answer, so arrivals interleave irregularly.

Reported per policy: mean / p50 / p95 TTFT over all requests, ``cache_n`` and
``prompt_n`` totals (llama-server's ``timings``: prompt tokens served from a slot's
cache / computed), and the ratio of round-robin's mean TTFT to the policy's.

``--workload stream`` (open loop) instead sends ``--requests`` single-turn RAG requests
at seeded Poisson arrival times, at every rate of ``--rates`` (requests/s): the core's
topic-clustered workload (``bench.workloads.topic_workload``: ``--topics`` knowledge
bases of ``--docs-per-topic`` documents, Zipf popularity over topics and within each,
``--k`` documents per request). One ``ContextPilot`` builds every prompt once, in
arrival order, so every policy and rate sends the same prompts; the arrival times are
one seeded unit-rate sequence scaled by the rate. Each request is sent from its own
thread at its arrival time, whatever the others are doing::

    python benchmarks/llama_server_routing.py --workload stream --policies \\
        round-robin,combined --write docs/benchmarks.md --plot docs/img/llama_server_stream.png

``--workload chat`` sends the same conversations open loop: they start at seeded
Poisson times, at every rate of ``--conversation-rates`` (conversations/s), instead of
``--stagger-s`` apart, so the fleet sees new conversations arrive while others go on,
as a chat service does; each still waits for its answer and a pause before its next
turn::

    python benchmarks/llama_server_routing.py --workload chat --users 12 \\
        --conversation-rates 0.06 --policies round-robin,combined,combined:slots \\
        --write docs/benchmarks.md --plot docs/img/llama_server_chat.png   # ~13 min

A policy named ``NAME:slots`` routes over every slot of every server instead of over
the servers: one ``Endpoint(base_url, slot=i, max_cached_prompts=1)`` per slot, so each
request carries llama-server's ``id_slot`` and the router knows a slot keeps only its
last prompt; ``NAME`` alone (or ``NAME:servers``) lets llama-server choose the slot.
``--cache-ram`` sets llama-server's host-memory prompt cache (MiB; default: the
server's own), the same for every policy; with ``--cache-ram 0`` the closed-loop and
the chat runs write sections of their own (``-slot-cache``)::

    python benchmarks/llama_server_routing.py --workload chat --users 12 \\
        --conversation-rates 0.06 --policies round-robin,combined,combined:slots \\
        --cache-ram 0 --write docs/benchmarks.md \\
        --plot docs/img/llama_server_chat_slot_cache.png

A label may pass numeric options to the policy's constructor: ``NAME+OPTION=VALUE…``,
e.g. ``combined+eviction_weight=0:slots``. ``--workload chat --seeds 0,1,2 --repeats N``
runs the open-loop conversations at one rate ``N`` times per seed (cold fleets, the
policies taking turns) and compares every policy with the first, run by run
(section ``llama-server-chat-seeds``, ``-slot-cache`` with ``--cache-ram 0``)::

    python benchmarks/llama_server_routing.py --workload chat --users 12 \\
        --conversation-rates 0.06 --cache-ram 0 --seeds 0,1,2 --repeats 2 \\
        --policies combined+eviction_weight=0:slots,combined:slots \\
        --write docs/benchmarks.md --plot docs/img/llama_server_chat_seeds_slot_cache.png

``--section NAME`` writes the report under another section name, so the same run at
another rate keeps a section of its own (``llama-server-chat-seeds-slot-cache-heavy``:
the run above at 0.2 conversations/s).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lib.report import progress_bars
from lib.sections import provenance, write_section
from rich.console import Console

from contextpilot_rag import ConfigError, ContextBlock, ContextPilot, Prompt
from contextpilot_rag.bench.workloads import (
    Workload,
    WorkloadRequest,
    multiturn_workload,
    topic_workload,
)
from contextpilot_rag.routing import ChatResult, Endpoint, Policy, RoutingClient, make_policy
from contextpilot_rag.testing import LlamaEngine, LlamaServer, find_llama_server

ROOT = Path(__file__).resolve().parents[1]
RUN_NOTE = (
    "not measured: one run per policy (and rate), CPU only, the replicas sharing the "
    "machine's cores; TTFTs of a rerun differ, token counts less so"
)


@dataclass(frozen=True)
class Row:
    policy: str
    user: str
    turn: int
    endpoint: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Summary:
    policy: str
    requests: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    cache_n: int
    prompt_n: int
    rr_over_this: float = 0.0  # round-robin over the servers
    same_targets_over_this: float = 0.0  # round-robin over this policy's targets (0: not run)
    history_reuse: float | None = None  # multi-turn: see history_reuse()
    rr_spread: tuple[float, float] | None = None  # --repeats: min and max of rr_over_this

    @property
    def cached_share(self) -> float:
        total = self.cache_n + self.prompt_n
        return self.cache_n / total if total else 0.0


def measured(answer: ChatResult) -> tuple[str, float, float, int, int]:
    """What a row keeps of an answer: endpoint, TTFT, E2E, prompt and cached tokens."""
    return (
        answer.endpoint,
        answer.ttft_s,
        answer.e2e_s,
        answer.prompt_tokens or 0,
        answer.cached_tokens or 0,
    )


def conversations(workload: Workload) -> list[list[WorkloadRequest]]:
    """The workload's requests grouped by conversation, turns in order."""
    sessions: dict[str, list[WorkloadRequest]] = {}
    for request in workload.requests:
        sessions.setdefault(str(request.session), []).append(request)
    return list(sessions.values())


def policy_spec(label: str) -> tuple[str, bool]:
    """``NAME[+OPTION=VALUE…][:servers|:slots]`` → the policy name and whether it
    addresses slots."""
    head, _, address = label.partition(":")
    if address not in ("", "servers", "slots"):
        raise SystemExit(f"{label!r}: the address after ':' must be 'servers' or 'slots'")
    return head.partition("+")[0], address == "slots"


def labelled_policy(label: str) -> Policy:
    """The policy a label names, its ``+OPTION=VALUE`` parts (numbers) passed to the
    policy's constructor: ``combined+eviction_weight=1:slots`` is
    ``make_policy("combined", eviction_weight=1.0)`` over the slots."""
    name, *pairs = label.partition(":")[0].split("+")
    options: dict[str, float] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        try:  # integral text stays an int, for the count-valued options
            options[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise SystemExit(f"{label!r}: {pair!r} is not OPTION=NUMBER") from None
        if not (equals and key):
            raise SystemExit(f"{label!r}: {pair!r} is not OPTION=NUMBER")
    try:
        return make_policy(name, **options)
    except (ConfigError, TypeError) as exc:
        raise SystemExit(f"{label!r}: {exc}") from None


def cold_fleet(
    stack: ExitStack, label: str, engine: LlamaEngine, args: argparse.Namespace
) -> RoutingClient:
    """Fresh llama-server replicas and a client routing over them (or over their
    slots) with the policy of ``label``; both stop when ``stack`` closes."""
    extra = ("--cache-ram", str(args.cache_ram)) if args.cache_ram is not None else ()
    servers = [
        stack.enter_context(
            LlamaServer(
                engine,
                slots=args.slots,
                context_tokens=args.context * args.slots,
                extra_args=extra,
            )
        )
        for _ in range(args.replicas)
    ]
    by_slot = policy_spec(label)[1]
    rates = {"prefill_tokens_per_s": args.prefill_rate, "decode_tokens_per_s": 40.0}
    endpoints = (
        [
            Endpoint(s.base_url, slot=slot, max_cached_prompts=1, **rates)
            for s in servers
            for slot in range(args.slots)
        ]
        if by_slot
        else [Endpoint(s.base_url, **rates) for s in servers]
    )
    return stack.enter_context(
        RoutingClient(
            endpoints, model=LlamaServer.model_name, policy=labelled_policy(label), timeout_s=600
        )
    )


def run_policy(
    policy: str,
    engine: LlamaEngine,
    workload: Workload,
    args: argparse.Namespace,
    advance: Callable[[], None],
    starts: Sequence[float],
) -> list[Row]:
    """One cold fleet, all users concurrently, user ``i`` starting ``starts[i]`` seconds
    after the fleet is up; the rows of every request."""
    sessions = conversations(workload)
    corpus, system = workload.corpus, workload.system_prompt
    with ExitStack() as stack:
        client = cold_fleet(stack, policy, engine, args)
        pilot = ContextPilot()
        rows: list[Row] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        started = time.monotonic()

        def user(number: int, requests: Sequence[WorkloadRequest]) -> None:
            time.sleep(max(0.0, started + starts[number] - time.monotonic()))
            think = random.Random(args.seed * 1000 + number)  # the same pauses for every policy
            try:
                for request in requests:
                    if request.turn:
                        time.sleep(think.expovariate(1 / args.think_s) if args.think_s else 0)
                    blocks = [ContextBlock(text=corpus[d], id=d) for d in request.doc_ids]
                    session = str(request.session)
                    prompt = pilot.optimize(
                        blocks, request.query, conversation_id=session, system=system
                    )
                    answer = client.complete(prompt, max_tokens=args.max_tokens, temperature=0)
                    pilot.record_answer(prompt, answer.text)
                    row = Row(policy, session, request.turn, *measured(answer))
                    with lock:
                        rows.append(row)
                    advance()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [
            threading.Thread(target=user, args=(i, requests)) for i, requests in enumerate(sessions)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return rows


@dataclass(frozen=True)
class StreamRow:
    policy: str
    rate_per_s: float
    index: int
    arrival_s: float
    endpoint: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    target: str  # the routing target: a server, or one slot of it
    predicted_cached_tokens: int


def stream_workload(args: argparse.Namespace) -> Workload:
    """The stream's topic workload from the command line (``--topics``,
    ``--docs-per-topic``, ``--requests``, ``--k``, ``--seed``)."""
    return topic_workload(
        n_topics=args.topics,
        docs_per_topic=args.docs_per_topic,
        n_requests=args.requests,
        k=args.k,
        seed=args.seed,
    )


def stream_prompts(workload: Workload) -> list[Prompt]:
    """Every request's prompt, built in arrival order by one ``ContextPilot``."""
    pilot = ContextPilot()
    return [
        pilot.optimize(
            [ContextBlock(text=workload.corpus[d], id=d) for d in request.doc_ids],
            request.query,
            system=workload.system_prompt,
        )
        for request in workload.requests
    ]


def unit_arrivals(count: int, seed: int) -> list[float]:
    """Arrival times (s) of a seeded Poisson process of rate 1; divided by a rate, the
    same sequence at that rate."""
    rng = random.Random(seed)
    return list(itertools.accumulate(rng.expovariate(1.0) for _ in range(count)))


def dispatch(arrivals: Sequence[float], send: Callable[[int], None]) -> None:
    """``send(i)`` in a thread of its own at ``arrivals[i]`` seconds from now; returns
    when every send has returned."""
    threads: list[threading.Thread] = []
    start = time.monotonic()
    for index, arrival in enumerate(arrivals):
        time.sleep(max(0.0, start + arrival - time.monotonic()))
        thread = threading.Thread(target=send, args=(index,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


def run_stream(
    policy: str,
    engine: LlamaEngine,
    prompts: Sequence[Prompt],
    rate_per_s: float,
    args: argparse.Namespace,
    advance: Callable[[], None],
) -> list[StreamRow]:
    """One cold fleet, the prompts sent open loop at ``rate_per_s``; a row per request."""
    arrivals = [t / rate_per_s for t in unit_arrivals(len(prompts), args.seed)]
    rows: list[StreamRow] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    with ExitStack() as stack:
        client = cold_fleet(stack, policy, engine, args)

        def send(index: int) -> None:
            try:
                answer = client.complete(prompts[index], max_tokens=args.max_tokens, temperature=0)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                return
            decision = answer.decision
            row = StreamRow(
                policy,
                rate_per_s,
                index,
                arrivals[index],
                *measured(answer),
                decision.replica_id,
                decision.predicted_cached_tokens,
            )
            with lock:
                rows.append(row)
            advance()

        dispatch(arrivals, send)
    if errors:
        raise errors[0]
    return sorted(rows, key=lambda row: row.index)


def history_reuse(rows: Sequence[Row]) -> float | None:
    """On turns after the first, the share of each conversation's previous prompt that
    the engine served from cache: the most any routing can reuse there (a turn's
    prompt starts with the previous one, and a prefix of another conversation is no
    longer than the shared system prompt). ``None`` without later turns."""
    previous = {(r.user, r.turn): r.prompt_tokens for r in rows}
    reused = possible = 0
    for r in rows:
        before = previous.get((r.user, r.turn - 1)) if r.turn else None
        if before:
            reused += min(r.cached_tokens, before)
            possible += before
    return reused / possible if possible else None


def summarise(policy: str, rows: Sequence[Row | StreamRow]) -> Summary:
    ttfts = sorted(r.ttft_s for r in rows)
    turns = [r for r in rows if isinstance(r, Row)]
    return Summary(
        policy,
        len(rows),
        statistics.fmean(ttfts),
        statistics.median(ttfts),
        ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        sum(r.cached_tokens for r in rows),
        sum(r.prompt_tokens - r.cached_tokens for r in rows),
        history_reuse=history_reuse(turns) if len(turns) == len(rows) else None,
    )


def markdown(summaries: Sequence[Summary], args: argparse.Namespace, command: str) -> str:
    lines = [
        f"## RoutingClient over real llama-server replicas{slot_caches_only(args)}: "
        "`benchmarks/llama_server_routing.py`",
        "",
        provenance(command, 1, RUN_NOTE),
        "",
        f"{engine_line(args)}; {cache_ram_text(args)}. "
        f"{SLOT_ADDRESSING + ' ' if by_slots(args) else ''}"
        f"Workload: {args.users} concurrent conversations × {args.turns} turns, "
        f"{args.k} documents per turn (multi-turn RAG workload of the core, seed {args.seed}), "
        f"users {args.stagger_s} s apart, pauses between turns exponential with mean "
        f"{args.think_s} s; "
        "prompts from `ContextPilot.optimize`, sent as completions with "
        f"`max_tokens={args.max_tokens}`.",
        "",
        f"| policy | requests | mean TTFT s | p50 s | p95 s | {RATIO_COLUMNS} "
        "| cache_n | prompt_n | cached share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {s.policy} | {summary_cells(s)} |" for s in summaries]
    if args.plot:
        lines += ["", f"![mean TTFT per policy](img/{args.plot.name})"]
    return "\n".join(lines)


def plot(summaries: Sequence[Summary], rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [s.policy for s in summaries]
    left.bar(names, [s.ttft_mean_s for s in summaries], color="tab:blue")
    left.tick_params(axis="x", labelrotation=20)
    left.set_ylabel("mean TTFT (s)")
    left.set_title("mean TTFT per policy")
    for s in summaries:
        turns = sorted({r.turn for r in rows if r.policy == s.policy})
        means = [
            statistics.fmean(r.ttft_s for r in rows if r.policy == s.policy and r.turn == t)
            for t in turns
        ]
        right.plot([t + 1 for t in turns], means, marker="o", label=s.policy)
    right.set_xlabel("turn")
    right.set_ylabel("mean TTFT (s)")
    right.set_title("by conversation turn")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def with_ratios(summaries: Sequence[Summary]) -> list[Summary]:
    """The summaries with round-robin's mean TTFT over each one's: round-robin over the
    servers (llama-server picks the slot), and round-robin over the same targets as the
    policy (the servers, or every slot addressed separately); 0 where it did not run."""
    rr = {
        policy_spec(s.policy)[1]: s.ttft_mean_s
        for s in summaries
        if policy_spec(s.policy)[0] == "round-robin"
    }

    def ratio(by_slot: bool, s: Summary) -> float:
        return rr[by_slot] / s.ttft_mean_s if by_slot in rr else 0.0

    return [
        Summary(
            **{
                **asdict(s),
                "rr_over_this": ratio(False, s),
                "same_targets_over_this": ratio(policy_spec(s.policy)[1], s),
            }
        )
        for s in summaries
    ]


RATIO_COLUMNS = "round-robin (servers) mean / this | round-robin (same targets) mean / this"


def summary_cells(s: Summary) -> str:
    return (
        f"{s.requests} | {s.ttft_mean_s:.2f} | {s.ttft_p50_s:.2f} | {s.ttft_p95_s:.2f} "
        f"| {_times(s.rr_over_this)} | {_times(s.same_targets_over_this)} "
        f"| {s.cache_n:,} | {s.prompt_n:,} | {s.cached_share:.1%}"
    )


def _seeds_spread(repeats: int) -> str:
    if repeats == 1:
        return "one run per seed; ratios within each seed's run"
    return (
        f"{repeats} runs per seed (a cold fleet each); per seed the median of the runs' "
        "mean TTFT and of their ratios (each within its run), the ratio's min–max in brackets"
    )


def _range(spread: tuple[float, float] | None) -> str:
    return "" if spread is None else f" ({spread[0]:.2f}–{spread[1]:.2f}×)"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _times(ratio: float) -> str:
    return f"{ratio:.2f}×" if ratio else "–"


def engine_line(args: argparse.Namespace) -> str:
    cache_ram = f" --cache-ram {args.cache_ram}" if args.cache_ram is not None else ""
    return (
        f"Engine: llama.cpp `llama-server` (llama-cpp-python 0.3.36 sources), gemma-3-270m "
        f"Q4_K_M; {args.replicas} replicas, each `-np {args.slots} "
        f"-c {args.context * args.slots} -t 1 --swa-full{cache_ram}`, started cold for "
        "every policy"
    )


def idle_prefill_rate(rows: Sequence[StreamRow]) -> float:
    """Prefill tokens/s of an idle replica: the median, over runs, of the computed
    tokens over the TTFT of each run's first request (sent to a cold, idle fleet)."""
    return statistics.median(
        (r.prompt_tokens - r.cached_tokens) / r.ttft_s for r in rows if r.index == 0
    )


def print_by_rate(by_rate: dict[float, list[Summary]], rate_key: str) -> None:
    """Every (rate, policy) summary as one JSON list on stdout."""
    print(
        json.dumps(
            [
                asdict(s) | {rate_key: rate, "cached_share": s.cached_share}
                for rate, summaries in by_rate.items()
                for s in summaries
            ]
        )
    )


SLOT_ADDRESSING = (
    "A policy marked `:slots` routes over every slot of every server: one target per slot, "
    "`Endpoint(url, slot=i, max_cached_prompts=1)`, each request carrying llama-server's "
    "`id_slot`; unmarked policies route over the servers and llama-server picks the slot."
)


def slot_caches_only(args: argparse.Namespace) -> str:
    """A heading's words for a run without llama-server's host-memory prompt cache, so
    sections that differ only in it (or in the rate) do not share a heading."""
    return ", slot caches only" if args.cache_ram == 0 else ""


def open_loop_header(
    title: str,
    workload: str,
    args: argparse.Namespace,
    command: str,
    runs: tuple[int, str] = (1, RUN_NOTE),
) -> list[str]:
    """The heading, machine and engine paragraphs of an open-loop section; ``runs``:
    how many runs it reports and how they spread."""
    return [
        f"## RoutingClient over real llama-server replicas, {title}: "
        f"`benchmarks/llama_server_routing.py --workload {workload}`",
        "",
        provenance(command, *runs),
        "",
        f"{engine_line(args)} (one fresh fleet per rate and policy); llama-server's "
        f"defaults otherwise, the same for every policy: {cache_ram_text(args)}, slot "
        "chosen by prompt similarity (`-sps 0.1`) unless the client addresses it, "
        f"continuous batching. {SLOT_ADDRESSING}",
        "",
    ]


def stream_markdown(
    by_rate: dict[float, list[Summary]],
    prefill_rate: float,
    args: argparse.Namespace,
    command: str,
) -> str:
    """The open-loop section: one table row per (rate, policy)."""
    prompt_tokens = statistics.fmean(
        (s.cache_n + s.prompt_n) / s.requests for summaries in by_rate.values() for s in summaries
    )
    capacity = args.replicas * prefill_rate  # prefill tokens/s of the fleet

    def load(rate: float, tokens_per_request: float) -> str:
        return f"{rate * tokens_per_request / capacity:.2f}"

    offered = ", ".join(f"{rate:g}/s: {load(rate, prompt_tokens)}" for rate in by_rate)
    title = "slot-addressed " if by_slots(args) else ""
    lines = [
        *open_loop_header(f"{title}open-loop RAG stream", "stream", args, command),
        f"Workload: {args.requests} single-turn requests from the core's topic-clustered "
        f"workload (`bench.workloads.topic_workload`: {args.topics} topics of "
        f"{args.docs_per_topic} documents, Zipf popularity over topics and within each, "
        f"{args.k} documents per request, seed {args.seed}), every prompt built once by one "
        "`ContextPilot.optimize` in arrival order (the same prompts for every policy and "
        f"rate; {prompt_tokens:,.0f} prompt tokens per request on average), sent as "
        f"completions with `max_tokens={args.max_tokens}` from a thread per request at "
        "seeded Poisson arrival times (one unit-rate sequence, scaled by the rate). "
        f"Prefill rate of an idle replica: {prefill_rate:.0f} tokens/s (computed tokens "
        "over TTFT of each run's first request, median over runs). Offered prefill load "
        "if nothing were cached (rate × prompt tokens / "
        f"({args.replicas} × {prefill_rate:.0f} tokens/s)): {offered}. *load* below is the "
        "same with each policy's computed tokens (`prompt_n`) per request; above 1 the "
        "fleet cannot keep up and queues grow for as long as requests arrive.",
        "",
        f"| rate /s | policy | requests | mean TTFT s | p50 s | p95 s | {RATIO_COLUMNS} "
        "| cache_n | prompt_n | cached share | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate, summaries in by_rate.items():
        lines += [
            f"| {rate:g} | {s.policy} | {summary_cells(s)} "
            f"| {load(rate, s.prompt_n / s.requests)} |"
            for s in summaries
        ]
    if args.plot:
        lines += ["", f"![mean TTFT per rate and policy](img/{args.plot.name})"]
    return "\n".join(lines)


def by_slots(args: argparse.Namespace) -> bool:
    """Whether any policy of the run addresses slots."""
    return any(policy_spec(p)[1] for p in args.policies.split(",") if p.strip())


def cache_ram_text(args: argparse.Namespace) -> str:
    if args.cache_ram == 0:
        return "host-memory prompt cache off (`--cache-ram 0`)"
    size = 8192 if args.cache_ram is None else args.cache_ram
    return (
        f"host-memory prompt cache `--cache-ram {size}` (a prompt evicted from a slot can "
        "be restored into any slot of the same server)"
    )


def plot_stream(by_rate: dict[float, list[Summary]], rows: Sequence[StreamRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rates = list(by_rate)
    policies = [s.policy for s in by_rate[rates[0]]]
    for policy in policies:
        means = [next(s.ttft_mean_s for s in by_rate[r] if s.policy == policy) for r in rates]
        left.plot(rates, means, marker="o", label=policy)
        top = [r for r in rows if r.policy == policy and r.rate_per_s == rates[-1]]
        right.plot([r.arrival_s for r in top], [r.ttft_s for r in top], ".-", label=policy)
    left.set_xlabel("arrival rate (requests/s)")
    left.set_ylabel("mean TTFT (s)")
    left.set_title("mean TTFT per arrival rate")
    left.legend()
    right.set_xlabel("arrival time (s)")
    right.set_ylabel("TTFT (s)")
    right.set_title(f"every request at {rates[-1]:g}/s")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def conversation_workload(args: argparse.Namespace) -> Workload:
    """The conversations of ``--users`` × ``--turns`` (``--k``, ``--seed``)."""
    return multiturn_workload(
        n_sessions=args.users,
        turns=args.turns,
        interleave=args.users,
        k=args.k,
        n_docs=400,
        seed=args.seed,
    )


def closed_loop(
    policies: Sequence[str],
    engine: LlamaEngine,
    args: argparse.Namespace,
    progress: Callable[[str, int], Callable[[], None]],
    label: str = "",
) -> tuple[list[Row], list[Summary]]:
    """The closed-loop conversations of ``args`` (its seed) under every policy, each
    on a cold fleet: every request's row, and each policy's summary with its ratios.
    ``label`` prefixes the progress bars."""
    workload = conversation_workload(args)
    starts = [number * args.stagger_s for number in range(args.users)]
    rows: list[Row] = []
    for policy in policies:
        advance = progress(f"{label}{policy}", len(workload.requests))
        rows += run_policy(policy, engine, workload, args, advance, starts)
    return rows, with_ratios([summarise(p, [r for r in rows if r.policy == p]) for p in policies])


def multiturn_benchmark(
    policies: Sequence[str], engine: LlamaEngine, args: argparse.Namespace, command: str
) -> str:
    """Run the closed-loop conversations under every policy; their section."""
    with progress_bars() as progress:
        rows, summaries = closed_loop(policies, engine, args, progress)
    if args.plot:
        plot(summaries, rows, args.plot)
    if args.json:
        print(json.dumps([asdict(s) | {"cached_share": s.cached_share} for s in summaries]))
    return markdown(summaries, args, command)


SEEDS_TARGET = 1.5  # issue 22, item 6: combined over round-robin, on every seed


def seeds_benchmark(
    policies: Sequence[str], engine: LlamaEngine, args: argparse.Namespace, command: str
) -> str:
    """The closed-loop conversations ``--repeats`` times per seed of ``--seeds`` (each
    seed its own conversations and pauses, a cold fleet per policy, seed and repeat);
    per seed, round-robin's mean TTFT over each policy's (the median over the repeats),
    and the worst seed against the target."""
    seeds = parse_seeds(args.seeds)
    by_seed: dict[int, list[Summary]] = {}
    every: list[str] = []  # --rows: each request, with its seed and repeat
    with progress_bars() as progress:
        for seed in seeds:
            seeded = with_seed(args, seed)
            runs = []
            for repeat in range(args.repeats):
                label = f"seed {seed}" + (f" #{repeat + 1}" if args.repeats > 1 else "") + ": "
                rows, summaries = closed_loop(policies, engine, seeded, progress, label)
                runs.append(summaries)
                keep_rows(every, rows, seed, repeat, args.rows)
            by_seed[seed] = combine_repeats(runs)
    if args.json:
        print(json.dumps({seed: [asdict(s) for s in rows] for seed, rows in by_seed.items()}))
    return seeds_markdown(by_seed, policies, args, command)


def with_seed(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    """The command line's arguments with ``seed`` in place of ``--seed``."""
    return argparse.Namespace(**(vars(args) | {"seed": seed}))


def keep_rows(
    every: list[str], rows: Sequence[Row], seed: int, repeat: int, path: Path | None
) -> None:
    """Add ``rows``, tagged with their seed and repeat, to ``every`` as JSON lines and,
    with ``--rows``, rewrite that file after every run: a long benchmark keeps what it
    measured."""
    every += [json.dumps({"seed": seed, "repeat": repeat} | asdict(row)) + "\n" for row in rows]
    if path:
        path.write_text("".join(every), encoding="utf-8")


def combine_repeats(runs: Sequence[Sequence[Summary]]) -> list[Summary]:
    """One summary per policy from repeated runs of one seed (each run's summaries
    with their ratios): the median of the runs' mean TTFT, of their ratios to the same
    run's round-robin and of their previous-prompt reuse; ``rr_spread`` the ratio's
    min and max. One run is returned as it is."""
    if len(runs) == 1:
        return list(runs[0])
    combined = []
    for first in runs[0]:
        mine = [next(s for s in run if s.policy == first.policy) for run in runs]
        ratios = [s.rr_over_this for s in mine]
        reuse = [s.history_reuse for s in mine if s.history_reuse is not None]
        combined.append(
            replace(
                first,
                ttft_mean_s=statistics.median(s.ttft_mean_s for s in mine),
                rr_over_this=statistics.median(ratios),
                history_reuse=statistics.median(reuse) if reuse else None,
                rr_spread=(min(ratios), max(ratios)),
            )
        )
    return combined


def seeds_markdown(
    by_seed: dict[int, list[Summary]],
    policies: Sequence[str],
    args: argparse.Namespace,
    command: str,
) -> str:
    others = [p for p in policies if policy_spec(p)[0] != "round-robin"]
    header = " | ".join(
        f"{p}: mean TTFT s | {p}: previous prompt cached | round-robin / {p}" for p in others
    )
    lines = [
        "## RoutingClient over real llama-server replicas, several seeds: "
        "`benchmarks/llama_server_routing.py --seeds`",
        "",
        provenance(command, len(by_seed) * args.repeats, _seeds_spread(args.repeats)),
        "",
        f"{engine_line(args)}; {cache_ram_text(args)}. Workload per seed: {args.users} "
        f"concurrent conversations × {args.turns} turns, {args.k} documents per turn (the "
        "core's multi-turn RAG workload with that seed: other documents, other pauses), "
        f"users {args.stagger_s} s apart, pauses exponential with mean {args.think_s} s. "
        "*Previous prompt cached*: on turns after the first, the share of the "
        "conversation's previous prompt the engine served from cache — 100% is the most "
        "any routing can reuse there.",
        "",
        f"| seed | round-robin: mean TTFT s | round-robin: previous prompt cached | {header} |",
        "|---:|---:|---:|" + "---:|---:|---:|" * len(others),
    ]
    for seed, summaries in by_seed.items():
        named = {s.policy: s for s in summaries}
        cells = " | ".join(
            f"{named[p].ttft_mean_s:.2f} | {_share(named[p].history_reuse)} | "
            f"{_times(named[p].rr_over_this)}{_range(named[p].rr_spread)}"
            for p in others
        )
        rr = named["round-robin"]
        lines.append(f"| {seed} | {rr.ttft_mean_s:.2f} | {_share(rr.history_reuse)} | {cells} |")
    for policy in others:
        mine = [next(s for s in rows if s.policy == policy) for rows in by_seed.values()]
        ratios = [s.rr_over_this for s in mine]
        reuse = [s.history_reuse for s in mine if s.history_reuse is not None]
        worst = min(ratios)
        lines += [
            "",
            f"`{policy}` over round-robin, mean TTFT: min {worst:.2f}×, median "
            f"{statistics.median(ratios):.2f}×, max {max(ratios):.2f}× over {len(ratios)} seeds; "
            f"target (issue 22, item 6): at least {SEEDS_TARGET}× on every seed: "
            f"{'met' if worst >= SEEDS_TARGET else 'not met'}."
            + (
                f" Previous prompt served from cache on later turns: min "
                f"{_share(min(reuse))} over the seeds."
                if reuse
                else ""
            ),
        ]
    return "\n".join(lines)


def chat_benchmark(
    policies: Sequence[str], engine: LlamaEngine, args: argparse.Namespace, command: str
) -> str:
    """Run the open-loop conversations at every rate under every policy; their section."""
    workload = conversation_workload(args)
    rates = [float(r) for r in args.conversation_rates.split(",") if r.strip()]
    runs: dict[tuple[float, str], list[Row]] = {}
    with progress_bars() as progress:
        for rate in rates:
            starts = [t / rate for t in unit_arrivals(args.users, args.seed)]
            for policy in policies:
                advance = progress(f"{rate:g}/s {policy}", len(workload.requests))
                runs[rate, policy] = run_policy(policy, engine, workload, args, advance, starts)
    by_rate = {rate: with_ratios([summarise(p, runs[rate, p]) for p in policies]) for rate in rates}
    # prefill rate of an idle replica: each run's first answer, sent to a cold idle fleet
    idle_rate = statistics.median(
        (rows[0].prompt_tokens - rows[0].cached_tokens) / rows[0].ttft_s for rows in runs.values()
    )
    if args.plot:
        plot_chat(by_rate, runs, args.plot)
    if args.json:
        print_by_rate(by_rate, "conversations_per_s")
    return chat_markdown(by_rate, idle_rate, args, command)


def chat_markdown(
    by_rate: dict[float, list[Summary]],
    prefill_rate: float,
    args: argparse.Namespace,
    command: str,
) -> str:
    """The open-loop conversation section: one table row per (rate, policy)."""
    capacity = args.replicas * prefill_rate  # prefill tokens/s of the fleet

    def load(rate: float, s: Summary) -> str:  # computed tokens per conversation × rate
        return f"{rate * s.prompt_n / args.users / capacity:.2f}"

    lines = [
        *open_loop_header(
            f"open-loop conversations{slot_caches_only(args)}", "chat", args, command
        ),
        f"Workload: {args.users} conversations × {args.turns} turns of the core's multi-turn "
        f"RAG workload ({args.k} documents per turn, seed {args.seed}; "
        "what the closed-loop run sends for these sizes), but open loop: conversations start at "
        "seeded Poisson times (one unit-rate sequence scaled by the rate, the same for every "
        "policy), and each sends its next turn a seeded exponential pause (mean "
        f"{args.think_s} s) after the previous answer. Prompts from `ContextPilot.optimize` "
        "with the conversation's id, the answer recorded into the conversation, sent as "
        f"completions with `max_tokens={args.max_tokens}`. Prefill rate of an idle replica: "
        f"{prefill_rate:.0f} tokens/s (each run's first answer, median over runs). *load*: "
        "conversations/s × computed tokens (`prompt_n`) per conversation / "
        f"({args.replicas} × {prefill_rate:.0f} tokens/s), the fraction of the fleet's "
        "prefill time the policy's computed tokens take at that rate.",
        "",
        "| conversations /s | policy | requests | mean TTFT s | p50 s | p95 s | "
        f"{RATIO_COLUMNS} | cache_n | prompt_n | cached share | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate, summaries in by_rate.items():
        lines += [
            f"| {rate:g} | {s.policy} | {summary_cells(s)} | {load(rate, s)} |" for s in summaries
        ]
    if args.plot:
        lines += ["", f"![mean TTFT per rate and policy](img/{args.plot.name})"]
    return "\n".join(lines)


def chat_seeds_benchmark(
    policies: Sequence[str], engine: LlamaEngine, args: argparse.Namespace, command: str
) -> str:
    """The open-loop conversations at the one rate of ``--conversation-rates``,
    ``--repeats`` times per seed of ``--seeds`` (each seed its own conversations, start
    times and pauses; a cold fleet per policy, seed and repeat; the policies take turns
    within a repeat); their section, comparing every policy with the first one."""
    rate = float(args.conversation_rates)
    runs: dict[int, list[list[Summary]]] = {}  # seed → repeats → one summary per policy
    every: list[str] = []  # --rows: each request, with its seed and repeat
    with progress_bars() as progress:
        for seed in parse_seeds(args.seeds):
            seeded = with_seed(args, seed)
            workload = conversation_workload(seeded)
            starts = [t / rate for t in unit_arrivals(args.users, seed)]
            for repeat in range(args.repeats):
                summaries = []
                for policy in policies:
                    label = f"seed {seed} #{repeat + 1}: {policy}"
                    advance = progress(label, len(workload.requests))
                    rows = run_policy(policy, engine, workload, seeded, advance, starts)
                    summaries.append(summarise(policy, rows))
                    keep_rows(every, rows, seed, repeat, args.rows)
                runs.setdefault(seed, []).append(summaries)
    if args.plot:
        plot_chat_seeds(runs, policies, args.plot)
    if args.json:
        print(
            json.dumps({seed: [[asdict(s) for s in run] for run in r] for seed, r in runs.items()})
        )
    return chat_seeds_markdown(runs, policies, rate, args, command)


def parse_seeds(text: str) -> list[int]:
    return [int(seed) for seed in text.split(",") if seed.strip()]


def _median_range(values: Sequence[float], form: str) -> str:
    """The median of ``values`` in ``form``, their min–max in brackets when several."""
    middle = form.format(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({form.format(min(values))}–{form.format(max(values))})"


def chat_seeds_markdown(
    runs: dict[int, list[list[Summary]]],
    policies: Sequence[str],
    rate: float,
    args: argparse.Namespace,
    command: str,
) -> str:
    """One table row per (seed, policy): the median over the repeats of the mean TTFT,
    of the cached share and of the first policy's mean TTFT over this one's (each
    within its repeat), min–max in brackets; then each policy over every run."""
    first = policies[0]
    count = sum(len(r) for r in runs.values())

    def column(
        seed: int | None, policy: str, value: Callable[[Summary, Summary], float]
    ) -> list[float]:
        seeds = list(runs) if seed is None else [seed]
        return [value(run[policies.index(policy)], run[0]) for s in seeds for run in runs[s]]

    lines = [
        *open_loop_header(
            f"open-loop conversations{slot_caches_only(args)}, {rate:g} conversations/s, "
            "several seeds",
            "chat --seeds",
            args,
            command,
            (count * len(policies), "cold-fleet runs; each cell's min–max below"),
        ),
        f"Workload per seed: {args.users} conversations × {args.turns} turns of the core's "
        f"multi-turn RAG workload ({args.k} documents per turn) with that seed, started at "
        f"{rate:g} conversations/s at seeded Poisson times, pauses exponential with mean "
        f"{args.think_s} s, `max_tokens={args.max_tokens}` — the `--workload chat` run, "
        f"{args.repeats} cold-fleet runs per policy and seed, the policies taking turns "
        f"within each repeat. Each cell: the median over the repeats, min–max in brackets; "
        f"*{first} / this*: `{first}`'s mean TTFT over the policy's, within the same repeat.",
        "",
        f"| seed | policy | mean TTFT s | cached share | {first} / this |",
        "|---:|---|---:|---:|---:|",
    ]

    def over_first(s: Summary, base: Summary) -> float:  # the first policy's TTFT / this
        return base.ttft_mean_s / s.ttft_mean_s

    for seed in runs:
        for policy in policies:
            ttft = column(seed, policy, lambda s, _: s.ttft_mean_s)
            share = column(seed, policy, lambda s, _: 100 * s.cached_share)
            ratio = column(seed, policy, over_first)
            versus = _median_range(ratio, "{:.2f}×") if policy != first else "–"
            lines.append(
                f"| {seed} | {policy} | {_median_range(ttft, '{:.2f}')} "
                f"| {_median_range(share, '{:.1f}%')} | {versus} |"
            )
    lines.append("")
    for policy in policies[1:]:
        ratios = column(None, policy, over_first)
        shares = column(None, policy, lambda s, base: 100 * (s.cached_share - base.cached_share))
        per_seed = [statistics.median(column(seed, policy, over_first)) for seed in runs]
        lines.append(
            f"- `{policy}` against `{first}` over all {count} runs: mean TTFT lower in "
            f"{sum(r > 1 for r in ratios)}, median ratio {statistics.median(ratios):.2f}× "
            f"(worst seed's median {min(per_seed):.2f}×), cached share "
            f"{statistics.median(shares):+.1f} points (median of the differences)."
        )
    if args.plot:
        lines += ["", f"![every run's mean TTFT and cached share per seed](img/{args.plot.name})"]
    return "\n".join(lines)


def plot_chat_seeds(
    runs: dict[int, list[list[Summary]]], policies: Sequence[str], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    seeds = list(runs)
    width = 0.6 / max(1, len(policies))
    for number, policy in enumerate(policies):
        measures: list[tuple[Any, Callable[[Summary], float]]] = [
            (left, lambda s: s.ttft_mean_s),
            (right, lambda s: 100 * s.cached_share),
        ]
        for axis, value in measures:
            xs = [
                i + (number - (len(policies) - 1) / 2) * width
                for i, seed in enumerate(seeds)
                for _ in runs[seed]
            ]
            ys = [value(run[number]) for seed in seeds for run in runs[seed]]
            axis.scatter(xs, ys, label=policy, alpha=0.8)
    for axis, label in ((left, "mean TTFT (s)"), (right, "cached share (%)")):
        axis.set_xticks(range(len(seeds)), [str(seed) for seed in seeds])
        axis.set_xlabel("seed (every run)")
        axis.set_ylabel(label)
        axis.legend()
    left.set_title("mean TTFT per run")
    right.set_title("share of prompt tokens served from cache")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_chat(
    by_rate: dict[float, list[Summary]], runs: dict[tuple[float, str], list[Row]], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rates = list(by_rate)
    for s in by_rate[rates[0]]:
        means = [next(x.ttft_mean_s for x in by_rate[r] if x.policy == s.policy) for r in rates]
        left.plot(rates, means, marker="o", label=s.policy)
        rows = runs[rates[-1], s.policy]
        turns = sorted({r.turn for r in rows})
        right.plot(
            [t + 1 for t in turns],
            [statistics.fmean(r.ttft_s for r in rows if r.turn == t) for t in turns],
            marker="o",
            label=s.policy,
        )
    left.set_xlabel("conversations started per second")
    left.set_ylabel("mean TTFT (s)")
    left.set_title("mean TTFT per arrival rate")
    left.legend()
    right.set_xlabel("turn")
    right.set_ylabel("mean TTFT (s)")
    right.set_title(f"by conversation turn at {rates[-1]:g}/s")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stream_benchmark(
    policies: Sequence[str], engine: LlamaEngine, args: argparse.Namespace, command: str
) -> str:
    """Run the open-loop stream at every rate under every policy; its section."""
    prompts = stream_prompts(stream_workload(args))
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    rows: list[StreamRow] = []
    with progress_bars() as progress:
        for rate in rates:
            for policy in policies:
                advance = progress(f"{rate:g}/s {policy}", len(prompts))
                rows += run_stream(policy, engine, prompts, rate, args, advance)
    by_rate = {
        rate: with_ratios(
            [
                summarise(p, [r for r in rows if r.policy == p and r.rate_per_s == rate])
                for p in policies
            ]
        )
        for rate in rates
    }
    if args.plot:
        plot_stream(by_rate, rows, args.plot)
    if args.rows:
        args.rows.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows), encoding="utf-8")
    if args.json:
        print_by_rate(by_rate, "rate_per_s")
    return stream_markdown(by_rate, idle_prefill_rate(rows), args, command)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="round-robin,least-load,ranvier,combined")
    parser.add_argument("--workload", choices=("multiturn", "chat", "stream"), default="multiturn")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--context", type=int, default=8192, help="tokens per slot")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stagger-s", type=float, default=0.5)
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause between turns")
    parser.add_argument("--rates", default="0.12,0.4", help="stream: requests/s, comma-separated")
    parser.add_argument(
        "--conversation-rates", default="0.03,0.06", help="chat: conversations/s, comma-separated"
    )
    parser.add_argument("--requests", type=int, default=48, help="stream: requests per run")
    parser.add_argument("--topics", type=int, default=8, help="stream: knowledge bases")
    parser.add_argument("--docs-per-topic", type=int, default=8)
    parser.add_argument("--prefill-rate", type=float, default=400.0, help="tokens/s (ENGINES.md)")
    parser.add_argument("--cache-ram", type=int, help="llama-server --cache-ram MiB (0: off)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds",
        help="multi-turn: run once per seed of this comma-separated list and write the "
        "llama-server-seeds section (every seed's ratios, the worst against the target); "
        "chat: the same at one conversation rate, comparing every policy with the first "
        "(llama-server-chat-seeds)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="with --seeds: cold-fleet runs per policy and seed; a seed's ratio is the "
        "median over them (default 1)",
    )
    parser.add_argument(
        "--section",
        help="the section of --write to write (default: named by the workload and "
        "--cache-ram), e.g. for a chat --seeds run at a second rate beside the first; "
        "llama-server-… in lower-case letters, digits and hyphens",
    )
    parser.add_argument("--write", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rows", type=Path, help="stream and --seeds: every request as JSON lines")
    return parser


def main() -> None:
    arguments = parser()
    args = arguments.parse_args()
    if args.repeats < 1:
        arguments.error("--repeats must be at least 1")
    if args.seeds and args.workload == "chat" and "," in args.conversation_rates.strip(", "):
        arguments.error("chat --seeds runs one rate: give --conversation-rates a single value")
    if args.section is not None and not re.fullmatch(r"llama-server(-[a-z0-9]+)+", args.section):
        arguments.error(f"--section {args.section!r} is not llama-server-… (a-z, 0-9, hyphens)")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for label in policies:  # a bad label stops the run before any engine starts
        labelled_policy(label)
    engine = find_llama_server(ROOT)
    if engine is None:
        raise SystemExit("llama-server not found: run benchmarks/engines/build_llama_server.sh")
    command = "python benchmarks/llama_server_routing.py " + " ".join(
        f"--{name.replace('_', '-')} {value}"
        for name, value in vars(args).items()
        if name not in ("write", "plot", "json", "rows") and value != arguments.get_default(name)
    )
    command = command.rstrip() + " --write docs/benchmarks.md"
    if args.plot:
        command += f" --plot {args.plot}"
    if args.seeds and args.workload == "multiturn":
        text, section = seeds_benchmark(policies, engine, args, command), "llama-server-seeds"
    elif args.workload == "stream":
        section = "llama-server-slots" if by_slots(args) else "llama-server-stream"
        text = stream_benchmark(policies, engine, args, command)
    elif args.workload == "chat" and args.seeds:
        section = "llama-server-chat-seeds" + ("-slot-cache" if args.cache_ram == 0 else "")
        text = chat_seeds_benchmark(policies, engine, args, command)
    elif args.workload == "chat":
        # without llama-server's host-memory prompt cache: a section of its own
        section = "llama-server-chat" + ("-slot-cache" if args.cache_ram == 0 else "")
        text = chat_benchmark(policies, engine, args, command)
    else:
        section = "llama-server-routing" + ("-slot-cache" if args.cache_ram == 0 else "")
        text = multiturn_benchmark(policies, engine, args, command)
    if args.write:
        write_section(args.write, args.section or section, text)
        Console(stderr=True).print(f"wrote {args.write}")
    elif not args.json:
        print(text)


if __name__ == "__main__":
    main()
