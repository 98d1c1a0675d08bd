"""Per-call cost of the conversation stores: ``optimize`` and ``record_answer`` on a
SQLite file and on a loopback Redis, against the in-memory default.

    python benchmarks/store_overhead.py --write docs/benchmarks.md

Workload (fixed seed): ``--conversations`` conversations of ``--turns`` turns, played
round-robin (turn 1 of each, then turn 2, ...), so every store holds them all; each
turn carries 6 documents of about 600 characters drawn from 60, half of them from the
conversation's earlier turns (de-duplication fires), then records an answer. The last
row plays each conversation on two pilots in turn (each with its own store client),
as two workers behind a round-robin balancer: every read finds the other pilot's
write, so no decoded record is reused. Each store gets fresh pilots and an empty store
(a new SQLite file, a new Redis key prefix whose keys expire after the default hour);
``--runs`` rounds alternate the stores. The overhead of a store is the difference of
its median ``optimize`` latency and the in-memory one's in the same run. Redis runs on
loopback: a ``redis-server`` the script starts (``redis-server`` on PATH), or
``--redis-url``. Writes the ``store-overhead`` generated section.
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lib.sections import markdown_table, provenance, spread, write_or_print

from contextpilot_rag import ContextBlock, ContextPilot, ConversationStore
from contextpilot_rag.stores import RedisConversationStore, SQLiteConversationStore

SECTION = "store-overhead"
TARGET_MS = 1.0  # issue 21: Redis store overhead per call, median, loopback
DOCS = [
    ContextBlock(f"Document {i}. " + f"Facts number {i} about the subject of topic {i}. " * 12)
    for i in range(60)
]
Turn = tuple[str, list[ContextBlock], str]  # conversation id, blocks, query


@dataclass(frozen=True)
class Timings:
    optimize_ms: list[float]
    answer_ms: list[float]


def workload(conversations: int, turns: int, seed: int = 0) -> list[Turn]:
    rng = random.Random(seed)
    shown: dict[str, list[ContextBlock]] = {f"conv-{c}": [] for c in range(conversations)}
    played: list[Turn] = []
    for turn in range(turns):
        for name, earlier in shown.items():
            blocks = rng.sample(earlier, min(3, len(earlier)))
            while len(blocks) < 6:
                block = rng.choice(DOCS)
                if block not in blocks:
                    blocks.append(block)
            earlier.extend(block for block in blocks if block not in earlier)
            played.append((name, blocks, f"Question {turn} of {name}?"))
    return played


def play(stores: Sequence[ConversationStore | None], turns: Sequence[Turn]) -> Timings:
    """One pilot per store; a conversation's turns go to the pilots in turn (with two,
    as two workers behind a round-robin balancer: each turn continues the other's)."""
    pilots = [ContextPilot(store=store) for store in stores]
    played: dict[str, int] = {}
    optimize_ms, answer_ms = [], []
    for conversation_id, blocks, query in turns:
        number = played[conversation_id] = played.get(conversation_id, -1) + 1
        pilot = pilots[number % len(pilots)]
        start = time.perf_counter_ns()
        prompt = pilot.optimize(blocks, query, conversation_id=conversation_id)
        middle = time.perf_counter_ns()
        pilot.record_answer(prompt, f"An answer to {query}")
        end = time.perf_counter_ns()
        optimize_ms.append((middle - start) / 1e6)
        answer_ms.append((end - middle) / 1e6)
    return Timings(optimize_ms, answer_ms)


@contextmanager
def loopback_redis(directory: Path) -> Iterator[str]:
    """A non-persistent redis-server on a free loopback port, for this run only."""
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH: install it, or pass --redis-url")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    server = subprocess.Popen(
        [*command, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                RedisConversationStore(url).ping()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def run(
    turns: Sequence[Turn], runs: int, redis_url: str, directory: Path
) -> dict[str, list[Timings]]:
    """Each store on a fresh pilot and an empty store (a new SQLite file, a new Redis
    key prefix), the stores alternating in every run."""
    prefix = f"contextpilot-bench:{random.Random().getrandbits(32):08x}:"

    def redis(number: int, workers: int) -> list[ConversationStore | None]:
        key_prefix = f"{prefix}run{number}-{workers}:"
        return [
            RedisConversationStore(redis_url, max_conversations=10_000, key_prefix=key_prefix)
            for _ in range(workers)
        ]

    stores: dict[str, Callable[[int], list[ConversationStore | None]]] = {
        "memory (default)": lambda _: [None],
        "SQLite file": lambda number: [SQLiteConversationStore(directory / f"run{number}.db")],
        "Redis, loopback": lambda number: redis(number, 1),
        "Redis, loopback, 2 pilots alternating": lambda number: redis(number, 2),
    }
    results: dict[str, list[Timings]] = {name: [] for name in stores}
    for number in range(runs):
        for name, make in stores.items():
            results[name].append(play(make(number), turns))
            print(f"run {number + 1}/{runs}: {name} done", file=sys.stderr)
    return results


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def markdown(
    results: dict[str, list[Timings]], argv: Sequence[str], runs: int, scale: tuple[int, int]
) -> str:
    baseline = [statistics.median(t.optimize_ms) for t in results["memory (default)"]]
    rows = []
    overheads: dict[str, list[float]] = {}
    for name, timings in results.items():
        medians = [statistics.median(t.optimize_ms) for t in timings]
        overhead = [m - b for m, b in zip(medians, baseline, strict=True)]
        overheads[name] = overhead
        rows.append(
            [
                name,
                spread(medians, ".3f"),
                spread([p99(t.optimize_ms) for t in timings], ".3f"),
                "-" if name.startswith("memory") else spread(overhead, ".3f"),
                spread([statistics.median(t.answer_ms) for t in timings], ".3f"),
            ]
        )
    redis = statistics.median(overheads["Redis, loopback"])
    alternating = statistics.median(overheads["Redis, loopback, 2 pilots alternating"])
    verdict = "met" if redis <= TARGET_MS else "not met"
    conversations, turns = scale
    return "\n".join(
        [
            "## Conversation store overhead (`benchmarks/store_overhead.py`)",
            "",
            provenance(
                "python benchmarks/store_overhead.py " + " ".join(argv),
                runs,
                "median of the per-run figures with min–max; runs alternate the stores",
            ),
            "",
            f"{conversations} conversations × {turns} turns each, played round-robin; "
            "6 documents per turn (half from earlier turns), an answer recorded per turn. "
            "With 2 pilots alternating, each turn of a conversation continues the other "
            "pilot's (two workers behind a round-robin balancer).",
            "",
            *markdown_table(
                [
                    "store",
                    "optimize median ms",
                    "optimize p99 ms",
                    "overhead over memory, median ms",
                    "record_answer median ms",
                ],
                rows,
            ),
            "",
            f"Target (issue 21): the Redis store adds at most {TARGET_MS:g} ms per call "
            f"(median, loopback): {verdict} ({redis:.3f} ms; {alternating:.3f} ms with 2 "
            "pilots alternating, where every read decodes the record).",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds over the stores (default 3)")
    parser.add_argument("--conversations", type=int, default=20, help="default 20")
    parser.add_argument("--turns", type=int, default=8, help="turns per conversation (default 8)")
    parser.add_argument("--redis-url", help="an empty Redis database to use (default: start one)")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    runs, scale = max(1, args.runs), (max(1, args.conversations), max(1, args.turns))
    turns = workload(*scale)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        if args.redis_url:
            results = run(turns, runs, args.redis_url, directory)
        else:
            with loopback_redis(directory) as url:
                results = run(turns, runs, url, directory)
    text = markdown(results, argv, runs, scale) + "\n"
    write_or_print(text, SECTION, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
