"""Stress: four processes (``spawn``), each with a thread pool and an asyncio loop,
continue the same few conversations at once on one real ``redis-server``; then every
conversation is read back from the store and checked turn by turn.

Every turn asks a question whose id names its process, lane and number, and is answered
with a text that repeats that id, so the record shows which answer went to which turn.
Documents recur across turns (each always with the same text), so most turns
de-duplicate against earlier ones written by other processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt
from contextpilot_rag.errors import ConversationConflictError

PROCESSES = 4
THREADS = 2  # lanes on a thread pool, sharing one pilot
TASKS = 2  # lanes on an asyncio loop (asyncio.to_thread), sharing another pilot
TURNS = 6  # per lane
CONVERSATIONS = 4
DOCUMENTS = {
    f"doc{i}": f"Document {i} states fact number {i} in some detail. " * 4 for i in range(10)
}

T = TypeVar("T")


@dataclass(frozen=True)
class SeenTurn:
    """What one worker got back for one turn (the prompt, reduced to what is checked)."""

    conversation_id: str
    question: str
    request_id: str
    sent: tuple[str, ...]  # blocks sent in full, in prompt order
    deduplicated: tuple[str, ...]
    asked: tuple[str, ...]  # every block id given to optimize
    history: tuple[str, ...]  # the earlier turns' user messages the prompt shows
    unanswered: int  # of those, the turns shown without an answer (still in flight)


def answer_to(question: str) -> str:
    return f"The answer to question {question}."


def turn_of(lane: str, offset: int, number: int) -> tuple[str, str, list[ContextBlock]]:
    """The conversation, question and documents of turn ``number`` of ``lane``."""
    question = f"{lane}-{number}"
    picked = random.Random(question).sample(sorted(DOCUMENTS), 3)
    blocks = [ContextBlock(DOCUMENTS[doc_id], id=doc_id) for doc_id in picked]
    return f"conv{(offset + number) % CONVERSATIONS}", question, blocks


def _until_written(call: Callable[[], T]) -> T:
    """``call()``, again after a conflict (nothing was written: calling again is safe)."""
    for _ in range(50):
        try:
            return call()
        except ConversationConflictError:
            time.sleep(0.01)
    raise AssertionError("a conversation conflicted through 50 calls")


def play(
    pilot: ContextPilot, conversation_id: str, question: str, blocks: list[ContextBlock]
) -> SeenTurn:
    """One turn, blocking: optimize, then record the answer against that prompt."""
    prompt: Prompt = _until_written(
        lambda: pilot.optimize(blocks, question, conversation_id=conversation_id)
    )
    _until_written(lambda: pilot.record_answer(prompt, answer_to(question)))
    users = [m["content"] for m in prompt.messages if m["role"] == "user"]
    stand_in = PilotConfig().unanswered_text
    in_flight = sum(m["role"] == "assistant" and m["content"] == stand_in for m in prompt.messages)
    return SeenTurn(
        conversation_id,
        question,
        prompt.request_id,
        tuple(block.id for block in prompt.blocks),
        tuple(block.id for block in prompt.deduplicated),
        tuple(block.id for block in blocks),
        tuple(users[:-1]),
        in_flight,
    )


def thread_lane(pilot: ContextPilot, lane: str, offset: int) -> list[SeenTurn]:
    return [play(pilot, *turn_of(lane, offset, number)) for number in range(TURNS)]


async def async_lane(pilot: ContextPilot, lane: str, offset: int) -> list[SeenTurn]:
    return [
        await asyncio.to_thread(play, pilot, *turn_of(lane, offset, number))
        for number in range(TURNS)
    ]


async def async_lanes(pilot: ContextPilot, process: int) -> list[SeenTurn]:
    lanes = [
        async_lane(pilot, f"p{process}a{task}", process + THREADS + task) for task in range(TASKS)
    ]
    return [turn for lane in await asyncio.gather(*lanes) for turn in lane]


def play_process(url: str, process: int) -> list[SeenTurn]:
    """This process's lanes, threads and asyncio tasks at once; every turn they saw."""
    thread_pilot, async_pilot = ContextPilot(store=url), ContextPilot(store=url)
    with ThreadPoolExecutor(THREADS) as pool:
        threads = [
            pool.submit(thread_lane, thread_pilot, f"p{process}t{lane}", process + lane)
            for lane in range(THREADS)
        ]
        seen = asyncio.run(async_lanes(async_pilot, process))
        return [turn for future in threads for turn in future.result()] + seen


def _wait(barrier: Any) -> None:
    barrier.wait(120)  # every process imported and ready: they start together


def play_everywhere(url: str) -> list[SeenTurn]:
    """Every process's turns (a process that dies breaks the pool: an error, no hang)."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    with ProcessPoolExecutor(
        PROCESSES, mp_context=context, initializer=_wait, initargs=(barrier,)
    ) as pool:
        done = [pool.submit(play_process, url, process) for process in range(PROCESSES)]
        return [turn for future in done for turn in future.result(timeout=240)]


def test_processes_threads_and_tasks_on_one_redis_lose_duplicate_and_mispair_no_turn(
    redis_url: str,
) -> None:
    seen = play_everywhere(redis_url)
    assert len(seen) == PROCESSES * (THREADS + TASKS) * TURNS
    assert any(turn.unanswered for turn in seen)  # lanes overlapped inside conversations
    by_request = {turn.request_id: turn for turn in seen}
    assert len(by_request) == len(seen)
    reader = ContextPilot(store=redis_url)
    for number in range(CONVERSATIONS):
        conversation_id = f"conv{number}"
        stored = reader.conversation(conversation_id).turns
        written = sorted(t.request_id for t in seen if t.conversation_id == conversation_id)
        assert sorted(turn.request_id for turn in stored) == written  # none lost, none twice
        assert len({turn.question[:2] for turn in stored}) > 1  # "p<n>": processes mixed
        for position, turn in enumerate(stored):
            got = by_request[turn.request_id]
            assert turn.question == got.question
            assert turn.answer == answer_to(turn.question)  # paired with its own question
            # the prompt returned is the turn written, planned on exactly the turns before it
            assert turn.block_ids == got.sent
            assert sorted(got.sent + got.deduplicated) == sorted(got.asked)  # no block lost
            assert got.history == tuple(earlier.user_message for earlier in stored[:position])
            shown_before = {block for earlier in stored[:position] for block in earlier.block_ids}
            assert not shown_before & set(turn.block_ids)  # never sent in full twice
            assert set(got.deduplicated) == shown_before & set(got.asked)  # every repeat noted
