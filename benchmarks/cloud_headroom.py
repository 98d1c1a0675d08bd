"""Where the multi-session cost goes on Anthropic's rules, and what is left to gain,
written into docs.

    python benchmarks/cloud_headroom.py --write docs/benchmarks.md \
        --plot docs/img/cloud_headroom.png

The ``cloud`` section puts the pilot's multi-session cost on Anthropic's rules beside
the chat-append bound, which says the target is reachable. This splits the cost, on the
same seeds, prompts, emulator and prices (``replay_ours``), into what each
turn pays, and measures the two things that separate ours from the bound:

- **First turns reading across conversations.** A first turn can read from another
  conversation only the leading content blocks it shares with an earlier prompt (and
  only from a prefix at least the model's minimum long). In tokens (the system prompt
  included), over the first turns: what ours *read*; what ours could have read *with an
  entry at every block boundary* (each first turn's longest common block prefix with
  an earlier first turn, as ours ordered both; no lifetime): the loss to where
  breakpoints went; the same with *orders planned in hindsight* (``plan_batch`` over
  every first turn's documents at once, each turn still reading only earlier ones):
  what an order that knew the coming requests would add; and the *bound's credit*
  (each first turn's documents in common with its best earlier first turn, in any
  order, before the bound's cap on all of them together).
- **Later turns that are a conversation's last.** Their prompt starts with the
  conversation's history, so no other request reads what they write; when no later turn
  comes, a write is the write premium paid for nothing. The pilot cannot know a turn is
  the last (it writes when the turns it has seen make another one likely enough); the
  bound knows.

On OpenAI's rules (no breakpoints, no write premium) the question is the route: a
first turn reads only what an earlier prompt left on the machine its own prompt and
``prompt_cache_key`` lead to. Beside what ours' first turns read, the same prompts
replayed through the emulator with a single machine (``OpenAICacheRules(machines=1)``):
what any keys and routing could let them read.

Deterministic (seeded workloads, simulated time): one run. Emulated, not measured on
the provider. Writes the ``cloud-headroom`` generated section of ``--write``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lib.report import progress_bars
from lib.sections import markdown_table, provenance, pyplot, save_figure, write_or_print

from contextpilot_rag.batch import plan_batch
from contextpilot_rag.batch.plan import sequences_of
from contextpilot_rag.bench.cloud_report import TARGETS
from contextpilot_rag.bench.cloud_suite import (
    DEFAULT_MODELS,
    CloudRun,
    SentRequest,
    replay_ours,
    run_cloud_workload,
)
from contextpilot_rag.bench.cloud_workloads import cloud_workload
from contextpilot_rag.bench.optimum import best_partner_shares, plan_hits
from contextpilot_rag.cloud import DEFAULT_PRICES, rules_for
from contextpilot_rag.sim import OpenAICacheModel, OpenAICacheRules

SECTION = "cloud-headroom"
FAMILY = "multi-session"


@dataclass(frozen=True)
class Headroom:
    """One seed's split (USD and tokens; see the module docstring)."""

    seed: int
    model: str
    baseline_usd: float
    chat_bound_usd: float
    first_usd: float
    later_usd: float
    first_turns: int
    read: int
    every_boundary: int
    hindsight: int
    credit: int
    last_turn_writes: int

    @property
    def total_usd(self) -> float:
        return self.first_usd + self.later_usd


@dataclass(frozen=True)
class OpenAIHeadroom:
    """One seed on OpenAI's rules: costs (USD), and the tokens first turns read from
    cache as routed and on a single machine."""

    seed: int
    baseline_usd: float
    ours_usd: float
    chat_bound_usd: float
    read: int
    one_machine: int


def _coded(
    prompts: Sequence[Sequence[tuple[str, int]]], codes: dict[str, int], sizes: dict[int, float]
) -> list[list[int]]:
    """``prompts`` (blocks as key and tokens) as block codes, ``codes`` and ``sizes``
    (tokens per code) filled in as they go."""
    coded = []
    for prompt in prompts:
        coded.append([codes.setdefault(key, len(codes)) for key, _ in prompt])
        sizes.update((codes[key], float(tokens)) for key, tokens in prompt)
    return coded


def _every_boundary(first: Sequence[SentRequest], minimum: int) -> int:
    """Each first turn's longest common block prefix with an earlier one, summed over
    those where it reaches ``minimum`` tokens."""
    sizes: dict[int, float] = {}
    coded = _coded([sent.blocks for sent in first], {}, sizes)
    return round(plan_hits(coded, sizes, min_hit=minimum))


def _hindsight(first: Sequence[SentRequest], minimum: int) -> int:
    """:func:`_every_boundary` with the documents of every first turn ordered by one
    ``plan_batch`` over all of them (system prompt first, question left out)."""
    codes: dict[str, int] = {}
    sizes: dict[int, float] = {}
    (system,) = _coded([first[0].blocks[:1]], codes, sizes)
    requests = _coded([sent.blocks[1:-1] for sent in first], codes, sizes)
    plan = plan_batch(requests, weights=[sizes[code] for code in range(len(codes))])
    planned = [[*system, *sequence] for sequence in sequences_of(requests, plan.orders)]
    return round(plan_hits(planned, sizes, min_hit=minimum))


def _credit(first: Sequence[SentRequest], minimum: int) -> int:
    """Each first turn's documents in common with its best earlier first turn (the
    system prompt added), summed where that reaches ``minimum`` tokens."""
    sizes: dict[int, float] = {}
    documents = _coded([sent.blocks[1:-1] for sent in first], {}, sizes)
    system = first[0].blocks[0][1]
    shared = best_partner_shares(documents, sizes, earlier_only=True)
    credited = (system + float(best) for best in shared if best)
    return round(sum(tokens for tokens in credited if tokens >= minimum))


def _checked(seed: int, sent: Sequence[SentRequest], run: CloudRun) -> None:
    """The replay is the suite's arm: the same cost to the last digit."""
    ours = sum(s.cost_usd for s in sent)
    if abs(ours - run.ours.cost_usd) > 1e-9 * max(1.0, ours):
        raise AssertionError(
            f"seed {seed}, {run.provider}: the replay costs {ours}, the suite's arm "
            f"{run.ours.cost_usd}"
        )


def headroom(seed: int, model: str) -> Headroom:
    workload = cloud_workload(FAMILY, seed)
    sent = replay_ours(workload, "anthropic", model)
    (run,) = run_cloud_workload(workload, ("anthropic",), {"anthropic": model})
    _checked(seed, sent, run)
    minimum = rules_for("anthropic").min_tokens(model)
    first = [s for s in sent if s.timed.request.turn == 0]
    last_turn: dict[str, int] = {}
    for number, s in enumerate(sent):
        last_turn[s.timed.user] = number
    final_later = [
        s
        for number, s in enumerate(sent)
        if s.timed.request.turn and last_turn[s.timed.user] == number
    ]
    return Headroom(
        seed,
        model,
        run.baseline.cost_usd,
        run.least_chat_cost_usd,
        sum(s.cost_usd for s in first),
        sum(s.cost_usd for s in sent if s.timed.request.turn),
        len(first),
        sum(s.usage.cache_read_tokens for s in first),
        _every_boundary(first, minimum),
        _hindsight(first, minimum),
        _credit(first, minimum),
        sum(s.usage.cache_write_tokens for s in final_later),
    )


def openai_headroom(seed: int) -> OpenAIHeadroom:
    workload = cloud_workload(FAMILY, seed)
    model = DEFAULT_MODELS["openai"]
    sent = replay_ours(workload, "openai", model)
    (run,) = run_cloud_workload(workload, ("openai",))
    _checked(seed, sent, run)
    one = OpenAICacheModel(OpenAICacheRules(machines=1))
    read = alone = 0
    for s in sent:  # every request, in send order, so the one machine holds what it would
        usage = one.request(
            s.ids, now_s=s.timed.at_s, prompt_cache_key=s.prompt_cache_key, model=model
        ).input_tokens
        if s.timed.request.turn == 0:
            read += s.usage.cache_read_tokens
            alone += usage.cache_read_tokens
    return OpenAIHeadroom(
        seed, run.baseline.cost_usd, run.ours.cost_usd, run.least_chat_cost_usd, read, alone
    )


def openai_report(rows: Sequence[OpenAIHeadroom]) -> list[str]:
    model = DEFAULT_MODELS["openai"]
    lines = [
        "",
        f"### OpenAI's rules (`{model}`): first turns' reads as routed and on one machine",
        "",
        "*Read*: tokens ours' first turns read from cache (every one of them, from any "
        "earlier prompt on its machine); *one machine*: the same requests replayed in the "
        "same order through the emulator with a single machine, which every prompt reaches "
        "(no route can do better for these prompts).",
        "",
    ]
    table = [
        [
            str(row.seed),
            f"{row.baseline_usd / row.ours_usd:.2f}x",
            f"{row.read:,}",
            f"{row.one_machine:,}",
            f"{100 * row.read / row.one_machine:.0f}%" if row.one_machine else "-",
            f"{row.baseline_usd / row.chat_bound_usd:.2f}x",
        ]
        for row in rows
    ]
    return lines + markdown_table(
        [
            "seed",
            "baseline / ours",
            "read",
            "one machine",
            "read of one machine",
            "bound: chat-append",
        ],
        table,
    )


def _gained(row: Headroom) -> float:
    """Ours less the three losses, each priced alone (an estimate): the reads every
    boundary and hindsight orders add, at a write's price less a read's, and the
    last-turn writes' premium."""
    price = DEFAULT_PRICES.price(row.model)
    write = price.cache_write_5m or price.input
    best = max(row.hindsight, row.every_boundary)  # the better order, every boundary cached
    reads = (best - row.read) * (write - price.cache_read)
    return row.total_usd - (reads + row.last_turn_writes * (write - price.input)) / 1e6


def report(rows: Sequence[Headroom], model: str, command: str, seconds: float) -> str:
    price = DEFAULT_PRICES.price(model)
    write = price.cache_write_5m or price.input
    saving = write - price.cache_read  # a token read instead of written
    lines = [
        "## Hosted prompt caches: where the multi-session cost goes "
        "(`benchmarks/cloud_headroom.py`)",
        "",
        provenance(command, 1, "none: seeded workloads on simulated time, deterministic"),
        "",
        f"- workloads: the `{FAMILY}` seeds of the `cloud` section, the pilot's prompts on "
        f"Anthropic's rules (`{model}`, minimum cacheable prefix "
        f"{rules_for('anthropic').min_tokens(model):,} tokens), the same emulator and prices",
        f"- whole run: {seconds:.0f} s",
        "",
        "Emulated from the provider's published rules, not measured on its servers. "
        "Tokens read across conversations by first turns (the system prompt included): "
        "*read*, what ours read; *every boundary*, what ours' own orders allow with an entry "
        "at every block boundary (no lifetime); *hindsight*, the same with every first "
        "turn's documents ordered by one `plan_batch` over all of them; *credit*, the "
        "documents each first turn has in common with its best earlier one, in any order "
        "(what the chat-append bound credits before its cap on all of them together). "
        "*Last-turn writes*: tokens written by later turns no turn follows, which no "
        "request reads. One token read instead of written saves "
        f"{saving:g} USD per million; one sent uncached instead of written, "
        f"{write - price.input:g}.",
        "",
    ]

    table = [
        [
            str(row.seed),
            f"{row.baseline_usd / row.total_usd:.2f}x",
            f"{row.first_usd:.3f} / {row.later_usd:.3f}",
            f"{row.first_turns:,}",
            f"{row.read:,}",
            f"{row.every_boundary:,}",
            f"{row.hindsight:,}",
            f"{row.credit:,}",
            f"{row.last_turn_writes:,}",
            f"{row.baseline_usd / _gained(row):.2f}x",
            f"{row.baseline_usd / row.chat_bound_usd:.2f}x",
        ]
        for row in rows
    ]
    lines += markdown_table(
        [
            "seed",
            "baseline / ours",
            "ours: first / later turns $",
            "first turns",
            "read",
            "every boundary",
            "hindsight",
            "credit",
            "last-turn writes",
            "baseline / ours with all three (estimate)",
            "bound: chat-append",
        ],
        table,
    )
    lines += [
        "",
        "*Baseline*: the cheaper common practice, as in the `cloud` section. *Ours with all "
        "three*: ours less the reads that every boundary and hindsight orders add (the "
        "better of the two orders; each "
        "token at the saving above) and less the last-turn writes' premium, each priced "
        "alone as if the others did not change it: what an online planner with perfect "
        "placement, orders as good as hindsight's and knowledge of the last turn would "
        "reach about, to be set against the target and the bound.",
    ]
    return "\n".join(lines)


def plot(rows: Sequence[Headroom], openai_rows: Sequence[OpenAIHeadroom], path: Path) -> bool:
    """Per seed on Anthropic's rules: ours, ours with the three losses gained, and the
    chat-append bound (baseline / cost), the target dashed; on OpenAI's, ours' first-turn
    reads as a share of one machine's. ``False`` when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), width_ratios=(3, 2))
    seeds = [row.seed for row in rows]
    width = 0.27
    series = (
        ("ours", [row.baseline_usd / row.total_usd for row in rows], "tab:orange"),
        (
            "ours with all three (estimate)",
            [row.baseline_usd / _gained(row) for row in rows],
            "tab:blue",
        ),
        ("bound: chat-append", [row.baseline_usd / row.chat_bound_usd for row in rows], "grey"),
    )
    for offset, (label, values, color) in enumerate(series):
        left.bar([s + (offset - 1) * width for s in seeds], values, width, label=label, color=color)
    left.axhline(TARGETS[FAMILY], color="red", linestyle="dashed", linewidth=1, label="target")
    left.axhline(1.0, color="black", linewidth=0.6)
    left.set_xticks(seeds, [f"seed {seed}" for seed in seeds], fontsize=8)
    left.set_ylabel("input cost, baseline / ours")
    left.set_title("multi-session, Anthropic's rules", fontsize=9)
    left.legend(fontsize=7, loc="lower right")
    shares = [100 * row.read / row.one_machine if row.one_machine else 0.0 for row in openai_rows]
    right.bar([row.seed for row in openai_rows], shares, color="tab:green")
    right.set_ylim(0, 100)
    right.set_xticks(
        [row.seed for row in openai_rows], [f"seed {row.seed}" for row in openai_rows], fontsize=8
    )
    right.set_ylabel("first turns' reads, % of one machine's")
    right.set_title("multi-session, OpenAI's rules", fontsize=9)
    figure.suptitle("Hosted prompt caches: what is left to gain (emulated)", fontsize=10)
    return save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5", help="multi-session seeds (0–5)")
    parser.add_argument("--model", default=DEFAULT_MODELS["anthropic"])
    parser.add_argument("--write", type=Path, help="docs file to write the section into")
    parser.add_argument("--plot", type=Path, help="PNG of the ratios and the OpenAI reads")
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    started = time.perf_counter()
    rows, openai_rows = [], []
    with progress_bars() as progress:
        tick = progress("multi-session seeds", 2 * len(seeds))
        for seed in seeds:
            rows.append(headroom(seed, args.model))
            tick()
            openai_rows.append(openai_headroom(seed))
            tick()
    command = "python benchmarks/cloud_headroom.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = report(rows, args.model, command.strip(), time.perf_counter() - started)
    text += "\n" + "\n".join(openai_report(openai_rows))
    if args.plot and plot(rows, openai_rows, args.plot) and args.write:
        image = os.path.relpath(args.plot.resolve(), args.write.resolve().parent)
        text += f"\n\n![what is left to gain]({image})"
    write_or_print(text, SECTION, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
