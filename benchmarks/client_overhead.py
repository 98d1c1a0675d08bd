"""Routing overhead of ``RoutingClient`` per request, network excluded.

    python benchmarks/client_overhead.py --write docs/benchmarks.md

Both sides talk to the same in-memory engine (``httpx.MockTransport`` answering a
three-event stream at once): ``RoutingClient.chat`` (serialising the messages, route
keys, the policy decision with its route update, counters, stream parsing, feedback
after the answer) and a bare ``httpx.Client`` posting the same JSON body and reading the
same stream (what any OpenAI-compatible client pays). The overhead is the difference
of their medians. Prompts: a system prompt, 36 documents of ~2k characters drawn from
200 (~18k tokens) and a question; two endpoints; 100 warm-up requests, then 500 timed,
``--runs`` times. Writes the ``client-overhead`` generated section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from lib.client_workload import STREAM, Messages, prompts
from lib.sections import markdown_table, provenance, spread, write_section

from contextpilot_rag.routing import RoutingClient

POLICIES = ("combined", "ranvier", "round-robin")
ENDPOINTS = ("http://127.0.0.1:8000/v1", "http://127.0.0.2:8000/v1")


def engine() -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda request: httpx.Response(
            200, content=STREAM, headers={"content-type": "text/event-stream"}
        )
    )


def timed_us(send: Callable[[Messages], object], workload: list[Messages], warmup: int) -> float:
    """Median microseconds of ``send`` over ``workload`` after ``warmup`` requests."""
    timings = []
    for i, messages in enumerate(workload):
        start = time.perf_counter_ns()
        send(messages)
        if i >= warmup:
            timings.append((time.perf_counter_ns() - start) / 1_000)
    return statistics.median(timings)


def routed_us(policy: str, workload: list[Messages], warmup: int) -> float:
    client = RoutingClient(list(ENDPOINTS), model="m", policy=policy, transport=engine())
    try:
        return timed_us(client.chat, workload, warmup)
    finally:
        client.close()


def bare_us(workload: list[Messages], warmup: int) -> float:
    with httpx.Client(transport=engine()) as http:

        def send(messages: Messages) -> None:
            body = {"model": "m", "messages": messages, "stream": True}
            with http.stream("POST", f"{ENDPOINTS[0]}/chat/completions", json=body) as reply:
                for _ in reply.iter_lines():
                    pass

        return timed_us(send, workload, warmup)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    workload, warmup = prompts(600), 100
    bare: list[float] = []
    routed: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    for _ in range(max(1, args.runs)):  # alternate, so drift of the machine hits all alike
        bare.append(bare_us(workload, warmup))
        for policy in POLICIES:
            routed[policy].append(routed_us(policy, workload, warmup))
    rows = [["bare httpx (same body and stream)", spread(bare, ".1f"), "-"]]
    for policy, values in routed.items():
        overheads = [value - base for value, base in zip(values, bare, strict=True)]
        rows.append([f"RoutingClient, {policy}", spread(values, ".1f"), spread(overheads, ".1f")])
    out = [
        "## RoutingClient overhead per request (`benchmarks/client_overhead.py`)",
        "",
        provenance(
            "python benchmarks/client_overhead.py " + " ".join(argv),
            len(bare),
            "median of the per-run medians with min–max; runs alternate between the sides",
        ),
        "",
        *markdown_table(["client", "median µs per request", "overhead over bare httpx µs"], rows),
        "",
        "Target: overhead within 200 µs per request.",
    ]
    text = "\n".join(out) + "\n"
    if args.write:
        write_section(args.write, "client-overhead", text)
        print(f"wrote {args.write}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
