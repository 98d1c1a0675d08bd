"""Many threads share one pilot: no call fails, every prompt is complete, request ids
are unique and the index accounts for exactly the requests still indexed."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from contextpilot_rag import (
    ContextBlock,
    ContextPilot,
    IndexConfig,
    PilotConfig,
    Prompt,
    Tokenizer,
)

CheckPrompt = Callable[[Prompt, Sequence[ContextBlock]], None]

THREADS = 8
CALLS_PER_THREAD = 40
UNIVERSE = tuple(
    ContextBlock(f"Shared passage {n}: fact {n} about topic {n % 5}.", id=f"s{n}")
    for n in range(16)
)


@pytest.fixture(autouse=True)
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads often, so that races have a chance to show."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


@dataclass
class WorkerLog:
    results: list[tuple[Prompt, list[ContextBlock]]] = field(default_factory=list)
    evicted: int = 0


def worker(pilot: ContextPilot, number: int, start: threading.Barrier) -> WorkerLog:
    rng = random.Random(number)
    log = WorkerLog()
    conversation_id = f"conversation-{number}"
    start.wait()
    for call in range(CALLS_PER_THREAD):
        blocks = rng.sample(UNIVERSE, rng.randint(1, 6))
        in_conversation = rng.random() < 0.4
        prompt = pilot.optimize(
            blocks,
            f"thread {number} call {call}?",
            conversation_id=conversation_id if in_conversation else None,
        )
        log.results.append((prompt, blocks))
        if in_conversation and rng.random() < 0.5:
            pilot.record_answer(prompt, f"answer {call}")
        if call % 7 == 6:
            earlier = [p.request_id for p, _ in rng.sample(log.results, 3)]
            log.evicted += pilot.evict(earlier)
    return log


def run_threads(pilot: ContextPilot) -> list[WorkerLog]:
    start = threading.Barrier(THREADS)
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(worker, pilot, number, start) for number in range(THREADS)]
        return [future.result(timeout=120) for future in futures]


def unbounded_pilot(tokenizer: Tokenizer) -> ContextPilot:
    index = IndexConfig(capacity_tokens=None, max_nodes=None)
    return ContextPilot(PilotConfig(index=index), tokenizer=tokenizer)


def test_concurrent_calls_all_produce_complete_prompts(
    tokenizer: Tokenizer, check_prompt: CheckPrompt
) -> None:
    logs = run_threads(unbounded_pilot(tokenizer))
    results = [result for log in logs for result in log.results]
    assert len(results) == THREADS * CALLS_PER_THREAD
    for prompt, blocks in results:
        check_prompt(prompt, blocks)


def test_concurrent_calls_get_unique_request_ids(tokenizer: Tokenizer) -> None:
    logs = run_threads(unbounded_pilot(tokenizer))
    request_ids = [prompt.request_id for log in logs for prompt, _ in log.results]
    assert len(set(request_ids)) == len(request_ids)


def test_concurrent_index_counts_requests_not_evicted(tokenizer: Tokenizer) -> None:
    pilot = unbounded_pilot(tokenizer)
    logs = run_threads(pilot)
    optimized = sum(len(log.results) for log in logs)
    evicted = sum(log.evicted for log in logs)
    assert evicted > 0
    assert pilot.index_stats().requests == optimized - evicted


def test_concurrent_conversations_keep_every_turn(tokenizer: Tokenizer) -> None:
    pilot = unbounded_pilot(tokenizer)
    logs = run_threads(pilot)
    for number, log in enumerate(logs):
        conversation_id = f"conversation-{number}"
        turns = sum(1 for prompt, _ in log.results if prompt.conversation_id == conversation_id)
        assert len(pilot.conversation(conversation_id).turns) == turns


def test_concurrent_calls_respect_the_capacity(
    tokenizer: Tokenizer, check_prompt: CheckPrompt
) -> None:
    pilot = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=500)), tokenizer=tokenizer)
    for log in run_threads(pilot):
        for prompt, blocks in log.results:
            check_prompt(prompt, blocks)
    assert pilot.index_stats().tokens <= 500
