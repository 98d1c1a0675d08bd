"""One evaluation run: build every arm's prompts, send them, score the answers.

All prompts are built before the first request is sent (histories use reference
answers, so no prompt depends on a model's answer), and each is checked for evidence
retention as it is built. Requests go out conversation by conversation — for each
conversation, every arm's turns in order — so an engine's prefix cache sees a
conversation's turns close together, as it would in service.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from ..errors import ConfigError
from ..tokenizers import Tokenizer
from .arms import ARM_NAMES, BASELINE, DEFAULT_ARMS, ArmPrompt, ArmSpec, arm_spec, build_prompts
from .client import Completion, Endpoint, complete_all
from .metrics import AnswerScores, score_answer
from .tasks import EvalTask

__all__ = ["ArmRun", "EvalRun", "EvalSettings", "TaskResult", "plan_prompts", "run_evaluation"]

Progress = Callable[[str, int], Callable[[], None]]
"""``progress(label, total)`` returns a callback that advances that bar by one."""


@dataclass(frozen=True)
class EvalSettings:
    """What to run: the arms (``unmodified``, the baseline, always runs first),
    tokens to generate, requests in flight, retries of transient failures and the
    history window (``None``: whole conversations)."""

    arms: tuple[str, ...] = DEFAULT_ARMS
    max_tokens: int = 128
    concurrency: int = 4
    retries: int = 3
    max_history_turns: int | None = None

    def __post_init__(self) -> None:
        unknown = [name for name in self.arms if name not in ARM_NAMES]
        if unknown:
            raise ConfigError(f"unknown arm(s) {unknown}; choose from {list(ARM_NAMES)}")
        arms = (BASELINE, *(name for name in dict.fromkeys(self.arms) if name != BASELINE))
        object.__setattr__(self, "arms", arms)
        for name, low in (("max_tokens", 1), ("concurrency", 1), ("retries", 0)):
            _check_int(name, getattr(self, name), low)
        if self.max_history_turns is not None:
            _check_int("max_history_turns", self.max_history_turns, 1)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class TaskResult:
    """One arm's prompt, answer and scores for one task (``scores`` is ``None``
    when the request failed)."""

    task: EvalTask
    prompt: ArmPrompt
    completion: Completion
    scores: AnswerScores | None


@dataclass(frozen=True)
class ArmRun:
    arm: ArmSpec
    results: tuple[TaskResult, ...]
    """In task order."""

    @property
    def lost(self) -> tuple[tuple[str, str], ...]:
        """``(task id, block id)`` of every block a prompt of this arm lost."""
        return tuple((r.task.task_id, block) for r in self.results for block in r.prompt.lost)

    @property
    def errors(self) -> tuple[tuple[str, str], ...]:
        """``(task id, error)`` of every failed request."""
        return tuple(
            (r.task.task_id, r.completion.error)
            for r in self.results
            if r.completion.error is not None
        )


@dataclass(frozen=True)
class EvalRun:
    tasks: tuple[EvalTask, ...]
    arms: tuple[ArmRun, ...]
    settings: EvalSettings
    seconds: float

    def arm(self, name: str) -> ArmRun:
        return next(run for run in self.arms if run.arm.name == name)


def plan_prompts(
    tasks: Sequence[EvalTask], settings: EvalSettings, *, tokenizer: Tokenizer | None = None
) -> dict[str, tuple[ArmPrompt, ...]]:
    """Every arm's prompts, in task order (see :mod:`.arms`)."""
    return {
        name: build_prompts(
            arm_spec(name),
            tasks,
            max_history_turns=settings.max_history_turns,
            tokenizer=tokenizer,
        )
        for name in settings.arms
    }


def send_order(tasks: Sequence[EvalTask], arms: int) -> list[tuple[int, int]]:
    """``(arm index, task index)`` pairs: conversation by conversation, and within
    one conversation every arm's turns in turn order."""
    clusters: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        clusters.setdefault(task.cluster, []).append(index)
    return [
        (arm, index) for members in clusters.values() for arm in range(arms) for index in members
    ]


def run_evaluation(
    tasks: Sequence[EvalTask],
    endpoint: Endpoint,
    settings: EvalSettings | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EvalRun:
    """Build, send and score every arm's prompts for ``tasks``."""
    if not tasks:
        raise ConfigError("no tasks to evaluate")
    settings = settings or EvalSettings()
    started = time.perf_counter()
    prompts = plan_prompts(tasks, settings, tokenizer=tokenizer)
    names = list(settings.arms)
    order = send_order(tasks, len(names))
    advance = progress("requests", len(order)) if progress is not None else None
    completions = complete_all(
        endpoint,
        [prompts[names[arm]][index].messages for arm, index in order],
        max_tokens=settings.max_tokens,
        concurrency=settings.concurrency,
        retries=settings.retries,
        on_done=advance,
        transport=transport,
    )
    answered = {
        (names[arm], index): done for (arm, index), done in zip(order, completions, strict=True)
    }
    arms = tuple(
        ArmRun(
            arm_spec(name),
            tuple(
                _result(task, prompts[name][index], answered[name, index])
                for index, task in enumerate(tasks)
            ),
        )
        for name in names
    )
    return EvalRun(tuple(tasks), arms, settings, time.perf_counter() - started)


def _result(task: EvalTask, prompt: ArmPrompt, completion: Completion) -> TaskResult:
    if completion.text is None:
        return TaskResult(task, prompt, completion, None)
    scores = score_answer(completion.text, task.references, task.answerable, prompt.labels)
    return TaskResult(task, prompt, completion, scores)
