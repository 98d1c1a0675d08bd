"""GORGO cost routing, the safe weight tuner, and the gorgo-lb wrapper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing.combined import CombinedPolicy
from contextpilot_rag.routing.gorgo import CostPolicy, PrefixLocations
from contextpilot_rag.routing.tuner import CostWeights, TunerBounds, WeightTuner
from contextpilot_rag.routing.types import Decision, Outcome, Policy, ReplicaState, RouteRequest


@dataclass(frozen=True)
class Fleet:
    now: float
    replicas: Sequence[ReplicaState]


def req(rid: str, blocks: Sequence[int], tokens: int | None = None) -> RouteRequest:
    hashes = tuple(hash((0, *blocks[: i + 1])) for i in range(len(blocks)))
    n = len(blocks)
    return RouteRequest(
        rid, tokens or n * 16, block_hashes=hashes, boundaries=tuple(range(1, n + 1))
    )


def test_cost_prefers_near_replica_when_idle() -> None:
    # near: 0.037 s; far: 0.456 s; same rate, nothing cached, nothing queued
    view = Fleet(
        0.0, (ReplicaState("far", "m", rtt_s=0.456), ReplicaState("near", "m", rtt_s=0.037))
    )
    decision = CostPolicy().choose(req("a", [1, 2]), view)
    assert decision.replica_id == "near"
    assert decision.predicted_ttft_s == pytest.approx(0.037 + 32 / 10_000)


def test_cost_prefers_idle_far_replica_over_queued_near_one() -> None:
    # near: 0.037 + 10_000/10_000 = 1.037 s queue; far: 0.456 s → far wins
    near = ReplicaState("near", "m", rtt_s=0.037, queued_tokens=10_000)
    view = Fleet(0.0, (near, ReplicaState("far", "m", rtt_s=0.456)))
    assert CostPolicy().choose(req("a", [1]), view).replica_id == "far"


def test_cost_prefers_replica_holding_the_prefix() -> None:
    policy = CostPolicy()
    a, b = ReplicaState("a", "m", rtt_s=0.05), ReplicaState("b", "m", rtt_s=0.0)
    # 16 blocks x 16 tokens, prefill 10k tok/s: cached on a saves 0.0256 s > 0.05 s? no:
    # make the prompt long so the saving (2560 tokens → 0.256 s) outweighs 0.05 s RTT
    blocks = list(range(160))
    policy.locations.record(req("w", blocks).block_hashes, range(1, 161), "a", 0.0)
    decision = policy.choose(req("q", blocks), Fleet(0.0, (a, b)))
    assert decision.replica_id == "a" and decision.predicted_cached_tokens == 160 * 16
    assert policy.costs(req("q", blocks), (a, b), 0.0)["b"][0] == pytest.approx(0.256)


def test_feedback_forgets_uncached_prefix() -> None:
    policy = CostPolicy()
    view = Fleet(0.0, (ReplicaState("a", "m"),))
    first = policy.choose(req("a", [1, 2, 3]), view)
    second = policy.choose(req("b", [1, 2, 3]), view)
    assert (first.predicted_cached_tokens, second.predicted_cached_tokens) == (0, 48)
    policy.observe(Outcome(req("b", [1, 2, 3]), second, 0.1, 1.0, cached_tokens=16))
    assert policy.choose(req("c", [1, 2, 3]), view).predicted_cached_tokens == 16


def test_tuner_respects_floor_and_cap_under_nearest_replica_objective() -> None:
    bounds = TunerBounds()
    tuner = WeightTuner(bounds=bounds, window=4, e2e_weight=0.0, seed=3)
    seen: list[CostWeights] = []
    for _ in range(4_000):
        w = tuner.weights
        seen.append(w)
        # TTFT-only objective that rewards "everything to the nearest replica":
        # better the higher the RTT weight and the lower the queue weight
        tuner.record(ttft_s=w.queue_weight / w.rtt_weight, e2e_s=0.0)
    assert tuner.successes > 0
    assert min(w.queue_weight for w in seen) >= bounds.queue_weight_floor
    assert max(w.rtt_weight for w in seen) <= bounds.rtt_weight_cap
    best = tuner.freeze()
    assert best.queue_weight == pytest.approx(bounds.queue_weight_floor, rel=0.2)
    assert best.rtt_weight == pytest.approx(bounds.rtt_weight_cap, rel=0.2)


def test_tuner_is_deterministic_by_seed_and_frozen_stays_put() -> None:
    def run(seed: int) -> CostWeights:
        tuner = WeightTuner(window=2, seed=seed)
        for i in range(200):
            tuner.record(ttft_s=abs(tuner.weights.prefill_weight - 2.0) + i * 0.0, e2e_s=1.0)
        frozen = tuner.freeze()
        tuner.record(0.0, 0.0)
        assert tuner.weights == frozen
        return frozen

    assert run(7) == run(7)


def test_a_request_decided_under_earlier_weights_does_not_score_the_current_trial() -> None:
    """Trials of two outcomes. ``late`` is decided with the initial weights but finishes
    (very slowly) during the next trial: it is not that trial's evidence, so the
    candidate weights are judged on ``c`` and ``d`` alone, which they did well."""
    tuner = WeightTuner(window=2, seed=0)
    policy = CostPolicy(tuner=tuner)
    view = Fleet(0.0, (ReplicaState("r0", "m"), ReplicaState("r1", "m")))

    def outcome(rid: str, decision: Decision, e2e_s: float) -> Outcome:
        return Outcome(req(rid, [1, 2]), decision, ttft_s=0.1, e2e_s=e2e_s)

    decided = {rid: policy.choose(req(rid, [1, 2]), view) for rid in ("a", "b", "late")}
    policy.observe(outcome("a", decided["a"], 1.0))
    policy.observe(outcome("b", decided["b"], 1.0))  # the initial weights' score
    candidate = tuner.weights
    assert candidate is not tuner.parent
    decided |= {rid: policy.choose(req(rid, [1, 2]), view) for rid in ("c", "d")}
    policy.observe(outcome("late", decided["late"], 100.0))
    policy.observe(outcome("c", decided["c"], 0.5))
    policy.observe(outcome("d", decided["d"], 0.5))
    assert tuner.trials == 1 and tuner.successes == 1 and tuner.parent is candidate


def test_cost_policy_freeze_stops_tuning() -> None:
    policy = CostPolicy(tuner=WeightTuner(window=1, seed=0))
    frozen = policy.freeze()
    assert policy.tuner is None and policy.weights == frozen


def test_gorgo_lb_wrapper_produces_valid_decisions() -> None:
    pytest.importorskip("gorgo")
    from contextpilot_rag.routing.external import GorgoLbPolicy

    policy = GorgoLbPolicy()
    assert isinstance(policy, Policy)
    replicas = (
        ReplicaState("a", "m", rtt_s=0.037),
        ReplicaState("b", "m", rtt_s=0.279, healthy=False),
        ReplicaState("c", "m", rtt_s=0.456),
    )
    for i in range(5):
        r = req(f"q{i}", [1, 2, i])
        decision = policy.choose(r, Fleet(float(i), replicas))
        assert isinstance(decision, Decision) and decision.replica_id in {"a", "c"}
        policy.observe(Outcome(r, decision, 0.1, 1.0))
    excluded = RouteRequest("x", 16, block_hashes=(1,), excluded=frozenset({("a", "m")}))
    assert policy.choose(excluded, Fleet(9.0, replicas)).replica_id == "c"


def test_route_update_records_a_bounded_spread_including_the_longest_prefix() -> None:
    policy = CostPolicy(recorded_boundaries=8)
    view = Fleet(0.0, (ReplicaState("a", "m"),))
    policy.choose(req("w", list(range(100))), view)
    assert len(policy.locations) == 8
    decision = policy.choose(req("q", list(range(100))), view)
    assert decision.predicted_cached_tokens == 100 * 16


def test_a_prompt_overwritten_on_a_one_prompt_replica_no_longer_attracts() -> None:
    locations = PrefixLocations()
    locations.limit_prompts("slot", 1)
    shared, first, second = req("s", [1]), req("a", [1, 2, 3]), req("b", [1, 7, 8])
    locations.record(first.block_hashes, first.boundaries, "slot", 0.0)
    assert locations.cached_blocks(first, 0.0) == {"slot": 3}
    locations.record(second.block_hashes, second.boundaries, "slot", 1.0)
    assert locations.cached_blocks(first, 1.0) == {"slot": 1}  # the shared first block stays
    assert locations.cached_blocks(second, 1.0) == {"slot": 3}
    assert locations.cached_blocks(shared, 1.0) == {"slot": 1}


def test_a_prompt_limit_keeps_the_last_k_prompts_and_spares_other_replicas() -> None:
    locations = PrefixLocations()
    locations.limit_prompts("two", 2)
    prompts = [req(f"p{i}", [100 + i, i]) for i in range(3)]
    for i, prompt in enumerate(prompts):
        locations.record(prompt.block_hashes, prompt.boundaries, "two", float(i))
        locations.record(prompt.block_hashes, prompt.boundaries, "free", float(i))
    assert locations.cached_blocks(prompts[0], 3.0) == {"free": 2}
    assert locations.cached_blocks(prompts[1], 3.0) == {"two": 2, "free": 2}
    assert locations.cached_blocks(prompts[2], 3.0) == {"two": 2, "free": 2}


def test_a_prompt_limit_bounds_the_route_table_by_the_kept_prompts() -> None:
    locations = PrefixLocations()
    locations.limit_prompts("slot", 1)
    for i in range(500):
        prompt = req(f"p{i}", [i, i + 1, i + 2])
        locations.record(prompt.block_hashes, prompt.boundaries, "slot", float(i))
    assert len(locations) == 3  # only the last prompt's routes; nothing else holds them


def test_the_combined_policy_predicts_no_hit_on_a_slot_overwritten_since() -> None:
    # without the eviction cost, which would send b to the empty slot instead
    policy = CombinedPolicy(eviction_weight=0.0)
    for slot in ("s0", "s1"):
        policy.locations.limit_prompts(slot, 1)
    view = Fleet(0.0, (ReplicaState("s0", "m"), ReplicaState("s1", "m")))
    assert policy.choose(req("a", list(range(1, 40))), view).replica_id == "s0"
    overwritten = policy.choose(req("b", [99, *range(2, 40)], tokens=39 * 16), view)
    assert overwritten.replica_id == "s0"  # predicted nothing cached anywhere: first slot
    decision = policy.choose(req("c", list(range(1, 40))), view)
    assert decision.predicted_cached_tokens == 0  # a's prompt is gone from s0


def test_routes_to_departed_replicas_do_not_end_the_probe_early() -> None:
    locations = PrefixLocations()
    prompt = req("q", list(range(8)))
    for gone in ("gone-1", "gone-2"):  # removed from the fleet; their routes live on
        locations.record(prompt.block_hashes, prompt.boundaries, gone, 0.0)
    locations.record(prompt.block_hashes[:4], range(1, 5), "live", 0.0)
    known = locations.cached_blocks(prompt, 1.0, {"live", "idle"})
    assert known["live"] == 4 and "idle" not in known
    assert locations.cached_blocks(prompt, 1.0, {"gone-1"}) == {"gone-1": 8, "gone-2": 8}


def test_the_combined_policy_credits_a_prefix_that_departed_replicas_held_longer() -> None:
    policy = CombinedPolicy()
    blocks = list(range(8))
    prompt = req("w", blocks)
    for gone in ("gone-1", "gone-2"):
        policy.locations.record(prompt.block_hashes, prompt.boundaries, gone, 0.0)
    policy.locations.record(prompt.block_hashes[:4], range(1, 5), "live", 0.0)
    view = Fleet(1.0, (ReplicaState("idle", "m"), ReplicaState("live", "m")))
    decision = policy.choose(req("q", blocks), view)
    assert decision.replica_id == "live" and decision.predicted_cached_tokens == 4 * 16


@pytest.mark.parametrize(
    "bad", [{"sigma": float("nan")}, {"sigma": 0.0}, {"e2e_weight": float("nan")}]
)
def test_tuner_settings_that_are_no_finite_numbers_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        WeightTuner(**bad)  # type: ignore[arg-type]


def test_prompt_limits_are_validated() -> None:
    locations = PrefixLocations()
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigError):
            locations.limit_prompts("slot", bad)  # type: ignore[arg-type]
    locations.limit_prompts("slot", None)  # no bound: nothing to check
