"""Replay a workload's prompts, in arrival order, into the prefix-cache model.

An *arm* builds the chat messages of one workload request (the unmodified prompt, or
``ContextPilot`` with some configuration). :class:`EngineTokenizer` turns messages
into the token ids an engine sees (a plain role template around each message), and
:func:`replay` admits them to a fresh :class:`PrefixCacheModel`. Hit ratio = cached
prompt tokens / prompt tokens.

Invariant: a replay is a pure function of the workload, the arm and the capacity; only
``ArmResult.build_s`` (wall time spent building prompts) varies between runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..tokenizers import Tokenizer
from .prefix_cache import PrefixCacheModel, distinct_block_tokens
from .traces import Messages, SessionRequest, WorkloadLike

__all__ = [
    "ArmResult",
    "BuildPrompt",
    "EngineTokenizer",
    "Messages",
    "TurnRequest",
    "capacity_for",
    "generated_tokens",
    "replay",
    "replay_tokens",
    "synthetic_answer",
]


class TurnRequest(SessionRequest, Protocol):
    """A workload request as a replay reads it: its conversation (or ``None``) and its
    turn in that conversation (``bench.workloads.WorkloadRequest`` is one)."""

    @property
    def turn(self) -> int: ...


Request = TypeVar("Request", bound=TurnRequest)
BuildPrompt = Callable[[Request], Messages]
"""An arm: build the messages of one request (and record its answer if it keeps history)."""


@dataclass(frozen=True)
class ArmResult:
    """What one arm's prompts cost a prefix cache; ``dedup_misses`` counts
    de-duplicated blocks whose text was not in the prompt's history (must be 0)."""

    name: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    build_s: float
    dedup_misses: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


class EngineTokenizer:
    """Token ids of a chat prompt as an engine sees them: ``<|role|>\\n`` + content +
    ``\\n`` per message. Messages seen before (system prompt, history) are memoised."""

    def __init__(self, tokenizer: Tokenizer, memo_size: int = 4096) -> None:
        self._tokenizer = tokenizer
        self._memo: dict[tuple[str, str], list[int]] = {}
        self._memo_size = memo_size

    def __call__(self, messages: Messages) -> list[int]:
        ids: list[int] = []
        for message in messages[:-1]:
            ids.extend(self._message(message, memo=True))
        ids.extend(self._message(messages[-1], memo=False))
        return ids

    def reply(self, answer: str) -> list[int]:
        """The tokens of an assistant message, as the next turn's prompt renders it:
        what the engine decodes after a prompt (the generation prompt included)."""
        return self._message({"role": "assistant", "content": answer}, memo=False)

    def _message(self, message: Mapping[str, str], *, memo: bool) -> list[int]:
        key = (message["role"], message["content"])
        cached = self._memo.get(key)
        if cached is None:
            cached = self._tokenizer.encode(f"<|{key[0]}|>\n{key[1]}\n")
            if memo:
                if len(self._memo) >= self._memo_size:
                    self._memo.pop(next(iter(self._memo)))
                self._memo[key] = cached
        return cached


def synthetic_answer(request: TurnRequest) -> str:
    """A fixed stand-in for the model's answer (about 30 tokens)."""
    return (
        f"According to the context documents, the answer to question {request.turn + 1} "
        f"of conversation {request.session} follows from the first two documents cited."
    )


def capacity_for(
    token_streams: Iterable[Sequence[int]], fraction: float, block_size: int = 16
) -> int:
    """``fraction`` of the distinct cacheable tokens of ``token_streams``."""
    return max(block_size, int(distinct_block_tokens(token_streams, block_size) * fraction))


def generated_tokens(
    workload: WorkloadLike[TurnRequest], encode: EngineTokenizer, *, cache_answers: bool
) -> list[list[int]]:
    """Per request, the tokens the engine decodes after its prompt, if the engine
    keeps them cached (vLLM v1 and SGLang do): the synthetic answer of requests that
    belong to a session; nothing otherwise."""
    return [
        encode.reply(synthetic_answer(request))
        if cache_answers and request.session is not None
        else []
        for request in workload.requests
    ]


def replay(
    name: str,
    workload: WorkloadLike[Request],
    build: BuildPrompt[Request],
    encode: EngineTokenizer,
    *,
    capacity_tokens: int | None,
    generated: Sequence[Sequence[int]] | None = None,
    on_request: Callable[[], None] | None = None,
) -> ArmResult:
    """Admit every request's prompt, in order, to a fresh prefix cache (followed by
    its ``generated`` tokens, if given, as the engine decodes them)."""
    cache = PrefixCacheModel(capacity_tokens=capacity_tokens)
    build_s = 0.0
    for number, request in enumerate(workload.requests):
        started = time.perf_counter()
        messages = build(request)
        build_s += time.perf_counter() - started
        cache.admit(encode(messages), generated[number] if generated else ())
        if on_request is not None:
            on_request()
    return ArmResult(
        name=name,
        requests=len(workload.requests),
        prompt_tokens=cache.prompt_tokens_total,
        cached_tokens=cache.cached_tokens_total,
        build_s=build_s,
    )


def replay_tokens(
    name: str,
    streams: Sequence[Sequence[int]],
    *,
    capacity_tokens: int | None,
    generated: Sequence[Sequence[int]] | None = None,
) -> ArmResult:
    """Admit already tokenized prompts, in order, to a fresh prefix cache."""
    cache = PrefixCacheModel(capacity_tokens=capacity_tokens)
    for number, stream in enumerate(streams):
        cache.admit(stream, generated[number] if generated else ())
    return ArmResult(name, len(streams), cache.prompt_tokens_total, cache.cached_tokens_total, 0.0)
