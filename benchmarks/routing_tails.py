"""Where the Mooncake p95 tails of route-sim come from (issue 5 analysis).

    python benchmarks/routing_tails.py [--replicas-per-region 1] [--window-s 30]

For ``prefix`` (the best baseline) and ``combined`` on the held-out half (fresh fleet,
as in ``route-sim``): per arrival window, the prompt tokens never seen before in the
half (the prefill no router can avoid, thousands per second; the 3 x 1 fleet prefills
60k tokens/s), the requests at or above the run's p95 TTFT and the mean TTFT / E2E.
Then the combined policy's two knobs (externality weight x late-binding hold wait,
``hold_wait_s``; off = no late binding) on the tune and held-out halves, as p95
changes against ``prefix`` on the same half.
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from contextpilot_rag.bench.routing import split_trace
from contextpilot_rag.routing import CombinedPolicy, Policy, RouteRequest, make_policy
from contextpilot_rag.sim import SimSummary, default_fleet, load_mooncake, simulate

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake"


def _tails_by_window(
    held_out: list[RouteRequest], replicas_per_region: int, window_s: float
) -> Table:
    table = Table(title="held-out half: requests in the p95 TTFT tail, by arrival window")
    table.add_column("window s")
    table.add_column("new tokens k/s", justify="right")
    start = held_out[0].arrival_s
    seen: set[int] = set()  # block hashes sent before: cacheable somewhere
    new_tokens: dict[int, int] = defaultdict(int)
    for request in held_out:
        fresh = [h for h in request.block_hashes if h not in seen]
        seen.update(fresh)
        new_tokens[int((request.arrival_s - start) // window_s)] += len(fresh) * 512
    per_policy = {}
    for name in ("prefix", "combined"):
        result = simulate(
            held_out, make_policy(name), default_fleet(3, replicas_per_region, block_tokens=512)
        )
        cut = result.summary.ttft_p95_ms / 1000
        rows: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
        for record in result.records:
            row = rows[int((record.arrival_s - start) // window_s)]
            row[0] += 1
            row[1] += record.ttft_s >= cut
            row[2] += record.ttft_s
            row[3] += record.e2e_s
        per_policy[name] = rows
        for column in ("tail", "TTFT mean s", "E2E mean s"):
            table.add_column(f"{name} {column}", justify="right")
    for window in sorted(per_policy["prefix"]):
        cells = [f"{window * window_s:.0f}", f"{new_tokens[window] / window_s / 1000:.1f}"]
        for rows in per_policy.values():
            n, tail, ttft, e2e = rows[window]
            cells += [f"{tail:.0f}", f"{ttft / n:.2f}", f"{e2e / n:.2f}"] if n else ["0", "-", "-"]
        table.add_row(*cells)
    return table


def _knob_grid(
    tune: list[RouteRequest], held_out: list[RouteRequest], replicas_per_region: int
) -> Table:
    table = Table(title="combined vs prefix, p95 change (TTFT / E2E)")
    for column in ("externality", "hold wait s", "tune half", "held-out half"):
        table.add_column(column, justify="right")

    def summary(part: list[RouteRequest], policy: Policy) -> SimSummary:
        fleet = default_fleet(3, replicas_per_region, block_tokens=512)
        return simulate(part, policy, fleet).summary

    parts = {"tune": tune, "held": held_out}
    base = {key: summary(part, make_policy("prefix")) for key, part in parts.items()}
    for weight, hold in itertools.product((0.5, 1.0), (None, 0.5, 1.0, 1.5, 2.0, 3.0)):
        cells = [f"{weight}", "off" if hold is None else f"{hold}"]
        for key, part in parts.items():
            run = summary(part, CombinedPolicy(externality_weight=weight, hold_wait_s=hold))
            ttft = 100 * (run.ttft_p95_ms / base[key].ttft_p95_ms - 1)
            e2e = 100 * (run.e2e_p95_s / base[key].e2e_p95_s - 1)
            cells.append(f"{ttft:+.1f}% / {e2e:+.1f}%")
        table.add_row(*cells)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=MOONCAKE / "synthetic_trace.jsonl")
    parser.add_argument("--replicas-per-region", type=int, default=1)
    parser.add_argument("--window-s", type=float, default=30.0)
    args = parser.parse_args()
    tune, held_out = split_trace(load_mooncake(args.trace, block_tokens=512), 0.5)
    console = Console()
    with console.status("simulating"):
        console.print(_tails_by_window(held_out, args.replicas_per_region, args.window_s))
        console.print(_knob_grid(tune, held_out, args.replicas_per_region))


if __name__ == "__main__":
    main()
