"""TTCA: accuracy profiles, the LAAR accuracy model and policy, the combined policy,
and the retry simulation."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest

from contextpilot_rag.errors import (
    ConfigError,
    InvalidDecisionError,
    InvalidRouteRequestError,
    NoReplicaAvailableError,
)
from contextpilot_rag.routing import LeastLoadPolicy, SessionAffinityPolicy
from contextpilot_rag.routing.combined import CombinedConfig, CombinedOptions, CombinedPolicy
from contextpilot_rag.routing.laar import AccuracyModel, LaarPolicy
from contextpilot_rag.routing.types import Decision, Outcome, Policy, ReplicaState, RouteRequest
from contextpilot_rag.sim.accuracy import DEFAULT_MODELS, ModelProfile, correct
from contextpilot_rag.sim.ttca import fit_accuracy, run_ttca, synthetic_requests

KV_FILE = Path(__file__).resolve().parents[2] / "shared/data/scbench_kv/kv_150pairs_n10_seed0.jsonl"
K = 1024
LOGGER = logging.getLogger(__name__)


def _profile(name: str) -> ModelProfile:
    return next(m for m in DEFAULT_MODELS if m.name == name)


def _best(language: str, tokens: int) -> str:
    return max(DEFAULT_MODELS, key=lambda m: m.accuracy(language, tokens)).name


@dataclass(frozen=True)
class _Fleet:
    now: float
    replicas: tuple[ReplicaState, ...]


def _request(language: str = "en", tokens: int = 8 * K, **changes: object) -> RouteRequest:
    base = RouteRequest(
        request_id="r",
        prompt_tokens=tokens,
        block_hashes=tuple(range(1, tokens // 16 + 1)),
        boundaries=(tokens // 16,),
        features={"language": language, "length_bucket": "8k", "task": "kv"},
        logical_id="r",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


# Profiles: the LAAR paper's qualitative findings hold.


def test_no_single_model_is_best_everywhere() -> None:
    cells = [(lang, t * K) for lang in ("en", "ja", "zh") for t in (4, 8, 16, 32, 64)]
    assert len({_best(lang, tokens) for lang, tokens in cells}) >= 3


def test_small_model_is_strongest_at_mid_lengths() -> None:
    small = _profile("small-1.5b")
    peak = max((4, 8, 16, 32, 64), key=lambda t: small.accuracy("en", t * K))
    assert peak in (8, 16)
    assert _best("en", 8 * K) == "small-1.5b"


def test_2b_overtakes_its_8b_sibling_at_32k_and_beyond() -> None:
    small, big = _profile("family-2b"), _profile("family-8b")
    assert small.accuracy("en", 4 * K) < big.accuracy("en", 4 * K)
    for tokens in (32 * K, 48 * K, 64 * K):
        assert small.accuracy("en", tokens) > big.accuracy("en", tokens)


def test_one_8b_model_collapses_beyond_16k() -> None:
    collapse = _profile("collapse-8b")
    assert collapse.accuracy("en", 32 * K) < 0.5 * collapse.accuracy("en", 16 * K)


def test_language_shifts_the_ranking() -> None:
    assert any(_best("en", t * K) != _best("ja", t * K) for t in (4, 8, 16, 32, 64))


def test_correctness_is_fixed_per_model_and_logical_request() -> None:
    model = _profile("family-8b")
    first = _request(request_id="a#0", logical_id="lr-1", attempt=0)
    retry = _request(request_id="a#1", logical_id="lr-1", attempt=1)
    assert correct(model, first, seed=3) == correct(model, retry, seed=3)
    draws = [correct(model, _request(logical_id=f"lr-{i}"), seed=0) for i in range(400)]
    assert 0.55 < sum(draws) / len(draws) < 0.9  # accuracy at 8K is 0.72


# The accuracy model.


def test_logistic_fit_learns_a_separable_toy() -> None:
    requests = [_request(lang, request_id=f"t{i}") for i, lang in enumerate(["en", "ja"] * 20)]
    labels = {"m": [r.features["language"] == "en" for r in requests]}
    model = AccuracyModel().fit(requests, labels)
    assert model.predict("m", _request("en")) > 0.9  # type: ignore[operator]
    assert model.predict("m", _request("ja")) < 0.1  # type: ignore[operator]
    assert model.predict("unknown", _request("en")) is None


def test_a_later_fit_over_other_tasks_leaves_the_models_it_does_not_refit_usable() -> None:
    """Fitted in steps (one model, then another on requests of more tasks): the first
    model keeps predicting as it did, on the task list it was fitted with."""
    first = [_request(lang, request_id=f"a{i}") for i, lang in enumerate(["en", "ja"] * 10)]
    model = AccuracyModel().fit(first, {"m": [r.features["language"] == "en" for r in first]})
    before = model.predict("m", _request("en"))
    tasks = ["qa", "code", "math", "chat"]
    later = [
        replace(_request(request_id=f"b{i}"), features={"language": "en", "task": tasks[i % 4]})
        for i in range(20)
    ]
    model.fit(later, {"n": [i % 2 == 0 for i in range(20)]})
    assert model.models == ("m", "n")
    assert model.predict("m", _request("en")) == before
    assert model.predict("n", later[0]) is not None


@pytest.mark.parametrize(
    "bad",
    [{"costs": {"m": -1.0}}, {"costs": {"m": float("nan")}}, {"alpha": float("nan")},
     {"q_floor": float("nan")}, {"response_smoothing": float("inf")}],
)  # fmt: skip
def test_laar_refuses_costs_and_settings_that_are_no_positive_finite_numbers(
    bad: dict[str, object],
) -> None:
    with pytest.raises(ConfigError):
        LaarPolicy(**bad)  # type: ignore[arg-type]


def _fleet(*models: str, queued: tuple[int, ...] = ()) -> _Fleet:
    replicas = tuple(
        ReplicaState(f"{m}/0", m, queued_tokens=queued[i] if queued else 0)
        for i, m in enumerate(models)
    )
    return _Fleet(0.0, replicas)


def _accuracy(good: str, bad: str) -> AccuracyModel:
    requests = [_request(request_id=f"t{i}") for i in range(20)]
    labels = {good: [i % 10 != 0 for i in range(20)], bad: [i % 10 == 0 for i in range(20)]}
    return AccuracyModel().fit(requests, labels)


# LAAR.


def test_laar_prefers_the_accurate_model() -> None:
    policy = LaarPolicy(_accuracy("good", "bad"))
    assert policy.choose(_request(), _fleet("bad", "good")).model == "good"


def test_laar_explores_on_retry() -> None:
    policy = LaarPolicy(_accuracy("good", "bad"))
    retry = _request(attempt=1, excluded=frozenset({("good/0", "good")}))
    assert policy.choose(retry, _fleet("bad", "good")).model == "bad"


# Combined.


def test_combined_prefers_a_cached_replica_when_accuracies_are_equal() -> None:
    policy = CombinedPolicy()
    request = _request()
    policy.locations.record(request.block_hashes, request.boundaries, "b/0", 0.0)
    assert policy.choose(request, _fleet("a", "b")).replica_id == "b/0"


def test_combined_prefers_the_accurate_model_when_latencies_are_equal() -> None:
    policy = CombinedPolicy(_accuracy("good", "bad"))
    assert policy.choose(_request(), _fleet("bad", "good")).model == "good"


def test_combined_without_features_is_a_load_policy() -> None:
    policy = CombinedPolicy(_accuracy("good", "bad"))
    request = _request(features={})
    fleet = _fleet("good", "bad", queued=(100_000, 0))
    assert policy.choose(request, fleet).model == "bad"


def test_combined_counts_its_own_unprefilled_prompts_as_queue() -> None:
    # The view shows a's queued tokens; a 100k-token prompt there is a long wait,
    # so the next request goes to b, and a is preferred again once the view shows
    # the prompt prefilled (the router's FIFO reconciles with the view).
    policy = CombinedPolicy()
    first = _request(request_id="first", prompt_tokens=100_000)
    assert policy.choose(first, _fleet("a", "b", queued=(0, 0))).replica_id == "a/0"
    second = _request(request_id="second")
    assert policy.choose(second, _fleet("a", "b", queued=(100_000, 0))).replica_id == "b/0"
    third = _request(request_id="third")
    assert policy.choose(third, _fleet("a", "b", queued=(0, 1_000))).replica_id == "a/0"


def test_combined_keeps_a_long_prefill_away_from_decoding_requests() -> None:
    # Engines with chunked prefill: a's in-flight request decodes for a long time, so
    # a 50k-token prefill there would stall it; b is idle. Equal RTT and caches.
    engine = {"prefill_chunk_tokens": 2048, "decode_s_per_context_token": 4e-8}
    policy = CombinedPolicy(ttft_budget_percentile=None)
    long_decode = _request(request_id="decoder", expected_output_tokens=2_000)
    a = ReplicaState("a/0", "a", **engine)  # type: ignore[arg-type]
    b = ReplicaState("b/0", "b", **engine)  # type: ignore[arg-type]
    assert policy.choose(long_decode, _Fleet(0.0, (a, b))).replica_id == "a/0"
    busy_a = ReplicaState("a/0", "a", in_flight=1, **engine)  # type: ignore[arg-type]
    heavy = _request(request_id="heavy", prompt_tokens=50_000)
    assert policy.choose(heavy, _Fleet(5.0, (busy_a, b))).replica_id == "b/0"


def test_combined_prices_prefill_interference_as_decode_time_mixed_by_duty() -> None:
    # a spent 15 s of the last 30 s prefilling (duty 0.5): every decode step that
    # carries a 2,048-token chunk takes 0.2 s longer and still yields a token, so a
    # 1,000-token answer runs half its time at 0.22 s a token and half at 0.02 s:
    # 1,000 / (0.5 / 0.2248 + 0.5 / 0.02) = 36.7 s there. b is idle but decodes at 20
    # tokens/s: 50 s. So a. (Charging every step duty x chunk time, 0.02 + 0.5 x
    # 0.2048 s, would predict 122 s and pick b.)
    engine = {"prefill_chunk_tokens": 2048}
    policy = CombinedPolicy(externality_weight=0.0, queue_externality_weight=0.0)
    a = ReplicaState("a/0", "a", **engine)  # type: ignore[arg-type]
    b = ReplicaState("b/0", "b", decode_tokens_per_s=20.0, **engine)  # type: ignore[arg-type]
    big = _request(request_id="big", tokens=150_000, expected_output_tokens=1)
    assert policy.choose(big, _Fleet(0.0, (a,))).replica_id == "a/0"  # 15 s booked
    busy_a = replace(a, in_flight=1)  # big prefilled (nothing queued), still in flight
    fresh = tuple(range(10**6, 10**6 + 512))  # 8k tokens cached nowhere
    answer = _request(request_id="answer", block_hashes=fresh, expected_output_tokens=1_000)
    assert policy.choose(answer, _Fleet(0.0, (busy_a, b))).replica_id == "a/0"
    # a short answer costs little decode anywhere: a, whose prefill is as fast
    short = _request(request_id="short", block_hashes=fresh, expected_output_tokens=10)
    assert policy.choose(short, _Fleet(0.0, (busy_a, b))).replica_id == "a/0"


def test_combined_keeps_a_cached_prefix_under_load_for_the_queue_behind_it() -> None:
    # a holds the 40k-token prefix but has 5 s of queue; b is idle and would prefill
    # it in 4 s. Alone, b is faster for this request; under a steady stream of
    # requests, 4 s of prefill on b delays every request queued behind it there, so
    # the queue externality keeps the request on a (where it adds no prefill).
    def route(weight: float) -> str:
        policy = CombinedPolicy(queue_externality_weight=weight)
        for i in range(30):
            small = _request(request_id=f"s{i}", tokens=16, block_hashes=(10**6 + i,))
            policy.choose(small, _Fleet(i / 30, _fleet("a", "b").replicas))
        big = _request(
            request_id="big",
            tokens=40 * 1000,
            block_hashes=tuple(range(1, 2501)),
            boundaries=(2500,),
        )
        policy.locations.record(big.block_hashes, big.boundaries, "a/0", 1.0)
        fleet = _Fleet(1.0, _fleet("a", "b", queued=(50_000, 0)).replicas)
        return policy.choose(big, fleet).replica_id

    assert route(0.0) == "b/0"
    assert route(1.0) == "a/0"


def _three_models() -> AccuracyModel:
    # "good" right 90% of the time, "fair" 60%, "poor" 10%: a retry after "good"
    # goes to "fair".
    requests = [_request(request_id=f"t{i}") for i in range(20)]
    labels = {
        "good": [i % 10 != 0 for i in range(20)],
        "fair": [i % 10 < 6 for i in range(20)],
        "poor": [i % 10 == 0 for i in range(20)],
    }
    return AccuracyModel().fit(requests, labels)


def test_combined_warms_the_replica_a_retry_would_take() -> None:
    policy = CombinedPolicy(_three_models())
    request = _request(max_attempts=3)
    decision = policy.choose(request, _fleet("poor", "fair", "good"))
    assert (decision.replica_id, decision.warm) == ("good/0", ("fair/0",))
    # the warm-up is booked: the retry expects the prompt cached on fair/0
    retry = replace(request, request_id="r#1", attempt=1, excluded=frozenset({("good/0", "good")}))
    again = policy.choose(retry, _fleet("poor", "fair", "good", queued=(0, 0, 0)))
    assert again.replica_id == "fair/0"
    assert again.predicted_cached_tokens == request.prompt_tokens


@pytest.mark.parametrize(
    ("options", "changes", "queued"),
    [
        ({}, {"max_attempts": 1}, (0, 0, 0)),  # no retry can follow
        ({"warm_retries": False}, {"max_attempts": 3}, (0, 0, 0)),
        ({}, {"max_attempts": 3, "features": {}}, (0, 0, 0)),  # Q unknown: sure
        ({}, {"max_attempts": 3}, (0, 50_000, 0)),  # the retry's replica has a queue
    ],
)
def test_combined_does_not_warm_when_it_cannot_pay(
    options: dict[str, object], changes: dict[str, object], queued: tuple[int, ...]
) -> None:
    policy = CombinedPolicy(_three_models(), **options)  # type: ignore[arg-type]
    decision = policy.choose(_request(**changes), _fleet("poor", "fair", "good", queued=queued))
    assert decision.warm == ()


def test_combined_holds_a_request_while_every_replica_is_backlogged() -> None:
    # Default rate 10k tokens/s: 100k queued tokens on each replica is 10 s of wait.
    policy = CombinedPolicy(hold_wait_s=1.0, max_hold_s=30.0)
    backlogged = _fleet("a", "b", queued=(100_000, 100_000))
    held = policy.choose(_request(request_id="h", may_hold=True), backlogged)
    assert held.reason == "hold"
    assert held.hold_s == pytest.approx(10.0 - 1.0, rel=0.05)  # until the wait drops to 1 s
    assert held.predicted_ttft_s is not None and held.predicted_ttft_s > 10.0
    assert policy._tracked == {} and len(policy.locations) == 0  # a hold books nothing
    # offered again once a replica drained: dispatched there
    drained = _Fleet(
        5.0, (ReplicaState("a/0", "a", queued_tokens=100_000), ReplicaState("b/0", "b"))
    )
    sent = policy.choose(_request(request_id="h", may_hold=True), drained)
    assert (sent.hold_s, sent.replica_id) == (0.0, "b/0")
    assert "h" in policy._tracked


@pytest.mark.parametrize(
    ("options", "changes"),
    [
        ({}, {"may_hold": False}),  # the caller cannot hold it
        ({"hold_wait_s": None}, {"may_hold": True}),  # late binding turned off
        ({"max_hold_s": 30.0}, {"may_hold": True, "arrival_s": -30.0}),  # held long enough
        ({"hold_wait_s": 20.0}, {"may_hold": True}),  # the wait is within the threshold
    ],
)
def test_combined_dispatches_instead_of_holding(
    options: dict[str, object], changes: dict[str, object]
) -> None:
    policy = CombinedPolicy(**options)  # type: ignore[arg-type]
    decision = policy.choose(_request(**changes), _fleet("a", "b", queued=(100_000, 100_000)))
    assert decision.hold_s == 0.0 and decision.reason != "hold"


def test_combined_holds_at_most_until_max_hold_s() -> None:
    policy = CombinedPolicy(hold_wait_s=1.0, max_hold_s=10.0)
    request = _request(may_hold=True, arrival_s=-8.0)  # held 8 s already
    decision = policy.choose(request, _fleet("a", "b", queued=(100_000, 100_000)))
    assert decision.hold_s == pytest.approx(2.0)


def test_route_request_rejects_max_attempts_below_one() -> None:
    with pytest.raises(InvalidRouteRequestError, match="max_attempts"):
        _request(max_attempts=0)


def test_combined_memory_is_bounded_without_outcomes() -> None:
    policy = CombinedPolicy(max_tracked=10)
    for i in range(50):
        policy.choose(_request(request_id=f"r{i}"), _fleet("a", "b"))
    assert len(policy._tracked) == 10
    assert sum(len(m.decode_ends) for m in policy._models.values()) == 10


# The TTCA simulation.


def test_run_ttca_on_synthetic_requests_is_sane_and_deterministic() -> None:
    requests = synthetic_requests(60, seed=2, prefix_groups=10)
    accuracy = fit_accuracy(synthetic_requests(300, seed=9), seed=0)
    first = run_ttca(requests, CombinedPolicy(accuracy), seed=0)
    again = run_ttca(requests, CombinedPolicy(accuracy), seed=0)
    assert (first.records, first.as_dict()) == (again.records, again.as_dict())
    untimed = [replace(a, decision_us=0.0) for a in first.attempts]  # wall clock differs
    assert untimed == [replace(a, decision_us=0.0) for a in again.attempts]
    assert len(first.attempts) == sum(r.attempts for r in first.records)
    assert len(first.records) == 60
    assert 0.5 < first.success_rate <= 1.0
    assert all(1 <= r.attempts <= 10 for r in first.records)
    assert 0.0 < first.ttca_mean_s <= first.ttca_penalized_mean_s


class _WarmingPolicy:
    """Always answers on model "a" and asks for "b" to be warmed."""

    name = "warming"
    route_memory = None

    def __init__(self, warm: str = "b/0") -> None:
        self.warm = warm
        self.seen: list[RouteRequest] = []

    def choose(self, request: RouteRequest, fleet: _Fleet) -> Decision:
        self.seen.append(request)
        if request.attempt == 0:
            return Decision("a/0", "a", "test", warm=(self.warm,))
        return Decision("b/0", "b", "test")

    def observe(self, outcome: Outcome) -> None:
        pass


def _two_models() -> tuple[ModelProfile, ...]:
    never = (0.0,) * 5
    return (ModelProfile("a", 1.0, 1.0, never), ModelProfile("b", 1.0, 1.0, (1.0,) * 5))


def test_ttca_serves_a_warm_up_as_a_prefill_the_retry_finds_cached() -> None:
    # "a" is always wrong, so every request is retried on "b", which was warmed.
    requests = synthetic_requests(3, seed=0, interarrival_s=10.0)
    policy = _WarmingPolicy()
    result = run_ttca(requests, policy, models=_two_models(), max_attempts=3, seed=0)
    assert all(r.max_attempts == 3 for r in policy.seen)
    retries = [a for a in result.attempts if a.model == "b"]
    assert len(retries) == 3
    # all blocks but the last, which the engine always computes
    assert all(a.cached_tokens == (a.prompt_tokens // 16 - 1) * 16 for a in retries)
    first_tries = sum(a.prompt_tokens for a in result.attempts if a.model == "a")
    warm_ups = sum(r.prompt_tokens for r in requests)  # nothing was cached on b
    leftovers = sum(a.prompt_tokens - a.cached_tokens for a in retries)
    assert result.computed_tokens == first_tries + warm_ups + leftovers
    assert all(r.success for r in result.records)


@pytest.mark.parametrize("warm", ["a/0", "nowhere/0"])
def test_ttca_rejects_a_warm_up_on_the_chosen_or_an_unknown_replica(warm: str) -> None:
    with pytest.raises(InvalidDecisionError, match="warm"):
        run_ttca(synthetic_requests(1), _WarmingPolicy(warm), models=_two_models())


def test_retries_never_repeat_a_pair_while_another_is_left() -> None:
    result = run_ttca(synthetic_requests(30, seed=4), LeastLoadPolicy(), seed=1)
    for record in result.records:
        head = record.models[: len(DEFAULT_MODELS)]
        assert len(set(head)) == len(head)


@pytest.mark.skipif(not KV_FILE.exists(), reason=f"KV-lookup data not found at {KV_FILE}")
def test_ttca_on_the_kv_file_compares_policies() -> None:
    from contextpilot_rag.sim.traces import load_scbench_kv

    requests = load_scbench_kv(KV_FILE)[:30]
    accuracy = fit_accuracy(synthetic_requests(600, seed=1), seed=0)
    costs = {m.name: m.cost for m in DEFAULT_MODELS}
    policies: list[Policy] = [
        LaarPolicy(accuracy, costs=costs),
        CombinedPolicy(accuracy),
        LeastLoadPolicy(),
        SessionAffinityPolicy(),
    ]
    for policy in policies:
        result = run_ttca(requests, policy, seed=0)
        LOGGER.info("%s %s", policy.name, result.as_dict())
        assert len(result.records) == len(requests)
        assert 0.0 <= result.success_rate <= 1.0
        assert result.ttca_mean_s >= 0.0


@pytest.mark.parametrize(
    "options",
    [
        {"externality_weight": -1.0},
        {"queue_externality_weight": -1.0},
        {"q_floor": 0.0},
        {"ttft_budget_percentile": 0.0},
        {"ttft_slack": -0.1},
        {"duty_tau_s": 0.0},
        {"max_tracked": 0},
        {"recorded_boundaries": 1},
        {"hold_wait_s": -1.0},
        {"max_hold_s": -1.0},
    ],
)
def test_combined_rejects_bad_settings(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        CombinedPolicy(**options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CombinedConfig(**options)  # type: ignore[arg-type]


def test_combined_keywords_are_the_config_fields() -> None:
    config = CombinedConfig(externality_weight=0.5, hold_wait_s=None)
    assert CombinedPolicy(config=config).config == config
    assert CombinedPolicy(externality_weight=0.5, hold_wait_s=None).config == config
    assert CombinedPolicy().config == CombinedConfig()
    over = CombinedPolicy(config=config, hold_wait_s=2.0).config  # keywords override
    assert over == CombinedConfig(externality_weight=0.5, hold_wait_s=2.0)


def test_combined_keywords_name_every_config_field() -> None:
    assert CombinedOptions.__optional_keys__ == {f.name for f in fields(CombinedConfig)}


def test_combined_config_is_frozen_and_unknown_options_are_refused() -> None:
    config = CombinedConfig()
    with pytest.raises(AttributeError):
        config.q_floor = 0.5  # type: ignore[misc]
    with pytest.raises(ConfigError, match="hold_wait"):
        CombinedPolicy(hold_wait=1.0)  # type: ignore[call-arg]


def test_a_failed_combined_decision_leaves_its_state_intact() -> None:
    policy = CombinedPolicy()
    policy.choose(_request(request_id="first"), _fleet("a", "b"))
    before = (dict(policy._tracked), len(policy.locations))
    sick = _Fleet(1.0, (ReplicaState("a/0", "a", healthy=False),))
    with pytest.raises(NoReplicaAvailableError):
        policy.choose(_request(request_id="second"), sick)
    assert (dict(policy._tracked), len(policy.locations)) == before
