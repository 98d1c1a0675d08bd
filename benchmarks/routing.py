"""Routing benchmark (issue 5): decision cost, Mooncake held-out latency, TTCA.

    python benchmarks/routing.py --write docs/benchmarks.md --plot docs/img/route_sim.png

Runs, in one process on this machine: the decision cost of every policy (16 replicas,
18k-token prompts of 16-token blocks, route update included), ``route-sim`` on the
Mooncake trace with 3 regions x 1 and x 2 replicas, and the TTCA experiment on both
SCBench-style KV files with 1 and 2 replicas per model. The markdown replaces the
routing section of ``--write`` (between its ``begin routing`` / ``end routing`` markers)
and leaves the rest.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path
from typing import Any

from rich.console import Console

from contextpilot_rag.bench.document import write_section
from contextpilot_rag.bench.routing import (
    default_policies,
    plot_route_sim,
    route_sim_progress,
    run_route_sim,
    split_trace,
    ttca_results,
    ttca_row,
)
from contextpilot_rag.cli import KEPT_SECTIONS_MARKER
from contextpilot_rag.routing import CombinedPolicy, make_policy
from contextpilot_rag.routing.measure import measure_decision_cost
from contextpilot_rag.sim import default_fleet, simulate
from contextpilot_rag.sim.traces import load_mooncake, load_scbench_kv

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOONCAKE = DATA / "mooncake" / "synthetic_trace.jsonl"
KV_FILES = (
    DATA / "scbench_kv" / "kv_150pairs_n10_seed0.jsonl",
    DATA / "scbench_kv" / "kv_600pairs_n5_seed1.jsonl",
)
BASELINES = ("random", "round-robin", "least-request", "least-load", "session", "prefix")


def _latency_table(rows: list[dict[str, Any]]) -> list[str]:
    best_ttft = min(r["ttft_p95_ms"] for r in rows if r["policy"] in BASELINES)
    best_e2e = min(r["e2e_p95_s"] for r in rows if r["policy"] in BASELINES)
    lines = [
        "| policy | TTFT p50 ms | TTFT p95 ms | vs best baseline | TTFT p99 ms | E2E p95 s "
        "| vs best baseline | hit ratio | max replica share | decision µs p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['ttft_p50_ms']:,.0f} | {r['ttft_p95_ms']:,.0f} "
            f"| {r['ttft_p95_ms'] / best_ttft - 1:+.1%} | {r['ttft_p99_ms']:,.0f} "
            f"| {r['e2e_p95_s']:.2f} | {r['e2e_p95_s'] / best_e2e - 1:+.1%} "
            f"| {r['hit_ratio']:.1%} | {r['max_replica_share']:.1%} | {r['decision_us_p50']:.1f} |"
        )
    return lines


def _ttca_table(rows: list[dict[str, Any]]) -> list[str]:
    ours = next(r["ttca_mean_s"] for r in rows if r["policy"] == "combined")
    lines = [
        "| policy | mean TTCA s | combined vs this | success | hit ratio | TTFT p95 ms "
        "| prefill k tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['ttca_mean_s']:.3f} | {ours / r['ttca_mean_s'] - 1:+.1%} "
            f"| {r['success_rate']:.0%} | {r['hit_ratio']:.1%} | {r['ttft_p95_ms']:,.0f} "
            f"| {r['prefill_tokens'] / 1000:,.1f} |"
        )
    return lines


def _without_warm_up(path: Path, per_model: int) -> dict[str, Any]:
    """The combined policy's TTCA row without retry warm-ups (the ablation)."""
    (result,) = ttca_results(
        load_scbench_kv(path),
        policies=["combined"],
        replicas_per_model=per_model,
        combined_options={"warm_retries": False},
    )
    return {**ttca_row(result), "policy": "combined, no warm-up"}


def _mooncake_ablations(per_region: int) -> list[dict[str, Any]]:
    """The combined policy's Mooncake rows without late binding and with the earlier
    externality weight 0.5 (held-out half, fresh fleet, as route-sim)."""
    _, held_out = split_trace(load_mooncake(MOONCAKE), 0.5)
    rows = []
    for label, options in (
        ("combined, no late binding", {"hold_wait_s": None}),
        ("combined, externality 0.5", {"externality_weight": 0.5}),
    ):
        policy = CombinedPolicy(**options)  # type: ignore[arg-type]
        fleet = default_fleet(3, per_region, block_tokens=held_out[0].block_tokens)
        summary = simulate(held_out, policy, fleet).summary
        rows.append({"policy": label, **summary.as_dict()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    console = Console(stderr=True)
    out = ["## Routing (issue 5): `benchmarks/routing.py`", ""]
    out += [
        f"Machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}; one run. Command: "
        "`python benchmarks/routing.py --write docs/benchmarks.md --plot docs/img/route_sim.png`.",
        "",
        "### Decision cost: 16 replicas, 18,000-token prompts (1,125 blocks of 16 tokens), "
        "route update included",
        "",
        "| policy | p50 µs | p90 µs | p99 µs |",
        "|---|---:|---:|---:|",
    ]
    policies = default_policies()
    for name in policies:
        cost = measure_decision_cost(make_policy(name))
        out.append(
            f"| {name} | {cost['p50_us']:.1f} | {cost['p90_us']:.1f} | {cost['p99_us']:.1f} |"
        )
        console.print(f"decision cost {name}: {cost['p50_us']:.1f} µs")
    with route_sim_progress(console) as progress:
        for per_region in (1, 2):
            rows = run_route_sim(MOONCAKE, replicas_per_region=per_region, progress=progress)
            rows += _mooncake_ablations(per_region)
            out += [
                "",
                f"### Mooncake trace, 3 regions × {per_region} replica(s), "
                "held-out second half (`contextpilot-rag route-sim --trace "
                "../shared/data/mooncake/synthetic_trace.jsonl "
                f"--replicas-per-region {per_region}`)",
                "",
            ]
            out += _latency_table(rows)
            if args.plot and per_region == 1:
                plot_route_sim(rows, args.plot)
        for path in KV_FILES:
            for per_model in (1, 2):
                rows = run_route_sim(path, replicas_per_region=per_model, progress=progress)
                rows.append(_without_warm_up(path, per_model))
                out += [
                    "",
                    f"### TTCA, {path.name}, 5 models × {per_model} replica(s), "
                    "retry cap 10, held-out second half",
                    "",
                ]
                out += _ttca_table(rows)
    text = "\n".join(out) + "\n"
    if args.write:
        write_section(args.write, "routing", text, KEPT_SECTIONS_MARKER)
        console.print(f"wrote {args.write}")
    else:
        print(text)


if __name__ == "__main__":
    main()
