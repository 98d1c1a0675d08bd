"""The combined policy's knobs on the tuning half of the conversation-trace family:
which configuration comes closest to issue 22's routing targets on traces it may be
tuned on.

    python benchmarks/conversation_knobs.py --write docs/benchmarks.md \
        --plot docs/img/conversation_knobs.png --random 40 \
        --also-trace ../shared/data/mooncake/synthetic_trace.jsonl

The traces are the even-numbered (tuning) draws of ``benchmarks/conversation_routing.py``
(the same family, count and seed), each also generated with ``--replicates`` other seeds;
the held-out draws are never run here. On every trace the six baselines and every
configuration of :data:`CONFIGS` route the second half (3 regions x 1 replica). Each
configuration's *shortfall* is how far its worst traces miss the two latency targets:
the larger of (worst p95 TTFT change + 10 points) and (worst p95 E2E change + 15
points); 0 or less meets both. The rule picks the smallest shortfall (the
default first on ties); then, as coordinate descent's second step, that choice runs with
each other knob set too (:func:`second_stage`); with ``--random N``, a third stage runs
N configurations whose knobs are all drawn at once (``lib.combined_knobs.random_options``:
a coordinate descent misses optima that need several knobs changed together), and the
rule picks again over every stage. ``--also-trace`` runs every configuration on a
Mooncake-format trace as well, reported apart (a default must hold there too), not used
by the rule. Writes the ``conversation-routing-knobs`` generated section.
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conversation_routing import (
    FAIR_SHARE_LIMIT,
    REGIONS,
    TUNED_LABEL,
    Draw,
    draw_traces,
    family_parser,
)
from lib.combined_knobs import CONFIGS, JOIN, RANDOM, options_of, random_labels
from lib.report import ordered_map, progress_bars
from lib.route_sim import BASELINES, split_trace
from lib.sections import markdown_table, provenance, pyplot, save_figure, write_or_print

from contextpilot_rag.routing import CombinedPolicy, make_policy
from contextpilot_rag.routing.types import RouteRequest
from contextpilot_rag.sim import default_fleet, simulate
from contextpilot_rag.sim.traces import conversation_trace, load_mooncake

SECTION = "conversation-routing-knobs"
TTFT_TARGET, E2E_TARGET = -0.10, -0.15


def second_stage(pick: str, labels: Sequence[str]) -> list[str]:
    """Coordinate descent's second step: the first stage's ``pick`` with each other knob
    of ``labels`` set too (none that changes a field the pick already sets; none for
    the default)."""
    if pick == "default":
        return []
    taken = set(options_of(pick))
    return [
        f"{pick}{JOIN}{label}"
        for label in labels
        if label not in ("default", pick) and not taken & set(options_of(label))
    ]


@dataclass(frozen=True)
class Outcome:
    """One configuration on one trace, relative to that trace's best baseline."""

    ttft: float  # p95 TTFT change (negative: faster)
    e2e: float  # p95 E2E change
    share: float  # busiest replica's share of the requests
    hit: float  # prompt tokens read from the replicas' caches / prompt tokens


def run_trace(job: tuple[Draw, int, tuple[str, ...]]) -> dict[str, Outcome]:
    """Every baseline and every configuration named in ``job`` on one trace's second half."""
    draw, n_requests, labels = job
    return outcomes_on(conversation_trace(**draw.trace_arguments(n_requests)), labels)


def outcomes_on(requests: Sequence[RouteRequest], labels: Sequence[str]) -> dict[str, Outcome]:
    """The configurations ``labels`` on the second half of ``requests``, each against the
    best of the baselines there."""
    _, held = split_trace(requests, 0.5)
    fleet = default_fleet(REGIONS, 1, block_tokens=held[0].block_tokens)
    baselines = [simulate(held, make_policy(name), fleet).summary for name in BASELINES]
    best_ttft = min(s.ttft_p95_ms for s in baselines)
    best_e2e = min(s.e2e_p95_s for s in baselines)
    outcomes = {}
    for label in labels:
        summary = simulate(held, CombinedPolicy(**options_of(label)), fleet).summary
        outcomes[label] = Outcome(
            summary.ttft_p95_ms / best_ttft - 1,
            summary.e2e_p95_s / best_e2e - 1,
            summary.max_replica_share,
            summary.hit_ratio,
        )
    return outcomes


def shortfall(outcomes: Sequence[Outcome]) -> float:
    """How far the worst traces miss the two latency targets (the larger miss, in
    fractions; <= 0: both met on every trace)."""
    worst_ttft = max(o.ttft for o in outcomes)
    worst_e2e = max(o.e2e for o in outcomes)
    return max(worst_ttft - TTFT_TARGET, worst_e2e - E2E_TARGET)


def chosen(by_label: dict[str, list[Outcome]]) -> str:
    """The label of the smallest shortfall; the first in ``by_label``'s order on ties."""
    return min(by_label, key=lambda label: shortfall(by_label[label]))


def rows(
    by_label: dict[str, list[Outcome]], pick: str, also: dict[str, Outcome] | None = None
) -> list[list[str]]:
    """One table row per configuration (``pick``, the rule's choice, in bold); with
    ``also``, each configuration's p95 changes on the trace from a file as a last cell."""
    table = []
    for label, outcomes in by_label.items():
        ttft = [o.ttft for o in outcomes]
        e2e = [o.e2e for o in outcomes]
        cells = [
            label,
            f"{max(ttft):+.1%}",
            f"{statistics.median(ttft):+.1%}",
            f"{max(e2e):+.1%}",
            f"{statistics.median(e2e):+.1%}",
            f"{max(o.share for o in outcomes):.1%}",
            f"{statistics.median(o.hit for o in outcomes):.1%}",
            f"{shortfall(outcomes) * 100:+.1f}",
        ]
        if also is not None:
            cells.append(f"{also[label].ttft:+.1%} / {also[label].e2e:+.1%}")
        table.append([f"**{cell}**" for cell in cells] if label == pick else cells)
    return table


def report(
    command: str,
    draws: Sequence[Draw],
    by_label: dict[str, list[Outcome]],
    seconds: float,
    image: Path | None,
    also: tuple[str, dict[str, Outcome]] | None = None,
) -> str:
    """The section; ``also``: a trace from a file (its name, and every configuration on
    it), shown in its own column and not used by the rule."""
    family = sorted({d.index for d in draws})
    randoms = [label for label in by_label if label.startswith(RANDOM)]
    per_draw = len(draws) // len(family)
    pick = chosen(by_label)
    if pick == TUNED_LABEL:
        verdict = f"`{pick}`, which the section above runs beside the default on the held-out half"
    else:
        verdict = (
            f"`{pick}`; the section above runs `{TUNED_LABEL}` beside the default: "
            "update `TUNED_OPTIONS` in `benchmarks/conversation_routing.py`"
        )
    lines = [
        "## Combined policy knobs on the conversation family's tuning half "
        "(`benchmarks/conversation_knobs.py`)",
        "",
        provenance(command, 1, "one run; every figure is simulated time, deterministic (seeded)"),
        f"- traces: the tuning draws {', '.join(map(str, family))} of "
        "`benchmarks/conversation_routing.py` (same family and seed), each generated with "
        f"{per_draw} seed(s) (the family's, then replicates): {len(draws)} traces; the "
        "held-out draws are not run",
        f"- fleet: {REGIONS} regions × 1 replica; every configuration and the six baselines "
        "route each trace's second half; changes are against each trace's best baseline",
        "- stages (coordinate descent): first, one knob at a time around the default; second, "
        "the first stage's choice with each other knob set too (the rows `choice + knob`, "
        "when the first stage chose other than the default)"
        + (
            f"; third, {len(randoms)} configurations with every knob drawn at once (the rows "
            "`random N`, their settings in the last table)"
            if randoms
            else ""
        )
        + "; the rule picks over every stage",
        f"- whole run: {seconds:.0f} s",
        "",
        "*Shortfall* (points): the larger of the worst trace's p95 TTFT change minus the "
        f"{TTFT_TARGET:.0%} target and its p95 E2E change minus the {E2E_TARGET:.0%} target; "
        f"at most 0 meets both. Busiest replica: the largest share over the traces (the "
        f"target allows {FAIR_SHARE_LIMIT / REGIONS:.0%}). Bold: the smallest shortfall "
        f"(the rule's choice): {verdict}."
        + (
            f" Last column: every configuration on the held-out half of `{also[0]}` (same "
            "fleet, against that trace's best baseline): a default has to hold there too. "
            "It does not enter the rule."
            if also is not None
            else ""
        ),
        "",
        *markdown_table(
            (
                "configuration",
                "worst p95 TTFT",
                "median p95 TTFT",
                "worst p95 E2E",
                "median p95 E2E",
                "busiest replica",
                "prompt read from cache (median)",
                "shortfall",
                *([f"{also[0]}: p95 TTFT / E2E"] if also is not None else []),
            ),
            rows(by_label, pick, None if also is None else also[1]),
        ),
    ]
    if randoms:
        best = min(randoms, key=lambda label: shortfall(by_label[label]))
        lines += [
            "",
            "### The joint draws",
            "",
            f"The best of the {len(randoms)} joint draws, `{best}`, falls short by "
            f"{shortfall(by_label[best]) * 100:+.1f} points; the rule's choice by "
            f"{shortfall(by_label[pick]) * 100:+.1f}.",
            "",
            *random_table(randoms),
        ]
    if image is not None:
        lines += ["", f"![worst p95 change per configuration]({image.as_posix()})"]
    return "\n".join(lines)


def random_table(labels: Sequence[str]) -> list[str]:
    """Each joint draw's settings (those it leaves out keep their defaults)."""
    settings = [
        [label, ", ".join(f"`{name}={value}`" for name, value in options_of(label).items())]
        for label in labels
    ]
    return markdown_table(("configuration", "settings"), settings)


PLOTTED_DRAWS = 5
"""Joint draws in the chart: those of the smallest shortfall (the table has them all)."""


def plot(by_label: dict[str, list[Outcome]], path: Path) -> bool:
    """Worst p95 TTFT and E2E change per configuration, with the targets (of the joint
    draws, the :data:`PLOTTED_DRAWS` best)."""
    plt = pyplot()
    if plt is None:
        return False
    draws = sorted(
        (label for label in by_label if label.startswith(RANDOM)),
        key=lambda label: shortfall(by_label[label]),
    )
    labels = [label for label in by_label if not label.startswith(RANDOM)]
    labels += draws[:PLOTTED_DRAWS]
    y = np.arange(len(labels))
    figure, axis = plt.subplots(figsize=(9, 0.35 * len(labels) + 1.5))
    ttft = [max(o.ttft for o in by_label[label]) * 100 for label in labels]
    e2e = [max(o.e2e for o in by_label[label]) * 100 for label in labels]
    axis.barh(y - 0.2, ttft, 0.4, label="worst p95 TTFT")
    axis.barh(y + 0.2, e2e, 0.4, label="worst p95 E2E", color="#dd8452")
    axis.axvline(TTFT_TARGET * 100, color="#4c72b0", linestyle="--", label="TTFT target")
    axis.axvline(E2E_TARGET * 100, color="#dd8452", linestyle="--", label="E2E target")
    axis.set_yticks(y, labels)
    axis.invert_yaxis()
    axis.set_xlabel("% change against the best baseline (negative: faster)")
    axis.set_title("Combined policy knobs, tuning half: worst trace")
    axis.legend(fontsize="small")
    return save_figure(figure, path)


def sweep(
    draws: Sequence[Draw], n_requests: int, labels: Sequence[str], jobs: int, stage: str
) -> dict[str, list[Outcome]]:
    """Every configuration of ``labels`` on every trace of ``draws`` (in that order)."""
    with progress_bars() as progress:
        results = ordered_map(
            run_trace,
            [(d, n_requests, tuple(labels)) for d in draws],
            jobs,
            progress(f"tuning traces, {stage}", len(draws)),
        )
    return {label: [r[label] for r in results] for label in labels}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = family_parser(__doc__, replicates=1, replicated="tuning draw")
    parser.add_argument(
        "--only", nargs="+", metavar="LABEL", help="run these configurations (default always)"
    )
    parser.add_argument(
        "--random",
        type=int,
        default=0,
        metavar="N",
        help="a third stage: N configurations with every knob drawn at once (0: none)",
    )
    parser.add_argument(
        "--also-trace",
        type=Path,
        help="also run every configuration on this Mooncake-format trace (not used by the rule)",
    )
    args = parser.parse_args(argv)
    known = [label for label, _ in CONFIGS]
    wanted = {"default", *(args.only or known)}
    labels = tuple(label for label in known if label in wanted)
    unknown = sorted(set(args.only or ()) - set(known))
    if args.count < 1 or args.requests < 10 or args.replicates < 0 or args.random < 0 or unknown:
        parser.error(
            "--count must be >= 1, --requests >= 10, --replicates >= 0, --random >= 0"
            + (f"; unknown configurations {unknown} (known: {known})" if unknown else "")
        )
    started = time.perf_counter()
    # read first: a bad file fails before the family's minutes of simulation
    other = None if args.also_trace is None else load_mooncake(args.also_trace)
    tuning = [d for d in draw_traces(args.count, args.seed) if not d.held_out]
    draws = [again for d in tuning for again in (d, *d.replicated(args.replicates))]
    by_label = sweep(draws, args.requests, labels, args.jobs, "first stage")
    stage_two = second_stage(chosen(by_label), labels)
    if stage_two:
        by_label |= sweep(draws, args.requests, stage_two, args.jobs, "second stage")
    if args.random:
        randoms = random_labels(args.random)
        by_label |= sweep(draws, args.requests, randoms, args.jobs, "joint draws")
    labels = tuple(by_label)
    also = None if other is None else (args.also_trace.name, outcomes_on(other, labels))
    image = None
    if args.plot and plot(by_label, args.plot) and args.write:
        image = Path(os.path.relpath(args.plot.resolve(), args.write.resolve().parent))
    command = shlex.join(["python", "benchmarks/conversation_knobs.py", *argv])
    text = report(command, draws, by_label, time.perf_counter() - started, image, also)
    write_or_print(text, SECTION, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
