"""The hit-ratio experiment: the same workload replayed through the prefix-cache model
once per arm, the unmodified prompt first.

``contextpilot-rag demo`` runs :func:`run_online` and :func:`run_multiturn` on a small
workload; ``benchmarks/bench.py`` runs them at full size and adds arms of its own
(``extra_arms``).

Invariants: every arm of one experiment sees the same workload and a fresh cache of
the same capacity, a fraction of the distinct cacheable tokens of the *unmodified*
prompts, so arms are compared as ratios; apart from ``ArmResult.build_s`` the result
is a pure function of the arguments (seed included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .bench.workloads import Workload, WorkloadRequest, multiturn_workload, online_workload
from .blocks import ContextBlock, render_block
from .index import IndexConfig
from .pilot import ContextPilot, PilotConfig, structure_guard_of
from .prompt import Prompt
from .sim.replay import (
    ArmResult,
    BuildPrompt,
    EngineTokenizer,
    Messages,
    capacity_for,
    generated_tokens,
    replay,
    replay_tokens,
    synthetic_answer,
)
from .tokenizers import Tokenizer, default_tokenizer

__all__ = [
    "Arm",
    "ArmFactory",
    "ExperimentResult",
    "ExtraArms",
    "Progress",
    "baseline_config",
    "block_lookup",
    "dedup_misses",
    "pilot_arm",
    "run_experiment",
    "run_multiturn",
    "run_online",
]

Progress = Callable[[str, int], Callable[[], None]]
"""``progress(label, total)`` returns a callback to advance that task by one."""

ArmFactory = Callable[[int], tuple[BuildPrompt[WorkloadRequest], Callable[[], int]]]
"""Given the cache capacity: an arm's prompt builder and a count of its dedup misses."""

Arm = tuple[str, ArmFactory]
ExtraArms = Callable[[Workload, Tokenizer], Sequence[Arm]]


@dataclass(frozen=True)
class ExperimentResult:
    name: str
    capacity_tokens: int
    arms: tuple[ArmResult, ...]

    def arm(self, name: str) -> ArmResult:
        return next(arm for arm in self.arms if arm.name == name)


def baseline_config(base: PilotConfig | None = None) -> PilotConfig:
    """The unmodified prompt: same rendering, no reorder, dedup or notes."""
    return replace(base or PilotConfig(), reorder=False, dedup=False, annotate=False)


def block_lookup(workload: Workload) -> Callable[[str], ContextBlock]:
    """A document id of ``workload`` to its block (one block object per document)."""
    blocks = {doc_id: ContextBlock(text, id=doc_id) for doc_id, text in workload.corpus.items()}
    return blocks.__getitem__


def pilot_arm(
    pilot: ContextPilot, workload: Workload, blocks_of: Callable[[str], ContextBlock]
) -> tuple[BuildPrompt[WorkloadRequest], list[Prompt]]:
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


def dedup_misses(prompts: Iterable[Prompt], pilot: ContextPilot | None = None) -> int:
    """De-duplicated blocks whose rendering (label line and escaped text, as
    ``pilot``'s layout renders them; the default layout's without one) is NOT in an
    earlier user message of the prompt (must be 0)."""
    guard = structure_guard_of(pilot)
    misses = 0
    for prompt in prompts:
        history = [m["content"] for m in prompt.messages[:-1] if m["role"] == "user"]
        for block in prompt.deduplicated:
            rendered = render_block(block, guard, label=prompt.label_of(block.id))
            misses += not any(rendered in message for message in history)
    return misses


def _no_progress(label: str, total: int) -> Callable[[], None]:
    return lambda: None


def _ours(workload: Workload, tokenizer: Tokenizer, **options: Any) -> ArmFactory:
    def make(capacity: int) -> tuple[BuildPrompt[WorkloadRequest], Callable[[], int]]:
        config = replace(PilotConfig(index=IndexConfig(capacity_tokens=capacity)), **options)
        pilot = ContextPilot(config, tokenizer=tokenizer)
        build, prompts = pilot_arm(pilot, workload, block_lookup(workload))
        return build, lambda: dedup_misses(prompts, pilot)

    return make


def _baseline_streams(
    workload: Workload, encode: EngineTokenizer, tokenizer: Tokenizer, tick: Callable[[], None]
) -> list[list[int]]:
    pilot = ContextPilot(baseline_config(), tokenizer=tokenizer)
    build, _ = pilot_arm(pilot, workload, block_lookup(workload))
    streams = []
    for request in workload.requests:
        streams.append(encode(build(request)))
        tick()
    return streams


def run_experiment(
    name: str,
    workload: Workload,
    arms: Sequence[Arm],
    *,
    capacity_fraction: float = 0.25,
    tokenizer: Tokenizer | None = None,
    progress: Progress = _no_progress,
    cache_answers: bool = False,
) -> ExperimentResult:
    """The unmodified prompts first (they set the cache capacity), then each arm on a
    fresh cache. ``cache_answers``: the engine keeps the KV of the answers it decodes
    (vLLM v1, SGLang), so the next turn reuses them."""
    tokenizer = tokenizer or default_tokenizer()
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


def run_online(
    *,
    n_docs: int = 2000,
    n_requests: int = 2000,
    k: int = 15,
    capacity_fraction: float = 0.25,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
    progress: Progress = _no_progress,
    extra_arms: ExtraArms | None = None,
) -> ExperimentResult:
    """Online requests, one at a time: unmodified vs ours with the retriever's order
    for unmatched blocks vs ours (popularity order), then ``extra_arms``."""
    tokenizer = tokenizer or default_tokenizer()
    workload = online_workload(n_docs=n_docs, n_requests=n_requests, k=k, seed=seed)
    arms: list[Arm] = [
        ("ours (retrieval order)", _ours(workload, tokenizer, remainder="retrieval")),
        ("ours", _ours(workload, tokenizer)),
    ]
    if extra_arms is not None:
        arms += extra_arms(workload, tokenizer)
    return run_experiment(
        "online",
        workload,
        arms,
        capacity_fraction=capacity_fraction,
        tokenizer=tokenizer,
        progress=progress,
    )


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
    reorder + de-duplication."""
    tokenizer = tokenizer or default_tokenizer()
    workload = multiturn_workload(
        n_sessions=n_sessions, turns=turns, interleave=interleave, k=k, n_docs=n_docs, seed=seed
    )
    arms: list[Arm] = [
        ("ours (no dedup)", _ours(workload, tokenizer, dedup=False)),
        ("ours", _ours(workload, tokenizer)),
    ]
    return run_experiment(
        "multi-turn" if cache_answers else "multi-turn, answers not cached",
        workload,
        arms,
        capacity_fraction=capacity_fraction,
        tokenizer=tokenizer,
        progress=progress,
        cache_answers=cache_answers,
    )
