"""Specification of the baseline routing policies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing.baselines import (
    LeastLoadPolicy,
    LeastRequestPolicy,
    NoReplicaAvailableError,
    PrefixCachePolicy,
    PrefixOwners,
    RandomPolicy,
    RoundRobinPolicy,
    SessionAffinityPolicy,
)
from contextpilot_rag.routing.prompt_keys import PromptKeys, serialise
from contextpilot_rag.routing.types import Policy, ReplicaState, RouteMemory, RouteRequest
from contextpilot_rag.sim.fleet import SimFleetView

FACTORIES: dict[str, Callable[[], Policy]] = {
    "random": lambda: RandomPolicy(0),
    "round-robin": RoundRobinPolicy,
    "least-request": LeastRequestPolicy,
    "least-load": LeastLoadPolicy,
    "session": SessionAffinityPolicy,
    "prefix": PrefixCachePolicy,
}


def fleet(*states: ReplicaState, count: int = 3) -> SimFleetView:
    replicas = states or tuple(ReplicaState(f"r{i}", "m") for i in range(count))
    return SimFleetView(0.0, tuple(replicas))


def req(
    request_id: str = "q",
    blocks: tuple[int, ...] = (),
    session: str | None = None,
    excluded: frozenset[tuple[str, str]] = frozenset(),
) -> RouteRequest:
    return RouteRequest(
        request_id, 16 * max(len(blocks), 1), blocks, session=session, excluded=excluded
    )


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_policy_conforms_to_the_protocol_and_is_named(name: str) -> None:
    policy = FACTORIES[name]()
    assert isinstance(policy, Policy)
    assert policy.name == name


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_unhealthy_and_excluded_replicas_are_skipped(name: str) -> None:
    policy = FACTORIES[name]()
    view = fleet(
        ReplicaState("r0", "m", healthy=False),
        ReplicaState("r1", "m"),
        ReplicaState("r2", "m"),
    )
    excluded = frozenset({("r1", "m")})
    for i in range(12):
        decision = policy.choose(req(f"q{i}", (i % 3, 99), f"s{i}", excluded), view)
        assert decision.replica_id == "r2"


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_all_excluded_falls_back_to_healthy_and_none_healthy_is_an_error(name: str) -> None:
    policy = FACTORIES[name]()
    view = fleet(ReplicaState("r0", "m"), ReplicaState("r1", "m", healthy=False))
    decision = policy.choose(req(excluded=frozenset({("r0", "m")})), view)
    assert decision.replica_id == "r0"
    with pytest.raises(NoReplicaAvailableError):
        policy.choose(req(), fleet(ReplicaState("r0", "m", healthy=False)))


def test_random_is_deterministic_by_seed_and_uses_every_replica() -> None:
    picks = [
        [policy.choose(req(f"q{i}"), fleet()).replica_id for i in range(20)]
        for policy in (RandomPolicy(5), RandomPolicy(5))
    ]
    assert picks[0] == picks[1]
    policy = RandomPolicy(5)
    seen = Counter(policy.choose(req(f"q{i}"), fleet()).replica_id for i in range(60))
    assert set(seen) == {"r0", "r1", "r2"}


def test_round_robin_cycles_in_fleet_order() -> None:
    policy = RoundRobinPolicy()
    picks = [policy.choose(req(f"q{i}"), fleet()).replica_id for i in range(6)]
    assert picks == ["r0", "r1", "r2", "r0", "r1", "r2"]


def test_least_request_picks_fewest_in_flight() -> None:
    view = fleet(ReplicaState("a", "m", in_flight=3), ReplicaState("b", "m", in_flight=1))
    assert LeastRequestPolicy().choose(req(), view).replica_id == "b"


def test_least_request_rotates_among_ties() -> None:
    policy = LeastRequestPolicy()
    assert {policy.choose(req(), fleet()).replica_id for _ in range(3)} == {"r0", "r1", "r2"}


def test_least_load_picks_fewest_queued_tokens() -> None:
    view = fleet(
        ReplicaState("a", "m", in_flight=1, queued_tokens=9000),
        ReplicaState("b", "m", in_flight=4, queued_tokens=100),
    )
    assert LeastLoadPolicy().choose(req(), view).replica_id == "b"


def test_session_sticks_and_spreads() -> None:
    policy = SessionAffinityPolicy()
    first = policy.choose(req("a", session="s1"), fleet()).replica_id
    assert all(
        policy.choose(req(f"q{i}", session="s1"), fleet()).replica_id == first for i in range(5)
    )
    spread = {policy.choose(req(session=f"s{i}"), fleet()).replica_id for i in range(30)}
    assert spread == {"r0", "r1", "r2"}


def test_session_falls_back_to_the_first_block() -> None:
    policy = SessionAffinityPolicy()
    a = policy.choose(req("a", (42, 1)), fleet()).replica_id
    assert all(policy.choose(req(f"q{i}", (42, i)), fleet()).replica_id == a for i in range(5))


def test_session_moves_only_keys_of_a_removed_replica() -> None:
    policy = SessionAffinityPolicy()
    full, reduced = fleet(count=4), fleet(*fleet(count=4).replicas[:3])
    for i in range(40):
        before = policy.choose(req(session=f"s{i}"), full).replica_id
        after = policy.choose(req(session=f"s{i}"), reduced).replica_id
        assert before == after or before == "r3"


def test_prefix_follows_the_longest_recorded_prefix() -> None:
    policy = PrefixCachePolicy()
    view = fleet()
    first = policy.choose(req("a", (1, 2, 3)), view).replica_id
    other = policy.choose(req("b", (7, 8)), view).replica_id
    assert other != first  # no match: least-request rotates
    decision = policy.choose(req("c", (1, 2, 9)), view)
    assert decision.replica_id == first
    assert decision.predicted_cached_tokens == 32
    assert policy.choose(req("d", (7, 8, 5)), view).replica_id == other


def test_prefix_matches_a_routing_clients_boundaries_past_its_unkeyed_blocks() -> None:
    """A RoutingClient keys only boundaries (every other block gets a hash unique to
    its request): the prefix baseline matches the deepest shared boundary, not only
    the first block."""
    keys = PromptKeys()
    document = {"role": "user", "content": "Document text. " * 400}

    def request(rid: str, question: str) -> RouteRequest:
        chat = [{"role": "system", "content": "sys " * 50}, document]
        return keys.request(
            serialise([*chat, {"role": "user", "content": question}]), request_id=rid
        )

    policy = PrefixCachePolicy()
    first = policy.choose(request("a", "First question?"), fleet())
    second = request("b", "Another question?")
    decision = policy.choose(second, fleet())
    assert decision.replica_id == first.replica_id and decision.reason == "prefix-match"
    deepest = max(second.boundaries[:-1]) if len(second.boundaries) > 1 else 1
    assert decision.predicted_cached_tokens >= deepest * second.block_tokens


def test_prefix_falls_back_to_least_request_under_imbalance() -> None:
    policy = PrefixCachePolicy(imbalance_threshold=2)
    policy.choose(req("a", (1, 2)), fleet())  # r0 on an idle fleet
    busy = fleet(
        ReplicaState("r0", "m", in_flight=5),
        ReplicaState("r1", "m", in_flight=2),
        ReplicaState("r2", "m", in_flight=4),
    )
    decision = policy.choose(req("b", (1, 2)), busy)
    assert decision.replica_id == "r1"
    assert decision.reason.startswith("prefix-imbalance")
    within = fleet(ReplicaState("r0", "m", in_flight=3), ReplicaState("r1", "m", in_flight=1))
    assert policy.choose(req("c", (1, 2)), within).replica_id == "r1"  # b moved the prefix


def test_prefix_table_is_bounded_with_lru() -> None:
    policy = PrefixCachePolicy(capacity_blocks=4)
    for i in range(10):
        policy.choose(req(f"q{i}", (i * 10, i * 10 + 1)), fleet())
        assert len(policy.route_memory) <= 4
    with pytest.raises(ConfigError):
        PrefixCachePolicy(capacity_blocks=0)


def test_only_the_prefix_baseline_keeps_route_memory() -> None:
    for name, factory in FACTORIES.items():
        memory = factory().route_memory
        if name == "prefix":
            assert isinstance(memory, PrefixOwners) and isinstance(memory, RouteMemory)
        else:
            assert memory is None


def test_a_one_prompt_slot_owns_only_its_last_prompt() -> None:
    owners = PrefixOwners()
    owners.limit_prompts("slot", 1)
    owners.record((1, 2, 3), "slot")
    owners.record((5, 6), "other")
    owners.record((1, 2, 9), "slot")  # overwrites the first prompt but its shared head
    everyone = {"slot", "other"}.__contains__
    assert owners.longest_match((1, 2, 3), everyone) == (2, "slot")
    assert owners.longest_match((1, 2, 9), everyone) == (3, "slot")
    assert owners.longest_match((5, 6), everyone) == (2, "other")  # unbounded
    assert len(owners) == 5
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="max_prompts"):
            owners.limit_prompts("slot", bad)  # type: ignore[arg-type]
    owners.limit_prompts("slot", None)  # unbounded again: nothing more is forgotten
    owners.record((7, 8), "slot")
    assert owners.longest_match((1, 2, 9), everyone) == (3, "slot")


def test_prefix_over_slots_stops_following_an_overwritten_prompt() -> None:
    policy = PrefixCachePolicy()
    for replica in ("r0", "r1", "r2"):
        policy.route_memory.limit_prompts(replica, 1)
    first = policy.choose(req("a", (1, 2, 3)), fleet()).replica_id
    policy.route_memory.record((7, 8, 9), first)  # another prompt overwrote the slot
    again = policy.choose(req("b", (1, 2, 3)), fleet())
    assert again.reason == "prefix-miss:least-request"
