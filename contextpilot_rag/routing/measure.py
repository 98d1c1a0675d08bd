"""Decision-cost measurement: wall time of ``policy.choose`` (which includes the route
update after dispatch) on a synthetic RAG workload of long prompts.

Workload (deterministic by ``seed``): each prompt is a shared system prompt
(``system_blocks`` blocks) followed by context documents of ``doc_blocks`` blocks drawn
from a pool of ``docs_in_pool``, then a unique question tail; ``prompt_tokens`` defaults to
18,000 (1,125 blocks of 16 tokens). Boundaries — where the client knows a boundary
exactly — are the end of the system prompt, the end of every document (every
``doc_blocks`` blocks, 32 by default ≈ 512 tokens, a typical RAG chunk) and each of the
last ``tail_boundaries`` blocks (the question and conversation turns): ≈ 50 per prompt.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .types import Policy, ReplicaState, RouteRequest

__all__ = ["StaticFleet", "measure_decision_cost", "synthetic_requests"]


@dataclass(frozen=True)
class StaticFleet:
    """A fixed fleet view: the minimal :class:`~.types.FleetView`."""

    now: float
    replicas: Sequence[ReplicaState]


def _chain(previous: int, token: int) -> int:
    return hash((previous, token)) & ((1 << 63) - 1)


def synthetic_requests(
    count: int,
    *,
    prompt_tokens: int = 18_000,
    block_tokens: int = 16,
    system_blocks: int = 32,
    doc_blocks: int = 32,
    docs_in_pool: int = 200,
    tail_boundaries: int = 16,
    seed: int = 0,
) -> list[RouteRequest]:
    """``count`` RAG-shaped requests with chained block hashes and boundaries."""
    rng = random.Random(seed)
    total_blocks = prompt_tokens // block_tokens
    docs_per_prompt = max(0, (total_blocks - system_blocks - tail_boundaries) // doc_blocks)
    requests = []
    for i in range(count):
        docs = rng.sample(range(docs_in_pool), min(docs_per_prompt, docs_in_pool))
        content = [(0, j) for j in range(system_blocks)]  # int tuples: hash() is unsalted
        content += [(d + 1, j) for d in docs for j in range(doc_blocks)]
        content += [(-(i + 1), j) for j in range(total_blocks - len(content))]
        hashes, h = [], 0
        for item in content:
            h = _chain(h, hash(item))
            hashes.append(h)
        doc_ends = range(
            system_blocks, system_blocks + docs_per_prompt * doc_blocks + 1, doc_blocks
        )
        tail = range(max(1, total_blocks - tail_boundaries + 1), total_blocks + 1)
        requests.append(
            RouteRequest(
                request_id=f"r{i}",
                prompt_tokens=prompt_tokens,
                block_hashes=tuple(hashes),
                block_tokens=block_tokens,
                boundaries=tuple(sorted(set(doc_ends) | set(tail))),
            )
        )
    return requests


def _fleet(replicas: int, seed: int) -> list[ReplicaState]:
    rng = random.Random(seed)
    return [
        ReplicaState(
            replica_id=f"replica-{k}",
            model="m",
            region=f"region-{k % 3}",
            rtt_s=(0.037, 0.279, 0.456)[k % 3],
            in_flight=rng.randint(0, 8),
            queued_tokens=rng.randint(0, 60_000),
        )
        for k in range(replicas)
    ]


def measure_decision_cost(
    policy: Policy,
    *,
    replicas: int = 16,
    requests: int = 500,
    warmup: int = 100,
    prompt_tokens: int = 18_000,
    seed: int = 0,
) -> dict[str, float]:
    """Per-decision wall time of ``policy.choose`` in microseconds (it includes the
    policy's own route update after dispatch): ``p50_us``, ``p90_us``, ``p99_us``,
    ``mean_us``, ``decisions``. Load changes between decisions so no answer is cached."""
    workload = synthetic_requests(warmup + requests, prompt_tokens=prompt_tokens, seed=seed)
    states = _fleet(replicas, seed)
    timings: list[float] = []
    for i, request in enumerate(workload):
        k = i % replicas
        states[k] = replace(states[k], in_flight=(states[k].in_flight + 3) % 9)
        fleet = StaticFleet(now=float(i) * 0.01, replicas=tuple(states))
        start = time.perf_counter_ns()
        policy.choose(request, fleet)
        elapsed_us = (time.perf_counter_ns() - start) / 1_000
        if i >= warmup:
            timings.append(elapsed_us)
    ordered = sorted(timings)
    return {
        "p50_us": statistics.median(ordered),
        "p90_us": ordered[int(0.9 * (len(ordered) - 1))],
        "p99_us": ordered[int(0.99 * (len(ordered) - 1))],
        "mean_us": statistics.fmean(ordered),
        "decisions": float(len(ordered)),
    }
