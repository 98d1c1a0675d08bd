"""The combined policy over targets that keep only their last prompts (llama-server
slots): the cost of pushing a kept prompt out, and what the route table tells it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import CombinedPolicy
from contextpilot_rag.routing.gorgo import PrefixLocations
from contextpilot_rag.routing.types import ReplicaState, RouteRequest

SYSTEM = [1, 2]  # blocks every prompt starts with


@dataclass(frozen=True)
class Fleet:
    now: float
    replicas: Sequence[ReplicaState]


def req(rid: str, blocks: Sequence[int]) -> RouteRequest:
    hashes = tuple(hash((0, *blocks[: i + 1])) for i in range(len(blocks)))
    n = len(blocks)
    return RouteRequest(rid, n * 16, block_hashes=hashes, boundaries=tuple(range(1, n + 1)))


def conversation(first: int, turns: int = 1) -> list[int]:
    """The system blocks, then ``turns`` turns of 19 blocks of one conversation."""
    return [*SYSTEM, *range(first, first + 19 * turns)]


def slots(
    eviction_weight: float | None = None,
) -> tuple[CombinedPolicy, tuple[ReplicaState, ...]]:
    """A combined policy over two one-prompt slots, ``s0`` first in fleet order, the
    eviction cost counted at ``eviction_weight`` (``None``: the policy's default)."""
    policy = (
        CombinedPolicy()
        if eviction_weight is None
        else CombinedPolicy(eviction_weight=eviction_weight)
    )
    for slot in ("s0", "s1"):
        policy.locations.limit_prompts(slot, 1)
    return policy, (ReplicaState("s0", "m"), ReplicaState("s1", "m"))


def test_a_new_conversation_leaves_a_slot_whose_conversation_is_between_turns() -> None:
    policy, replicas = slots()
    assert policy.choose(req("a1", conversation(100)), Fleet(0.0, replicas)).replica_id == "s0"
    # b shares the system blocks with a's prompt in s0; s1 is empty
    decision = policy.choose(req("b1", conversation(500)), Fleet(5.0, replicas))
    assert decision.replica_id == "s1"
    # a's next turn extends its prompt: back to s0, nothing pushed out
    again = policy.choose(req("a2", conversation(100, turns=2)), Fleet(8.0, replicas))
    assert again.replica_id == "s0"
    assert again.predicted_cached_tokens == len(conversation(100)) * 16


def test_without_the_eviction_cost_the_shared_system_prompt_decides() -> None:
    assert CombinedPolicy().config.eviction_weight == 1.0  # on by default; 0 turns it off
    policy, replicas = slots(0.0)
    policy.choose(req("a1", conversation(100)), Fleet(0.0, replicas))
    decision = policy.choose(req("b1", conversation(500)), Fleet(5.0, replicas))
    assert decision.replica_id == "s0"  # two cached blocks: a's prompt is overwritten
    known = policy.locations.cached_blocks(req("a2", conversation(100, turns=2)), 6.0)
    assert known["s0"] <= len(SYSTEM)  # only the system blocks are left of a's prompt


def test_the_oldest_kept_prompt_is_the_cheapest_to_push_out() -> None:
    policy, replicas = slots()
    policy.choose(req("a1", conversation(100)), Fleet(0.0, replicas))  # s0
    policy.choose(req("b1", conversation(500)), Fleet(5.0, replicas))  # s1
    policy.choose(req("a2", conversation(100, turns=2)), Fleet(100.0, replicas))  # s0
    # both slots hold a prompt: a's sent 1 s ago, b's 96 s ago
    assert policy.choose(req("c1", conversation(900)), Fleet(101.0, replicas)).replica_id == "s1"


def test_displaced_names_the_unshared_part_of_the_oldest_kept_prompt() -> None:
    locations = PrefixLocations()
    locations.limit_prompts("slot", 2)
    first, second = req("a", conversation(100)), req("b", conversation(500))
    locations.record(first.block_hashes, first.boundaries, "slot", 3.0)
    assert locations.displaced("slot", second.block_hashes) is None  # room for one more
    locations.record(second.block_hashes, second.boundaries, "slot", 4.0)
    third = req("c", conversation(100, turns=2))  # extends a's prompt
    assert locations.displaced("slot", third.block_hashes) == (0, 3.0, 21)
    other = req("d", conversation(900))  # shares only the system blocks
    assert locations.displaced("slot", other.block_hashes) == (19, 3.0, 21)
    assert locations.displaced("unbounded", other.block_hashes) is None
    assert dict(locations.bounded) == {"slot": 2}


@pytest.mark.parametrize(
    "options", [{"eviction_weight": -1.0}, {"eviction_horizon_s": 0.0}, {"eviction_horizon_s": -5}]
)
def test_bad_eviction_settings_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="eviction"):
        CombinedPolicy(**options)  # type: ignore[arg-type]


def test_a_kept_prompt_is_wanted_as_long_as_returns_still_come() -> None:
    from contextpilot_rag.routing.combined import _ReturnGaps

    single_turn = _ReturnGaps()
    for _ in range(40):  # no prompt sent to a bounded target was ever extended
        single_turn.dispatched(None)
    assert single_turn.wanted(1.0, 30.0) < 0.05
    chat = _ReturnGaps()
    for _ in range(30):
        chat.dispatched(None)  # a conversation's first turn
        chat.dispatched(5.0)  # its next turn, 5 s later
    # between two turns: half the prompts were extended (every first turn's)
    assert chat.wanted(1.0, 30.0) == pytest.approx(0.5, abs=0.02)
    assert chat.wanted(10.0, 30.0) < 0.05  # silent for twice the usual gap: over
    fresh = _ReturnGaps()  # nothing seen yet: the prior, decaying over the horizon
    assert fresh.wanted(60.0, 30.0) < fresh.wanted(1.0, 30.0) < 1.0
