"""Compare routing policies on a trace in the fleet simulator (``benchmarks/route_sim.py``,
``benchmarks/routing.py``): replay it once per policy and report one row of
:data:`RESULT_FIELDS` per policy.

Protocol (deterministic by ``seed``, except the wall-clock ``decision_us_p50``):

1. Load the Mooncake-format trace and split it by arrival order at ``tune_fraction``.
2. Tune what is tunable on the first part: ``gorgo`` runs a :class:`CostPolicy` with a
   :class:`WeightTuner` through the simulator, then freezes its weights.
3. Evaluate every policy on the held-out rest, each with a fresh fleet (empty caches,
   empty queues) and a fresh policy. Only *learned parameters* (gorgo's weights) carry
   over: route tables and prefix locations learned on the tune part would point at
   caches the fresh fleet does not hold, so every policy starts its routing state empty.

An SCBench-style KV-lookup trace selects the **TTCA experiment**: five heterogeneous
models (:data:`~contextpilot_rag.sim.accuracy.DEFAULT_MODELS`, ``replicas_per_region``
replicas each, spread over the GORGO regions); the accuracy model of ``laar`` and
``combined`` is fitted on the tune part plus synthetic KV requests of every language
and length bucket (never on the held-out part); ``gorgo`` tunes its weights on the tune
part; every policy then serves the held-out part with retries (each failed
``(replica, model)`` excluded) up to ``max_attempts``. Latency fields are over all
attempts; ``ttca_mean_s`` over logical requests answered correctly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.table import Table

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import (
    POLICY_NAMES,
    CostPolicy,
    Policy,
    RouteRequest,
    WeightTuner,
    make_policy,
)
from contextpilot_rag.sim.accuracy import DEFAULT_MODELS
from contextpilot_rag.sim.fleet import Replica, SimResult, default_fleet, simulate
from contextpilot_rag.sim.traces import load_mooncake, load_scbench_kv
from contextpilot_rag.sim.ttca import (
    TtcaResult,
    fit_accuracy,
    run_ttca,
    synthetic_requests,
    ttca_fleet,
)

from .report import save_figure

__all__ = [
    "BASELINES",
    "PEERS",
    "RESULT_FIELDS",
    "ProgressFactory",
    "default_policies",
    "plot_route_sim",
    "resolve_policies",
    "result_row",
    "route_sim_results",
    "route_sim_table",
    "run_route_sim",
    "split_trace",
    "trace_kind",
    "ttca_results",
    "ttca_row",
]

logger = logging.getLogger(__name__)

BASELINES = ("random", "round-robin", "least-request", "least-load", "session", "prefix")
"""The simple policies whose best the combined policy's margins are measured against."""
PEERS = ("ranvier", "gorgo", "gorgo-lb", "laar")
"""Published routers the combined policy must not be worse than."""

_Result = TypeVar("_Result")

ProgressFactory = Callable[[str, int], Callable[[], None]]
"""``progress(label, total)`` returns an ``advance()`` callback."""

RESULT_FIELDS = (
    "policy",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "e2e_p95_s",
    "hit_ratio",
    "max_replica_share",
    "ttca_mean_s",
    "success_rate",
    "decision_us_p50",
    "prefill_tokens",
)
"""The ``--json`` row fields; ``prefill_tokens``: prompt tokens the fleet prefilled
(not served from cache), warm-ups included."""


def trace_kind(path: str | Path) -> str:
    """``"mooncake"`` or ``"scbench_kv"``, from the first record of a ``.jsonl`` trace."""
    with open(path, encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), None)
    if first is None:
        raise ConfigError(f"{path}: the trace is empty")
    try:
        record = json.loads(first)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: the first line is not valid JSON ({exc})") from None
    if isinstance(record, dict) and "hash_ids" in record:
        return "mooncake"
    if isinstance(record, dict) and "context" in record and "multi_turns" in record:
        return "scbench_kv"
    raise ConfigError(
        f"{path}: neither a Mooncake trace (hash_ids) nor an SCBench KV trace "
        "(context, multi_turns)"
    )


def _installed(name: str) -> bool:
    try:
        make_policy(name)
    except ImportError:
        return False
    return True


def resolve_policies(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(runnable names, notes on the skipped ones)``. Raises :class:`ConfigError` for
    a name that is not registered."""
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown:
        raise ConfigError(f"unknown routing policies {unknown}; choose from {list(POLICY_NAMES)}")
    runnable, notes = [], []
    for name in dict.fromkeys(names):
        if not _installed(name):
            notes.append(f"skipped {name!r}: its optional package is not installed")
        else:
            runnable.append(name)
    return runnable, notes


def default_policies() -> list[str]:
    """Every registered policy that can run here (``gorgo-lb`` only if installed)."""
    return resolve_policies(POLICY_NAMES)[0]


def split_trace(
    requests: Sequence[RouteRequest], tune_fraction: float
) -> tuple[list[RouteRequest], list[RouteRequest]]:
    """``(tune part, held-out part)`` by arrival order (ties keep trace order)."""
    if not 0.0 <= tune_fraction < 1.0:
        raise ConfigError(f"tune_fraction must be in [0, 1), got {tune_fraction}")
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    cut = int(len(ordered) * tune_fraction)
    if cut >= len(ordered):
        raise ConfigError("the held-out part of the trace is empty; lower tune_fraction")
    return ordered[:cut], ordered[cut:]


def _tuned_gorgo(replay: Callable[[Policy], object], seed: int) -> Policy:
    """A frozen :class:`CostPolicy` whose weights were tuned while ``replay`` ran the
    tune part through it; a fresh one (fresh prefix locations) routes the held-out
    part."""
    learner = CostPolicy(tuner=WeightTuner(seed=seed))
    replay(learner)
    return CostPolicy(learner.freeze())


def _prepare(
    requests: Sequence[RouteRequest], policies: Sequence[str] | None, tune_fraction: float
) -> tuple[list[str], list[RouteRequest], list[RouteRequest]]:
    """``(runnable policy names, tune part, held-out part)``; skipped policies are
    logged. ``policies`` defaults to every registered one."""
    names, notes = resolve_policies(POLICY_NAMES if policies is None else policies)
    for note in notes:
        logger.warning(note)
    tune, held_out = split_trace(requests, tune_fraction)
    return names, tune, held_out


def _per_policy(
    names: Sequence[str],
    label: str,
    progress: ProgressFactory | None,
    run: Callable[[str], _Result],
) -> list[_Result]:
    """``run(name)`` for every policy name in order, advancing one progress bar."""
    advance = progress(label, len(names)) if progress else None
    results = []
    for name in names:
        results.append(run(name))
        if advance:
            advance()
    return results


def route_sim_results(
    requests: Sequence[RouteRequest],
    *,
    policies: Sequence[str] | None = None,
    regions: int = 3,
    replicas_per_region: int = 1,
    tune_fraction: float = 0.5,
    seed: int = 0,
    progress: ProgressFactory | None = None,
) -> list[SimResult]:
    """One :class:`SimResult` per runnable policy, on the held-out part only."""
    names, tune, held_out = _prepare(requests, policies, tune_fraction)
    block_tokens = held_out[0].block_tokens

    def fleet() -> list[Replica]:
        return default_fleet(regions, replicas_per_region, block_tokens=block_tokens)

    def run(name: str) -> SimResult:
        if name == "gorgo":
            policy = _tuned_gorgo(lambda learner: simulate(tune, learner, fleet(), seed=seed), seed)
        else:
            policy = make_policy(name)
        return simulate(held_out, policy, fleet(), seed=seed)

    return _per_policy(names, "route-sim policies", progress, run)


def ttca_results(
    requests: Sequence[RouteRequest],
    *,
    policies: Sequence[str] | None = None,
    replicas_per_model: int = 1,
    tune_fraction: float = 0.5,
    max_attempts: int = 10,
    seed: int = 0,
    progress: ProgressFactory | None = None,
    combined_options: Mapping[str, Any] | None = None,
) -> list[TtcaResult]:
    """One :class:`TtcaResult` per runnable policy, on the held-out part only;
    ``combined_options`` are extra keyword arguments of the combined policy (for
    ablations, e.g. ``{"warm_retries": False}``)."""
    names, tune, held_out = _prepare(requests, policies, tune_fraction)
    accuracy = fit_accuracy([*tune, *synthetic_requests(600, seed=seed + 1)], seed=seed)
    costs = {m.name: m.cost for m in DEFAULT_MODELS}
    fleet = ttca_fleet(DEFAULT_MODELS, replicas_per_model)

    def build(name: str) -> Policy:
        if name == "laar":
            return make_policy("laar", accuracy=accuracy, costs=costs)
        if name == "combined":
            return make_policy("combined", accuracy=accuracy, **(combined_options or {}))
        if name == "gorgo":
            return _tuned_gorgo(
                lambda learner: run_ttca(
                    tune, learner, replicas=fleet, max_attempts=max_attempts, seed=seed
                ),
                seed,
            )
        return make_policy(name)

    def run(name: str) -> TtcaResult:
        return run_ttca(held_out, build(name), replicas=fleet, max_attempts=max_attempts, seed=seed)

    return _per_policy(names, "route-sim TTCA policies", progress, run)


def ttca_row(result: TtcaResult) -> dict[str, Any]:
    """A TTCA result as a :data:`RESULT_FIELDS` row (latencies over all attempts)."""
    row: dict[str, Any] = {"policy": result.policy, **result.attempt_summary.as_dict()}
    row["ttca_mean_s"] = result.ttca_mean_s
    row["success_rate"] = result.success_rate
    row["prefill_tokens"] = result.computed_tokens
    return {field: row[field] for field in RESULT_FIELDS}


def result_row(name: str, result: SimResult) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": name, **result.summary.as_dict()}
    row["ttca_mean_s"] = row["success_rate"] = None  # no correctness in Mooncake traces
    row["prefill_tokens"] = sum(r.prompt_tokens - r.cached_tokens for r in result.records)
    return {field: row[field] for field in RESULT_FIELDS}


def run_route_sim(
    trace_path: str | Path,
    *,
    policies: Sequence[str] | None = None,
    regions: int = 3,
    replicas_per_region: int = 1,
    tune_fraction: float = 0.5,
    seed: int = 0,
    progress: ProgressFactory | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The benchmark's rows (:data:`RESULT_FIELDS`) for a Mooncake-format trace, or
    the TTCA experiment's for an SCBench KV-lookup trace (``replicas_per_region``
    replicas per model there; ``regions`` does not apply); ``policies`` defaults to
    every registered policy that can run here, and ``limit`` keeps the first requests
    of the trace. Raises :class:`ConfigError` for an invalid trace or setting."""
    if trace_kind(trace_path) == "scbench_kv":
        kv_requests = load_scbench_kv(trace_path)[:limit]
        if not kv_requests:
            raise ConfigError(f"{trace_path}: the trace has no requests")
        ttca = ttca_results(
            kv_requests,
            policies=policies,
            replicas_per_model=replicas_per_region,
            tune_fraction=tune_fraction,
            seed=seed,
            progress=progress,
        )
        return [ttca_row(result) for result in ttca]
    requests = load_mooncake(trace_path, limit=limit)
    if not requests:
        raise ConfigError(f"{trace_path}: the trace has no requests")
    results = route_sim_results(
        requests,
        policies=policies,
        regions=regions,
        replicas_per_region=replicas_per_region,
        tune_fraction=tune_fraction,
        seed=seed,
        progress=progress,
    )
    return [result_row(result.policy, result) for result in results]


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


_TABLE_COLUMNS = (
    ("policy", "", "s"),
    ("TTFT p50 ms", "ttft_p50_ms", ",.0f"),
    ("TTFT p95 ms", "ttft_p95_ms", ",.0f"),
    ("TTFT p99 ms", "ttft_p99_ms", ",.0f"),
    ("E2E p95 s", "e2e_p95_s", ".2f"),
    ("hit ratio", "hit_ratio", ".1%"),
    ("max share", "max_replica_share", ".1%"),
    ("TTCA s", "ttca_mean_s", ".2f"),
    ("success", "success_rate", ".1%"),
    ("decision µs p50", "decision_us_p50", ",.1f"),
)


def route_sim_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """The benchmark rows as a rich table."""
    columns = [  # TTCA columns only when some row has them (not for Mooncake traces)
        column
        for column in _TABLE_COLUMNS
        if any(row[column[1] or "policy"] is not None for row in rows)
    ]
    table = Table(title=title)
    for header, _, _ in columns:
        if header == "policy":
            table.add_column(header, no_wrap=True, min_width=13)
        else:
            table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*(_cell(row[key or "policy"], fmt) for _, key, fmt in columns))
    return table


def plot_route_sim(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """Bar charts of p95 TTFT and p95 E2E per policy; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [row["policy"] for row in rows]
    figure, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5))
    panels = (
        ("p95 TTFT (s, lower: better)", [row["ttft_p95_ms"] / 1000 for row in rows]),
        ("p95 E2E (s, lower: better)", [row["e2e_p95_s"] for row in rows]),
    )
    for axis, (label, values) in zip(axes, panels, strict=True):
        bars = axis.barh(names, values, color="#4c72b0")
        axis.bar_label(bars, fmt="%.2f")
        axis.set_xlabel(label)
        axis.invert_yaxis()
        axis.margins(x=0.15)
    return save_figure(figure, path)
