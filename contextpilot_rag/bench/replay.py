"""Replay a workload through a prompt builder into the prefix-cache model.

Each *arm* turns a workload request into chat messages (the unmodified baseline,
``ContextPilot`` with some configuration, or the reference implementation); the
messages are tokenized the way an engine would see them (a plain role template around
each message) and admitted, in arrival order, to a vLLM-style prefix cache. Hit ratio
= cached prompt tokens / prompt tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..blocks import ContextBlock
from ..pilot import ContextPilot, PilotConfig
from ..prompt import Prompt
from ..sim.prefix_cache import PrefixCacheModel, distinct_block_tokens
from ..tokenizers import Tokenizer
from .workloads import Workload, WorkloadRequest

__all__ = [
    "ArmResult",
    "BuildPrompt",
    "EngineTokenizer",
    "baseline_config",
    "capacity_for",
    "generated_tokens",
    "pilot_arm",
    "replay",
    "replay_tokens",
    "synthetic_answer",
]

Messages = Sequence[Mapping[str, str]]
BuildPrompt = Callable[[WorkloadRequest], Messages]
"""An arm: build the messages of one request (and record its answer if it keeps history)."""


@dataclass(frozen=True)
class ArmResult:
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


def synthetic_answer(request: WorkloadRequest) -> str:
    """A fixed stand-in for the model's answer (about 30 tokens)."""
    return (
        f"According to the context documents, the answer to question {request.turn + 1} "
        f"of conversation {request.session} follows from the first two documents cited."
    )


def baseline_config(base: PilotConfig | None = None) -> PilotConfig:
    """The unmodified prompt: same rendering, no reorder, dedup or notes."""
    return replace(base or PilotConfig(), reorder=False, dedup=False, annotate=False)


def pilot_arm(
    pilot: ContextPilot, workload: Workload, blocks_of: Callable[[str], ContextBlock]
) -> tuple[BuildPrompt, list[Prompt]]:
    """An arm backed by ``pilot``; keeps the prompts it built for later checks."""
    built: list[Prompt] = []

    def build(request: WorkloadRequest) -> Messages:
        blocks = [blocks_of(doc_id) for doc_id in request.doc_ids]
        prompt = pilot.optimize(
            blocks, request.query, conversation_id=request.session, system=workload.system_prompt
        )
        if request.session is not None:
            pilot.record_answer(prompt, synthetic_answer(request))
        built.append(prompt)
        return prompt.messages

    return build, built


def capacity_for(
    token_streams: Iterable[Sequence[int]], fraction: float, block_size: int = 16
) -> int:
    """``fraction`` of the distinct cacheable tokens of ``token_streams``."""
    return max(block_size, int(distinct_block_tokens(token_streams, block_size) * fraction))


def generated_tokens(
    workload: Workload, encode: EngineTokenizer, *, cache_answers: bool
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
    workload: Workload,
    build: BuildPrompt,
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


def dedup_misses(prompts: Iterable[Prompt]) -> int:
    """De-duplicated blocks whose full text is NOT in the prompt's history (must be 0)."""
    misses = 0
    for prompt in prompts:
        history = "".join(m["content"] for m in prompt.messages[:-1] if m["role"] == "user")
        misses += sum(1 for block in prompt.deduplicated if block.text.strip() not in history)
    return misses
