"""The batch-mode experiment: one batch of N requests planned at once, replayed in
its execution order through the prefix-cache model.

Arms: ``unmodified`` (arrival order, retrieval order), ours with each planner and
scheduler, and the reference implementation's batch mode where it finishes in time.
Hit ratio is measured at 25% of the unmodified prompts' distinct cacheable tokens and
with an unbounded cache. Build + schedule time is the planner alone (block codes in,
orders and schedule out); peak memory is measured in a fresh child process.

Prompts are tokenized from cached segments (the user message's header, each block's
rendering, its tail) instead of whole: at 100,000 requests tokenizing every prompt
anew would dominate the run. The pieces split where tiktoken's pre-tokenizer splits
anyway (blank lines before ``[label]``), which :func:`run_batch` checks on a sample
against whole-prompt tokenization.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from contextpilot_rag.batch import REFINE_UP_TO, BatchMethod, BatchSchedule, plan_batch
from contextpilot_rag.bench.workloads import Workload, online_workload
from contextpilot_rag.blocks import ContextBlock, render_block
from contextpilot_rag.experiment import Progress, baseline_config
from contextpilot_rag.index import IndexConfig
from contextpilot_rag.pilot import ContextPilot, PilotConfig
from contextpilot_rag.prompt import Prompt
from contextpilot_rag.sim.prefix_cache import PrefixCacheModel, distinct_block_tokens
from contextpilot_rag.sim.replay import EngineTokenizer
from contextpilot_rag.tokenizers import Tokenizer, default_tokenizer

from .suite import REFERENCE

__all__ = ["BatchArm", "BatchResult", "measure_plan_memory", "run_batch"]

REFINE_ARM_UP_TO = 20_000  # batch sizes that also run an arm with refining flipped


@dataclass(frozen=True)
class BatchArm:
    name: str
    hit_ratio: float  # at the experiment's capacity
    hit_ratio_unbounded: float
    plan_s: float | None  # build + schedule, block codes in, plan out (median of runs)
    total_s: float | None  # optimize_batch end to end (rendering included)
    peak_mb: float | None = None
    note: str = ""
    plan_runs_s: tuple[float, ...] = ()  # every timed planning run


@dataclass(frozen=True)
class BatchResult:
    requests: int
    capacity_tokens: int
    arms: tuple[BatchArm, ...]

    def arm(self, name: str) -> BatchArm:
        return next(arm for arm in self.arms if arm.name == name)


class SegmentEncoder:
    """Token ids of a prompt as :class:`EngineTokenizer` would produce them, built from
    cached pieces: earlier messages whole, the last user message as header + blocks +
    tail."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._whole = EngineTokenizer(tokenizer)
        self._segments: dict[str, list[int]] = {}

    def __call__(self, prompt: Prompt) -> list[int]:
        messages = prompt.messages
        ids: list[int] = []
        for message in messages[:-1]:
            ids.extend(self._segment(f"<|{message['role']}|>\n{message['content']}\n"))
        content = messages[-1]["content"]
        role = messages[-1]["role"]
        if not prompt.boundaries:
            ids.extend(self._tokenizer.encode(f"<|{role}|>\n{content}\n"))
            return ids
        ids.extend(self._segment(f"<|{role}|>\n{content[: prompt.boundaries[0].char_start]}"))
        for boundary in prompt.boundaries:
            ids.extend(self._segment(content[boundary.char_start : boundary.char_end]))
        ids.extend(self._tokenizer.encode(content[prompt.boundaries[-1].char_end :] + "\n"))
        return ids

    def whole(self, prompt: Prompt) -> list[int]:
        return self._whole(prompt.messages)

    def _segment(self, text: str) -> list[int]:
        cached = self._segments.get(text)
        if cached is None:
            cached = self._segments[text] = self._tokenizer.encode(text)
        return cached


def run_batch(
    n_requests: int,
    *,
    n_docs: int = 2000,
    k: int = 15,
    seed: int = 0,
    capacity_fraction: float = 0.25,
    arms: Sequence[tuple[str, BatchMethod, BatchSchedule]] = (
        ("ours", "auto", "prefix-tree"),
        ("ours, greedy build only", "greedy", "prefix-tree"),
        ("ours, Alg. 5 schedule", "auto", "grouped"),
        ("ours, Alg. 4 clustering", "cluster", "prefix-tree"),
    ),
    refine_arm_up_to: int = REFINE_ARM_UP_TO,
    reference_timeout_s: float | None = 120.0,
    measure_memory: bool = True,
    runs: int = 1,
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
) -> BatchResult:
    """Plan one batch of ``n_requests`` with each arm and replay it in execution order.
    ``reference_timeout_s=None`` skips the reference implementation;
    ``measure_memory`` measures the first arm's planner in a child process (peak
    memory added by planning, the workload itself excluded); the planner is timed
    ``runs`` times (hit ratios do not depend on it: planning is deterministic). Up to
    ``refine_arm_up_to`` requests one more arm plans like the first with the refining
    pass the other way round from its default (``plan_batch``'s ``REFINE_UP_TO``)."""
    tokenizer = tokenizer or default_tokenizer()
    workload = online_workload(n_docs=n_docs, n_requests=n_requests, k=k, seed=seed)
    blocks = {doc_id: ContextBlock(text, id=doc_id) for doc_id, text in workload.corpus.items()}
    requests = [([blocks[d] for d in r.doc_ids], r.query) for r in workload.requests]
    encode = SegmentEncoder(tokenizer)
    tick = progress or (lambda label, total: lambda: None)

    def unmodified() -> Iterator[Prompt]:  # rendered twice rather than held in memory
        baseline = ContextPilot(baseline_config(), tokenizer=tokenizer)
        for request_blocks, query in requests:
            yield baseline.optimize(request_blocks, query, system=workload.system_prompt)

    _check_segments(encode, list(itertools.islice(unmodified(), 20)))
    distinct = distinct_block_tokens((encode(prompt) for prompt in unmodified()), 16)
    capacity = max(16, int(distinct * capacity_fraction))
    results = [
        _arm("unmodified", unmodified(), encode, capacity, None, None, tick, total=n_requests)
    ]

    codes = _codes(workload)
    coded = [[codes[d] for d in r.doc_ids] for r in workload.requests]
    weights = [float(tokenizer.count(render_block(blocks[doc_id]))) for doc_id in codes]
    planned: list[tuple[str, BatchMethod, BatchSchedule, bool | None]] = [
        (name, method, schedule, None) for name, method, schedule in arms
    ]
    if arms and n_requests <= refine_arm_up_to:
        name, method, schedule = arms[0]
        flipped = n_requests > REFINE_UP_TO  # the opposite of the default
        label = f"{name}, refine {'on' if flipped else 'off'}"
        planned.insert(1, (label, method, schedule, flipped))
    for name, method, schedule, refine in planned:
        try:
            plan_runs_s = tuple(
                _time_plan(coded, method, schedule, weights, refine) for _ in range(max(1, runs))
            )
        except ImportError as exc:  # an optional planner whose module is absent
            results.append(BatchArm(name, 0.0, 0.0, None, None, note=f"unavailable: {exc}"))
            continue
        plan_s = statistics.median(plan_runs_s)
        pilot = ContextPilot(
            PilotConfig(index=IndexConfig(capacity_tokens=capacity)), tokenizer=tokenizer
        )
        started = time.perf_counter()
        prompts = pilot.optimize_batch(
            requests,
            system=workload.system_prompt,
            method=method,
            schedule=schedule,
            refine=refine,
        )
        total_s = time.perf_counter() - started
        peak_mb, note = None, ""
        if name == arms[0][0]:
            _check_segments(encode, prompts[:20])
            if measure_memory:
                memory = measure_plan_memory(
                    n_requests, method=method, schedule=schedule, n_docs=n_docs, k=k, seed=seed
                )
                peak_mb = memory["plan_mb"]
                note = f"process peak RSS {memory['peak_rss_mb']:,.0f} MB"
        arm = _arm(
            name, prompts, encode, capacity, plan_s, total_s, tick, peak_mb=peak_mb, note=note
        )
        results.append(replace(arm, plan_runs_s=plan_runs_s))
        del prompts
    if reference_timeout_s is None:
        results.append(BatchArm(REFERENCE, 0.0, 0.0, None, None, note="not run at this size"))
    else:
        results.append(
            _reference_arm(
                workload, coded, blocks, encode, capacity, reference_timeout_s, tokenizer, tick
            )
        )
    return BatchResult(n_requests, capacity, tuple(results))


def _time_plan(
    coded: Sequence[Sequence[int]],
    method: BatchMethod,
    schedule: BatchSchedule,
    weights: Sequence[float],
    refine: bool | None = None,
) -> float:
    started = time.perf_counter()
    plan_batch(coded, method=method, schedule=schedule, weights=weights, refine=refine)
    return time.perf_counter() - started


def _check_segments(encode: SegmentEncoder, prompts: Sequence[Prompt]) -> None:
    for prompt in prompts:
        if encode(prompt) != encode.whole(prompt):
            raise AssertionError("segment tokenization differs from whole-prompt tokenization")


def _arm(
    name: str,
    prompts: Iterable[Prompt],
    encode: SegmentEncoder,
    capacity: int,
    plan_s: float | None,
    total_s: float | None,
    tick: Progress,
    *,
    peak_mb: float | None = None,
    note: str = "",
    total: int | None = None,
) -> BatchArm:
    """Replay ``prompts`` in the given order into a capped and an unbounded cache."""
    capped, unbounded = PrefixCacheModel(capacity_tokens=capacity), PrefixCacheModel()
    count = total if total is not None else len(prompts)  # type: ignore[arg-type]
    advance = tick(f"batch {count:,}: {name}", count)
    for prompt in prompts:
        stream = encode(prompt)
        capped.admit(stream)
        unbounded.admit(stream)
        advance()
    return BatchArm(name, capped.hit_ratio, unbounded.hit_ratio, plan_s, total_s, peak_mb, note)


def _reference_arm(
    workload: Workload,
    coded: Sequence[Sequence[int]],
    blocks: Mapping[str, ContextBlock],
    encode: SegmentEncoder,
    capacity: int,
    timeout_s: float,
    tokenizer: Tokenizer,
    tick: Progress,
) -> BatchArm:
    """The reference batch mode (its block orders and schedule, our rendering without
    notes), or a row saying why it is missing."""
    name = REFERENCE
    try:
        from .reference_batch import run_reference_batch
    except ImportError as exc:
        return BatchArm(name, 0.0, 0.0, None, None, note=f"unavailable: {exc}")
    result = run_reference_batch([list(request) for request in coded], timeout_s=timeout_s)
    if result is None:
        return BatchArm(
            name, 0.0, 0.0, None, None, note=f"not installed or did not finish in {timeout_s:.0f} s"
        )
    doc_ids = {code: doc_id for doc_id, code in _codes(workload).items()}
    render = ContextPilot(baseline_config(), tokenizer=tokenizer)
    prompts = [
        render.optimize(
            [blocks[doc_ids[code]] for code in result.orders[index]],
            workload.requests[index].query,
            system=workload.system_prompt,
        )
        for index in result.schedule
    ]
    return _arm(
        name, prompts, encode, capacity, result.seconds, None, tick, peak_mb=result.peak_rss_mb
    )


def _codes(workload: Workload) -> dict[str, int]:
    codes: dict[str, int] = {}
    for request in workload.requests:
        for doc_id in request.doc_ids:
            codes.setdefault(doc_id, len(codes))
    return codes


def measure_plan_memory(
    n_requests: int,
    *,
    method: BatchMethod = "auto",
    schedule: BatchSchedule = "prefix-tree",
    n_docs: int = 2000,
    k: int = 15,
    seed: int = 0,
    timeout_s: float = 600.0,
) -> dict[str, float]:
    """``plan_batch`` measured in a fresh child process: ``seconds``, ``peak_rss_mb``
    (peak resident memory of the whole process: interpreter, workload and plan) and
    ``plan_mb`` (peak memory allocated while planning, from tracemalloc, which also
    sees numpy's buffers)."""
    arguments = json.dumps([n_requests, n_docs, k, seed, method, schedule])
    completed = subprocess.run(
        [sys.executable, "-I", str(Path(__file__).with_name("plan_memory.py")), arguments],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    result: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result
