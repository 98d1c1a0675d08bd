"""The online, multi-turn and latency experiments behind ``contextpilot-rag demo``
and ``benchmarks/bench.py``. Every arm of one experiment runs in the same process on
the same workload, so results are compared as ratios."""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..blocks import ContextBlock
from ..index import IndexConfig
from ..pilot import ContextPilot, PilotConfig
from ..tokenizers import Tokenizer, default_tokenizer
from .replay import (
    ArmResult,
    BuildPrompt,
    EngineTokenizer,
    Messages,
    baseline_config,
    capacity_for,
    dedup_misses,
    generated_tokens,
    pilot_arm,
    replay,
    replay_tokens,
)
from .workloads import Workload, WorkloadRequest, multiturn_workload, online_workload

__all__ = [
    "ExperimentResult",
    "LatencyResult",
    "run_latency",
    "run_multiturn",
    "run_online",
]

Progress = Callable[[str, int], Callable[[], None]]
"""``progress(label, total)`` returns a callback to advance that task by one."""


@dataclass(frozen=True)
class ExperimentResult:
    name: str
    capacity_tokens: int
    arms: tuple[ArmResult, ...]

    def arm(self, name: str) -> ArmResult:
        return next(arm for arm in self.arms if arm.name == name)


@dataclass(frozen=True)
class LatencyResult:
    requests: int
    p50_ms: float
    p99_ms: float
    first_decile_p50_ms: float
    last_decile_p50_ms: float
    capacity_tokens: int
    max_index_tokens: int
    max_index_nodes: int
    reference: StreamLatency | None = None
    ours_on_reference_stream: StreamLatency | None = None

    @property
    def drift(self) -> float:
        """Median of the last 10% of calls over the median of the first 10%."""
        return self.last_decile_p50_ms / self.first_decile_p50_ms


@dataclass(frozen=True)
class StreamLatency:
    """Medians of per-request times over a (shorter) stream, for side-by-side rows."""

    requests: int
    p50_ms: float
    first_decile_p50_ms: float
    last_decile_p50_ms: float

    @classmethod
    def of(cls, timings: Sequence[float]) -> StreamLatency:
        decile = max(1, len(timings) // 10)
        return cls(
            requests=len(timings),
            p50_ms=statistics.median(timings) * 1e3,
            first_decile_p50_ms=statistics.median(timings[:decile]) * 1e3,
            last_decile_p50_ms=statistics.median(timings[-decile:]) * 1e3,
        )


def _no_progress(label: str, total: int) -> Callable[[], None]:
    return lambda: None


def _block_lookup(workload: Workload) -> Callable[[str], ContextBlock]:
    blocks = {doc_id: ContextBlock(text, id=doc_id) for doc_id, text in workload.corpus.items()}
    return blocks.__getitem__


def _pilot(tokenizer: Tokenizer, capacity: int | None, **options: Any) -> ContextPilot:
    config = replace(PilotConfig(index=IndexConfig(capacity_tokens=capacity)), **options)
    return ContextPilot(config, tokenizer=tokenizer)


def _baseline_streams(
    workload: Workload, encode: EngineTokenizer, tokenizer: Tokenizer, tick: Callable[[], None]
) -> list[list[int]]:
    pilot = ContextPilot(baseline_config(), tokenizer=tokenizer)
    build, _ = pilot_arm(pilot, workload, _block_lookup(workload))
    streams = []
    for request in workload.requests:
        streams.append(encode(build(request)))
        tick()
    return streams


def _run_arms(
    name: str,
    workload: Workload,
    arms: Sequence[tuple[str, Callable[[int], tuple[BuildPrompt, Callable[[], int]]]]],
    capacity_fraction: float,
    tokenizer: Tokenizer,
    progress: Progress,
    *,
    cache_answers: bool = False,
) -> ExperimentResult:
    """Baseline first (it sets the cache capacity), then each arm on a fresh cache."""
    encode = EngineTokenizer(tokenizer)
    streams = _baseline_streams(
        workload, encode, tokenizer, progress(f"{name}: unmodified", len(workload.requests))
    )
    capacity = capacity_for(streams, capacity_fraction)
    generated = generated_tokens(workload, encode, cache_answers=cache_answers)
    results = [replay_tokens("unmodified", streams, capacity_tokens=capacity, generated=generated)]
    del streams
    for arm_name, make in arms:
        build, misses = make(capacity)
        tick = progress(f"{name}: {arm_name}", len(workload.requests))
        result = replay(
            arm_name,
            workload,
            build,
            encode,
            capacity_tokens=capacity,
            generated=generated,
            on_request=tick,
        )
        results.append(replace(result, dedup_misses=misses()))
    return ExperimentResult(name, capacity, tuple(results))


def _ours(
    workload: Workload, tokenizer: Tokenizer, **options: Any
) -> Callable[[int], tuple[BuildPrompt, Callable[[], int]]]:
    def make(capacity: int) -> tuple[BuildPrompt, Callable[[], int]]:
        pilot = _pilot(tokenizer, capacity, **options)
        build, prompts = pilot_arm(pilot, workload, _block_lookup(workload))
        return build, lambda: dedup_misses(prompts)

    return make


def _reference(
    workload: Workload, tokenizer: Tokenizer
) -> Callable[[int], tuple[BuildPrompt, Callable[[], int]]] | None:
    """The reference ``contextpilot`` online mode, if installed: its order, our
    rendering (so only the ordering differs), no annotations."""
    try:
        from contextpilot.server.live_index import ContextPilot as Reference
    except ImportError:
        return None

    def make(capacity: int) -> tuple[BuildPrompt, Callable[[], int]]:
        reference = Reference(alpha=0.001, use_gpu=False)
        render = ContextPilot(baseline_config(), tokenizer=tokenizer)
        lookup = _block_lookup(workload)

        def build(request: WorkloadRequest) -> Messages:
            with contextlib.redirect_stdout(io.StringIO()):
                reordered, _ = reference.reorder(
                    list(request.doc_ids), conversation_id=request.session
                )
            blocks = [lookup(doc_id) for doc_id in reordered[0]]
            return render.optimize(blocks, request.query, system=workload.system_prompt).messages

        return build, lambda: 0

    return make


def run_online(
    *,
    n_docs: int = 2000,
    n_requests: int = 2000,
    k: int = 15,
    capacity_fraction: float = 0.25,
    seed: int = 0,
    with_reference: bool = True,
    tokenizer: Tokenizer | None = None,
    progress: Progress = _no_progress,
) -> ExperimentResult:
    """Online requests, one at a time: unmodified vs ours (two remainder orders) vs
    the reference implementation when installed."""
    tokenizer = tokenizer or default_tokenizer()
    workload = online_workload(n_docs=n_docs, n_requests=n_requests, k=k, seed=seed)
    arms = [
        ("ours (retrieval order)", _ours(workload, tokenizer, remainder="retrieval")),
        ("ours", _ours(workload, tokenizer)),
    ]
    reference = _reference(workload, tokenizer) if with_reference else None
    if reference is not None:
        arms.append(("reference contextpilot 0.5.0", reference))
    return _run_arms("online", workload, arms, capacity_fraction, tokenizer, progress)


def run_multiturn(
    *,
    n_sessions: int = 200,
    turns: int = 5,
    interleave: int = 16,
    k: int = 15,
    n_docs: int = 2000,
    capacity_fraction: float = 0.25,
    seed: int = 0,
    cache_answers: bool = True,
    tokenizer: Tokenizer | None = None,
    progress: Progress = _no_progress,
) -> ExperimentResult:
    """Interleaved multi-turn sessions with history: unmodified vs reorder only vs
    reorder + de-duplication. ``cache_answers``: the engine keeps the KV of the
    answers it decodes (vLLM v1, SGLang), so the next turn reuses them."""
    tokenizer = tokenizer or default_tokenizer()
    workload = multiturn_workload(
        n_sessions=n_sessions, turns=turns, interleave=interleave, k=k, n_docs=n_docs, seed=seed
    )
    arms = [
        ("ours (no dedup)", _ours(workload, tokenizer, dedup=False)),
        ("ours", _ours(workload, tokenizer)),
    ]
    name = "multi-turn" if cache_answers else "multi-turn, answers not cached"
    return _run_arms(
        name, workload, arms, capacity_fraction, tokenizer, progress, cache_answers=cache_answers
    )


def run_latency(
    *,
    n_requests: int = 100_000,
    n_docs: int = 2000,
    k: int = 15,
    capacity_tokens: int = 1_500_000,
    seed: int = 1,
    reference_requests: int = 2000,
    tokenizer: Tokenizer | None = None,
    progress: Progress = _no_progress,
) -> LatencyResult:
    """Time every ``optimize`` call over a long stream; track the index size. When
    the reference implementation is installed and ``reference_requests`` > 0, also
    time its online ``reorder`` over the first ``reference_requests`` of the stream."""
    tokenizer = tokenizer or default_tokenizer()
    workload = online_workload(n_docs=n_docs, n_requests=n_requests, k=k, seed=seed)
    pilot = _pilot(tokenizer, capacity_tokens)
    lookup = _block_lookup(workload)
    requests = [([lookup(d) for d in r.doc_ids], r.query) for r in workload.requests]
    tick = progress("latency: optimize()", n_requests)
    timings, max_tokens, max_nodes = [], 0, 0
    for number, (blocks, query) in enumerate(requests):
        started = time.perf_counter()
        pilot.optimize(blocks, query, system=workload.system_prompt)
        timings.append(time.perf_counter() - started)
        if number % 100 == 0:
            stats = pilot.index_stats()
            max_tokens, max_nodes = max(max_tokens, stats.tokens), max(max_nodes, stats.nodes)
        tick()
    whole = StreamLatency.of(timings)
    reference = _reference_latency(workload, reference_requests, progress)
    return LatencyResult(
        requests=n_requests,
        p50_ms=whole.p50_ms,
        p99_ms=sorted(timings)[int(len(timings) * 0.99)] * 1e3,
        first_decile_p50_ms=whole.first_decile_p50_ms,
        last_decile_p50_ms=whole.last_decile_p50_ms,
        capacity_tokens=capacity_tokens,
        max_index_tokens=max_tokens,
        max_index_nodes=max_nodes,
        reference=reference,
        ours_on_reference_stream=(
            StreamLatency.of(timings[: reference.requests]) if reference else None
        ),
    )


def _reference_latency(
    workload: Workload, n_requests: int, progress: Progress
) -> StreamLatency | None:
    """Per-request time of the reference implementation's online ``reorder``."""
    if n_requests <= 0:
        return None
    try:
        from contextpilot.server.live_index import ContextPilot as Reference
    except ImportError:
        return None
    reference = Reference(alpha=0.001, use_gpu=False)
    requests = workload.requests[:n_requests]
    tick = progress("latency: reference reorder()", len(requests))
    timings = []
    with contextlib.redirect_stdout(io.StringIO()):
        for request in requests:
            doc_ids = list(request.doc_ids)
            started = time.perf_counter()
            reference.reorder(doc_ids)
            timings.append(time.perf_counter() - started)
            tick()
    return StreamLatency.of(timings)
