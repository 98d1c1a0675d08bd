"""The combined policy under saturation: batch slots (``ReplicaState.max_batch``) and
the decode model calibrated against observed answers."""

from __future__ import annotations

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import CombinedPolicy
from contextpilot_rag.routing.baselines import PrefixCachePolicy
from contextpilot_rag.routing.types import Decision, Outcome, ReplicaState, RouteRequest
from contextpilot_rag.sim import Replica, default_fleet, simulate
from contextpilot_rag.sim.fleet import SimFleetView, SimSummary
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


def test_prompts_queued_behind_full_slots_are_no_reason_to_hold() -> None:
    # a replica whose slots are all taken keeps prompts queued; the prefill unit is idle
    # meanwhile, so holding for it only waits (requests used to sit at the router until
    # max_hold_s while dispatched ones kept the queue full)
    policy = CombinedPolicy(hold_wait_s=0.5)
    _fill(policy, "a", 16)  # 4 in slots, 12 queued for one
    _fill(policy, "b", 16)
    view = SimFleetView(0.1, tuple(r.state(16, 12 * 2_000) for r in FLEET))
    request = RouteRequest("probe", prompt_tokens=2_000, expected_output_tokens=200, may_hold=True)
    assert policy.choose(request, view).hold_s == 0.0
    # the same queue with free slots is a prefill backlog: hold
    spare = tuple(Replica(r.replica_id, max_batch=32) for r in FLEET)
    backlog = SimFleetView(0.1, tuple(r.state(16, 12 * 2_000) for r in spare))
    assert CombinedPolicy(hold_wait_s=0.5).choose(request, backlog).hold_s > 0.0


def test_the_decode_estimate_under_constant_prefill_is_one_chunk_per_token() -> None:
    # while a replica prefills, every engine step carries a chunk and still yields a
    # token: a decode takes at most (step + chunk time) per token, however busy the
    # prefill unit; the earlier estimate, steps / (1 - duty), grew without bound
    replica = Replica("a", decode_s_per_context_token=0.0)
    policy = CombinedPolicy(hold_wait_s=None)
    probe = RouteRequest("probe", prompt_tokens=2_000, expected_output_tokens=100)
    view = SimFleetView(0.0, (replica.state(0, 0),))
    idle = policy._options(probe, view)[0][0][6]
    step_s = 1.0 / replica.decode_tokens_per_s
    chunk_s = replica.prefill_chunk_tokens / replica.prefill_tokens_per_s
    assert idle == pytest.approx(100 * step_s)
    state = policy._model("a")
    state.duty, state.duty_at = policy.config.duty_tau_s, 0.0  # prefilling all the time
    busy = policy._options(probe, view)[0][0][6]
    assert busy == pytest.approx(100 * (step_s + chunk_s))
    state.duty = policy.config.duty_tau_s / 2  # half the time
    half = policy._options(probe, view)[0][0][6]
    expected = 100 / (0.5 / (step_s + chunk_s) + 0.5 / step_s)  # tokens per second, mixed
    assert half == pytest.approx(expected)


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


def _held_out_against_prefix(requests: list[RouteRequest]) -> tuple[SimSummary, SimSummary]:
    """The combined policy's and the prefix router's summaries on the second half of
    ``requests``, 3 regions x 1 replica."""
    held_out = requests[len(requests) // 2 :]
    fleet = default_fleet(3, 1, block_tokens=requests[0].block_tokens)
    ours = simulate(held_out, CombinedPolicy(), fleet).summary
    return ours, simulate(held_out, PrefixCachePolicy(), fleet).summary


def test_an_overloaded_conversation_trace_keeps_its_ttft_tail() -> None:
    # a conversation trace (one of a generated family) that saturates the replicas'
    # batch slots: the policy used to keep sending to a replica whose slots were all
    # taken, predicting a second where requests waited a minute (p95 TTFT several times the
    # prefix router's); and late binding livelocked there (a hold of 1e-14 s)
    # (the generator's earlier shape: exponential answers and think times, follow-ups as
    # long as first messages, no context window, sessions starting inside the trace)
    requests = conversation_trace(
        seed=500686379,
        mean_turns=1.6571,
        think_s=36.75,
        spread=1.0576,
        mean_input_tokens=14_758.6,
        app_prefix_tokens=(512, 1478),
        apps=20,
        think_spread=None,
        follow_up_tokens=None,
        short_answer_share=0.0,
        answer_shape=1.0,
        max_output_tokens=None,
        lead_s=0.0,
        max_input_tokens=None,
    )
    ours, prefix = _held_out_against_prefix(requests)
    assert ours.ttft_p95_ms < 2.5 * prefix.ttft_p95_ms
    assert ours.e2e_p95_s < 1.25 * prefix.e2e_p95_s


def test_a_bad_batch_limit_is_refused_where_the_state_is_built() -> None:
    # a custom fleet view with max_batch=0 would divide by zero in the slot wait
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="max_batch"):
            ReplicaState("a", MODEL, max_batch=bad)  # type: ignore[arg-type]
    assert ReplicaState("a", MODEL, max_batch=1).max_batch == 1


def test_a_trace_that_fills_the_slots_of_the_replica_holding_its_prefixes() -> None:
    # one of the conversation family (published shape): bursts fill the batch slots of
    # the replica most conversations are cached on; requests were held at the router
    # until max_hold_s (p95 TTFT a third above the prefix router's, E2E a fifth)
    requests = conversation_trace(
        seed=1355203196,
        mean_turns=1.7961,
        think_s=166.885,
        think_spread=1.1068,
        spread=1.2952,
        mean_input_tokens=14_695.3,
        apps=16,
        app_prefix_tokens=(512, 1984),
        follow_up_tokens=33.375,
        paste_share=0.2291,
        short_answer_share=0.2240,
        answer_shape=5.1136,
    )
    ours, prefix = _held_out_against_prefix(requests)
    assert ours.ttft_p95_ms < 1.2 * prefix.ttft_p95_ms
    assert ours.e2e_p95_s < prefix.e2e_p95_s


def test_prompts_of_no_tokens_leave_the_queue_model_once_nothing_is_queued() -> None:
    """The queue model drops prompts while the view shows fewer queued tokens than it
    holds; prompts of 0 tokens never made it hold more, so they stayed for ever."""
    policy = CombinedPolicy(hold_wait_s=None)
    replica = ReplicaState("r0", "m")  # queued_tokens 0: nothing waits there
    for number in range(2_000):
        request = RouteRequest(f"q{number}", 0)
        decision = policy.choose(request, SimFleetView(float(number), (replica,)))
        policy.observe(Outcome(request, decision, 0.01, 0.02))
    assert len(policy._models["r0"].pending) <= 1  # the latest dispatch at most
