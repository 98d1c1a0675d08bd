"""RoutingClient over real llama-server replicas (issue 6): mean TTFT per policy.

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
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.bench.document import write_section
from contextpilot_rag.bench.workloads import Workload, WorkloadRequest, multiturn_workload
from contextpilot_rag.cli import KEPT_SECTIONS_MARKER
from contextpilot_rag.routing import Endpoint, RoutingClient
from contextpilot_rag.testing import LlamaEngine, LlamaServer, find_llama_server

ROOT = Path(__file__).resolve().parents[1]


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
    rr_over_this: float = 0.0

    @property
    def cached_share(self) -> float:
        total = self.cache_n + self.prompt_n
        return self.cache_n / total if total else 0.0


def conversations(workload: Workload) -> list[list[WorkloadRequest]]:
    """The workload's requests grouped by conversation, turns in order."""
    sessions: dict[str, list[WorkloadRequest]] = {}
    for request in workload.requests:
        sessions.setdefault(str(request.session), []).append(request)
    return list(sessions.values())


def run_policy(
    policy: str,
    engine: LlamaEngine,
    sessions: list[list[WorkloadRequest]],
    corpus: dict[str, str],
    system: str,
    args: argparse.Namespace,
    advance: Callable[[], None],
) -> list[Row]:
    """One cold fleet, all users concurrently; the rows of every request."""
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                LlamaServer(engine, slots=args.slots, context_tokens=args.context * args.slots)
            )
            for _ in range(args.replicas)
        ]
        endpoints = [
            Endpoint(s.base_url, prefill_tokens_per_s=args.prefill_rate, decode_tokens_per_s=40.0)
            for s in servers
        ]
        client = stack.enter_context(
            RoutingClient(endpoints, model=LlamaServer.model_name, policy=policy, timeout_s=600)
        )
        pilot = ContextPilot()
        rows: list[Row] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        def user(number: int, requests: Sequence[WorkloadRequest]) -> None:
            time.sleep(number * args.stagger_s)
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
                    pilot.record_answer(session, answer.text)
                    row = Row(
                        policy,
                        session,
                        request.turn,
                        answer.endpoint,
                        answer.ttft_s,
                        answer.e2e_s,
                        answer.prompt_tokens or 0,
                        answer.cached_tokens or 0,
                    )
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


def summarise(policy: str, rows: Sequence[Row]) -> Summary:
    ttfts = sorted(r.ttft_s for r in rows)
    return Summary(
        policy,
        len(rows),
        statistics.fmean(ttfts),
        statistics.median(ttfts),
        ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        sum(r.cached_tokens for r in rows),
        sum(r.prompt_tokens - r.cached_tokens for r in rows),
    )


def markdown(summaries: Sequence[Summary], args: argparse.Namespace, command: str) -> str:
    lines = [
        "## RoutingClient over real llama-server replicas (issue 6): "
        "`benchmarks/llama_server_routing.py`",
        "",
        f"Machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, CPU only; one run. Command: `{command}`.",
        "",
        f"Engine: llama.cpp `llama-server` (llama-cpp-python 0.3.36 sources), gemma-3-270m "
        f"Q4_K_M; {args.replicas} replicas, each `-np {args.slots} "
        f"-c {args.context * args.slots} -t 1 --swa-full`, started cold for every policy. "
        f"Workload: {args.users} concurrent conversations × {args.turns} turns, "
        f"{args.k} documents per turn (multi-turn RAG workload of the core, seed {args.seed}), "
        f"users {args.stagger_s} s apart, pauses between turns exponential with mean "
        f"{args.think_s} s; "
        "prompts from `ContextPilot.optimize`, sent as completions with "
        f"`max_tokens={args.max_tokens}`.",
        "",
        "| policy | requests | mean TTFT s | p50 s | p95 s | round-robin mean / this "
        "| cache_n | prompt_n | cached share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.policy} | {s.requests} | {s.ttft_mean_s:.2f} | {s.ttft_p50_s:.2f} "
            f"| {s.ttft_p95_s:.2f} | {s.rr_over_this:.2f}× | {s.cache_n:,} | {s.prompt_n:,} "
            f"| {s.cached_share:.1%} |"
        )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="round-robin,least-load,ranvier,combined")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--context", type=int, default=8192, help="tokens per slot")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stagger-s", type=float, default=0.5)
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause between turns")
    parser.add_argument("--prefill-rate", type=float, default=400.0, help="tokens/s (ENGINES.md)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)
    engine = find_llama_server(ROOT)
    if engine is None:
        raise SystemExit("llama-server not found: run benchmarks/engines/build_llama_server.sh")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    workload = multiturn_workload(
        n_sessions=args.users,
        turns=args.turns,
        interleave=args.users,
        k=args.k,
        n_docs=400,
        seed=args.seed,
    )
    sessions = conversations(workload)
    corpus, system = dict(workload.corpus), workload.system_prompt
    rows: list[Row] = []
    with Progress(console=console) as progress:
        total = sum(len(s) for s in sessions)
        for policy in policies:
            task = progress.add_task(policy, total=total)
            rows += run_policy(
                policy,
                engine,
                sessions,
                corpus,
                system,
                args,
                lambda task=task: progress.advance(task),  # type: ignore[misc]
            )
    summaries = [summarise(p, [r for r in rows if r.policy == p]) for p in policies]
    rr = next((s.ttft_mean_s for s in summaries if s.policy == "round-robin"), None)
    if rr is not None:
        summaries = [
            Summary(**{**asdict(s), "rr_over_this": rr / s.ttft_mean_s}) for s in summaries
        ]
    command = "python benchmarks/llama_server_routing.py " + " ".join(
        f"--{name.replace('_', '-')} {value}"
        for name, value in vars(args).items()
        if name not in ("write", "plot", "json") and value != parser.get_default(name)
    )
    command = command.rstrip() + " --write docs/benchmarks.md"
    if args.plot:
        command += f" --plot {args.plot}"
        plot(summaries, rows, args.plot)
    if args.json:
        print(json.dumps([asdict(s) | {"cached_share": s.cached_share} for s in summaries]))
    text = markdown(summaries, args, command)
    if args.write:
        write_section(args.write, "llama-server-routing", text, KEPT_SECTIONS_MARKER)
        console.print(f"wrote {args.write}")
    elif not args.json:
        print(text)


if __name__ == "__main__":
    main()
