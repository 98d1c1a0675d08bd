"""Ranvier learned prefix routes: table semantics, policy behaviour, decision cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing.measure import measure_decision_cost
from contextpilot_rag.routing.ranvier import RanvierConfig, RanvierPolicy, Route, RouteTable
from contextpilot_rag.routing.types import Decision, Outcome, ReplicaState, RouteRequest


@dataclass(frozen=True)
class Fleet:
    now: float
    replicas: Sequence[ReplicaState]


def chain(tokens: Sequence[int]) -> tuple[int, ...]:
    hashes, h = [], 0
    for t in tokens:
        h = hash((h, t))
        hashes.append(h)
    return tuple(hashes)


def fleet(n: int = 4, now: float = 0.0, **overrides: ReplicaState) -> Fleet:
    replicas = [ReplicaState(f"r{k}", "m") for k in range(n)]
    replicas = [overrides.get(r.replica_id, r) for r in replicas]
    return Fleet(now, tuple(replicas))


def request(blocks: Sequence[int], boundaries: Sequence[int], rid: str = "q") -> RouteRequest:
    return RouteRequest(
        rid, len(blocks) * 16, block_hashes=chain(blocks), boundaries=tuple(boundaries)
    )


@settings(max_examples=60, deadline=None)
@given(
    learned=st.lists(
        st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=8), st.sampled_from("abc")),
        max_size=6,
    ),
    query=st.lists(st.integers(0, 2), min_size=1, max_size=8),
)
def test_longest_prefix_match_equals_brute_force(
    learned: list[tuple[list[int], str]], query: list[int]
) -> None:
    table = RouteTable()
    reference: dict[tuple[int, ...], str] = {}
    for blocks, replica in learned:
        table.learn(chain(blocks), range(1, len(blocks) + 1), replica, now=0.0)
        for b in range(1, len(blocks) + 1):
            reference[tuple(blocks[:b])] = replica
    match = table.lookup(chain(query), range(1, len(query) + 1), now=0.0)
    expected = max(
        ((len(p), r) for p, r in reference.items() if tuple(query[: len(p)]) == p), default=None
    )
    got = None if match is None else (match.route.blocks, match.route.replica_id)
    assert got == expected


def test_table_is_bounded_and_evicts_least_recently_used() -> None:
    table = RouteTable(capacity=3)
    for key in range(5):
        table.put(key, Route("a", 1, 0.0))
    assert len(table) == 3
    assert table.get(0, 0.0) is None and table.get(4, 0.0) is not None


def test_routes_expire_after_ttl() -> None:
    table = RouteTable(ttl_s=10.0)
    table.put(1, Route("a", 1, learned_s=0.0))
    assert table.get(1, now=10.0) is not None
    assert table.get(1, now=10.5) is None


def test_peer_routes_are_evicted_before_local_ones() -> None:
    table = RouteTable(capacity=2)
    table.put(1, Route("a", 1, 0.0))
    assert table.import_routes([(2, Route("b", 1, 0.0))]) == 1
    table.put(3, Route("c", 1, 0.0))
    assert table.get(1, 0.0) is not None and table.get(3, 0.0) is not None
    assert table.get(2, 0.0) is None


def test_peer_route_never_replaces_local_route() -> None:
    table = RouteTable()
    table.put(1, Route("a", 1, 0.0))
    assert table.import_routes([(1, Route("b", 1, 0.0))]) == 0
    route = table.get(1, 0.0)
    assert route is not None and route.replica_id == "a" and route.trust == "local"


def test_policy_follows_learned_route() -> None:
    policy = RanvierPolicy()
    first = policy.choose(request([1, 2, 3, 4], [2, 4], "a"), fleet())
    second = policy.choose(request([1, 2, 9, 9], [2, 4], "b"), fleet())
    assert second.replica_id == first.replica_id
    assert second.reason == "route" and second.predicted_cached_tokens == 2 * 16


def test_a_one_prompt_slot_forgets_the_routes_its_next_prompt_overwrote() -> None:
    table = RouteTable()
    table.limit_prompts("slot", 1)
    first, second = request([1, 2, 3, 4], [2, 4], "a"), request([1, 2, 9, 9], [2, 4], "b")
    elsewhere = request([5, 6, 7, 8], [2, 4], "x")
    table.learn(first.block_hashes, first.boundaries, "slot", 0.0)
    table.learn(elsewhere.block_hashes, elsewhere.boundaries, "other", 0.0)
    table.learn(second.block_hashes, second.boundaries, "slot", 1.0)
    assert table.get(first.block_hashes[3], 1.0) is None  # overwritten on its slot
    assert table.get(first.block_hashes[1], 1.0) == Route("slot", 2, 1.0)  # shared: kept
    assert table.get(second.block_hashes[3], 1.0) == Route("slot", 4, 1.0)
    assert table.get(elsewhere.block_hashes[3], 1.0) == Route("other", 4, 0.0)  # unbounded
    assert len(table) == 4
    table.limit_prompts("slot", None)  # unbounded again: nothing more is forgotten
    table.learn(first.block_hashes, first.boundaries, "slot", 2.0)
    table.learn(elsewhere.block_hashes, elsewhere.boundaries, "slot", 3.0)
    assert table.get(first.block_hashes[3], 3.0) == Route("slot", 4, 2.0)


def test_a_bad_prompt_limit_is_refused_and_changes_nothing() -> None:
    table = RouteTable()
    table.limit_prompts("slot", 1)
    first, second = request([1, 2, 3, 4], [2, 4], "a"), request([1, 2, 9, 9], [2, 4], "b")
    table.learn(first.block_hashes, first.boundaries, "slot", 0.0)
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="max_prompts"):
            table.limit_prompts("slot", bad)  # type: ignore[arg-type]
    assert table.get(first.block_hashes[3], 0.0) == Route("slot", 4, 0.0)  # kept
    table.learn(second.block_hashes, second.boundaries, "slot", 1.0)  # the bound of 1 holds
    assert table.get(first.block_hashes[3], 1.0) is None


def test_ranvier_over_slots_stops_following_an_overwritten_prompt() -> None:
    policy = RanvierPolicy()
    for slot in ("r0", "r1", "r2", "r3"):
        policy.table.limit_prompts(slot, 1)
    first = policy.choose(request([1, 2, 3, 4], [2, 4], "a"), fleet())
    # a prompt sharing nothing lands on first's slot (hash fallback) and overwrites it
    slot = first.replica_id
    overwrite = request([7, 8, 9, 9], [2, 4], "b")
    policy.table.learn(overwrite.block_hashes, overwrite.boundaries, slot, 0.0)
    again = policy.choose(request([1, 2, 3, 4], [2, 4], "c"), fleet())
    assert again.reason != "route" and again.predicted_cached_tokens == 0


def test_load_override_when_preferred_far_above_median() -> None:
    policy = RanvierPolicy(RanvierConfig(load_factor=2.0, load_slack=4))
    first = policy.choose(request([1, 2], [2], "a"), fleet())
    busy = ReplicaState(first.replica_id, "m", in_flight=4)  # 4 <= 2 * median 0 + slack 4
    assert policy.choose(request([1, 2], [2], "b"), fleet(**{first.replica_id: busy})).reason == (
        "route"
    )
    hot = ReplicaState(first.replica_id, "m", in_flight=50)
    decision = policy.choose(request([1, 2], [2], "c"), fleet(**{first.replica_id: hot}))
    assert decision.reason == "load-override" and decision.replica_id != first.replica_id


@pytest.mark.parametrize("seed", range(8))
def test_a_load_override_on_queued_tokens_leaves_the_overloaded_replica(seed: int) -> None:
    """Queued tokens trip the override while every replica has as many requests in
    flight: the fallback, which balances requests in flight, must not hand the request
    back to the route's replica (often its hash placement too)."""
    policy = RanvierPolicy()
    first = policy.choose(request([seed, 1, 2], [3], "a"), fleet())
    flooded = {
        r.replica_id: ReplicaState(
            r.replica_id,
            "m",
            in_flight=1,
            queued_tokens=500_000 if r.replica_id == first.replica_id else 0,
        )
        for r in fleet().replicas
    }
    decision = policy.choose(request([seed, 1, 2], [3], "b"), fleet(**flooded))
    assert decision.reason == "load-override" and decision.replica_id != first.replica_id


def test_independent_policies_converge_on_first_block() -> None:
    for first_block in range(20):
        a = RanvierPolicy().choose(request([first_block, 1], [2], "x"), fleet(8))
        b = RanvierPolicy().choose(request([first_block, 7], [2], "y"), fleet(8))
        assert (a.reason, a.replica_id) == ("hash", b.replica_id)


def test_hash_fallback_respects_load_bound() -> None:
    policy = RanvierPolicy(RanvierConfig(hash_load_factor=1.25))
    in_flight = {f"r{k}": 0 for k in range(4)}
    for i in range(200):
        view = Fleet(0.0, tuple(ReplicaState(r, "m", in_flight=n) for r, n in in_flight.items()))
        decision = policy.choose(request([0, i], [], f"q{i}"), view)  # same first block
        in_flight[decision.replica_id] += 1
        bound = -(-1.25 * sum(in_flight.values()) // 4)
        assert max(in_flight.values()) <= bound


def test_feedback_trims_disproved_routes() -> None:
    policy = RanvierPolicy()
    req = request([1, 2, 3, 4], [1, 2, 4], "a")
    policy.choose(req, fleet())
    decision = policy.choose(request([1, 2, 3, 4], [1, 2, 4], "b"), fleet())
    assert decision.predicted_cached_tokens == 64
    policy.observe(Outcome(req, decision, ttft_s=0.1, e2e_s=1.0, cached_tokens=16))
    again = policy.choose(request([1, 2, 3, 4], [1, 2, 4], "c"), fleet())
    assert again.predicted_cached_tokens == 16


def test_unhealthy_and_excluded_replicas_are_skipped() -> None:
    policy = RanvierPolicy()
    first = policy.choose(request([1, 2], [2], "a"), fleet())
    sick = ReplicaState(first.replica_id, "m", healthy=False)
    assert policy.choose(request([1, 2], [2]), fleet(**{first.replica_id: sick})).replica_id != (
        first.replica_id
    )
    excluded = RouteRequest(
        "b", 32, block_hashes=chain([1, 2]), boundaries=(2,),
        excluded=frozenset({(first.replica_id, "m")}),
    )  # fmt: skip
    assert policy.choose(excluded, fleet()).replica_id != first.replica_id


def test_capacity_model_stops_routes_to_evicted_prefixes() -> None:
    policy = RanvierPolicy(RanvierConfig(capacity_tokens_per_replica=64))
    only = Fleet(0.0, (ReplicaState("r0", "m"),))
    policy.choose(request([1, 2, 3, 4], [2, 4], "a"), only)
    policy.choose(request([7, 8, 9, 10], [2, 4], "b"), only)  # evicts prefix [1, 2, 3, 4]
    decision = policy.choose(request([1, 2, 3, 4], [2, 4], "c"), only)
    assert decision.reason == "hash" and decision.predicted_cached_tokens == 0


def test_the_capacity_model_leaves_routes_shared_by_a_peer_to_their_trust() -> None:
    """The cache model sees only this router's dispatches, so it cannot have evicted a
    route a peer learned: that route is followed as without the model."""
    asked = request([1, 2, 3, 4], [2, 4], "a")
    for config in (RanvierConfig(), RanvierConfig(capacity_tokens_per_replica=1_000_000)):
        policy = RanvierPolicy(config)
        policy.table.learn_peer(asked.block_hashes[3], "r3", 4, 0.0, 0.0)
        decision = policy.choose(asked, fleet())
        assert (decision.replica_id, decision.reason) == ("r3", "route")


def test_decision_cost_is_measured() -> None:
    result = measure_decision_cost(RanvierPolicy(), requests=50, warmup=10, prompt_tokens=4_000)
    assert result["decisions"] == 50 and 0 < result["p50_us"] <= result["p99_us"]


def test_decision_reports_cached_tokens_within_prompt() -> None:
    decision: Decision = RanvierPolicy().choose(request([1], [1]), fleet())
    assert 0 <= decision.predicted_cached_tokens <= 16


@pytest.mark.parametrize(
    "options",
    [{"load_factor": float("nan")}, {"hash_load_factor": float("nan")}, {"load_factor": 0.5}],
)
def test_a_load_factor_that_is_not_a_number_at_least_one_is_refused(
    options: dict[str, float],
) -> None:
    with pytest.raises(ConfigError):
        RanvierConfig(**options)  # type: ignore[arg-type]
