"""Comparing routing policies on a trace (``benchmarks/route_sim.py``): held-out
evaluation, deterministic rows, the script's command line."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import pytest
from lib.route_sim import (
    RESULT_FIELDS,
    route_sim_results,
    run_route_sim,
    split_trace,
    ttca_results,
)
from route_sim import main

from contextpilot_rag.routing import POLICY_NAMES
from contextpilot_rag.sim.traces import load_mooncake, load_scbench_kv

MOONCAKE = Path(__file__).resolve().parents[2] / "shared/data/mooncake/synthetic_trace.jsonl"
FAST = ["random", "round-robin", "least-load", "session", "prefix", "ranvier", "gorgo"]


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    """120 Mooncake-format requests: 6 shared 4-block prefixes plus unique tails."""
    path = tmp_path / "tiny.jsonl"
    lines = []
    for i in range(120):
        prefix = [1000 * (i % 6) + b for b in range(4)]
        hash_ids = prefix + [100_000 + 10 * i + b for b in range(1 + i % 3)]
        record = {
            "timestamp": i * 150,
            "input_length": 512 * len(hash_ids) - 100,
            "output_length": 20 + i % 7,
            "hash_ids": hash_ids,
        }
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def without_timing(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in row.items() if k != "decision_us_p50"} for row in rows]


def test_rows_have_exactly_the_contract_fields_and_sane_values(tiny_trace: Path) -> None:
    rows = run_route_sim(tiny_trace, policies=FAST)
    assert [row["policy"] for row in rows] == FAST
    for row in rows:
        assert tuple(row) == RESULT_FIELDS
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p95_ms"] <= row["ttft_p99_ms"]
        assert row["e2e_p95_s"] * 1000 >= row["ttft_p95_ms"]
        assert 0.0 <= row["hit_ratio"] < 1.0
        assert 1 / 3 <= row["max_replica_share"] <= 1.0
        assert row["ttca_mean_s"] is None and row["success_rate"] is None
        assert row["decision_us_p50"] >= 0


def test_rows_are_deterministic_apart_from_wall_clock_timing(tiny_trace: Path) -> None:
    first = run_route_sim(tiny_trace, policies=FAST, replicas_per_region=2, seed=3)
    second = run_route_sim(tiny_trace, policies=FAST, replicas_per_region=2, seed=3)
    assert without_timing(first) == without_timing(second)


def test_only_the_held_out_part_is_evaluated(tiny_trace: Path) -> None:
    requests = load_mooncake(tiny_trace)
    tune, held_out = split_trace(requests, 0.25)
    assert (len(tune), len(held_out)) == (30, 90)
    assert max(r.arrival_s for r in tune) <= min(r.arrival_s for r in held_out)
    for result in route_sim_results(requests, policies=["gorgo", "prefix"], tune_fraction=0.25):
        assert sorted(r.request_id for r in result.records) == sorted(
            r.request_id for r in held_out
        )


def test_planned_policies_are_skipped_and_unknown_ones_rejected(tiny_trace: Path) -> None:
    # laar / combined run once the registry knows them, and are skipped until then
    rows = run_route_sim(tiny_trace, policies=["random", "laar", "combined"])
    registered = [name for name in ("laar", "combined") if name in POLICY_NAMES]
    assert [row["policy"] for row in rows] == ["random", *registered]
    with pytest.raises(ValueError, match="unknown routing policies"):
        run_route_sim(tiny_trace, policies=["random", "no-such-policy"])


def kv_trace(path: Path, records: int = 8, turns: int = 3, pairs: int = 40) -> Path:
    """An SCBench-style KV-lookup trace: ``records`` contexts of ``pairs`` uuid pairs,
    ``turns`` questions each (the turns of a record share its context as a prefix)."""
    rng = random.Random(7)
    lines = []
    for i in range(records):
        kv = {
            str(uuid.UUID(int=rng.getrandbits(128))): str(uuid.UUID(int=rng.getrandbits(128)))
            for _ in range(pairs)
        }
        keys = rng.sample(list(kv), turns)
        turn_list = [{"input": f'Key: "{k}"\nThe value is: ', "answer": kv[k]} for k in keys]
        lines.append(json.dumps({"id": i, "context": json.dumps(kv), "multi_turns": turn_list}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TTCA_POLICIES = ["least-load", "session", "laar", "combined"]


def test_an_scbench_trace_runs_the_ttca_experiment_on_the_held_out_part(tmp_path: Path) -> None:
    path = kv_trace(tmp_path / "kv.jsonl")
    rows = run_route_sim(path, policies=TTCA_POLICIES)
    assert [row["policy"] for row in rows] == TTCA_POLICIES
    for row in rows:
        assert tuple(row) == RESULT_FIELDS
        assert row["ttca_mean_s"] > 0 and 0 < row["success_rate"] <= 1
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p95_ms"] <= row["ttft_p99_ms"]
    assert without_timing(rows) == without_timing(run_route_sim(path, policies=TTCA_POLICIES))
    requests = load_scbench_kv(path)
    _, held_out = split_trace(requests, 0.5)
    for result in ttca_results(requests, policies=["combined", "session"]):
        assert sorted(r.logical_id for r in result.records) == sorted(
            str(r.logical_id) for r in held_out
        )
        assert len(result.attempts) >= len(held_out)


def test_an_empty_scbench_trace_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "kv.jsonl"
    path.write_text(json.dumps({"id": 0, "context": "{}", "multi_turns": []}) + "\n")
    with pytest.raises(ValueError, match="no requests"):
        run_route_sim(path)


def test_script_json_prints_only_the_rows(
    tiny_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "route.png"
    argv = ["--trace", str(tiny_trace), "--policies", "random,gorgo", "--json"]
    assert main([*argv, "--plot", str(plot)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["policy"] for row in rows] == ["random", "gorgo"]
    assert plot.exists() or not _has_matplotlib()


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_script_prints_a_table_by_default(
    tiny_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--trace", str(tiny_trace), "--policies", "prefix"]) == 0
    assert "prefix" in capsys.readouterr().out


def test_script_unknown_policy_exits_2_with_a_message(
    tiny_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--trace", str(tiny_trace), "--policies", "random,bogus"]) == 2
    assert "unknown routing policies ['bogus']" in capsys.readouterr().err


def test_script_scbench_trace_prints_ttca_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = kv_trace(tmp_path / "kv.jsonl", records=4)
    assert main(["--trace", str(path), "--policies", "laar,combined", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["policy"] for row in rows] == ["laar", "combined"]
    assert all(row["ttca_mean_s"] > 0 for row in rows)


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"Mooncake trace not found at {MOONCAKE}")
def test_first_300_mooncake_requests_evaluate_the_held_out_150() -> None:
    requests = load_mooncake(MOONCAKE, limit=300)
    results = route_sim_results(requests, policies=FAST)
    assert all(len(result.records) == 150 for result in results)
    rows = run_route_sim(MOONCAKE, policies=FAST, limit=300)
    again = run_route_sim(MOONCAKE, policies=FAST, limit=300)
    assert without_timing(rows) == without_timing(again)
    assert all(tuple(row) == RESULT_FIELDS for row in rows)
