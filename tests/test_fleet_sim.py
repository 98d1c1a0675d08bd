"""Specification of the fleet simulator and the trace loaders."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag.bench.workloads import WorkloadRequest, multiturn_workload
from contextpilot_rag.errors import ConfigError, InvalidDecisionError, InvalidInputError
from contextpilot_rag.routing.baselines import RandomPolicy, RoundRobinPolicy
from contextpilot_rag.routing.registry import make_policy
from contextpilot_rag.routing.types import Decision, FleetView, Outcome, RouteRequest
from contextpilot_rag.sim.fleet import (
    Replica,
    SimSummary,
    cached_tokens_bound,
    default_fleet,
    latency_floor,
    simulate,
)
from contextpilot_rag.sim.replay import EngineTokenizer
from contextpilot_rag.sim.traces import (
    conversation_trace,
    detect_language,
    from_workload,
    length_bucket,
    load_mooncake,
    load_scbench_kv,
)
from contextpilot_rag.tokenizers import default_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOONCAKE = DATA / "mooncake" / "synthetic_trace.jsonl"
SCBENCH = DATA / "scbench_kv" / "kv_150pairs_n10_seed0.jsonl"


def _ticks() -> Iterator[int]:
    tick = 0
    while True:
        tick += 1000
        yield tick


def clock_ns() -> Callable[[], int]:
    """A nanosecond clock advancing 1 µs per reading."""
    return _ticks().__next__


def replica(replica_id: str = "r0", **overrides: object) -> Replica:
    config: dict[str, object] = {
        "rtt_s": 0.2,
        "prefill_tokens_per_s": 1000.0,
        "decode_tokens_per_s": 10.0,
        "decode_s_per_context_token": 0.0,  # the plain model: hand-computable times
        "prefill_chunk_tokens": 0,
        "max_batch": 1,
        "block_tokens": 100,
    }
    config.update(overrides)
    return Replica(replica_id, **config)  # type: ignore[arg-type]


def request(
    request_id: str, blocks: tuple[int, ...], arrival_s: float = 0.0, output: int = 10
) -> RouteRequest:
    return RouteRequest(
        request_id,
        prompt_tokens=100 * len(blocks),
        block_hashes=blocks,
        block_tokens=100,
        expected_output_tokens=output,
        arrival_s=arrival_s,
    )


class Fixed:
    """Sends everything to one replica and remembers what it saw."""

    name = "fixed"
    route_memory = None

    def __init__(
        self, replica_id: str = "r0", model: str = "sim-8b", warm: tuple[str, ...] = ()
    ) -> None:
        self.replica_id = replica_id
        self.model = model
        self.warm = warm
        self.views: list[dict[str, tuple[int, int]]] = []
        self.outcomes: list[Outcome] = []

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        self.views.append({r.replica_id: (r.in_flight, r.queued_tokens) for r in fleet.replicas})
        return Decision(self.replica_id, self.model, "fixed", warm=self.warm)

    def observe(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def random_requests(seed: int, count: int) -> list[RouteRequest]:
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(10**6) for _ in range(3)) for _ in range(4)]
    return [
        request(
            f"q{i}",
            rng.choice(prefixes) + tuple(rng.randrange(10**6) for _ in range(rng.randrange(4))),
            arrival_s=rng.uniform(0, 5),
            output=rng.randrange(1, 20),
        )
        for i in range(count)
    ]


def test_hand_computed_two_requests_on_one_replica() -> None:
    # A: arrives at the replica at 0.1, prefill 0.3 s, decode 1 s, ends at the client at 1.5.
    # B: queued (max_batch=1) until 1.4, 2 of 3 blocks cached, prefill 0.1 s.
    requests = [request("a", (1, 2, 3)), request("b", (1, 2, 4), arrival_s=0.2)]
    result = simulate(requests, Fixed(), [replica()], clock_ns=clock_ns())
    a, b = result.records
    assert a.request_id == "a" and a.cached_tokens == 0
    assert (a.ttft_s, a.e2e_s) == pytest.approx((0.5, 1.5))
    assert b.start_s == pytest.approx(1.4)
    assert b.cached_tokens == 200
    assert b.ttft_s == pytest.approx(1.4)
    assert b.e2e_s == pytest.approx(2.4)
    summary = result.summary
    assert summary.ttft_p50_ms == pytest.approx(950.0)
    assert summary.e2e_p95_s == pytest.approx(1.5 + 0.95 * 0.9)
    assert summary.hit_ratio == pytest.approx(200 / 600)
    assert summary.max_replica_share == 1.0
    assert summary.decision_us_p50 == pytest.approx(1.0)


def test_same_seed_gives_the_same_results() -> None:
    fleet = [replica(f"r{i}", rtt_s=0.05 * i, max_batch=2) for i in range(3)]
    runs = [
        simulate(random_requests(1, 60), RandomPolicy(7), fleet, seed=3, clock_ns=clock_ns())
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(0, 40), batch=st.integers(1, 3))
def test_every_request_completes_exactly_once(seed: int, count: int, batch: int) -> None:
    requests = random_requests(seed, count)
    fleet = [replica(f"r{i}", max_batch=batch) for i in range(2)]
    policy = RoundRobinPolicy()
    result = simulate(requests, policy, fleet)
    assert sorted(r.request_id for r in result.records) == sorted(q.request_id for q in requests)
    assert all(r.e2e_s >= r.ttft_s > 0 for r in result.records)


def test_a_repeated_prefix_on_the_same_replica_has_lower_ttft() -> None:
    requests = [request("cold", (1, 2, 3, 4)), request("warm", (1, 2, 3, 4), arrival_s=10.0)]
    cold, warm = simulate(requests, Fixed(), [replica()]).records
    assert warm.cached_tokens == 300
    assert warm.ttft_s < cold.ttft_s
    assert cold.ttft_s - warm.ttft_s == pytest.approx(300 / 1000.0)


def test_kv_capacity_bounds_the_cache() -> None:
    requests = [
        request("a", (1, 2, 3)),
        request("b", (7, 8, 9), arrival_s=10.0),
        request("c", (1, 2, 3), arrival_s=20.0),
    ]
    records = simulate(requests, Fixed(), [replica(kv_capacity_tokens=300)]).records
    assert records[2].cached_tokens == 0


def test_concurrency_limit_and_fifo_order_are_respected() -> None:
    requests = [request(f"q{i}", (100 + i,), output=20) for i in range(6)]
    records = simulate(requests, Fixed(), [replica(max_batch=2)]).records
    starts = {r.request_id: r.start_s for r in records}
    assert [starts[f"q{i}"] for i in range(6)] == sorted(starts.values())
    intervals = [(r.start_s, r.arrival_s + r.e2e_s - 0.1) for r in records]
    for start, _ in intervals:
        assert sum(s <= start + 1e-9 < e for s, e in intervals) <= 2


def test_prefill_runs_one_prompt_at_a_time_while_decodes_overlap() -> None:
    requests = [request("a", (1, 2, 3)), request("b", (4, 5))]
    a, b = simulate(requests, Fixed(), [replica(max_batch=2)]).records
    assert b.start_s == pytest.approx(a.start_s + 0.3)  # a's prefill: 300 tokens at 1000/s
    assert b.e2e_s - a.e2e_s == pytest.approx(0.2)  # decodes overlap: only prefill delays b


def test_round_trip_time_is_added_to_ttft_and_e2e() -> None:
    near = simulate([request("a", (1,))], Fixed(), [replica(rtt_s=0.0)]).records[0]
    far = simulate([request("a", (1,))], Fixed(), [replica(rtt_s=0.4)]).records[0]
    assert far.ttft_s - near.ttft_s == pytest.approx(0.4)
    assert far.e2e_s - near.e2e_s == pytest.approx(0.4)


def test_policy_sees_live_load_and_observes_every_outcome() -> None:
    policy = Fixed()
    requests = [request("a", (1, 2)), request("b", (3,), arrival_s=0.05)]
    simulate(requests, policy, [replica(), replica("r1")])
    assert policy.views[1]["r0"] == (1, 200)
    assert policy.views[1]["r1"] == (0, 0)
    assert [o.request.request_id for o in policy.outcomes] == ["a", "b"]


def test_choosing_an_unknown_or_unhealthy_replica_is_an_error() -> None:
    with pytest.raises(InvalidDecisionError):
        simulate([request("a", (1,))], Fixed("nope"), [replica()])
    with pytest.raises(InvalidDecisionError):
        simulate([request("a", (1,))], Fixed(), [replica(healthy=False), replica("r1")])
    with pytest.raises(InvalidDecisionError):
        simulate([request("a", (1,))], Fixed(model="other"), [replica()])
    with pytest.raises(InvalidDecisionError, match="warm-ups"):
        simulate([request("a", (1,))], Fixed(warm=("r1",)), [replica(), replica("r1")])


class Holding(Fixed):
    """Holds a request while r0 has unprefilled prompts (late binding), predicting a
    TTFT from ``ttft`` (by request id), or for ``hold_s`` once when r0 is idle."""

    name = "holding"

    def __init__(
        self, ttft: dict[str, float] | None = None, hold_once_s: float = 0.0, rude: bool = False
    ) -> None:
        super().__init__()
        self.rude = rude  # holds even a request offered without may_hold
        self.ttft = ttft or {}
        self.hold_once_s = hold_once_s
        self.offers: list[tuple[float, str]] = []

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        self.offers.append((fleet.now, request.request_id))
        queued = next(r.queued_tokens for r in fleet.replicas if r.replica_id == "r0")
        predicted = self.ttft.get(request.request_id, 1.0)
        if queued and request.may_hold:
            return Decision("r0", self.model, "hold", 0, predicted, hold_s=60.0)
        if self.hold_once_s and (request.may_hold or self.rude):
            hold_s, self.hold_once_s = self.hold_once_s, 0.0
            return Decision("r0", self.model, "hold", 0, predicted, hold_s=hold_s)
        return super().choose(request, fleet)


def test_a_held_request_waits_at_the_router_and_goes_when_a_prefill_ends() -> None:
    # a: at r0 at 0.1, prefill of 300 tokens ends at 0.4. b arrives at 0.1 and is held
    # (nothing queued or in flight for it) until then; sent at 0.4, at r0 at 0.5,
    # 2 of its 3 blocks cached: prefill 0.1 s, first token back at 0.7.
    policy = Holding()
    requests = [request("a", (1, 2, 3)), request("b", (1, 2, 4), arrival_s=0.1)]
    a, b = simulate(requests, policy, [replica(max_batch=2)]).records
    assert a.ttft_s == pytest.approx(0.5)  # unaffected by the held b
    assert policy.offers == [(0.0, "a"), (0.1, "b"), (pytest.approx(0.4), "b")]
    assert policy.views[-1]["r0"] == (1, 0)  # the held b was not counted as in flight
    assert (b.start_s, b.cached_tokens) == (pytest.approx(0.5), 200)
    assert b.ttft_s == pytest.approx(0.7 - 0.1)  # time held is time waited
    assert b.e2e_s == pytest.approx(b.ttft_s + 1.0)  # 10 tokens at 10 tokens/s


def test_held_requests_are_offered_again_smallest_predicted_ttft_first() -> None:
    policy = Holding(ttft={"b": 3.0, "c": 1.0, "d": 2.0})
    requests = [request("a", (1,))] + [
        request(name, (10 + i,), arrival_s=0.05) for i, name in enumerate("bcd")
    ]
    simulate(requests, policy, [replica(max_batch=4)])
    release = [name for now, name in policy.offers if now > 0.05]
    assert release[:3] == ["c", "d", "b"]


def test_a_held_request_is_offered_again_after_its_hold_at_the_latest() -> None:
    policy = Holding(hold_once_s=1.0)  # an idle fleet: no prefill ends to wake it
    (record,) = simulate([request("a", (1,))], policy, [replica()]).records
    assert policy.offers == [(0.0, "a"), (1.0, "a")]
    assert record.ttft_s == pytest.approx(1.0 + 0.2 + 0.1)


def test_a_hold_without_late_binding_is_an_error() -> None:
    with pytest.raises(InvalidDecisionError, match="may_hold"):
        simulate(
            [request("a", (1,))],
            Holding(hold_once_s=1.0, rude=True),
            [replica()],
            late_binding=False,
        )
    records = simulate([request("a", (1,))], Fixed(), [replica()], late_binding=False).records
    assert len(records) == 1


def test_choosing_an_excluded_replica_is_an_error_when_another_exists() -> None:
    excluded = RouteRequest("a", 100, (1,), 100, excluded=frozenset({("r0", "sim-8b")}))
    with pytest.raises(InvalidDecisionError):
        simulate([excluded], Fixed(), [replica(), replica("r1")])
    assert len(simulate([excluded], Fixed(), [replica()]).records) == 1


def test_invalid_inputs_are_rejected_before_running() -> None:
    with pytest.raises(ConfigError):
        simulate([request("a", (1,)), request("a", (2,))], Fixed(), [replica()])
    with pytest.raises(ConfigError):
        simulate([request("a", (1,))], Fixed(), [replica(block_tokens=16)])
    with pytest.raises(ConfigError):
        simulate([], Fixed(), [])
    with pytest.raises(ConfigError):
        Replica("r", prefill_tokens_per_s=0)


def test_default_fleet_uses_the_gorgo_round_trips() -> None:
    fleet = default_fleet(3, 2, block_tokens=512)
    assert len(fleet) == 6
    assert sorted({r.rtt_s for r in fleet}) == [0.037, 0.279, 0.456]
    assert len({r.replica_id for r in fleet}) == 6


def test_empty_run_has_zero_summary() -> None:
    assert SimSummary.of([]).as_dict() == dict.fromkeys(SimSummary.__dataclass_fields__, 0.0)


def test_mooncake_loader_parses_an_inline_sample(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 2]},
    ]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    first, second = load_mooncake(trace)
    assert (first.prompt_tokens, first.expected_output_tokens) == (1000, 5)
    assert first.block_hashes == (0, 1) and first.boundaries == (1, 2)
    assert second.arrival_s == 1.5 and second.block_tokens == 512
    assert len(load_mooncake(trace, limit=1)) == 1


def test_mooncake_loader_rejects_malformed_records(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": "x", "hash_ids": []}) + "\n")
    with pytest.raises(InvalidInputError, match="input_length"):
        load_mooncake(trace)


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"shared trace not found at {MOONCAKE}")
def test_mooncake_loader_parses_the_shared_trace() -> None:
    requests = load_mooncake(MOONCAKE)
    assert len(requests) == 3993
    assert all(len(r.block_hashes) == -(-r.prompt_tokens // 512) for r in requests)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)


def test_scbench_loader_makes_one_request_per_turn_sharing_the_context(tmp_path: Path) -> None:
    record = {
        "id": 3,
        "context": "JSON data:\n" + json.dumps({f"key-{i}": f"value-{i}" for i in range(60)}),
        "multi_turns": [
            {"input": 'Key: "key-1"\nThe value is: ', "answer": "value-1"},
            {"input": 'Key: "key-2"\nThe value is: ', "answer": "value-2"},
        ],
    }
    path = tmp_path / "kv.jsonl"
    path.write_text(json.dumps(record) + "\n")
    first, second = load_scbench_kv(path, interarrival_s=2.0)
    assert first.session == second.session == "scbench-3"
    assert second.arrival_s == 2.0
    shared = first.boundaries[0]
    assert shared > 0 and first.block_hashes[:shared] == second.block_hashes[:shared]
    assert first.features == {"language": "en", "length_bucket": "4k", "task": "kv"}


@pytest.mark.skipif(not SCBENCH.exists(), reason=f"shared KV data not found at {SCBENCH}")
def test_scbench_loader_parses_the_shared_file() -> None:
    requests = load_scbench_kv(SCBENCH)
    assert len(requests) == 50
    assert all(r.features["task"] == "kv" and r.prompt_tokens > 4000 for r in requests)
    assert len({r.session for r in requests}) == 10


def test_language_comes_from_character_classes() -> None:
    assert detect_language("The value associated with the key") == "en"
    assert detect_language("これは日本語の文章です。キーの値を答えてください。") == "ja"
    assert detect_language("请找出与指定键对应的值。这是中文文本。") == "zh"


def test_length_buckets() -> None:
    assert [length_bucket(n) for n in (100, 5000, 20_000, 70_000)] == ["4k", "8k", "32k", "64k+"]


def test_workload_requests_keep_sessions_and_share_the_system_prompt_blocks() -> None:
    workload = multiturn_workload(n_sessions=3, turns=2, k=3, n_docs=40, seed=0)

    def build(item: WorkloadRequest) -> list[dict[str, str]]:
        docs = "\n".join(workload.corpus[d] for d in item.doc_ids)
        return [
            {"role": "system", "content": workload.system_prompt},
            {"role": "user", "content": f"{docs}\n{item.query}"},
        ]

    requests = from_workload(workload, build, EngineTokenizer(default_tokenizer()))
    assert len(requests) == 6
    assert {r.session for r in requests} == {q.session for q in workload.requests}
    head = requests[0].boundaries[0]
    assert head > 0 and all(
        r.block_hashes[:head] == requests[0].block_hashes[:head] for r in requests
    )
    assert all(r.prompt_tokens >= 16 * len(r.block_hashes) for r in requests)


def test_prefill_slows_decoding_and_decoding_slows_prefill_hand_computed() -> None:
    # Steps: 0.1 s decode part, +0.1 s while a 100-token chunk is prefilled (1000 tok/s).
    # A: prefill [0, 0.1], then decodes 10 tokens; B arrives at 0.1 with 2 uncached
    # blocks: 0.2 s of prefill + 2 chunk steps carrying A's decode (0.1 s each) -> ends
    # at 0.5. A makes 2 tokens in [0.1, 0.5] (0.2 s steps), its last 8 end at 1.3;
    # B's 10 tokens end at 1.5.
    config = replica(
        rtt_s=0.0, max_batch=4, prefill_chunk_tokens=100, decode_s_per_context_token=0.0
    )
    requests = [request("a", (1,)), request("b", (2, 3), arrival_s=0.1)]
    records = {r.request_id: r for r in simulate(requests, Fixed(), [config]).records}
    assert (records["a"].ttft_s, records["a"].e2e_s) == pytest.approx((0.1, 1.3))
    assert (records["b"].ttft_s, records["b"].e2e_s) == pytest.approx((0.4, 1.4))


def test_decode_steps_grow_with_the_batch_context() -> None:
    # 0.1 s + 1e-4 s per context token: two 100-token prompts decode at 0.12 s a step.
    config = replica(rtt_s=0.0, max_batch=4, decode_s_per_context_token=1e-4)
    requests = [request("a", (1,), output=5), request("b", (2,), output=5)]
    records = {r.request_id: r for r in simulate(requests, Fixed(), [config]).records}
    # a: prefill [0, 0.1]; b: prefill [0.1, 0.2] (a decodes alone at 0.11 s a step).
    # a: 0.1/0.11 tokens by 0.2, the rest at 0.12 s a step.
    a_left = 5 - 0.1 / 0.11
    assert records["a"].e2e_s == pytest.approx(0.2 + a_left * 0.12)
    b_done = 0.2 + a_left * 0.12 + (5 - a_left) * 0.11
    assert records["b"].e2e_s == pytest.approx(b_done)


@pytest.mark.parametrize(
    "field", ["decode_s_per_context_token", "prefill_chunk_tokens", "decode_tokens_per_s"]
)
def test_replica_rejects_negative_engine_parameters(field: str) -> None:
    with pytest.raises(ConfigError):
        replica(**{field: -1})


# -- the latency floor no policy beats --------------------------------------------------------


@pytest.mark.parametrize("policy", ["round-robin", "prefix", "combined"])
def test_no_policy_beats_the_latency_floor(policy: str) -> None:
    requests = conversation_trace(seed=5, n_requests=300)
    fleet = default_fleet(3, 1, block_tokens=requests[0].block_tokens)
    floor = dict(zip((r.request_id for r in requests), latency_floor(requests, fleet), strict=True))
    result = simulate(requests, make_policy(policy), fleet)
    slack = [
        (record.ttft_s - floor[record.request_id][0], record.e2e_s - floor[record.request_id][1])
        for record in result.records
    ]
    assert min(min(pair) for pair in slack) >= -1e-9
    assert max(e2e for _, e2e in slack) > 0  # the load of 300 requests adds to some


@pytest.mark.parametrize("policy", ["round-robin", "prefix", "combined"])
def test_no_policy_reads_more_from_cache_than_the_bound(policy: str) -> None:
    requests = conversation_trace(seed=7, n_requests=400)
    fleet = default_fleet(3, 1, block_tokens=requests[0].block_tokens)
    bound = dict(zip((r.request_id for r in requests), cached_tokens_bound(requests), strict=True))
    result = simulate(requests, make_policy(policy), fleet)
    assert all(r.cached_tokens <= bound[r.request_id] for r in result.records)
    # one replica and no contention reach it: every earlier prompt is in the one cache
    lone = simulate(
        requests, Fixed("only"), [Replica("only", block_tokens=requests[0].block_tokens)]
    )
    reached = sum(r.cached_tokens for r in lone.records)
    assert 0 < reached <= sum(bound.values())


def test_the_cache_bound_counts_what_earlier_and_simultaneous_requests_carry() -> None:
    def request(name: str, at: float, blocks: tuple[int, ...], tokens: int) -> RouteRequest:
        return RouteRequest(name, tokens, blocks, 16, arrival_s=at)

    requests = [
        request("late", 2.0, (1, 2, 5, 6, 4), 80),  # twin-a carried 1, 2, 5, 6; 4: its last
        request("first", 0.0, (1, 2, 9), 48),  # nothing before it
        request("twin-a", 1.0, (1, 2, 5, 6), 64),  # 1, 2 earlier; 5 by its twin
        request("twin-b", 1.0, (1, 2, 5, 7, 8), 70),  # 1, 2 earlier, 5 by its twin, not 7
        request("other", 3.0, (8, 1), 32),  # 8 is not a prefix of anyone's
    ]
    assert cached_tokens_bound(requests) == [64, 0, 48, 48, 0]
    # a prompt shorter than its cached blocks is capped at its own length
    assert cached_tokens_bound([requests[1], request("short", 1.0, (1, 2, 9, 10), 40)]) == [0, 40]


def test_a_lone_request_meets_its_floor() -> None:
    request = RouteRequest("r", 4000, tuple(range(1, 251)), 16, expected_output_tokens=50)
    fleet = [Replica("far", rtt_s=0.3), Replica("near", rtt_s=0.05)]
    ((ttft, e2e),) = latency_floor([request], fleet)
    assert ttft == pytest.approx(0.05 + 4000 / 20_000)  # nothing shared: all prefilled
    assert e2e == pytest.approx(ttft + 50 * (0.01 + 4e-8 * 4000))
    record = simulate([request], Fixed("near"), fleet).records[0]
    assert (record.ttft_s, record.e2e_s) == pytest.approx((ttft, e2e))
    with pytest.raises(ConfigError):
        latency_floor([request], [])
