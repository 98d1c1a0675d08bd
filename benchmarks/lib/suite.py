"""The parts of the main benchmark that the installed package leaves out: the
reference implementation's online arm and the ``optimize()`` latency stream.

The online and multi-turn experiments themselves are
:func:`contextpilot_rag.experiment.run_online` / ``run_multiturn``; this module adds
the reference ``contextpilot`` 0.5.0 as an extra arm of the online one when it is
installed (its order, our rendering, so only the ordering differs).
"""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contextpilot_rag.bench.workloads import Workload, WorkloadRequest, online_workload
from contextpilot_rag.experiment import (
    Arm,
    Progress,
    baseline_config,
    block_lookup,
)
from contextpilot_rag.index import IndexConfig
from contextpilot_rag.pilot import ContextPilot, PilotConfig
from contextpilot_rag.sim.replay import BuildPrompt, Messages
from contextpilot_rag.tokenizers import Tokenizer, default_tokenizer

__all__ = ["REFERENCE", "LatencyResult", "StreamLatency", "reference_arms", "run_latency"]

REFERENCE = "reference contextpilot 0.5.0"


@dataclass(frozen=True)
class StreamLatency:
    """Medians of per-request times over one stream."""

    requests: int
    p50_ms: float
    p99_ms: float
    first_decile_p50_ms: float
    last_decile_p50_ms: float

    @classmethod
    def of(cls, timings: Sequence[float]) -> StreamLatency:
        decile = max(1, len(timings) // 10)
        return cls(
            requests=len(timings),
            p50_ms=statistics.median(timings) * 1e3,
            p99_ms=sorted(timings)[int(len(timings) * 0.99)] * 1e3,
            first_decile_p50_ms=statistics.median(timings[:decile]) * 1e3,
            last_decile_p50_ms=statistics.median(timings[-decile:]) * 1e3,
        )

    @property
    def drift(self) -> float:
        """Median of the last 10% of calls over the median of the first 10%."""
        return self.last_decile_p50_ms / self.first_decile_p50_ms


@dataclass(frozen=True)
class LatencyResult:
    """``runs``: one :class:`StreamLatency` per timed pass over the same stream, each
    on a fresh pilot; the index size is tracked on the first."""

    runs: tuple[StreamLatency, ...]
    capacity_tokens: int
    max_index_tokens: int
    max_index_nodes: int
    reference: StreamLatency | None = None
    ours_on_reference_stream: StreamLatency | None = None

    @property
    def requests(self) -> int:
        return self.runs[0].requests

    @property
    def p50_ms(self) -> float:
        return statistics.median(run.p50_ms for run in self.runs)

    @property
    def drift(self) -> float:
        return statistics.median(run.drift for run in self.runs)


def reference_arms(workload: Workload, tokenizer: Tokenizer) -> list[Arm]:
    """The reference ``contextpilot`` online mode as an arm, if installed: its order,
    our rendering (so only the ordering differs), no annotations."""
    try:
        from contextpilot.server.live_index import ContextPilot as Reference
    except ImportError:
        return []

    def make(capacity: int) -> tuple[BuildPrompt[WorkloadRequest], Callable[[], int]]:
        reference = Reference(alpha=0.001, use_gpu=False)
        render = ContextPilot(baseline_config(), tokenizer=tokenizer)
        lookup = block_lookup(workload)

        def build(request: WorkloadRequest) -> Messages:
            with contextlib.redirect_stdout(io.StringIO()):
                reordered, _ = reference.reorder(
                    list(request.doc_ids), conversation_id=request.session
                )
            blocks = [lookup(doc_id) for doc_id in reordered[0]]
            return render.optimize(blocks, request.query, system=workload.system_prompt).messages

        return build, lambda: 0

    return [(REFERENCE, make)]


def _no_progress(label: str, total: int) -> Callable[[], None]:
    return lambda: None


def run_latency(
    *,
    n_requests: int = 100_000,
    n_docs: int = 2000,
    k: int = 15,
    capacity_tokens: int = 1_500_000,
    seed: int = 1,
    runs: int = 1,
    reference_requests: int = 2000,
    tokenizer: Tokenizer | None = None,
    progress: Progress = _no_progress,
) -> LatencyResult:
    """Time every ``optimize`` call over a long stream, ``runs`` times on a fresh pilot;
    track the index size. When the reference implementation is installed and
    ``reference_requests`` > 0, also time its online ``reorder`` over the first
    ``reference_requests`` of the stream."""
    tokenizer = tokenizer or default_tokenizer()
    workload = online_workload(n_docs=n_docs, n_requests=n_requests, k=k, seed=seed)
    lookup = block_lookup(workload)
    requests = [([lookup(d) for d in r.doc_ids], r.query) for r in workload.requests]
    passes: list[StreamLatency] = []
    first_timings: list[float] = []
    max_tokens = max_nodes = 0
    for number in range(max(1, runs)):
        config = PilotConfig(index=IndexConfig(capacity_tokens=capacity_tokens))
        pilot = ContextPilot(config, tokenizer=tokenizer)
        tick = progress(f"latency: optimize(), run {number + 1}", n_requests)
        timings = []
        for index, (blocks, query) in enumerate(requests):
            started = time.perf_counter()
            pilot.optimize(blocks, query, system=workload.system_prompt)
            timings.append(time.perf_counter() - started)
            if number == 0 and index % 100 == 0:
                stats = pilot.index_stats()
                max_tokens, max_nodes = max(max_tokens, stats.tokens), max(max_nodes, stats.nodes)
            tick()
        passes.append(StreamLatency.of(timings))
        first_timings = first_timings or timings
    reference = _reference_latency(workload, reference_requests, progress)
    return LatencyResult(
        runs=tuple(passes),
        capacity_tokens=capacity_tokens,
        max_index_tokens=max_tokens,
        max_index_nodes=max_nodes,
        reference=reference,
        ours_on_reference_stream=(
            StreamLatency.of(first_timings[: reference.requests]) if reference else None
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
