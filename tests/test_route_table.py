"""Conformance of every learned route table (ranvier's RouteTable, gorgo's
PrefixLocations) to what RouteTableBase promises: a capacity bound, a TTL, per-replica
prompt bounds, and corrections from what the engine reported."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing.gorgo import PrefixLocations
from contextpilot_rag.routing.ranvier import RouteTable
from contextpilot_rag.routing.types import Decision, Outcome, RouteRequest

Table = RouteTable | PrefixLocations


def request(name: str, blocks: int) -> RouteRequest:
    """``blocks`` blocks of a prompt named ``name``, a boundary after each block."""
    hashes = tuple(hash((name, b)) for b in range(1, blocks + 1))
    return RouteRequest(name, blocks * 16, hashes, boundaries=tuple(range(1, blocks + 1)))


def record(table: Table, sent: RouteRequest, replica_id: str, now: float = 0.0) -> None:
    if isinstance(table, PrefixLocations):
        table.record(sent.block_hashes, sent.boundaries, replica_id, now)
    else:
        table.learn(sent.block_hashes, sent.boundaries, replica_id, now)


def longest(table: Table, wanted: RouteRequest, now: float = 0.0) -> dict[str, int]:
    """Replica → blocks of the longest prefix of ``wanted`` the table sends there."""
    if isinstance(table, PrefixLocations):
        return table.cached_blocks(wanted, now)
    match = table.lookup(wanted.block_hashes, wanted.boundaries, now)
    return {} if match is None else {match.route.replica_id: match.route.blocks}


TABLES: dict[str, Callable[..., Table]] = {"ranvier": RouteTable, "gorgo": PrefixLocations}


@pytest.fixture(params=sorted(TABLES))
def make(request: pytest.FixtureRequest) -> Callable[..., Table]:
    return TABLES[request.param]


def test_a_table_holds_at_most_capacity_keys_dropping_the_least_recent(
    make: Callable[..., Table],
) -> None:
    table = make(capacity=2)
    for name in ("old", "middle", "new"):
        record(table, request(name, 1), "a")
    assert len(table) == 2
    assert longest(table, request("old", 1)) == {}
    assert longest(table, request("new", 1)) == {"a": 1}


def test_a_route_older_than_the_ttl_is_never_used(make: Callable[..., Table]) -> None:
    table = make(ttl_s=10.0)
    record(table, request("p", 2), "a", now=0.0)
    assert longest(table, request("p", 2), now=10.0) == {"a": 2}
    assert longest(table, request("p", 2), now=10.5) == {}


def test_a_replica_limited_to_one_prompt_keeps_only_the_latest_routes(
    make: Callable[..., Table],
) -> None:
    table = make()
    table.limit_prompts("slot", 1)
    record(table, request("first", 2), "slot")
    record(table, request("second", 2), "slot")
    assert longest(table, request("first", 2)) == {}
    assert longest(table, request("second", 2)) == {"slot": 2}
    with pytest.raises(ConfigError, match="max_prompts"):
        table.limit_prompts("slot", 0)


def test_correct_forgets_what_the_engine_showed_it_does_not_hold(
    make: Callable[..., Table],
) -> None:
    table = make()
    sent = request("p", 4)
    record(table, sent, "a")
    decision = Decision("a", "m", "route", predicted_cached_tokens=4 * 16)
    table.correct(Outcome(sent, decision, 0.1, 0.2, cached_tokens=2 * 16))
    assert longest(table, sent) == {"a": 2}
    table.correct(Outcome(sent, decision, 0.1, 0.2, error="HTTP 500"))
    assert longest(table, sent) == {}


def test_a_disproved_prediction_keeps_the_requests_own_longer_prefixes(
    make: Callable[..., Table],
) -> None:
    # a first turn predicted to read only the shared system prompt (block 1) on "a",
    # where the engine had nothing: the system prompt's route goes, but "a" has just
    # prefilled the whole prompt, so the next turn must still find it there
    table = make()
    system = request("system", 1)
    record(table, system, "a")
    hashes = (system.block_hashes[0], *(hash(("turn", b)) for b in range(2, 5)))
    first_turn = RouteRequest("t0", 4 * 16, hashes, boundaries=(1, 2, 3, 4))
    record(table, first_turn, "a")
    decision = Decision("a", "m", "route", predicted_cached_tokens=16)
    table.correct(Outcome(first_turn, decision, 0.1, 0.2, cached_tokens=0))
    assert longest(table, system) == {}
    assert longest(table, first_turn) == {"a": 4}


def test_a_cancelled_request_corrects_nothing(make: Callable[..., Table]) -> None:
    table = make()
    sent = request("p", 2)
    record(table, sent, "a")
    decision = Decision("a", "m", "route", predicted_cached_tokens=2 * 16)
    table.correct(Outcome(sent, decision, 0.0, 0.0, error="cancelled", cancelled=True))
    assert longest(table, sent) == {"a": 2}


@pytest.mark.parametrize(("capacity", "ttl_s"), [(0, 1.0), (1, 0.0), (1, float("nan"))])
def test_bad_bounds_are_config_errors(
    make: Callable[..., Table], capacity: int, ttl_s: float
) -> None:
    with pytest.raises(ConfigError):
        make(capacity=capacity, ttl_s=ttl_s)
