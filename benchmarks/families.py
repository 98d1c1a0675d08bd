"""Workload families: the prompt optimizer on many independently drawn workloads, the
minimum over a held-out half, and how far each result is from the best possible.

    python benchmarks/families.py --write docs/benchmarks.md --plot docs/img/families.png

Three families (issue 22, items 1 and 3): *batch* (``optimize_batch``, replayed in its
execution order), *online* (``optimize`` in arrival order) and *multi-turn* (dedup,
computed tokens vs the unmodified prompts). Each draws ``--count`` workloads from the
generators of :mod:`contextpilot_rag.bench.workloads` with independent seeds and
parameters from the issue's ranges; even-numbered workloads are the tuning half,
odd-numbered ones the held-out half, and targets apply to the held-out worst.

Distance to the optimum: every workload gets a bound that no ordering can pass (a
prompt token is cached only if its block was in an earlier request), and small batch
instances are solved exactly (:mod:`contextpilot_rag.bench.optimum`). Writes the
``families`` generated section of ``--write``; prints the markdown without it.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from lib.batch import SegmentEncoder, _codes, _reference_arm
from lib.report import ordered_map, progress_bars, save_figure
from lib.sections import markdown_table, provenance, pyplot, write_or_print
from lib.suite import REFERENCE, reference_arms

from contextpilot_rag.batch import plan_batch
from contextpilot_rag.bench.optimum import (
    best_partner_bound,
    best_partner_shares,
    optimal_hits,
    plan_hits,
    random_instance,
    seen_before_bound,
    separation_bound,
)
from contextpilot_rag.bench.workloads import (
    DOC_WORDS,
    TextLengths,
    Workload,
    WorkloadRequest,
    intent_workload,
    log_uniform,
    multiturn_workload,
    online_workload,
    topic_workload,
)
from contextpilot_rag.blocks import ContextBlock
from contextpilot_rag.experiment import (
    ArmFactory,
    Progress,
    baseline_config,
    block_lookup,
    dedup_misses,
    pilot_arm,
    run_experiment,
)
from contextpilot_rag.index import IndexConfig
from contextpilot_rag.pilot import ContextPilot, PilotConfig
from contextpilot_rag.prompt import Prompt
from contextpilot_rag.sim.prefix_cache import PrefixCacheModel
from contextpilot_rag.sim.replay import (
    BuildPrompt,
    EngineTokenizer,
    Messages,
    capacity_for,
    replay,
)
from contextpilot_rag.tokenizers import Tokenizer, default_tokenizer

SECTION = "families"
FAMILIES = ("batch", "online", "multi-turn", "batch, D=2,000 k=15", "online, D=2,000 k=15")
SHAPE = {"n_docs": 2000, "k": 15, "requests": 2000}  # the issue's targets' workload shape
SHAPE_ZIPF = (0.9, 1.2)
SHAPE_REFERENCE_TIMEOUT_S = 60.0  # around the calibrated 1.04 (80% of slots on the top 20% of docs)
CAPACITY_FRACTION = 0.25
UNBOUNDED_FRACTION = 4.0  # of the distinct cacheable tokens: nothing is ever evicted
PAGE_SLACK_TOKENS = 15  # a cached prefix may end inside one 16-token page of new text
QUESTION_EDGE_TOKENS = 2  # a question's first and last token may merge with their neighbours
SEPARATION_LEVELS = 300  # depth intervals of the separation bound (finer: tighter, slower)
SMALL_SHAPES = ((6, 3, 6), (7, 4, 8), (8, 4, 8))  # requests, blocks each, vocabulary
# text lengths (issue 22: query/document length ranges), in words (~1.9 cl100k tokens
# each): a workload's mean drawn log-uniformly, each text uniform within +-spread of it.
# Documents: 40-400 words on average (MTRAG's passages: 60-380 words, 5th-95th
# percentile); questions: 10-80 words (MultiHop-RAG's: 31-64).
DOC_MEAN_WORDS = (40.0, 400.0)
DOC_SPREAD = 0.5
QUERY_MEAN_WORDS = (10.0, 80.0)
QUERY_SPREAD = 0.3


@dataclass(frozen=True)
class Draw:
    """One workload's parameters. ``docs_per_topic`` None: no topic structure."""

    family: str
    index: int  # even: tuning half; odd: held-out half
    seed: int
    n_docs: int
    k: int
    zipf: float
    docs_per_topic: int | None = None
    turns: int = 1
    reretrieve: float = 0.0
    interleave: int = 1
    intents: int | None = None  # intent_workload: near-duplicate request groups
    swap: float = 0.0
    requests: int | None = None  # None: the command's --requests
    doc_words: tuple[int, int] = DOC_WORDS  # words per document, uniform in this range
    query_words: tuple[int, int] | None = None  # words per question; None: bare questions

    @property
    def lengths(self) -> TextLengths:
        return TextLengths(self.doc_words, self.query_words)

    @property
    def kind(self) -> str:
        """What the planner sees: the generator (``batch``/``online`` runner)."""
        return "online" if self.family.startswith("online") else self.family.split(",")[0]

    @property
    def held_out(self) -> bool:
        return self.index % 2 == 1


@dataclass(frozen=True)
class Outcome:
    """One workload's result. ``ours``, ``unmodified``, ``reference``: hit ratio at 25%
    capacity (batch, online) or computed tokens / unmodified (multi-turn); ``bound``:
    the best any ordering could reach on the same scale; ``of_bound``: ours as a
    fraction of that best (1.0: nothing left to gain)."""

    draw: Draw
    ours: float
    unmodified: float
    bound: float
    of_bound: float
    reference: float | None = None
    reference_note: str = ""
    seconds: float = 0.0  # ours: optimize_batch (batch) or every optimize call
    plan_s: float | None = None  # batch: plan_batch alone (block codes in)
    popularity_alone: float | None = None  # online: hit ratio with together_window=0

    @property
    def lower_is_better(self) -> bool:
        return self.draw.family == "multi-turn"

    @property
    def versus_reference(self) -> float | None:
        if self.reference is None or self.reference <= 0:
            return None
        return self.reference / self.ours if self.lower_is_better else self.ours / self.reference


@dataclass(frozen=True)
class SmallInstances:
    """Ours against the exact optimum on small batch instances (block-granular hits)."""

    shape: tuple[int, int, int]
    of_optimum: tuple[float, ...]  # ours / optimum per instance
    optimum_of_bound: tuple[float, ...]  # optimum / the smallest bound per instance
    seconds: float


def draw_family(
    family: str, count: int, seed: int, shape_requests: int = SHAPE["requests"]
) -> list[Draw]:
    """``count`` parameter draws. Batch and online rotate over three independent
    generators in pairs of workloads (independent Zipf draws, topics, intents), so both
    halves hold every kind; the ``D=2,000 k=15`` families keep the targets' shape and
    draw only the popularity skew and the generator's own parameters."""
    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    # text lengths from a stream of their own: the other parameters stay as drawn before
    lengths_rng = np.random.default_rng([seed, FAMILIES.index(family), 1])
    draws = []
    shaped = family.endswith("k=15")
    for index in range(count):
        n_docs = round(math.exp(rng.uniform(math.log(500), math.log(20_000))))
        k, zipf = int(rng.integers(5, 31)), float(rng.uniform(0.6, 1.4))
        docs_per_topic = int(rng.integers(max(k, 20), 201))
        turns, reretrieve = int(rng.integers(2, 11)), float(rng.uniform(0.1, 0.6))
        interleave, workload_seed = int(rng.integers(4, 33)), int(rng.integers(2**31))
        intents, swap = int(rng.integers(100, 601)), float(rng.uniform(0.1, 0.5))
        if shaped:
            n_docs, k, zipf = SHAPE["n_docs"], SHAPE["k"], float(rng.uniform(*SHAPE_ZIPF))
            docs_per_topic = int(rng.integers(50, 201))
        doc_mean = log_uniform(lengths_rng, DOC_MEAN_WORDS)
        query_mean = log_uniform(lengths_rng, QUERY_MEAN_WORDS)
        draw = Draw(family, index, workload_seed, n_docs, k, zipf)
        if shaped:
            draw = replace(draw, requests=shape_requests)
        else:
            draw = replace(
                draw,
                doc_words=_around(doc_mean, DOC_SPREAD),
                query_words=_around(query_mean, QUERY_SPREAD),
            )
        if family == "multi-turn":
            draw = replace(draw, turns=turns, reretrieve=reretrieve, interleave=interleave)
        elif index % 6 >= 4:
            draw = replace(draw, intents=intents, swap=swap)
        elif index % 6 >= 2:
            n_topics = max(1, n_docs // docs_per_topic)
            draw = replace(draw, n_docs=n_topics * docs_per_topic, docs_per_topic=docs_per_topic)
        draws.append(draw)
    return draws


def _around(mean: float, spread: float) -> tuple[int, int]:
    """The inclusive word range ``mean`` ± ``spread`` of it (at least one word)."""
    return max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))


def make_workload(draw: Draw, n_requests: int, n_turns: int) -> Workload:
    common = {
        "k": draw.k,
        "seed": draw.seed,
        "zipf_exponent": draw.zipf,
        "lengths": draw.lengths,
    }
    n_requests = draw.requests or n_requests
    if draw.family == "multi-turn":
        return multiturn_workload(
            n_sessions=max(1, round(n_turns / draw.turns)),
            turns=draw.turns,
            interleave=draw.interleave,
            reretrieve_fraction=draw.reretrieve,
            n_docs=draw.n_docs,
            **common,  # type: ignore[arg-type]
        )
    if draw.intents is not None:
        return intent_workload(
            n_docs=draw.n_docs,
            n_requests=n_requests,
            n_intents=draw.intents,
            swap=draw.swap,
            **common,  # type: ignore[arg-type]
        )
    if draw.docs_per_topic is not None:
        return topic_workload(
            n_topics=draw.n_docs // draw.docs_per_topic,
            docs_per_topic=draw.docs_per_topic,
            n_requests=n_requests,
            **common,  # type: ignore[arg-type]
        )
    return online_workload(n_docs=draw.n_docs, n_requests=n_requests, **common)  # type: ignore[arg-type]


# --- bounds: what any ordering could reach --------------------------------------------


RequestTokens = tuple[int, list[tuple[str, int]]]
"""A request's unmodified prompt: tokens before its first block, then (block, tokens)."""


def request_tokens(prompts: Iterable[Prompt], tokenizer: Tokenizer) -> list[RequestTokens]:
    """Per unmodified prompt without history: the head (system message and user
    header) and each block's segment, tokenized in the pieces :class:`SegmentEncoder`
    uses. A block renders to the same text wherever it appears, so its segment is its
    size in any prompt."""
    sizes: dict[str, int] = {}  # block id -> tokens
    pieces_tokens: dict[str, int] = {}  # head piece -> tokens
    rows = []
    for prompt in prompts:
        content = prompt.messages[-1]["content"]
        pieces = [f"<|{m['role']}|>\n{m['content']}\n" for m in prompt.messages[:-1]]
        pieces.append("<|user|>\n" + content[: prompt.boundaries[0].char_start])
        for piece in pieces:
            if piece not in pieces_tokens:
                pieces_tokens[piece] = len(tokenizer.encode(piece))
        for b in prompt.boundaries:
            if b.block_id not in sizes:
                sizes[b.block_id] = len(tokenizer.encode(content[b.char_start : b.char_end]))
        head = sum(pieces_tokens[piece] for piece in pieces)
        rows.append((head, [(b.block_id, sizes[b.block_id]) for b in prompt.boundaries]))
    return rows


def unmodified_prompts(workload: Workload, tokenizer: Tokenizer) -> Iterator[Prompt]:
    """The unmodified prompt of every request, without history."""
    render = ContextPilot(baseline_config(), tokenizer=tokenizer)
    blocks = block_lookup(workload)
    for request in workload.requests:
        yield render.optimize(
            [blocks(d) for d in request.doc_ids], request.query, system=workload.system_prompt
        )


def coded_requests(rows: Sequence[RequestTokens]) -> tuple[list[list[int]], dict[int, float]]:
    """The rows' blocks as integer codes (the bounds of ``bench.optimum`` take those),
    and each code's tokens."""
    codes: dict[str, int] = {}
    requests = [[codes.setdefault(b, len(codes)) for b, _ in blocks] for _, blocks in rows]
    return requests, {codes[b]: float(size) for _, blocks in rows for b, size in blocks}


def cached_upper_bound(rows: Sequence[RequestTokens], *, fixed_order: bool) -> float:
    """Cached tokens no plan can exceed (unbounded cache): the head of every request
    but the first, less than one page per request, and the smallest of three bounds on
    the blocks (:mod:`contextpilot_rag.bench.optimum`): each block hits at most once
    fewer than it occurs; a request hits at most what it shares with one other
    request — an earlier one when the arrival order is fixed (``fixed_order``); and
    the trie of the sequences is at least as wide at every depth as a set of requests
    that pairwise share less than that depth (``separation_bound``, any order)."""
    requests, weights = coded_requests(rows)
    blocks = min(
        seen_before_bound(requests, weights),
        best_partner_bound(requests, weights, earlier_only=fixed_order),
        separation_bound(requests, weights, levels=SEPARATION_LEVELS),
    )
    heads = sum(head for head, _ in rows[1:])
    return heads + blocks + PAGE_SLACK_TOKENS * len(rows)


def computed_lower_bound(
    requests: Sequence[WorkloadRequest],
    rows: Sequence[RequestTokens],
    questions: Sequence[int] = (),
) -> int:
    """Computed tokens no history-first prompt strategy goes below (unbounded cache,
    arrival order). Every prompt of a conversation starts with the shared head and then
    its first turn's blocks, followed by a question asked nowhere else; so a first turn
    can hit beyond the head only blocks it shares with one earlier first turn (its best
    partner, ``best_partner_shares``), and a later turn computes every block new to its
    conversation. ``questions[n]``: tokens of request ``n``'s question no prompt has
    cached when it is first asked (:func:`question_floor`; none when not given). Less at
    most one page per request that may match by coincidence."""
    coded, sizes = coded_requests(rows)
    firsts = [number for number, request in enumerate(requests) if request.turn == 0]
    partner = dict(
        zip(
            firsts,
            best_partner_shares([coded[n] for n in firsts], sizes, earlier_only=True),
            strict=True,
        )
    )
    in_session: dict[str | None, set[str]] = defaultdict(set)
    total = 0
    for number, (request, (head, blocks)) in enumerate(zip(requests, rows, strict=True)):
        known = in_session[request.session]
        new = (0 if number else head) + sum(size for b, size in blocks if b not in known)
        new -= round(partner.get(number, 0.0))
        new += questions[number] if questions else 0
        total += max(0, new - PAGE_SLACK_TOKENS)
        known.update(b for b, _ in blocks)
    return total


def question_floor(requests: Sequence[WorkloadRequest], tokenizer: Tokenizer) -> list[int]:
    """Per request, the tokens of its question no prompt can have cached when it is
    asked: a question is asked once (a later turn carries it only as history), so a
    cache holds at most what it shares from its start with another question, one more
    token where the text before it merges into its first, and one where it runs on
    into what follows (``QUESTION_EDGE_TOKENS``)."""
    encoded = [tuple(tokenizer.encode(request.query)) for request in requests]
    order = sorted(range(len(encoded)), key=encoded.__getitem__)
    shared = [0] * len(encoded)  # longest common start with any other question
    for before, after in itertools.pairwise(order):
        common = _common_start(encoded[before], encoded[after])
        shared[before] = max(shared[before], common)
        shared[after] = max(shared[after], common)
    return [
        max(0, len(tokens) - common - QUESTION_EDGE_TOKENS)
        for tokens, common in zip(encoded, shared, strict=True)
    ]


def _common_start(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


# --- the three families -----------------------------------------------------------------


def replay_streams(streams: Iterable[Sequence[int]], capacity: int) -> PrefixCacheModel:
    cache = PrefixCacheModel(capacity_tokens=capacity)
    for stream in streams:
        cache.admit(stream)
    return cache


@dataclass
class SingleTurn:
    """A batch or online workload's unmodified side: its requests, the cache capacity
    they set, their replay and the bound on cached tokens."""

    requests: list[tuple[list[ContextBlock], str]]
    encode: SegmentEncoder
    capacity: int
    unmodified: PrefixCacheModel
    rows: list[RequestTokens]

    @classmethod
    def of(cls, workload: Workload, tokenizer: Tokenizer) -> SingleTurn:
        blocks = block_lookup(workload)
        requests = [([blocks(d) for d in r.doc_ids], r.query) for r in workload.requests]
        encode = SegmentEncoder(tokenizer)
        prompts = list(unmodified_prompts(workload, tokenizer))
        capacity = capacity_for((encode(p) for p in prompts), CAPACITY_FRACTION)
        base = replay_streams((encode(p) for p in prompts), capacity)
        return cls(requests, encode, capacity, base, request_tokens(prompts, tokenizer))

    def pilot(self, tokenizer: Tokenizer, **options: Any) -> ContextPilot:
        config = PilotConfig(index=IndexConfig(capacity_tokens=self.capacity), **options)
        return ContextPilot(config, tokenizer=tokenizer)

    def outcome(self, draw: Draw, prompts: Iterable[Prompt], **fields: Any) -> Outcome:
        ours = replay_streams((self.encode(p) for p in prompts), self.capacity)
        bound = cached_upper_bound(self.rows, fixed_order=draw.kind == "online")
        return Outcome(
            draw,
            ours.hit_ratio,
            self.unmodified.hit_ratio,
            bound / self.unmodified.prompt_tokens_total,
            ours.cached_tokens_total / bound,
            **fields,
        )


def run_batch_draw(
    draw: Draw, workload: Workload, tokenizer: Tokenizer, reference_timeout_s: float | None
) -> Outcome:
    side = SingleTurn.of(workload, tokenizer)
    started = time.perf_counter()
    prompts = side.pilot(tokenizer).optimize_batch(side.requests, system=workload.system_prompt)
    seconds = time.perf_counter() - started
    codes = _codes(workload)
    coded = [[codes[d] for d in r.doc_ids] for r in workload.requests]
    reference, note = None, "not run"
    if reference_timeout_s is not None:
        blocks = {d: ContextBlock(text, id=d) for d, text in workload.corpus.items()}
        arm = _reference_arm(
            workload, coded, blocks, side.encode, side.capacity, reference_timeout_s, tokenizer,
            _no_tick,
        )  # fmt: skip
        reference, note = (None, "did not finish") if arm.plan_s is None else (arm.hit_ratio, "")
    return side.outcome(
        draw,
        prompts,
        reference=reference,
        reference_note=note,
        seconds=seconds,
        plan_s=_time_plan(coded, side.rows, codes),
    )


def _time_plan(
    coded: Sequence[Sequence[int]], rows: Sequence[RequestTokens], codes: dict[str, int]
) -> float:
    weights = [0.0] * len(codes)
    for _, blocks in rows:
        for block_id, size in blocks:
            weights[codes[block_id]] = float(size)
    started = time.perf_counter()
    plan_batch(coded, weights=weights)
    return time.perf_counter() - started


class _DidNotFinish(Exception):
    """The reference arm ran past its time limit."""


def run_online_draw(
    draw: Draw, workload: Workload, tokenizer: Tokenizer, reference_timeout_s: float | None
) -> Outcome:
    side = SingleTurn.of(workload, tokenizer)
    pilot = side.pilot(tokenizer)
    started = time.perf_counter()
    prompts = [pilot.optimize(b, q, system=workload.system_prompt) for b, q in side.requests]
    seconds = time.perf_counter() - started
    alone = side.pilot(tokenizer, together_window=0)
    alone_prompts = (alone.optimize(b, q, system=workload.system_prompt) for b, q in side.requests)
    popularity_alone = replay_streams(map(side.encode, alone_prompts), side.capacity).hit_ratio
    reference, note = None, "not run"
    if reference_timeout_s is not None:
        reference, note = _online_reference(workload, tokenizer, side.capacity, reference_timeout_s)
    measured = {"seconds": seconds, "popularity_alone": popularity_alone}
    return side.outcome(draw, prompts, reference=reference, reference_note=note, **measured)


def _online_reference(
    workload: Workload, tokenizer: Tokenizer, capacity: int, timeout_s: float
) -> tuple[float | None, str]:
    """The reference's online mode (bench.py's arm) with a time limit for the whole
    workload: its hit ratio, or None and why not."""
    arms = reference_arms(workload, tokenizer)
    if not arms:
        return None, "not installed"
    build, _ = arms[0][1](capacity)
    deadline = time.perf_counter() + timeout_s

    def limited(request: WorkloadRequest) -> Messages:
        if time.perf_counter() > deadline:
            raise _DidNotFinish
        return build(request)

    try:
        arm = replay(
            REFERENCE, workload, limited, EngineTokenizer(tokenizer), capacity_tokens=capacity
        )
    except _DidNotFinish:
        return None, "did not finish"
    except Exception as error:  # the reference's own failures are reported, not raised
        return None, f"failed ({type(error).__name__})"
    return arm.hit_ratio, ""


def default_arm(workload: Workload, tokenizer: Tokenizer) -> ArmFactory:
    """Ours with the default configuration at the experiment's capacity."""

    def make(capacity: int) -> tuple[BuildPrompt[WorkloadRequest], Callable[[], int]]:
        config = PilotConfig(index=IndexConfig(capacity_tokens=capacity))
        pilot = ContextPilot(config, tokenizer=tokenizer)
        build, prompts = pilot_arm(pilot, workload, block_lookup(workload))
        return build, lambda: dedup_misses(prompts, pilot)

    return make


def run_multiturn_draw(
    draw: Draw, workload: Workload, tokenizer: Tokenizer, reference_timeout_s: float | None
) -> Outcome:
    def computed(capacity_fraction: float) -> tuple[int, int, float]:  # unmodified, ours
        result = run_experiment(
            "multi-turn",
            workload,
            [("ours", default_arm(workload, tokenizer))],
            capacity_fraction=capacity_fraction,
            tokenizer=tokenizer,
            cache_answers=True,
        )
        arm = result.arm("ours")
        return result.arm("unmodified").computed_tokens, arm.computed_tokens, arm.build_s

    base, ours, build_s = computed(CAPACITY_FRACTION)
    _, ours_unbounded, _ = computed(UNBOUNDED_FRACTION)
    rows = request_tokens(unmodified_prompts(workload, tokenizer), tokenizer)
    lower = computed_lower_bound(
        workload.requests, rows, question_floor(workload.requests, tokenizer)
    )
    return Outcome(
        draw,
        ours / base,
        1.0,
        lower / base,
        lower / ours_unbounded,  # like with like: the bound ignores the cache's capacity
        reference_note="no multi-turn mode",
        seconds=build_s,
    )


RUNNERS: dict[str, Callable[[Draw, Workload, Tokenizer, float | None], Outcome]] = {  # by kind
    "batch": run_batch_draw,
    "online": run_online_draw,
    "multi-turn": run_multiturn_draw,
}


def _no_tick(label: str, total: int) -> Callable[[], None]:
    return lambda: None


@dataclass(frozen=True)
class Job:
    """One workload to run, in a worker process."""

    draw: Draw
    n_requests: int
    n_turns: int
    reference_timeout_s: float | None


def run_job(job: Job) -> Outcome:
    workload = make_workload(job.draw, job.n_requests, job.n_turns)
    runner = RUNNERS[job.draw.kind]
    return runner(job.draw, workload, default_tokenizer(), job.reference_timeout_s)


def run_jobs(jobs: Sequence[Job], processes: int, progress: Progress) -> list[Outcome]:
    """Every job, in order, on ``processes`` worker processes (1: in this process)."""
    return ordered_map(run_job, jobs, processes, progress("workloads", len(jobs)))


def run_small_instances(
    shape: tuple[int, int, int], instances: int, seed: int, progress: Progress
) -> SmallInstances:
    """Ours (``plan_batch`` defaults, unit block weights) and the exact optimum."""
    n_requests, blocks_per_request, vocabulary = shape
    tick = progress(f"optimum: {n_requests} x {blocks_per_request} of {vocabulary}", instances)
    of_optimum, of_bound = [], []
    started = time.perf_counter()
    for number in range(instances):
        requests = random_instance(
            seed * 100_003 + number,
            n_requests=n_requests,
            blocks_per_request=blocks_per_request,
            vocabulary=vocabulary,
        )
        plan = plan_batch(requests)
        sequences = [[r[p] for p in order] for r, order in zip(requests, plan.orders, strict=True)]
        ours = plan_hits([sequences[i] for i in plan.schedule])
        optimum = optimal_hits(requests).hits
        of_optimum.append(ours / optimum if optimum else 1.0)
        bound = min(
            seen_before_bound(requests),
            best_partner_bound(requests),
            separation_bound(requests, levels=blocks_per_request),
        )
        of_bound.append(optimum / bound if bound else 1.0)
        tick()
    return SmallInstances(shape, tuple(of_optimum), tuple(of_bound), time.perf_counter() - started)


# --- report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    measure: str
    family: str
    threshold: float
    value: Callable[[Sequence[Outcome]], float | None]  # over the held-out half
    at_most: bool = False
    ratio: bool = False
    seconds: bool = False
    bound: Callable[[Sequence[Outcome]], float | None] | None = None  # the best any plan
    # could measure over the held-out half, from the per-workload bounds

    def cells(self, outcomes: Sequence[Outcome]) -> tuple[str, ...]:
        held_out = [o for o in outcomes if o.draw.family == self.family and o.draw.held_out]
        value = self.value(held_out) if held_out else None
        shown = "-" if value is None else self.format(value)
        met = "-" if value is None else "yes" if _meets(value, self) else "no"
        sign = "<=" if self.at_most else ">="
        best = self.bound(held_out) if self.bound is not None and held_out else None
        best_shown = "-" if best is None else self.format(best)
        feasible = "-" if best is None else "yes" if _meets(best, self) else "no"
        return (
            f"{self.family}: {self.measure}",
            f"{sign} {self.format(self.threshold)}",
            shown,
            met,
            best_shown,
            feasible,
        )

    def format(self, value: float) -> str:
        return f"{value:.2f} s" if self.seconds else _format(value, self.ratio)


def _meets(value: float, target: Target) -> bool:
    return value <= target.threshold if target.at_most else value >= target.threshold


def _format(value: float, ratio: bool) -> str:
    return f"{value:.2f}x" if ratio else f"{value:.1%}"


def _worst_versus_reference(outcomes: Sequence[Outcome]) -> float | None:
    ratios = [o.versus_reference for o in outcomes if o.versus_reference is not None]
    return min(ratios) if ratios else None


def _bound_versus_reference(outcomes: Sequence[Outcome]) -> float | None:
    """The worst, over the workloads where the reference finished, of the bound over the
    reference's hit ratio: no plan's ratio to the reference passes it there."""
    ratios = [o.bound / o.reference for o in outcomes if o.reference]
    return min(ratios) if ratios else None


def _slowest_plan(outcomes: Sequence[Outcome]) -> float | None:
    seconds = [o.plan_s for o in outcomes if o.plan_s is not None]
    return max(seconds) if seconds else None


BATCH, ONLINE = FAMILIES[3], FAMILIES[4]


def _lowest_bound(outcomes: Sequence[Outcome]) -> float:
    return min(o.bound for o in outcomes)


TARGETS = (
    Target("batch hit ratio, worst held-out", BATCH, 0.38, lambda o: min(x.ours for x in o),
           bound=_lowest_bound),
    Target("batch ours / reference, worst held-out that finished", BATCH, 1.15,
           _worst_versus_reference, ratio=True, bound=_bound_versus_reference),
    Target("batch build + schedule, 2,000 requests, slowest held-out", BATCH, 2.0,
           _slowest_plan, at_most=True, seconds=True),
    Target("online hit ratio, worst held-out", ONLINE, 0.25, lambda o: min(x.ours for x in o),
           bound=_lowest_bound),
    Target("online ours / reference, worst held-out", ONLINE, 2.0, _worst_versus_reference,
           ratio=True, bound=_bound_versus_reference),
    Target("multi-turn computed vs unmodified, worst held-out", "multi-turn", 0.60,
           lambda o: max(x.ours for x in o), at_most=True,
           bound=lambda o: max(x.bound for x in o)),
    # the issue asks for 1.15x "on every workload where it finishes": the general batch
    # family too, not only the targets' shape
    Target("batch ours / reference, worst held-out that finished", "batch", 1.15,
           _worst_versus_reference, ratio=True, bound=_bound_versus_reference),
)  # fmt: skip


def _span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "-"
    return " / ".join(fmt(v) for v in (min(values), statistics.median(values), max(values)))


def _percent(value: float) -> str:
    return f"{value:.1%}"


def _times(value: float) -> str:
    return f"{value:.2f}x"


def summary_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    rows = []
    for family in FAMILIES:
        for half, held_out in (("tuning", False), ("held-out", True)):
            part = [o for o in outcomes if o.draw.family == family and o.draw.held_out == held_out]
            if not part:
                continue
            versus = [o.versus_reference for o in part if o.versus_reference is not None]
            rows.append(
                [
                    family,
                    half,
                    str(len(part)),
                    _span([o.ours for o in part], _percent),
                    _span([o.unmodified for o in part], _percent),
                    _span([o.bound for o in part], _percent),
                    _span([o.of_bound for o in part], _percent),
                    _span([v for v in versus if v is not None], _times)
                    + (f" ({len(versus)} of {len(part)})" if versus else ""),
                ]
            )
    return rows


def _ratio3(value: float) -> str:
    return f"{value:.3f}x"


def _generator(draw: Draw) -> str:
    if draw.intents is not None:
        return "intents (near-duplicates)"
    return "independent draws" if draw.docs_per_topic is None else "topics"


def together_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """Online families, per generator: ours over ours ordering by popularity alone."""
    rows = []
    for family in FAMILIES:
        online = [o for o in outcomes if o.draw.family == family and o.popularity_alone]
        for generator in sorted({_generator(o.draw) for o in online}):
            part = [o for o in online if _generator(o.draw) == generator]
            ratios = [o.ours / o.popularity_alone for o in part if o.popularity_alone]
            rows.append([family, generator, str(len(part)), _span(ratios, _ratio3)])
    return rows


def _words(draw: Draw) -> str:
    low, high = draw.doc_words
    documents = f"{low}–{high}"
    if draw.query_words is None:
        return f"{documents} / bare"
    return f"{documents} / {draw.query_words[0]}–{draw.query_words[1]}"


def _shape(draw: Draw) -> list[str]:
    topics = "-" if draw.docs_per_topic is None else f"{draw.docs_per_topic} docs each"
    if draw.intents is not None:
        topics = f"{draw.intents} intents, {draw.swap:.0%} swapped"
    sessions = (
        f"{draw.turns} turns, {draw.reretrieve:.0%} again, {draw.interleave} at once"
        if draw.family == "multi-turn"
        else "-"
    )
    return [f"{draw.n_docs:,}", str(draw.k), f"{draw.zipf:.2f}", topics, sessions, _words(draw)]


def workload_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    rows = []
    for o in outcomes:
        reference = "-" if o.reference is None else _percent(o.reference)
        versus = o.versus_reference
        rows.append(
            [
                str(o.draw.index),
                "held-out" if o.draw.held_out else "tuning",
                *_shape(o.draw),
                _percent(o.unmodified),
                _percent(o.ours),
                _percent(o.bound),
                _percent(o.of_bound),
                reference if not o.reference_note else o.reference_note,
                "-" if versus is None else _times(versus),
                f"{o.seconds:.2f} s" + ("" if o.plan_s is None else f" ({o.plan_s:.2f} s)"),
            ]
        )
    return rows


_WORKLOAD_HEADERS = (
    "#",
    "half",
    "D",
    "k",
    "Zipf",
    "topics",
    "sessions",
    "words: documents / questions",
    "unmodified",
    "ours",
    "bound",
    "ours of bound",
    "reference",
    "ours vs reference",
    "ours, seconds (plan)",
)


def small_rows(results: Sequence[SmallInstances]) -> list[list[str]]:
    return [
        [
            f"{r.shape[0]} requests x {r.shape[1]} blocks of {r.shape[2]}",
            str(len(r.of_optimum)),
            f"{min(r.of_optimum):.1%} / {statistics.median(r.of_optimum):.1%}",
            f"{sum(v >= 1.0 - 1e-12 for v in r.of_optimum) / len(r.of_optimum):.0%}",
            f"{min(r.optimum_of_bound):.1%} / {statistics.median(r.optimum_of_bound):.1%}",
            f"{r.seconds:.1f} s",
        ]
        for r in results
        if r.of_optimum
    ]


def report_markdown(
    command: str,
    outcomes: Sequence[Outcome],
    small: Sequence[SmallInstances],
    *,
    n_requests: int,
    n_turns: int,
    reference_timeout_s: float | None,
    seconds: float,
    image: Path | None,
    shape_requests: int = SHAPE["requests"],
) -> str:
    lines = [
        "## Workload families: held-out worst case and distance to the optimum "
        "(`benchmarks/families.py`)",
        "",
        provenance(command, 1, "one run; hit ratios and token counts are deterministic "
                   "(seeded draws), seconds are from that run"),
        *_method_lines(n_requests, n_turns, reference_timeout_s, seconds, shape_requests),
        "",
        "### Targets (issue 22), on the held-out half",
        "",
        "*Bound*: the best value any plan could measure on the held-out half, from each "
        "workload's bound (for a ratio to the reference, the bound over the reference's "
        "hit ratio); *within the bound* says whether the target is reachable at all.",
        "",
        *markdown_table(("measure", "target", "measured", "met", "bound", "within the bound"),
                        [t.cells(outcomes) for t in TARGETS]),
        "",
        "### Per family: min / median / max",
        "",
        *markdown_table(
            ("family", "half", "workloads", "ours", "unmodified", "bound", "ours of bound",
             "ours vs reference (where it finished)"),
            summary_rows(outcomes),
        ),
    ]  # fmt: skip
    together = together_rows(outcomes)
    if together:
        lines += [
            "",
            "### Online: what follows the matched prefix",
            "",
            "Ours (the default, `PilotConfig.together_window=1024`: blocks most recent "
            "requests with the matched prefix carried follow it first) over ours ordering "
            "the rest by popularity alone (`together_window=0`), hit ratios on the same "
            "workloads, both halves; min / median / max.",
            "",
            *markdown_table(("family", "generator", "workloads", "ours / popularity alone"),
                            together),
        ]  # fmt: skip
    if any(r.of_optimum for r in small):  # --small-instances 0: none run
        lines += [
            "",
            "### Small batch instances: ours against the exact optimum",
            "",
            "Requests are sets of distinct blocks drawn by Zipf popularity (exponent 1) from a "
            "small vocabulary; unit block weights, unbounded cache, a request hits its longest "
            "common block prefix with any earlier request. The optimum is the lightest trie "
            "over all block orders (exhaustive search, `contextpilot_rag.bench.optimum`); "
            "ours is `plan_batch` with its defaults; the bound is the smallest of the three "
            "bounds above (block-granular depths here).",
            "",
            *markdown_table(
                ("instances", "count", "ours / optimum, min / median", "ours optimal",
                 "optimum / bound, min / median", "seconds"),
                small_rows(small),
            ),
        ]  # fmt: skip
    for family in FAMILIES:
        part = [o for o in outcomes if o.draw.family == family]
        if part:
            lines += ["", f"### {family}: every workload", "", *_family_note(family), ""]
            lines += markdown_table(_WORKLOAD_HEADERS, workload_rows(part))
    if image is not None:
        lines += ["", f"![workload families]({image.as_posix()})"]
    return "\n".join(lines)


def _method_lines(
    n_requests: int,
    n_turns: int,
    reference_timeout_s: float | None,
    seconds: float,
    shape_requests: int,
) -> list[str]:
    if reference_timeout_s is None:
        limit = "not run"
    else:  # _reference_limit: the 2,000-request shape's draws get more time
        shape_limit = max(reference_timeout_s, SHAPE_REFERENCE_TIMEOUT_S)
        limit = f"limit {reference_timeout_s:.0f} s ({shape_limit:.0f} s at the shape)"
    return [
        f"- draws: D log-uniform 500–20,000 documents, k 5–30, Zipf exponent 0.6–1.4; "
        f"batch and online: {n_requests:,} requests, three generators by pairs of "
        "workloads (of every 6: 0, 1 independent Zipf draws, `online_workload`; 2, 3 "
        "topics, `topic_workload`, 20–200 documents per topic; 4, 5 intents, "
        "`intent_workload`, 100–600 intents, 10–50% of an intent's documents swapped); "
        f"multi-turn: about {n_turns:,} turns, session length 2–10 turns, re-retrieval "
        "10–60% of k, 4–32 sessions interleaved; text lengths (all three families): a "
        f"workload's mean words per document log-uniform {DOC_MEAN_WORDS[0]:.0f}–"
        f"{DOC_MEAN_WORDS[1]:.0f} (MTRAG's passages: 60–380 words, 5th–95th percentile), "
        f"each document within ±{DOC_SPREAD:.0%} of it, per question "
        f"{QUERY_MEAN_WORDS[0]:.0f}–{QUERY_MEAN_WORDS[1]:.0f} (MultiHop-RAG's questions: "
        f"31–64), each within ±{QUERY_SPREAD:.0%} (a context sentence before the "
        "question makes up the length); independent seeds",
        f"- the targets' shape (families `{FAMILIES[3]}` and `{FAMILIES[4]}`): "
        f"{shape_requests:,} requests, D = {SHAPE['n_docs']:,}, k = {SHAPE['k']}, Zipf "
        f"exponent {SHAPE_ZIPF[0]}–{SHAPE_ZIPF[1]}, the same three generators (topics of "
        "50–200 documents), the `bench` section's texts (documents of "
        f"{DOC_WORDS[0]}–{DOC_WORDS[1]} words, bare questions); the issue names the shape, "
        "not its generator, so every generator counts",
        "- split: even-numbered workloads are the tuning half, odd-numbered the held-out "
        "half; targets apply to the held-out worst",
        "- cache model: `PrefixCacheModel` (16-token blocks, LRU) at 25% of the unmodified "
        "prompts' distinct cacheable tokens (as in the `bench` section); multi-turn engines "
        "keep the KV of decoded answers",
        "- bound: batch and online, cached tokens no plan exceeds in an unbounded cache "
        "(the shared system prompt of every request but the first, one partial page per "
        "request, and for the blocks the smallest of: each block hits once fewer than it "
        "occurs; a request hits at most the blocks it shares with its best partner, an "
        "earlier request online; the weight sent less a trie no narrower at any depth "
        "than a set of requests that pairwise share less than that depth, "
        f"`separation_bound` on {SEPARATION_LEVELS} depth intervals), over the unmodified "
        "prompt tokens; *ours of bound* "
        "= our cached tokens / those. Multi-turn, the computed tokens that no "
        "history-first strategy avoids in an unbounded cache (the system prompt once; a "
        "later turn, every block new to its conversation; a first turn, every block but "
        "those it shares with its best earlier first turn, since each prompt of a "
        "conversation continues the system prompt with its first turn's blocks; every "
        "question, asked once, less what it shares from its start with another question and "
        "a token at each edge; less one page per request) over the unmodified computed "
        "tokens; *ours of bound* = that / ours",
        f"- reference `contextpilot` 0.5.0: batch mode in a child process, online mode "
        f"in process, per workload {limit}; its prompts use our rendering without notes",
        f"- whole run: {seconds:.0f} s",
    ]


def _family_note(family: str) -> list[str]:
    return {
        "batch": ["Hit ratio at 25% capacity, `optimize_batch` replayed in its execution "
                  "order; seconds: `optimize_batch` (in parentheses `plan_batch` alone)."],
        "online": ["Hit ratio at 25% capacity, `optimize` in arrival order; seconds: every "
                   "`optimize` call of the workload."],
        "multi-turn": ["Computed tokens as a share of the unmodified prompts' at 25% "
                       "capacity (lower is better); bound: the share no history-first "
                       "strategy goes below in an unbounded cache; ours of bound: the bound "
                       "over ours in an unbounded cache too (what ours loses beyond that "
                       "share at 25% is the cache's capacity, not the prompts)."],
    }[family.split(",")[0]]  # fmt: skip


def plot_families(outcomes: Sequence[Outcome], small: Sequence[SmallInstances], path: Path) -> bool:
    """One panel per family (ours per workload, bound, reference, unmodified) and one
    for ours / optimum on small instances. False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    columns = math.ceil((len(FAMILIES) + 1) / 2)  # every family, then the small instances
    figure, axes = plt.subplots(2, columns, figsize=(6.5 * columns, 8))
    for axis, family in zip(axes.flat, FAMILIES, strict=False):
        _plot_family(axis, [o for o in outcomes if o.draw.family == family], family)
    axis = axes.flat[len(FAMILIES)]
    for result in small:
        axis.hist([v * 100 for v in result.of_optimum], bins=20, alpha=0.5,
                  label=f"{result.shape[0]} x {result.shape[1]} of {result.shape[2]}")  # fmt: skip
    axis.set_xlabel("ours / exact optimum (%), small batch instances")
    axis.set_ylabel("instances")
    axis.legend()
    return save_figure(figure, path)


def _plot_family(axis: object, outcomes: Sequence[Outcome], family: str) -> None:
    x = [o.draw.index for o in outcomes]
    colors = ["#dd8452" if o.draw.held_out else "#4c72b0" for o in outcomes]
    axis.bar(x, [o.ours * 100 for o in outcomes], color=colors)  # type: ignore[attr-defined]
    axis.scatter(x, [o.bound * 100 for o in outcomes], marker="_", s=300, color="black",  # type: ignore[attr-defined]
                 label="bound", zorder=3)  # fmt: skip
    references = [(o.draw.index, o.reference * 100) for o in outcomes if o.reference is not None]
    if references:
        axis.scatter(*zip(*references, strict=True), marker="x", color="#c44e52",  # type: ignore[attr-defined]
                     label="reference", zorder=3)  # fmt: skip
    axis.scatter(x, [o.unmodified * 100 for o in outcomes], marker=".", color="gray",  # type: ignore[attr-defined]
                 label="unmodified", zorder=3)  # fmt: skip
    scale = "computed tokens, % of unmodified" if family == "multi-turn" else "hit ratio (%)"
    axis.set_ylabel(scale)  # type: ignore[attr-defined]
    axis.set_xlabel("workload (blue: tuning, orange: held-out)")  # type: ignore[attr-defined]
    axis.set_title(family)  # type: ignore[attr-defined]
    axis.legend(fontsize="small")  # type: ignore[attr-defined]


# --- command line -------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=12, help="workloads per family (12)")
    parser.add_argument(
        "--families", default=";".join(FAMILIES), help="semicolon separated (all of them)"
    )
    parser.add_argument("--requests", type=int, default=1000, help="batch and online (1000)")
    parser.add_argument("--turns", type=int, default=400, help="multi-turn, about (400)")
    parser.add_argument(
        "--shape-requests",
        type=int,
        default=SHAPE["requests"],
        help=f"requests of the D=2,000 k=15 families ({SHAPE['requests']:,}, the targets')",
    )
    parser.add_argument("--small-instances", type=int, default=100, help="per shape (100)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference")
    parser.add_argument(
        "--reference-timeout",
        type=float,
        default=15.0,
        help="seconds per workload (15; at least 60 at the 2,000-request shape, where the "
        "reference's batch mode takes about 20 s)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--write", type=Path, help="write the markdown section into this file")
    parser.add_argument("--plot", type=Path, help="write a chart (PNG) to this file")
    return parser


def _reference_limit(timeout: float | None, draw: Draw) -> float | None:
    if timeout is None or draw.requests is None:
        return timeout
    return max(timeout, SHAPE_REFERENCE_TIMEOUT_S)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    timeout = None if args.no_reference else args.reference_timeout
    started = time.perf_counter()
    families = [f.strip() for f in args.families.split(";") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser().error(f"unknown families {unknown}; choose from {list(FAMILIES)}")
    jobs = [
        Job(draw, args.requests, args.turns, _reference_limit(timeout, draw))
        for family in families
        for draw in draw_family(family, args.count, args.seed, args.shape_requests)
    ]
    with progress_bars() as progress:
        outcomes = run_jobs(jobs, args.jobs, progress)
        small = [
            run_small_instances(shape, args.small_instances, args.seed, progress)
            for shape in SMALL_SHAPES
        ]
    image = None
    if args.plot and plot_families(outcomes, small, args.plot) and args.write:
        image = Path(os.path.relpath(args.plot.resolve(), args.write.resolve().parent))
    report = report_markdown(
        ("python benchmarks/families.py " + " ".join(argv)).strip(),
        outcomes,
        small,
        n_requests=args.requests,
        n_turns=args.turns,
        reference_timeout_s=timeout,
        seconds=time.perf_counter() - started,
        image=image,
        shape_requests=args.shape_requests,
    )
    write_or_print(report, SECTION, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
