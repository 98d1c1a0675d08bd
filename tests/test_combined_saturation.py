"""The combined policy under saturation: batch slots (``ReplicaState.max_batch``) and
the decode model calibrated against observed answers."""

from __future__ import annotations

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import CombinedPolicy
from contextpilot_rag.routing.baselines import PrefixCachePolicy
from contextpilot_rag.routing.types import Decision, Outcome, ReplicaState, RouteRequest
from contextpilot_rag.sim import Replica, default_fleet, simulate
from contextpilot_rag.sim.fleet import SimFleetView
from contextpilot_rag.sim.traces import conversation_trace

FLEET = (Replica("a", max_batch=4), Replica("b", max_batch=4))
MODEL = FLEET[0].model


def _view(
    now: float, in_flight: dict[str, int], fleet: tuple[Replica, ...] = FLEET
) -> SimFleetView:
    return SimFleetView(now, tuple(r.state(in_flight.get(r.replica_id, 0), 0) for r in fleet))


def _request(name: str, *, only: str | None = None, output_tokens: int = 200) -> RouteRequest:
    others = frozenset((r.replica_id, MODEL) for r in FLEET if only and r.replica_id != only)
    return RouteRequest(
        name, prompt_tokens=2_000, expected_output_tokens=output_tokens, excluded=others
    )


def _fill(policy: CombinedPolicy, replica: str, count: int) -> list[tuple[RouteRequest, Decision]]:
    sent = []
    for number in range(count):
        request = _request(f"{replica}-{number}", only=replica)
        sent.append((request, policy.choose(request, _view(0.0, {replica: number}))))
    return sent


def test_a_full_batch_adds_the_wait_for_a_slot() -> None:
    policy = CombinedPolicy(hold_wait_s=None)
    _fill(policy, "a", 4)  # a's four slots busy, with predicted ends
    full = policy.choose(_request("probe", only="a"), _view(0.1, {"a": 4}))
    free = CombinedPolicy(hold_wait_s=None)
    _fill(free, "a", 3)
    spare = free.choose(_request("probe", only="a"), _view(0.1, {"a": 3}))
    assert full.predicted_ttft_s is not None and spare.predicted_ttft_s is not None
    assert full.predicted_ttft_s > spare.predicted_ttft_s + 1.0  # waits for a decode to end
    # and with the slot count unknown, nothing is added
    unknown = (Replica("a"), Replica("b"))
    blind = CombinedPolicy(hold_wait_s=None)
    for number in range(4):
        request = _request(f"a-{number}", only="a")
        blind.choose(request, _view(0.0, {"a": number}, unknown))
    probe = blind.choose(_request("probe", only="a"), _view(0.1, {"a": 4}, unknown))
    assert probe.predicted_ttft_s is not None and probe.predicted_ttft_s < full.predicted_ttft_s


def test_a_full_replica_loses_the_next_request() -> None:
    policy = CombinedPolicy(hold_wait_s=None)
    _fill(policy, "a", 4)
    _fill(policy, "b", 2)
    assert policy.choose(_request("probe"), _view(0.1, {"a": 4, "b": 2})).replica_id == "b"


def test_waiting_for_a_slot_is_no_reason_to_hold() -> None:
    # holding waits for a prefill unit to drain; a batch slot frees on its own
    policy = CombinedPolicy(hold_wait_s=0.5)
    _fill(policy, "a", 4)
    _fill(policy, "b", 4)
    request = RouteRequest("probe", prompt_tokens=2_000, expected_output_tokens=200, may_hold=True)
    decision = policy.choose(request, _view(0.1, {"a": 4, "b": 4}))
    assert decision.hold_s == 0.0
    assert decision.predicted_ttft_s is not None and decision.predicted_ttft_s > 1.0


def test_slower_answers_than_predicted_raise_the_replicas_decode_estimate() -> None:
    policy = CombinedPolicy(hold_wait_s=None)
    probe = _request("probe", only="a")
    before = policy._options(probe, _view(0.0, {}))[0][0][6]  # predicted decode on a
    for request, decision in _fill(policy, "a", 3):
        # each answer took four times what the step model predicted
        policy.observe(Outcome(request, decision, 0.2, 0.2 + 4 * before))
    after = policy._options(probe, _view(5.0, {}))[0][0][6]
    assert after > 1.3 * before
    # the other replica keeps its own estimate, so requests move there
    assert policy.choose(_request("next"), _view(5.0, {})).replica_id == "b"


def test_an_overloaded_conversation_trace_keeps_its_ttft_tail() -> None:
    # a conversation trace (one of a generated family) that saturates the replicas'
    # batch slots: the policy used to keep sending to a replica whose slots were all
    # taken, predicting a second where requests waited a minute (p95 TTFT several times the
    # prefix router's); and late binding livelocked there (a hold of 1e-14 s)
    requests = conversation_trace(
        seed=500686379,
        mean_turns=1.6571,
        think_s=36.75,
        spread=1.0576,
        mean_input_tokens=14_758.6,
        app_prefix_tokens=(512, 1478),
    )
    held_out = requests[len(requests) // 2 :]
    fleet = default_fleet(3, 1, block_tokens=requests[0].block_tokens)
    ours = simulate(held_out, CombinedPolicy(), fleet).summary
    prefix = simulate(held_out, PrefixCachePolicy(), fleet).summary
    assert ours.ttft_p95_ms < 2.5 * prefix.ttft_p95_ms
    assert ours.e2e_p95_s < 1.25 * prefix.e2e_p95_s


def test_a_bad_batch_limit_is_refused_where_the_state_is_built() -> None:
    # a custom fleet view with max_batch=0 would divide by zero in the slot wait
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="max_batch"):
            ReplicaState("a", MODEL, max_batch=bad)  # type: ignore[arg-type]
    assert ReplicaState("a", MODEL, max_batch=1).max_batch == 1
