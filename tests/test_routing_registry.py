"""Every policy name of the contract builds a policy that routes a real trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextpilot_rag.errors import ConfigError, InvalidInputError, InvalidRouteRequestError
from contextpilot_rag.routing import (
    POLICY_NAMES,
    Decision,
    Outcome,
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


@pytest.mark.parametrize(
    "overrides",
    [
        {"prompt_tokens": float("nan")},
        {"expected_output_tokens": float("inf")},
        {"block_tokens": float("nan")},
        {"arrival_s": float("nan")},
    ],
)
def test_a_route_request_with_a_non_finite_number_is_rejected(
    overrides: dict[str, object],
) -> None:
    """NaN passes every ``< 0`` check: one such request made the combined policy's
    queue model NaN for good (every later request went to one replica)."""
    with pytest.raises(InvalidRouteRequestError):
        RouteRequest("q", **{"prompt_tokens": 64, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "overrides",
    [
        {"prefill_tokens_per_s": 0},
        {"decode_tokens_per_s": 0.0},
        {"rtt_s": float("nan")},
        {"rtt_s": -0.1},
        {"in_flight": -1},
        {"decode_s_per_context_token": float("inf")},
    ],
)
def test_a_replica_state_with_a_rate_of_zero_or_a_non_finite_number_is_refused(
    overrides: dict[str, object],
) -> None:
    with pytest.raises(ConfigError):
        ReplicaState("r0", "m", **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ttft_s", "e2e_s", "cached"),
    [(float("nan"), 1.0, 0), (0.1, float("inf"), 0), (-0.1, 1.0, 0), (0.1, 1.0, -5)],
)
def test_an_outcome_with_a_non_finite_or_negative_measure_is_refused(
    ttft_s: float, e2e_s: float, cached: int
) -> None:
    """One NaN latency made combined's decode scale, laar's response time and the
    tuner's parent score NaN for good."""
    request = RouteRequest("q", 64)
    decision = Decision("r0", "m", "test")
    with pytest.raises(InvalidInputError):
        Outcome(request, decision, ttft_s, e2e_s, cached_tokens=cached)


def test_the_prefix_policys_reasons_are_a_small_fixed_set() -> None:
    """The reason is a metrics label: one value per matched depth made one series per
    prompt length."""
    policy = make_policy("prefix")
    fleet = SimFleetView(0.0, (ReplicaState("r0", "m"), ReplicaState("r1", "m")))
    reasons = set()
    for n in range(1, 40):
        hashes = tuple(range(1, n + 1))
        request = RouteRequest(f"q{n}", 16 * n, block_hashes=hashes, boundaries=(n,))
        decision = policy.choose(request, fleet)
        reasons.add(decision.reason)
        policy.observe(Outcome(request, decision, 0.1, 0.2))
    assert len(reasons) <= 3 and "prefix-match" in reasons
