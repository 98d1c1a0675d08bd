"""Routing benchmark: decision cost, Mooncake held-out latency, TTCA, and the targets.

    python benchmarks/routing.py --write docs/benchmarks.md --plot docs/img/route_sim.png

Runs, in one process on this machine: the decision cost of every policy (16 replicas,
18k-token prompts of 16-token blocks, route update included; ``--runs`` times, the
only wall-clock figures), route-sim (``lib/route_sim.py``) on the Mooncake trace with
3 regions x 1 and x 2 replicas plus ablations of the combined policy, and the TTCA
experiment on both SCBench-style KV files with 1 and 2 replicas per model. Writes the
``routing`` generated section of ``--write`` and leaves the rest of the file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lib.report import progress_bars
from lib.route_sim import (
    BASELINES,
    PEERS,
    default_policies,
    plot_route_sim,
    run_route_sim,
    split_trace,
    ttca_results,
    ttca_row,
)
from lib.sections import provenance, spread, write_section
from rich.console import Console

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
DECISION_POLICIES = ("combined", "ranvier", "gorgo")
Row = dict[str, Any]


def decision_costs(runs: int, console: Console) -> dict[str, list[float]]:
    """Per policy, the median decision time in µs of each run."""
    costs: dict[str, list[float]] = {name: [] for name in default_policies()}
    for _ in range(runs):
        for name in costs:
            costs[name].append(measure_decision_cost(make_policy(name))["p50_us"])
    for name, values in costs.items():
        console.print(f"decision cost {name}: {spread(values, '.1f', ' µs')}")
    return costs


def _latency_table(rows: Sequence[Row]) -> list[str]:
    best_ttft = min(r["ttft_p95_ms"] for r in rows if r["policy"] in BASELINES)
    best_e2e = min(r["e2e_p95_s"] for r in rows if r["policy"] in BASELINES)
    lines = [
        "| policy | TTFT p50 ms | TTFT p95 ms | vs best baseline | TTFT p99 ms | E2E p95 s "
        "| vs best baseline | hit ratio | max replica share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['ttft_p50_ms']:,.0f} | {r['ttft_p95_ms']:,.0f} "
            f"| {r['ttft_p95_ms'] / best_ttft - 1:+.1%} | {r['ttft_p99_ms']:,.0f} "
            f"| {r['e2e_p95_s']:.2f} | {r['e2e_p95_s'] / best_e2e - 1:+.1%} "
            f"| {r['hit_ratio']:.1%} | {r['max_replica_share']:.1%} |"
        )
    return lines


def _ttca_table(rows: Sequence[Row]) -> list[str]:
    ours = _row(rows, "combined")["ttca_mean_s"]
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


def _row(rows: Sequence[Row], policy: str) -> Row:
    return next(r for r in rows if r["policy"] == policy)


def _without_warm_up(path: Path, per_model: int) -> Row:
    """The combined policy's TTCA row without retry warm-ups (the ablation)."""
    (result,) = ttca_results(
        load_scbench_kv(path),
        policies=["combined"],
        replicas_per_model=per_model,
        combined_options={"warm_retries": False},
    )
    return {**ttca_row(result), "policy": "combined, no warm-up"}


def _mooncake_ablations(per_region: int) -> list[Row]:
    """The combined policy's Mooncake rows without late binding and with externality
    weight 0.5 (held-out half, fresh fleet, as route-sim)."""
    _, held_out = split_trace(load_mooncake(MOONCAKE), 0.5)
    rows = []
    for label, policy in (
        ("combined, no late binding", CombinedPolicy(hold_wait_s=None)),
        ("combined, externality 0.5", CombinedPolicy(externality_weight=0.5)),
    ):
        fleet = default_fleet(3, per_region, block_tokens=held_out[0].block_tokens)
        summary = simulate(held_out, policy, fleet).summary
        rows.append({"policy": label, **summary.as_dict()})
    return rows


def _target(name: str, target: str, measured: str, met: bool) -> str:
    return f"| {name} | {target} | {measured} | {'yes' if met else 'no'} |"


def _mooncake_targets(per_region: int, rows: Sequence[Row]) -> list[str]:
    ours = _row(rows, "combined")
    out = []
    for metric, label, bound in (
        ("ttft_p95_ms", "p95 TTFT", -0.10),
        ("e2e_p95_s", "p95 E2E", -0.15),
    ):
        best = min(r[metric] for r in rows if r["policy"] in BASELINES)
        change = ours[metric] / best - 1
        out.append(
            _target(
                f"Mooncake 3×{per_region}: {label} vs best baseline",
                f"≤ {bound:+.0%}",
                f"{change:+.1%}",
                change <= bound,
            )
        )
    peers = [r for r in rows if r["policy"] in PEERS]
    margins = [
        (r[metric] / ours[metric] - 1, f"{r['policy']} {metric.split('_')[0]}")
        for r in peers
        for metric in ("ttft_p95_ms", "e2e_p95_s")
    ]
    if margins:
        margin, closest = min(margins)
        names = ", ".join(r["policy"] for r in peers)
        out.append(
            _target(
                f"Mooncake 3×{per_region}: p95 TTFT and E2E vs {names}",
                "not worse",
                f"closest: {closest}, {margin:+.1%} slower than combined",
                margin >= 0,
            )
        )
    share = ours["max_replica_share"]
    out.append(
        _target(
            f"Mooncake 3×{per_region}: no single-replica collapse",
            "max replica share < 50%",
            f"{share:.1%}",
            share < 0.5,
        )
    )
    return out


def _ttca_targets(label: str, rows: Sequence[Row]) -> list[str]:
    ours = _row(rows, "combined")["ttca_mean_s"]
    out = []
    for policy, bound in (("least-load", -0.30), ("session", -0.45), ("laar", 0.0)):
        present = [r for r in rows if r["policy"] == policy]
        if not present:
            continue
        change = ours / present[0]["ttca_mean_s"] - 1
        target = "not worse" if bound == 0 else f"≤ {bound:+.0%}"
        out.append(_target(f"TTCA {label}: vs {policy}", target, f"{change:+.1%}", change <= bound))
    return out


def targets_markdown(
    decision: Mapping[str, Sequence[float]],
    mooncake: Mapping[int, Sequence[Row]],
    ttca: Mapping[str, Sequence[Row]],
) -> list[str]:
    lines = ["| measure | target | measured | met |", "|---|---|---|---|"]
    for name in DECISION_POLICIES:
        if name in decision:
            values = decision[name]
            lines.append(
                _target(
                    f"decision cost p50, {name}",
                    "≤ 50 µs",
                    spread(values, ".1f", " µs"),
                    statistics.median(values) <= 50,
                )
            )
    for per_region, rows in mooncake.items():
        lines += _mooncake_targets(per_region, rows)
    for label, rows in ttca.items():
        lines += _ttca_targets(label, rows)
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--runs", type=int, default=3, help="decision-cost runs (default 3)")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    decision = decision_costs(max(1, args.runs), console)
    mooncake: dict[int, list[Row]] = {}
    ttca: dict[str, list[Row]] = {}
    with progress_bars() as progress:
        for per_region in (1, 2):
            rows = run_route_sim(MOONCAKE, replicas_per_region=per_region, progress=progress)
            mooncake[per_region] = rows + _mooncake_ablations(per_region)
            if args.plot and per_region == 1:
                plot_route_sim(rows, args.plot)
        for path in KV_FILES:
            for per_model in (1, 2):
                rows = run_route_sim(path, replicas_per_region=per_model, progress=progress)
                ttca[f"{path.stem} ×{per_model}"] = [*rows, _without_warm_up(path, per_model)]
    out = [
        "## Routing policies in the fleet simulator (`benchmarks/routing.py`)",
        "",
        provenance(
            "python benchmarks/routing.py " + " ".join(argv),
            args.runs,
            "decision costs show the median of the per-run medians with min–max; "
            "every simulated figure is deterministic (seeded, simulated time)",
        ),
        "",
        "### Targets",
        "",
        *targets_markdown(decision, mooncake, ttca),
        "",
        "### Decision cost: 16 replicas, 18,000-token prompts (1,125 blocks of 16 tokens), "
        "route update included",
        "",
        "| policy | p50 µs |",
        "|---|---:|",
        *(f"| {name} | {spread(values, '.1f')} |" for name, values in decision.items()),
    ]
    for per_region, rows in mooncake.items():
        out += [
            "",
            f"### Mooncake trace, 3 regions × {per_region} replica(s), held-out second half "
            "(`python benchmarks/route_sim.py --trace "
            f"../shared/data/mooncake/synthetic_trace.jsonl --replicas-per-region {per_region}`)",
            "",
            *_latency_table(rows),
        ]
    for label, rows in ttca.items():
        name, replicas = label.split(" ×")
        out += [
            "",
            f"### TTCA, {name}.jsonl, 5 models × {replicas} replica(s), retry cap 10, "
            "held-out second half",
            "",
            *_ttca_table(rows),
        ]
    if args.plot:
        out += ["", f"![p95 TTFT and E2E per policy, Mooncake 3 × 1](img/{args.plot.name})"]
    text = "\n".join(out) + "\n"
    if args.write:
        write_section(args.write, "routing", text)
        console.print(f"wrote {args.write}")
    else:
        print(text)


if __name__ == "__main__":
    main()
