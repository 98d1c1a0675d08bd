"""Where the conversation traces' p95 end-to-end latency goes: how much of it a router
could still change.

    python benchmarks/conversation_tails.py --write docs/benchmarks.md

The held-out draws of ``benchmarks/conversation_routing.py`` (the same family, count and
seed; 3 regions x 1 replica, each policy routing the second half on a fresh fleet) under
``prefix`` (the best baseline for p95 E2E on most of them), ``combined`` with its
defaults and ``combined`` with the tuning half's choice. Per trace and policy:

- *prefill work over its floor*: the prompt tokens the fleet prefilled over the fewest
  any router could prefill with caches that never evict, taking requests in arrival
  order (a request reads at most the longest prefix of blocks some earlier request of
  the half carried, and never its last block, as the simulator's engines);
- the fleet's *prefill duty*: the prefilled tokens' seconds at the prefill rate over the
  replicas' time, about the share of decode steps that carry a prefill chunk;
- the requests at or above the run's p95 E2E (*the tail*), their mean TTFT, their mean
  *bare decode* (their answer decoded alone: one step of ``1/decode_tokens_per_s`` plus
  the reads of their own context per token) and their mean *decode contention* (the
  rest of their decode: other requests' context reads and prefill chunks);
- two counterfactual p95s over every request: *without decode contention* (TTFT + bare
  decode) and *with TTFT at its floor* (the request's ``latency_floor`` TTFT + its
  decode as routed). They bound nothing a router reaches; they say which part a 15%
  cut of the p95 would have to come from.

Writes the ``conversation-tails`` generated section.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conversation_routing import REGIONS, TUNED_LABEL, TUNED_OPTIONS, Draw, draw_traces
from lib.report import ordered_map, progress_bars
from lib.route_sim import split_trace
from lib.sections import markdown_table, provenance, write_or_print

from contextpilot_rag.routing import CombinedPolicy, Policy, make_policy
from contextpilot_rag.routing.types import RouteRequest
from contextpilot_rag.sim import PrefixCacheModel, Replica, SimResult, default_fleet, simulate
from contextpilot_rag.sim.fleet import latency_floor
from contextpilot_rag.sim.traces import conversation_trace

SECTION = "conversation-tails"
POLICIES = ("prefix", "combined", "combined, tuned")


@dataclass(frozen=True)
class Tail:
    """One policy on one trace."""

    policy: str
    e2e_p95_s: float
    work_over_floor: float  # prefilled tokens / the floor
    duty: float  # prefill seconds / (replicas x the run's span)
    tail_ttft_s: float  # means over the requests at or above the p95 E2E
    tail_bare_s: float
    tail_contention_s: float
    no_contention_p95_s: float  # p95 of TTFT + bare decode
    floor_ttft_p95_s: float  # p95 of floor TTFT + decode as routed
    busiest: float  # the busiest replica's share of the requests


@dataclass(frozen=True)
class TraceTails:
    draw: Draw
    floor_tokens: int  # prefill_floor of the held-out half
    tails: tuple[Tail, ...]


def prefill_floor(requests: Sequence[RouteRequest]) -> int:
    """The fewest prompt tokens any router prefills for ``requests`` in arrival order
    with caches that never evict (module docstring): one unbounded cache of the
    simulator's engines (:class:`PrefixCacheModel` over block hashes, as
    ``contextpilot_rag.sim.fleet`` keeps per replica) that every request reaches."""
    cache = PrefixCacheModel(block_size=1)  # capacity None: never evicts
    total = 0
    for request in requests:
        cached = cache.admit(request.block_hashes).cached_tokens * request.block_tokens
        total += request.prompt_tokens - min(cached, request.prompt_tokens)
    return total


def _policy(name: str) -> Policy:
    if name == "combined, tuned":
        return CombinedPolicy(**TUNED_OPTIONS)
    return make_policy(name)


def run_trace(job: tuple[Draw, int]) -> TraceTails:
    draw, n_requests = job
    _, held = split_trace(conversation_trace(**draw.trace_arguments(n_requests)), 0.5)
    fleet = default_fleet(REGIONS, 1, block_tokens=held[0].block_tokens)
    floor_ttft = {
        request.request_id: ttft
        for request, (ttft, _) in zip(held, latency_floor(held, fleet), strict=True)
    }
    outputs = {request.request_id: request.expected_output_tokens for request in held}
    floor_tokens = prefill_floor(held)
    tails = tuple(
        measure(
            name, simulate(held, _policy(name), fleet), fleet, outputs, floor_ttft, floor_tokens
        )
        for name in POLICIES
    )
    return TraceTails(draw, floor_tokens, tails)


def measure(
    name: str,
    result: SimResult,
    fleet: Sequence[Replica],
    outputs: dict[str, int],
    floor_ttft: dict[str, float],
    floor_tokens: int,
) -> Tail:
    """One policy's run taken apart (module docstring); ``outputs`` and ``floor_ttft``:
    each request's answer tokens and latency-floor TTFT, by request id."""
    replica = fleet[0]  # identical replicas but for their RTT
    records = result.records
    e2e = np.array([r.e2e_s for r in records])
    ttft = np.array([r.ttft_s for r in records])
    step_s = 1 / replica.decode_tokens_per_s
    per_context = replica.decode_s_per_context_token
    bare = np.array(
        [outputs[r.request_id] * (step_s + per_context * r.prompt_tokens) for r in records]
    )
    decode = e2e - ttft
    cut = float(np.percentile(e2e, 95))
    tail = e2e >= cut
    prefilled = sum(r.prompt_tokens - r.cached_tokens for r in records)
    span = max(r.arrival_s + r.e2e_s for r in records) - min(r.arrival_s for r in records)
    busiest = Counter(r.replica_id for r in records).most_common(1)[0][1]
    floor = np.array([floor_ttft[r.request_id] for r in records])
    return Tail(
        policy=name,
        e2e_p95_s=cut,
        work_over_floor=prefilled / floor_tokens,
        duty=prefilled / replica.prefill_tokens_per_s / (len(fleet) * span),
        tail_ttft_s=float(ttft[tail].mean()),
        tail_bare_s=float(bare[tail].mean()),
        tail_contention_s=float((decode[tail] - bare[tail]).mean()),
        no_contention_p95_s=float(np.percentile(ttft + bare, 95)),
        floor_ttft_p95_s=float(np.percentile(floor + decode, 95)),
        busiest=busiest / len(records),
    )


def trace_rows(results: Sequence[TraceTails]) -> list[list[str]]:
    rows = []
    for result in results:
        prefix = result.tails[0].e2e_p95_s
        for tail in result.tails:
            change = (
                "-" if tail.policy == "prefix" else f"{100 * (tail.e2e_p95_s / prefix - 1):+.1f}%"
            )
            rows.append(
                [
                    f"{result.draw.index}",
                    tail.policy,
                    f"{tail.e2e_p95_s:.1f} s",
                    change,
                    f"{tail.work_over_floor:.2f}×",
                    f"{100 * tail.duty:.0f}%",
                    f"{tail.tail_ttft_s:.1f} s",
                    f"{tail.tail_bare_s:.1f} s",
                    f"{tail.tail_contention_s:.1f} s",
                    f"{tail.no_contention_p95_s:.1f} s",
                    f"{tail.floor_ttft_p95_s:.1f} s",
                    f"{100 * tail.busiest:.0f}%",
                ]
            )
    return rows


def _median_and_largest(values: list[float], form: str) -> str:
    return f"{form.format(float(np.median(values)))} / {form.format(max(values))}"


def summary_rows(results: Sequence[TraceTails]) -> list[list[str]]:
    """Per policy, the median and the largest over the traces."""
    rows = []
    for i, name in enumerate(POLICIES):
        tails = [result.tails[i] for result in results]
        rows.append(
            [
                name,
                _median_and_largest([t.work_over_floor for t in tails], "{:.2f}×"),
                _median_and_largest([100 * t.duty for t in tails], "{:.0f}%"),
                _median_and_largest(
                    [100 * t.tail_contention_s / t.e2e_p95_s for t in tails], "{:.0f}%"
                ),
                _median_and_largest(
                    [100 * (t.no_contention_p95_s / t.e2e_p95_s - 1) for t in tails], "{:+.0f}%"
                ),
                _median_and_largest(
                    [100 * (t.floor_ttft_p95_s / t.e2e_p95_s - 1) for t in tails], "{:+.0f}%"
                ),
            ]
        )
    return rows


def report(command: str, results: Sequence[TraceTails], seconds: float) -> str:
    lines = [
        "## Where the conversation traces' p95 E2E goes (`benchmarks/conversation_tails.py`)",
        "",
        provenance(command, 1, "one run; every figure is simulated time, deterministic (seeded)"),
        f"- traces: the {len(results)} held-out draws of `benchmarks/conversation_routing.py` "
        f"(same family and seed), each routed on its second half by `prefix`, `combined` "
        f"(defaults) and `combined, tuned` (`{TUNED_LABEL}`, the tuning half's choice)",
        f"- fleet: {REGIONS} regions × 1 replica (`default_fleet`); whole run: {seconds:.0f} s",
        "",
        "*Prefill work over floor*: tokens prefilled over the fewest any router prefills with "
        "caches that never evict. *Duty*: the prefilled tokens' time at the prefill rate over "
        "the replicas' time. *Tail*: the requests at or above the p95 E2E; *bare decode*: the "
        "answer decoded alone; *contention*: the rest of its decode (other requests' context "
        "reads and prefill chunks). *Without contention* and *TTFT at floor*: the p95 with "
        "every decode bare, and with every TTFT at its latency floor (decodes as routed).",
        "",
        "How to read it: where the prefill work is close to its floor, placing prefixes "
        "better has little left to give, and the fleet's prefill duty is set by the trace; "
        "where the p95 with TTFT at floor is close to the p95, shortening the wait for a "
        "prefill unit has little to give too. What is left is the tail's decode contention: "
        "each decode step on a replica that is prefilling also carries a prefill chunk, so a "
        "long answer decodes at the pace its replica's prefill duty allows while it decodes, "
        "and a router changes that only by choosing which decoders the prefills interrupt.",
        "",
        "### Per policy: median / largest over the traces",
        "",
        *markdown_table(
            [
                "policy",
                "prefill work over floor",
                "prefill duty",
                "tail's decode contention, share of the p95",
                "p95 without contention",
                "p95 with TTFT at floor",
            ],
            summary_rows(results),
        ),
        "",
        "### Every trace",
        "",
        *markdown_table(
            [
                "#",
                "policy",
                "p95 E2E",
                "vs prefix",
                "prefill work over floor",
                "prefill duty",
                "tail: TTFT",
                "tail: bare decode",
                "tail: contention",
                "p95 without contention",
                "p95 with TTFT at floor",
                "busiest replica",
            ],
            trace_rows(results),
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=16, help="family draws (16; odd: held out)")
    parser.add_argument("--requests", type=int, default=12_031, help="per trace (12,031)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--write", type=Path, help="write the markdown section into this file")
    args = parser.parse_args(argv)
    if args.count < 2 or args.requests < 10:
        parser.error("--count must be >= 2 (a tuning and a held-out trace), --requests >= 10")
    started = time.perf_counter()
    held_out = [draw for draw in draw_traces(args.count, args.seed) if draw.held_out]
    work = [(draw, args.requests) for draw in held_out]
    with progress_bars() as progress:
        results = ordered_map(run_trace, work, args.jobs, progress("held-out traces", len(work)))
    command = ("python benchmarks/conversation_tails.py " + " ".join(argv)).strip()
    write_or_print(report(command, results, time.perf_counter() - started), SECTION, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
