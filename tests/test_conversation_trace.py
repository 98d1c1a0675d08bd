"""The generated multi-turn conversation trace (sim.traces.conversation_trace) and the
benchmark that routes a family of them."""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter
from pathlib import Path

import conversation_knobs
import conversation_routing
import conversation_tails
import pytest
from lib.sections import begin_marker, end_marker

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import CombinedPolicy, make_policy
from contextpilot_rag.routing.types import RouteRequest
from contextpilot_rag.sim.fleet import default_fleet, simulate
from contextpilot_rag.sim.traces import conversation_trace


@pytest.fixture(scope="module")
def trace() -> list:  # type: ignore[type-arg]
    return conversation_trace(seed=3, n_requests=3000)


def test_defaults_follow_the_published_conversation_statistics() -> None:
    requests = conversation_trace()
    assert len(requests) == 12_031
    assert statistics.mean(r.prompt_tokens for r in requests) == pytest.approx(12_035, rel=0.03)
    outputs = [r.expected_output_tokens for r in requests]
    assert statistics.mean(outputs) == pytest.approx(343, rel=0.05)
    # Mooncake's trace: a fifth of the answers are a few dozen tokens, the rest cluster
    # around 400 (p95 about twice the mean), none above 2,000; an exponential's p95 is 3x
    deciles = statistics.quantiles(outputs, n=20)
    assert deciles[1] < 50 and 250 < deciles[9] < 450 and deciles[18] < 2.5 * 343
    assert max(outputs) <= 2000
    assert max(r.prompt_tokens for r in requests) <= 128_000  # the context window
    seen: set[int] = set()
    reused = total = 0
    for request in requests:
        for block in request.block_hashes:
            total, reused = total + 1, reused + (block in seen)
            seen.add(block)
    assert 0.3 <= reused / total <= 0.45  # published: about 37% of 512-token blocks
    assert 3600 * 0.9 <= requests[-1].arrival_s <= 3600  # an hour's window
    # every session shares the one system-prompt block, as in the published trace
    assert {r.block_hashes[0] for r in requests} == {requests[0].block_hashes[0]}


def test_later_turns_follow_a_think_time_and_are_mostly_short() -> None:
    requests = conversation_trace(seed=1)
    last: dict[str | None, RouteRequest] = {}
    gaps, added = [], []
    for request in requests:
        previous = last.get(request.session)
        if previous is not None:
            gaps.append(request.arrival_s - previous.arrival_s)
            added.append(request.prompt_tokens - previous.prompt_tokens)
        last[request.session] = request
    # published trace: gaps between turns median ~2 min, few under half a minute; a
    # later turn adds the previous answer and a short message (median growth ~450 tokens)
    assert 80 < statistics.median(gaps) < 170
    assert statistics.quantiles(gaps, n=20)[0] > 15
    assert 250 < statistics.median(added) < 700
    assert statistics.quantiles(added, n=20)[18] > 3000  # some follow-ups paste documents


def test_the_window_opens_inside_running_conversations() -> None:
    # sessions begun before the window contribute later turns whose earlier prompts are
    # not in the trace; with lead_s=0 every session starts inside it
    def headless_share(**arguments: float) -> float:
        requests = conversation_trace(n_requests=3000, **arguments)
        started = {r.session for r in requests if r.request_id.endswith("-0")}
        return sum(r.session not in started for r in requests) / len(requests)

    assert headless_share() > 0.01
    assert headless_share(lead_s=0.0) == 0.0


def test_the_context_window_caps_prompts_and_ends_conversations() -> None:
    requests = conversation_trace(n_requests=3000, max_input_tokens=16_384, mean_input_tokens=6000)
    assert max(r.prompt_tokens for r in requests) <= 16_384
    assert any(r.prompt_tokens == 16_384 for r in requests)  # a first message cut to fit
    assert statistics.mean(r.prompt_tokens for r in requests) == pytest.approx(6000, rel=0.05)


def test_later_turns_extend_the_previous_turn_of_their_session(trace: list) -> None:  # type: ignore[type-arg]
    last: dict[str, object] = {}
    extended = 0
    for request in trace:
        previous = last.get(request.session)
        if previous is not None:
            assert request.arrival_s >= previous.arrival_s  # type: ignore[attr-defined]
            before = previous.block_hashes[: previous.prompt_tokens // 512]  # type: ignore[attr-defined]
            assert request.block_hashes[: len(before)] == before  # its full blocks
            assert request.prompt_tokens > previous.prompt_tokens  # type: ignore[attr-defined]
            extended += 1
        last[request.session] = request
    assert extended > 0.2 * len(trace)


def test_block_hashes_match_the_prompt_and_every_block_end_is_a_boundary(trace: list) -> None:  # type: ignore[type-arg]
    partial_ids: list[int] = []
    for request in trace:
        full = request.prompt_tokens // 512
        assert len(request.block_hashes) == -(-request.prompt_tokens // 512)  # Mooncake: ceil
        assert request.boundaries == tuple(range(1, full + 1))
        partial_ids += request.block_hashes[full:]
    all_ids = Counter(h for request in trace for h in request.block_hashes)
    assert partial_ids and all(all_ids[h] == 1 for h in partial_ids)  # never shared
    # sessions of one application share its prompt's blocks; others share none
    several = conversation_trace(seed=3, n_requests=3000, apps=20, app_prefix_tokens=(512, 2048))
    assert 1 < len({r.block_hashes[0] for r in several if r.block_hashes}) <= 20


def test_arrivals_are_sorted_and_the_trace_is_deterministic(trace: list) -> None:  # type: ignore[type-arg]
    assert [r.arrival_s for r in trace] == sorted(r.arrival_s for r in trace)
    assert conversation_trace(seed=3, n_requests=3000) == trace
    assert conversation_trace(seed=4, n_requests=3000) != trace


def test_more_turns_per_session_reuse_more_blocks() -> None:
    def reuse(mean_turns: float) -> float:
        requests = conversation_trace(n_requests=2000, mean_turns=mean_turns)
        seen: set[int] = set()
        hits = [b in seen or seen.add(b) for r in requests for b in r.block_hashes]  # type: ignore[func-returns-value]
        return sum(map(bool, hits)) / len(hits)

    assert reuse(1.2) < reuse(2.0) < reuse(3.0)


@pytest.mark.parametrize(
    "arguments",
    [
        {"n_requests": 0},
        {"mean_turns": 0.5},
        {"mean_turns": 11.0},
        {"mean_input_tokens": 100.0},
        {"think_s": -1.0},
        {"app_prefix_tokens": (2048, 512)},
        {"apps": 0},
        {"think_spread": -1.0},
        {"follow_up_tokens": 0.5},
        {"paste_share": 1.5},
        {"short_answer_share": 1.0},
        {"short_answer_share": 0.9, "mean_output_tokens": 20.0},
        {"answer_shape": 0.0},
        {"max_output_tokens": 0},
        {"lead_s": -1.0},
        {"max_input_tokens": 100},
    ],
)
def test_bad_arguments_are_config_errors(arguments: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        conversation_trace(**arguments)  # type: ignore[arg-type]


def test_small_family_run_writes_its_section_with_targets(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    argv = ["--count", "2", "--requests", "600", "--jobs", "1", "--write", str(report)]
    assert conversation_routing.main(argv) == 0
    text = report.read_text(encoding="utf-8")
    section = conversation_routing.SECTION
    assert begin_marker(section) in text and text.rstrip().endswith(end_marker(section))
    assert "p95 E2E vs best baseline, worst held-out | <= -15%" in text
    for policy in ("combined", "round-robin", "ranvier", "laar", conversation_routing.TUNED):
        assert f"| {policy} |" in text
    assert (
        f"| combined (default) | met | {conversation_routing.TUNED_LABEL} (tuned) | met "
        "| bound: latency floor | within the bound |"
    ) in text
    assert "| 1 | held-out | 600 |" in text
    # the held-out draw is generated again with two other seeds (the default replicates)
    assert "p95 TTFT vs best baseline, worst held-out, every replicate too (3 traces)" in text
    assert "### Held-out draws on other seeds" in text
    assert text.count("| 1 | held-out | 600 |") == 1  # replicates stay out of the per-trace table
    # every trace's hit ratios: combined, tuned, and the most any routing reaches (above both)
    row = next(line for line in text.splitlines() if line.startswith("| 1 | held-out | 600 |"))
    hits = [float(x.strip().rstrip("%")) for x in row.split("|")[-3].split(" / ")]
    assert len(hits) == 3 and max(hits[:2]) <= hits[2] <= 100


def test_replicates_keep_the_parameters_and_change_the_seed() -> None:
    draw = conversation_routing.draw_traces(2, 0)[1]
    again = draw.replicated(2)
    assert [d.replicate for d in again] == [1, 2]
    assert len({draw.seed, *(d.seed for d in again)}) == 3
    assert all(d.index == draw.index and d.think_s == draw.think_s for d in again)
    assert draw.replicated(2) == again  # deterministic


def test_knob_rule_picks_the_smallest_shortfall_and_the_first_on_ties() -> None:
    Outcome = conversation_knobs.Outcome
    # worst TTFT -12% (meets), worst E2E -10% (5 points short): shortfall 0.05
    near = [Outcome(-0.20, -0.16, 0.4, 0.3), Outcome(-0.12, -0.10, 0.4, 0.3)]
    # worst TTFT +1% (11 points short), worst E2E -20% (meets): shortfall 0.11
    fast_e2e = [Outcome(+0.01, -0.20, 0.4, 0.3), Outcome(-0.30, -0.25, 0.4, 0.3)]
    assert conversation_knobs.shortfall(near) == pytest.approx(0.05)
    assert conversation_knobs.shortfall(fast_e2e) == pytest.approx(0.11)
    assert conversation_knobs.chosen({"a": fast_e2e, "b": near}) == "b"
    assert conversation_knobs.chosen({"a": near, "b": list(near)}) == "a"
    assert conversation_knobs.shortfall([Outcome(-0.10, -0.15, 0.3, 0.3)]) == pytest.approx(0.0)


def test_small_knob_run_writes_one_row_per_configuration_on_the_tuning_half(
    tmp_path: Path,
) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    # a Mooncake-format file for --also-trace: a generated trace written as the loader reads it
    other = tmp_path / "other.jsonl"
    lines = [
        json.dumps(
            {
                "timestamp": round(r.arrival_s * 1000),
                "input_length": r.prompt_tokens,
                "output_length": r.expected_output_tokens,
                "hash_ids": list(r.block_hashes),
            }
        )
        for r in conversation_trace(seed=5, n_requests=300)
    ]
    other.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["--count", "2", "--requests", "600", "--jobs", "1", "--only", "hold wait 3 s"]
    assert conversation_knobs.main([*argv, "--also-trace", str(other), "--write", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    section = conversation_knobs.SECTION
    assert begin_marker(section) in text and text.rstrip().endswith(end_marker(section))
    # draw 0 (the only tuning draw of two) and its one default replicate
    assert "the tuning draws 0 of" in text and ": 2 traces;" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "%" in line]
    assert [row.split("|")[1].strip().strip("*") for row in rows] == ["default", "hold wait 3 s"]
    assert sum(row.startswith("| **") for row in rows) == 1  # the rule's one choice
    assert "| other.jsonl: p95 TTFT / E2E |" in text
    assert all(row.rstrip(" |*").endswith("%") and row.count(" / ") == 1 for row in rows)


def test_joint_draws_are_deterministic_and_within_their_ranges() -> None:
    labels = conversation_knobs.random_labels(30)
    assert labels[:2] == ("random 1", "random 2") and len(set(labels)) == 30
    draws = [conversation_knobs.options_of(label) for label in labels]
    assert draws == [conversation_knobs.options_of(label) for label in labels]
    assert len({tuple(sorted(d.items(), key=str)) for d in draws}) == 30
    for options in draws:
        assert 4 <= options["queue_externality_weight"] <= 64
        assert 0.5 <= options["externality_weight"] <= 2
        assert 10 <= options["duty_tau_s"] <= 60
        assert options["hold_wait_s"] in (None, 0.5, 1.0, 2.0, 3.0, 5.0)
        assert ("tail_quantile" in options) == ("tail_discount" in options)
        CombinedPolicy(**options)  # every draw is a valid configuration
    assert any("tail_quantile" in d for d in draws) and not all("tail_quantile" in d for d in draws)
    with pytest.raises(ValueError):
        conversation_knobs.options_of("random 0")


def test_small_knob_run_with_joint_draws_lists_them_and_picks_over_every_stage(
    tmp_path: Path,
) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    argv = ["--count", "2", "--requests", "600", "--jobs", "1", "--replicates", "0"]
    argv += ["--only", "hold wait 3 s", "--random", "2", "--write", str(report)]
    image = tmp_path / "img" / "knobs.png"
    assert conversation_knobs.main([*argv, "--plot", str(image)]) == 0
    assert image.stat().st_size > 0  # the chart takes the best joint draws too
    text = report.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "%" in line]
    labels = [row.split("|")[1].strip().strip("*") for row in rows]
    assert labels == ["default", "hold wait 3 s", "random 1", "random 2"]
    assert sum(row.startswith("| **") for row in rows) == 1  # one choice over all stages
    assert "third, 2 configurations with every knob drawn at once" in text
    assert "### The joint draws" in text and "The best of the 2 joint draws, `random " in text
    assert "| random 1 | `queue_externality_weight=" in text


@pytest.mark.parametrize(
    ("main", "argv", "said"),
    [
        ("knobs", ["--random", "-1"], "--random >= 0"),
        ("tails", ["--count", "1"], "--count must be >= 2"),
        ("tails", ["--requests", "5"], "--requests >= 10"),
    ],
)
def test_bad_arguments_are_refused_before_any_simulation(
    main: str, argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    module = {"knobs": conversation_knobs, "tails": conversation_tails}[main]
    with pytest.raises(SystemExit) as stopped:
        module.main([*argv, "--write", str(report)])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err
    assert report.read_text(encoding="utf-8") == "# Benchmarks\n"  # nothing written


def test_knob_run_refuses_an_unknown_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        conversation_knobs.main(["--only", "no such knob"])
    assert stopped.value.code == 2
    assert "unknown configurations ['no such knob']" in capsys.readouterr().err


def test_the_tuned_configuration_is_one_the_knob_sweep_names() -> None:
    options = conversation_knobs.options_of(conversation_routing.TUNED_LABEL)
    assert options == conversation_routing.TUNED_OPTIONS


def test_second_stage_adds_each_other_knob_to_the_first_choice() -> None:
    labels = [label for label, _ in conversation_knobs.CONFIGS]
    pick = "queue externality 4"
    stage = conversation_knobs.second_stage(pick, labels)
    assert conversation_knobs.second_stage("default", labels) == []
    assert f"{pick} + externality 2" in stage and f"{pick} + no late binding" in stage
    # never the pick again, the default, or another value of the knob the pick sets
    assert not any("queue externality" in label.split(" + ")[1] for label in stage)
    assert len(stage) == len(labels) - sum("queue externality" in label for label in labels) - 1
    merged = conversation_knobs.options_of(f"{pick} + E2E tail weighting 0.85 / 0.2")
    assert merged == {"queue_externality_weight": 4.0, "tail_quantile": 0.85, "tail_discount": 0.2}


def test_prefill_floor_counts_blocks_no_earlier_request_carried_and_every_last_block() -> None:
    def request(name: str, hashes: tuple[int, ...], tokens: int) -> RouteRequest:
        return RouteRequest(name, tokens, hashes, block_tokens=10)

    first = request("a", (1, 2, 3), 30)  # nothing seen: 30
    turn = request("b", (1, 2, 3, 4), 45)  # 3 blocks seen: 45 - 30 = 15
    again = request("c", (1, 2), 20)  # every block seen: the last one computed, 10
    fork = request("d", (1, 9, 3), 30)  # a block seen after a new one does not count: 20
    empty = request("e", (), 7)  # no full block: all 7
    assert conversation_tails.prefill_floor([first]) == 30
    every = [first, turn, again, fork, empty]
    assert conversation_tails.prefill_floor(every) == 30 + 15 + 10 + 20 + 7


def test_small_tails_run_writes_its_section_within_the_floor(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    argv = ["--count", "4", "--requests", "600", "--jobs", "1", "--write", str(report)]
    assert conversation_tails.main(argv) == 0
    text = report.read_text(encoding="utf-8")
    section = conversation_tails.SECTION
    assert begin_marker(section) in text and text.rstrip().endswith(end_marker(section))
    rows = [line for line in text.splitlines() if line.startswith(("| 1 |", "| 3 |"))]
    assert len(rows) == 2 * len(conversation_tails.POLICIES)  # the held-out draws 1 and 3
    for row in rows:
        cells = row.split(" | ")
        assert float(cells[4].rstrip("×")) >= 1.0  # no router prefills less than the floor
        assert 0 < float(cells[5].rstrip("%")) <= 100  # prefill duty
    assert "| prefix | 1." in text  # the summary's prefill work over floor


def test_a_later_turn_without_a_new_full_block_reads_every_full_block_from_cache() -> None:
    """The simulators recompute a prompt's last block id; with Mooncake's ceil ids that
    is the partial block, so a turn that adds no full block still reads all its full
    ones (vLLM would; floor ids made the last full block a miss)."""
    trace = conversation_trace(seed=1, n_requests=4000)
    turns: dict[str, list[RouteRequest]] = {}
    for request in trace:
        turns.setdefault(str(request.session), []).append(request)
    pairs = [
        (a, b)
        for session in turns.values()
        for a, b in itertools.pairwise(session)
        if a.prompt_tokens // 512 == b.prompt_tokens // 512 and b.prompt_tokens % 512
    ]
    first, second = pairs[0]
    result = simulate(
        [first, second], make_policy("session"), default_fleet(1, 1, block_tokens=512)
    )
    later = next(r for r in result.records if r.request_id == second.request_id)
    assert later.cached_tokens == second.prompt_tokens // 512 * 512
