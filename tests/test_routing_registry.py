"""Every policy name of the contract builds a policy that routes a real trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextpilot_rag.errors import ConfigError, InvalidRouteRequestError
from contextpilot_rag.routing import (
    POLICY_NAMES,
    Policy,
    ReplicaState,
    RouteMemory,
    RouteRequest,
    make_policy,
)
from contextpilot_rag.routing.metrics import route_table_entries
from contextpilot_rag.sim import default_fleet, load_mooncake, simulate
from contextpilot_rag.sim.fleet import SimFleetView

LEARNS_PREFIXES = {"prefix", "ranvier", "gorgo", "combined"}

MOONCAKE = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake" / "synthetic_trace.jsonl"
)


def test_the_contract_names_are_registered() -> None:
    expected = {"random", "round-robin", "least-request", "least-load", "session", "prefix"}
    learned = {"ranvier", "gorgo", "gorgo-lb", "laar", "combined"}
    assert expected | learned == set(POLICY_NAMES)


def test_an_unknown_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown routing policy"):
        make_policy("fastest")


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared/data/mooncake is not present")
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_each_policy_routes_the_mooncake_trace(name: str) -> None:
    if name == "gorgo-lb":
        pytest.importorskip("gorgo", reason="gorgo-lb is an optional comparison")
    policy = make_policy(name)
    assert isinstance(policy, Policy) and policy.name == name
    requests = load_mooncake(MOONCAKE, limit=150, block_tokens=512)
    result = simulate(requests, policy, default_fleet(3, 1, block_tokens=512))
    assert len(result.records) == len(requests)
    summary = result.summary
    assert 0 < summary.ttft_p50_ms <= summary.ttft_p95_ms <= summary.ttft_p99_ms
    assert 0.0 <= summary.hit_ratio < 1.0
    assert 1 / 3 <= summary.max_replica_share <= 1.0


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_each_policy_names_its_route_memory(name: str) -> None:
    if name == "gorgo-lb":
        pytest.importorskip("gorgo", reason="gorgo-lb is an optional comparison")
    policy = make_policy(name)
    memory = policy.route_memory
    if name not in LEARNS_PREFIXES:
        assert memory is None and route_table_entries(policy) is None
        return
    assert isinstance(memory, RouteMemory) and len(memory) == 0
    view = SimFleetView(0.0, (ReplicaState("r0", "m"), ReplicaState("r1", "m")))
    policy.choose(RouteRequest("q", 64, block_hashes=(1, 2, 3, 4), boundaries=(2, 4)), view)
    assert len(memory) > 0 and route_table_entries(policy) == len(memory)
    memory.limit_prompts("r0", 1)
    memory.limit_prompts("r0", None)
    with pytest.raises(ConfigError, match="max_prompts"):
        memory.limit_prompts("r0", 0)


def test_a_route_request_stores_its_boundaries_ascending_and_distinct() -> None:
    request = RouteRequest("q", 64, block_hashes=(11, 12, 13, 14), boundaries=(4, 2, 2, 1))
    assert request.boundaries == (1, 2, 4)
    listed = RouteRequest("q", 64, block_hashes=(11, 12, 13, 14), boundaries=[1, 3])  # type: ignore[arg-type]
    assert listed.boundaries == (1, 3)


@pytest.mark.parametrize(
    "overrides",
    [
        {"boundaries": (0, 2)},
        {"boundaries": (2, 5)},
        {"prompt_tokens": -1},
        {"block_tokens": 0},
        {"expected_output_tokens": -5},
    ],
)
def test_a_malformed_route_request_is_rejected(overrides: dict[str, object]) -> None:
    fields: dict[str, object] = {"prompt_tokens": 64, "block_hashes": (11, 12, 13, 14)}
    fields.update(overrides)
    with pytest.raises(InvalidRouteRequestError):
        RouteRequest("q", **fields)  # type: ignore[arg-type]
